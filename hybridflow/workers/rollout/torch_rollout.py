"""``TorchRollout`` (registry name ``"torch"``): the built-in sampler, runs wherever torch runs.

It samples from a Hugging Face causal LM in the same process. For Llama-family models (plain
or with LoRA adapters) it uses :class:`~hybridflow.inference.lean_decoder.LeanDecoder`
(own decode loop, own KV cache, packed weights on CPU); for other architectures and LoRA
variants it steps the model's own forward (:class:`~hybridflow.inference.hf_decoder.HFDecoder`).
Both paths share the sampling loop of :mod:`hybridflow.inference.generation`.

Vision-language models (Qwen2-VL) sample on the HF path: a prompt row's image inputs (the
``multi_modal_inputs`` non-tensor column) go to the prefill with its per-axis (B, 3, P)
positions; the output's positions are (B·n, 3, P+T), each response token one past the prompt's
largest position on all three axes; the model's vision tokens are never sampled.

Weights: the rollout reads the module it was given. Handed the actor's module (colocated
default), it sees every update at once — packed copies are rebuilt when a parameter changed
(see :mod:`hybridflow.inference.projections`). Handed its own module, it receives
weights via :meth:`update_weights`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from hybridflow import fields as F
from hybridflow.config.actor_rollout_ref import RolloutConfig
from hybridflow.engine.multimodal_inputs import vision_token_ids
from hybridflow.inference.decoders import build_decoder
from hybridflow.inference.generation import Generated, generate
from hybridflow.inference.positions import response_positions
from hybridflow.inference.sampling import GenerationParams
from hybridflow.inference.weights import load_named_tensors
from hybridflow.protocol import DataProto
from hybridflow.workers.rollout.base import (
    ROLLOUTS,
    BaseRollout,
    NamedTensors,
    RolloutCapabilities,
)


def _token_ids(value: Any, what: str) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (int, np.integer)):
        return (int(value),)
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, np.integer)) for v in value):
        return tuple(int(v) for v in value)
    raise ValueError(f"{what} must be an int or a list of ints, got {value!r}")


def _compute_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    names = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
    if dtype not in names:
        raise ValueError(f"unknown rollout dtype {dtype!r}; valid: {', '.join(names)}")
    return names[dtype]


def _meta(meta: Mapping[str, Any], key: str, fallback: Any) -> Any:
    """``meta[key]`` when the caller set it for this call, else the configured value."""
    return meta[key] if key in meta else fallback


def pad_token_id(meta: Mapping[str, Any], default: int | None) -> int:
    """The call's pad id: ``meta['pad_token_id']``, else ``default`` (the tokenizer's pad/eos)."""
    pad = _meta(meta, F.META_PAD_TOKEN_ID, None)
    pad = default if pad is None else int(pad)
    if pad is None:
        raise ValueError("no pad token id: pass meta_info['pad_token_id'] or a tokenizer with a pad/eos token")
    return pad


def rollout_sampling(config: RolloutConfig, meta: Mapping[str, Any], default_eos: tuple[int, ...]) -> GenerationParams:
    """Settings for one call: ``config`` (or its ``val_kwargs`` when ``meta['validate']``),
    overridden by the keys the caller put in ``meta``; the stop ids are the EOS ids plus
    ``meta['stop_token_ids']``."""
    base = config.val_kwargs if bool(_meta(meta, F.META_VALIDATE, False)) else config
    eos = _token_ids(_meta(meta, F.META_EOS_TOKEN_ID, default_eos), "meta_info['eos_token_id']")
    stops = eos + _token_ids(_meta(meta, F.META_STOP_TOKEN_IDS, None), "meta_info['stop_token_ids']")
    return GenerationParams(
        max_new_tokens=int(_meta(meta, F.META_RESPONSE_LENGTH, config.response_length)),
        temperature=float(_meta(meta, F.META_TEMPERATURE, base.temperature)),
        top_k=int(_meta(meta, F.META_TOP_K, base.top_k)),
        top_p=float(_meta(meta, F.META_TOP_P, base.top_p)),
        do_sample=bool(_meta(meta, F.META_DO_SAMPLE, base.do_sample)),
        n=int(_meta(meta, F.META_N, 1)),
        stop_token_ids=tuple(dict.fromkeys(stops)),
        ignore_eos=config.ignore_eos,
    )


@ROLLOUTS.register("torch")
class TorchRollout(BaseRollout):
    """The built-in sampler. See the module docstring."""

    capabilities: ClassVar[RolloutCapabilities] = RolloutCapabilities(sleep_wake=True)

    def __init__(
        self,
        config: RolloutConfig,
        model: nn.Module,
        tokenizer: Any = None,
        *,
        dtype: torch.dtype | str | None = None,
        decoder: str = "auto",
        weight_format: str = "auto",
    ) -> None:
        if config.response_length is None:
            raise ValueError("rollout.response_length is null; set it (or data.max_response_length)")
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.decoder = build_decoder(model, decoder, weight_format, _compute_dtype(dtype))
        self.generator = torch.Generator(device=next(model.parameters()).device)
        self.generator.manual_seed(config.seed if config.seed is not None else 0)
        self.default_eos = _token_ids(self._default_eos(), "eos_token_id")
        self.default_pad = self._default_pad()
        # a vision-language model's image pads / vision markers: never sampled (see sampling.py)
        self.suppress_token_ids = vision_token_ids(model)

    def _default_eos(self) -> Any:
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            return self.tokenizer.eos_token_id
        generation_config = getattr(self.model, "generation_config", None)
        return getattr(generation_config, "eos_token_id", None)

    def _default_pad(self) -> int | None:
        if self.tokenizer is not None and self.tokenizer.pad_token_id is not None:
            return int(self.tokenizer.pad_token_id)
        return self.default_eos[0] if self.default_eos else None

    # ---- sampling settings -------------------------------------------------------------------
    def sampling_params(self, meta: Mapping[str, Any]) -> GenerationParams:
        """Settings for one call: config (or ``val_kwargs`` when ``meta['validate']``) + overrides;
        the model's vision tokens suppressed."""
        params = rollout_sampling(self.config, meta, self.default_eos)
        return replace(params, suppress_token_ids=self.suppress_token_ids) if self.suppress_token_ids else params

    def _check_lengths(self, prompt_len: int, response_len: int) -> None:
        limit = self.config.prompt_length
        if limit is not None and prompt_len > limit:
            raise ValueError(
                f"prompt length {prompt_len} exceeds rollout.prompt_length={limit}; "
                "filter or truncate prompts (data.filter_overlong_prompts / data.truncation)"
            )
        max_pos = getattr(self.model.config, "max_position_embeddings", None)
        if max_pos is not None and prompt_len + response_len > max_pos:
            raise ValueError(
                f"prompt length {prompt_len} + response_length {response_len} exceeds the model's "
                f"max_position_embeddings={max_pos}"
            )

    # ---- BaseRollout -------------------------------------------------------------------------
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        meta = dict(prompts.meta_info)
        params = self.sampling_params(meta)
        pad = pad_token_id(meta, self.default_pad)
        batch = prompts.batch
        if batch is None:
            raise ValueError(
                f"generate_sequences needs batch[{F.INPUT_IDS!r}] (left-padded prompts); the batch has no tensors"
            )
        for key in (F.INPUT_IDS, F.ATTENTION_MASK, F.POSITION_IDS):
            if key not in batch.keys():
                raise ValueError(f"generate_sequences needs batch[{key!r}] (left-padded prompts)")
        input_ids, attention_mask, position_ids = batch[F.INPUT_IDS], batch[F.ATTENTION_MASK], batch[F.POSITION_IDS]
        self._check_lengths(input_ids.shape[1], params.max_new_tokens)
        generator = self.generator
        if F.META_SEED in meta:
            generator = torch.Generator(device=input_ids.device).manual_seed(int(meta[F.META_SEED]))
        column = prompts.non_tensor_batch.get(F.MULTI_MODAL_INPUTS)
        images = list(column) if column is not None else None
        desc = meta.get(F.META_PROGRESS_DESC)
        if not desc:
            out = generate(self.decoder, input_ids, attention_mask, position_ids, params, pad, generator, images=images)
            return self._to_dataproto(prompts, params.n, out)
        rows = input_ids.shape[0] * params.n
        with tqdm(total=params.max_new_tokens, desc=desc, unit="tok", leave=False) as bar:

            def on_token(t: int, live: int) -> None:
                bar.set_postfix(rows_left=f"{live}/{rows}", refresh=False)
                bar.update(t - bar.n)

            out = generate(
                self.decoder, input_ids, attention_mask, position_ids, params, pad, generator, on_token, images
            )
        return self._to_dataproto(prompts, params.n, out)

    def _to_dataproto(self, prompts: DataProto, n: int, out: Generated) -> DataProto:
        batch = prompts.require_batch()
        prompt_ids = batch[F.INPUT_IDS].repeat_interleave(n, dim=0)
        prompt_mask = batch[F.ATTENTION_MASK].repeat_interleave(n, dim=0)
        prompt_pos = batch[F.POSITION_IDS].repeat_interleave(n, dim=0)
        steps = out.responses.shape[1]
        response_mask = (torch.arange(steps, device=out.lengths.device)[None] < out.lengths[:, None]).to(
            prompt_mask.dtype
        )
        response_pos = response_positions(prompt_pos, steps)
        tensors = {
            F.PROMPTS: prompt_ids,
            F.RESPONSES: out.responses,
            F.RESPONSE_MASK: response_mask,
            F.INPUT_IDS: torch.cat([prompt_ids, out.responses], dim=1),
            F.ATTENTION_MASK: torch.cat([prompt_mask, response_mask], dim=1),
            F.POSITION_IDS: torch.cat([prompt_pos, response_pos], dim=-1),
            F.ROLLOUT_LOG_PROBS: out.log_probs,
        }
        non_tensors = {key: np.repeat(value, n, axis=0) for key, value in prompts.non_tensor_batch.items()}
        return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=dict(prompts.meta_info))

    def update_weights(self, weights: NamedTensors) -> None:
        """Copy new weights into the module (skipped for tensors that already are its parameters)."""
        load_named_tensors(self.model, weights)
        self.weights_changed()

    def weights_changed(self) -> None:
        """The module's tensors were replaced in place: drop the packed copies."""
        self.decoder.invalidate_weights()

    def release(self) -> None:
        """Free the KV cache and packed weight copies (rebuilt on the next call)."""
        self.decoder.release()

    def resume(self) -> None:
        """Nothing to restore: the next call re-packs weights and allocates its cache."""
