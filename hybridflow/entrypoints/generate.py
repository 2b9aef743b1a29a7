"""Batch generation: prompts file → N sampled responses per prompt (verl's ``main_generation``).

    python -m hybridflow.entrypoints.generate data.path=test.parquet data.n_samples=4 \\
        data.output_path=gen.parquet model.path=smollm2-135m-instruct rollout.temperature=0.7
    hybridflow generate ...same keys...
    hybridflow eval data.path=gen.parquet

Input: parquet or JSON lines; ``data.prompt_key`` holds chat messages (verl's RL schema) or a
plain string (one user message, or raw text with ``data.apply_chat_template=false``). Output:
the input rows, in order, with a ``responses`` column holding ``data.n_samples`` strings each
(special tokens removed) — what ``hybridflow eval`` reads.

Sampling runs on the built-in torch sampler (:class:`TorchRollout`) in batches of
``data.batch_size`` prompts. Batch ``b`` is sampled with seed ``seed + b`` and written to its
own part file as soon as it is done (:mod:`hybridflow.data.generation_journal`), so a
crashed run restarted with the same command resumes after its last finished batch and ends
with the same file an uninterrupted run writes.

Images: a row whose ``data.image_key`` column (default ``images``) holds images is a
vision-language prompt in verl's layout (``docs/vision.md``): its messages' ``<image>``
placeholders are filled in order, the model folder's processor expands the image tokens, and
the sampler is given the rows' pixel inputs and Qwen2-VL's 3-D positions, as ``hybridflow
train``'s rollout is. Such a file needs a vision-language model folder (a ``vision_config`` in
its config), and its prompts are never truncated (a cut would separate image tokens from their
pixels). The resume fingerprint covers the images' bytes too.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from tqdm import tqdm

from hybridflow import fields as F
from hybridflow.config import ConfigError, RolloutConfig, load_structured, to_dict
from hybridflow.config.build import check_leaves
from hybridflow.config.spec import section, setting
from hybridflow.data import (
    DataFileError,
    DataRowError,
    read_rows,
    truncate_ids,
)
from hybridflow.data.generation_journal import GenerationJournal
from hybridflow.data.multimodal import (
    MultimodalPrompt,
    check_media_counts,
    decode_images,
    encode_multimodal_prompt,
    processor_max_pixels,
)
from hybridflow.data.prompt_text import prompt_token_ids
from hybridflow.entrypoints.common import ensure_builtin_task_files, resolve_device
from hybridflow.entrypoints.generate_images import images_digest, prompt_batch
from hybridflow.models import load_model_and_tokenizer, resolve_model_path
from hybridflow.models.loader import is_vision_language_folder
from hybridflow.models.processor import load_processor
from hybridflow.utils.allocator import keep_freed_memory
from hybridflow.utils.errors import InputError, debug_enabled, one_paragraph
from hybridflow.utils.precision import resolve_compute_dtype
from hybridflow.workers.rollout.base import BaseRollout
from hybridflow.workers.rollout.torch_rollout import TorchRollout

# --- config --------------------------------------------------------------------------------


@dataclass(frozen=True)
class GenDataConfig:
    """``data``: the prompts file, how to read it, and where the responses go."""

    path: str = setting(
        "~/data/hybridflow/arithmetic/test.parquet",
        "parquet or jsonl file of prompts (the default is the built-in arithmetic test set)",
    )
    prompt_key: str = setting("prompt", "column holding chat messages, or a plain string")
    n_samples: int = setting(1, "responses sampled per prompt", ge=1)
    output_path: str = setting("outputs/generations.parquet", "output parquet or jsonl file (input rows + responses)")
    batch_size: int = setting(32, "prompts per sampler call (each with n_samples responses); one part file each", ge=1)
    truncation: Literal["error", "left", "right", "middle"] = setting(
        "error", "a prompt longer than rollout.prompt_length: error, or keep its left / right / middle tokens"
    )
    apply_chat_template: bool = setting(
        True, "string prompts become one user message in the chat template; false = encode them as raw text"
    )
    chat_template_kwargs: dict[str, Any] = setting(factory=dict, help="extra keyword arguments for apply_chat_template")
    image_key: str = setting(
        "images", "column holding each row's images (verl's multimodal layout); needs a vision-language model"
    )


@dataclass(frozen=True)
class GenModelConfig:
    """``model``: the policy to sample from."""

    path: str = setting("smollm2-135m-instruct", "HF model folder or known name (tiny-llama, smollm2-135m-instruct)")
    trust_remote_code: bool = setting(False, "allow custom model code from the folder")


@dataclass(frozen=True)
class GenRolloutConfig:
    """``rollout``: sampling settings (verl's ``rollout.*`` names)."""

    temperature: float = setting(1.0, "sampling temperature; 0 = greedy", ge=0)
    top_p: float = setting(1.0, "nucleus sampling mass", gt=0, le=1)
    top_k: int = setting(-1, "top-k sampling; -1 or 0 = off", ge=-1)
    do_sample: bool = setting(True, "sample (true) or decode greedily (false)")
    prompt_length: int = setting(1024, "max prompt tokens after the chat template (see data.truncation)", ge=1)
    response_length: int = setting(512, "max new tokens per response", ge=1)
    ignore_eos: bool = setting(False, "keep generating after EOS up to response_length")
    dtype: Literal["auto", "fp32", "bf16", "float32", "bfloat16"] = setting(
        "auto", "model weights and compute dtype; auto = bf16 where the hardware has a native bf16 matmul, else fp32"
    )
    decoder: Literal["auto", "lean", "hf"] = setting(
        "auto", "sampler forward: lean (Llama, Qwen2, Mistral, Qwen3, Gemma 3), hf, or auto"
    )


@dataclass(frozen=True)
class GenerationConfig:
    """Root of the ``hybridflow generate`` config."""

    data: GenDataConfig = section(GenDataConfig, "prompts in, responses out")
    model: GenModelConfig = section(GenModelConfig, "model to sample from")
    rollout: GenRolloutConfig = section(GenRolloutConfig, "sampling")
    seed: int = setting(0, "batch b is sampled with seed + b (same seed, same responses, resumed or not)")
    device: Literal["auto", "cpu", "cuda"] = setting("auto", "auto = cuda if available, else cpu")
    resume: bool = setting(
        True, "continue an unfinished run of the same settings from its part files; false = start over"
    )


def load_generation_config(config_files: list[str] | None, overrides: list[str]) -> GenerationConfig:
    """Defaults ← YAML files ← ``key=value`` overrides, validated (raises :class:`ConfigError`)."""
    cfg = load_structured(GenerationConfig, config_files, overrides)
    problems = check_leaves(cfg)
    if Path(cfg.data.output_path).suffix.lower() not in (".parquet", ".jsonl"):
        problems.append(f"data.output_path: must end in .parquet or .jsonl, got {cfg.data.output_path!r}")
    if problems:
        raise ConfigError(problems)
    return cfg


# --- prompts --------------------------------------------------------------------------------


def _messages(value: Any, fail) -> list[dict[str, Any]]:
    if not isinstance(value, (list, tuple)) or not value:
        raise fail(f"expected a string or a non-empty list of chat messages, got {type(value).__name__}")
    messages = []
    for j, message in enumerate(value):
        if (
            not isinstance(message, dict)
            or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)
        ):
            raise fail(f"message {j}: expected a dict with string 'role' and 'content', got {message!r}")
        messages.append({k: v for k, v in message.items() if v is not None})  # parquet fills absent keys with None
    return messages


def prompt_ids(tokenizer: Any, value: Any, data: GenDataConfig, fail) -> list[int]:
    """Token ids of one prompt cell: chat messages or a string, templated per ``data``."""
    if isinstance(value, str) and not data.apply_chat_template:
        return list(tokenizer(value)["input_ids"])
    messages = [{"role": "user", "content": value}] if isinstance(value, str) else _messages(value, fail)
    if not data.apply_chat_template:  # chat messages as plain text, as training renders them
        return prompt_token_ids(tokenizer, [messages], False)[0]
    if not getattr(tokenizer, "chat_template", None):
        raise fail("the tokenizer has no chat template; set data.apply_chat_template=false for raw-text prompts")
    text = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, **data.chat_template_kwargs
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def tokenize_prompts(rows: list[dict[str, Any]], tokenizer: Any, cfg: GenerationConfig, file: str) -> list[list[int]]:
    """Every row's prompt ids (truncated per ``data.truncation``); bad rows are named."""
    data, limit = cfg.data, cfg.rollout.prompt_length
    out = []
    for i, row in enumerate(rows):

        def fail(problem: str, i: int = i) -> DataRowError:
            return DataRowError(file, i, data.prompt_key, problem)

        if data.prompt_key not in row:
            raise fail(f"missing column (row has: {', '.join(sorted(row)) or 'nothing'})")
        ids = prompt_ids(tokenizer, row[data.prompt_key], data, fail)
        if not ids:
            raise fail("the prompt has no tokens")
        try:
            out.append(truncate_ids(ids, limit, data.truncation))
        except ValueError as err:
            raise fail(f"{err}; raise rollout.prompt_length or set data.truncation") from err
    return out


# --- prompts with images ----------------------------------------------------------------------


def has_images(rows: list[dict[str, Any]], image_key: str) -> bool:
    """Whether any row's ``image_key`` cell holds at least one image."""
    return any(row.get(image_key) is not None and len(row[image_key]) > 0 for row in rows)


def encode_image_row(processor: Any, row: dict[str, Any], i: int, data: GenDataConfig, file: str) -> MultimodalPrompt:
    """One row through the processor: its ``<image>`` placeholders filled with its images (checked
    one for one), the image tokens expanded, the pixel inputs. Bad rows are named."""

    def fail(problem: str, column: str = data.prompt_key) -> DataRowError:
        return DataRowError(file, i, column, problem)

    def fail_images(problem: str) -> DataRowError:
        return fail(problem, data.image_key)

    if data.prompt_key not in row:
        raise fail(f"missing column (row has: {', '.join(sorted(row)) or 'nothing'})")
    value = row[data.prompt_key]
    messages = [{"role": "user", "content": value}] if isinstance(value, str) else _messages(value, fail)
    cell = row.get(data.image_key)
    images = decode_images(
        None if cell is None else list(cell),
        fail_images,
        base_dir=Path(file).parent,
        max_pixels=processor_max_pixels(processor),
    )
    check_media_counts(messages, len(images), None, fail_images, fail_images)
    return encode_multimodal_prompt(processor, messages, images, data.chat_template_kwargs)


def tokenize_image_prompts(
    rows: list[dict[str, Any]], processor: Any, cfg: GenerationConfig, file: str
) -> list[list[int]]:
    """Every row's prompt ids with its image tokens expanded; an over-long prompt is an error
    (never truncated: a cut would separate image tokens from their pixels)."""
    if not cfg.data.apply_chat_template:
        raise DataFileError(
            f"{file}: rows with images need data.apply_chat_template=true (the template writes each image's block)"
        )
    out = []
    for i, row in enumerate(rows):
        ids = encode_image_row(processor, row, i, cfg.data, file).input_ids
        if len(ids) > cfg.rollout.prompt_length:
            raise DataRowError(
                file, i, cfg.data.prompt_key,
                f"prompt is {len(ids)} tokens with its image tokens, more than rollout.prompt_length="
                f"{cfg.rollout.prompt_length}; raise it (prompts with images are never truncated)",
            )  # fmt: skip
        out.append(ids)
    return out


def fingerprint(cfg: GenerationConfig, prompts: list[list[int]], images: str = "") -> str:
    """Hash of everything that decides the responses: prompts (and ``images``, the images'
    digest), model, sampling, n, batch size, seed."""
    digest = hashlib.sha256(json.dumps(prompts).encode())
    digest.update(images.encode())
    settings = {
        "model": cfg.model.path,
        "rollout": to_dict(cfg.rollout),
        "n": cfg.data.n_samples,
        "batch_size": cfg.data.batch_size,
        "seed": cfg.seed,
    }
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()


# --- sampling --------------------------------------------------------------------------------


def build_rollout(cfg: GenerationConfig, model: torch.nn.Module, tokenizer: Any) -> TorchRollout:
    """The built-in sampler with this run's settings (the model already in ``rollout.dtype``)."""
    r = cfg.rollout
    config = dataclasses.replace(
        RolloutConfig(),
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        do_sample=r.do_sample,
        prompt_length=r.prompt_length,
        response_length=r.response_length,
        ignore_eos=r.ignore_eos,
        seed=cfg.seed,
    )
    return TorchRollout(config, model, tokenizer, decoder=r.decoder)


def generate_batch(
    rollout: BaseRollout,
    tokenizer: Any,
    prompts: list[list[int]],
    n: int,
    seed: int,
    device: str = "cpu",
    images: list[MultimodalPrompt] | None = None,
    processor: Any = None,
) -> list[list[str]]:
    """``n`` response texts for each prompt (left-padded together on ``device``, sampled with
    ``seed``); ``images``: each prompt's processed images (see :func:`prompt_batch`)."""
    batch = prompt_batch(prompts, int(tokenizer.pad_token_id), images, processor)
    batch.meta_info.update({F.META_N: n, F.META_SEED: seed})
    out = rollout.generate_sequences(batch.to(device))
    lengths = out.require_batch()[F.RESPONSE_MASK].sum(dim=1).tolist()
    texts = tokenizer.batch_decode(
        [row[: int(k)].tolist() for row, k in zip(out.require_batch()[F.RESPONSES], lengths, strict=True)],
        skip_special_tokens=True,
    )
    return [texts[i * n : (i + 1) * n] for i in range(len(prompts))]


def generate_file(
    cfg: GenerationConfig, rollout: BaseRollout, tokenizer: Any, progress: bool = True, processor: Any = None
) -> Path:
    """Run (or resume) the whole file; returns the output path. See the module docstring.
    ``processor``: the vision-language model's processor (None for a text model), needed when
    rows have images."""
    data = cfg.data
    ensure_builtin_task_files((data.path,))
    path = os.path.expanduser(data.path)
    rows = read_rows(path)
    if not rows:
        raise DataFileError(f"{path}: no prompts")
    with_images = has_images(rows, data.image_key)
    if with_images and processor is None:
        raise DataFileError(
            f"{path}: rows have images (column {data.image_key!r}) but model.path={cfg.model.path} is not a "
            "vision-language model (its config.json has no vision_config); use a Qwen2-VL / Qwen2.5-VL folder"
        )
    if with_images:
        prompts = tokenize_image_prompts(rows, processor, cfg, path)
    else:
        prompts = tokenize_prompts(rows, tokenizer, cfg, path)
    digest = images_digest(rows, data.image_key) if with_images else ""
    journal = GenerationJournal(
        Path(data.output_path).expanduser(), fingerprint(cfg, prompts, digest), len(rows), data.batch_size
    )
    done = journal.open(resume=cfg.resume)
    initial = sum(len(journal.batch_rows(b)) for b in done)
    device = resolve_device(cfg.device)
    with tqdm(total=len(rows), initial=initial, unit="prompt", desc="generate", disable=not progress) as bar:
        for batch in range(journal.num_batches):
            if batch in done:
                continue
            index = journal.batch_rows(batch)
            batch_prompts = [prompts[i] for i in index]
            images = [encode_image_row(processor, rows[i], i, data, path) for i in index] if with_images else None
            texts = generate_batch(
                rollout, tokenizer, batch_prompts, data.n_samples, cfg.seed + batch, device, images, processor
            )
            journal.write_batch(batch, texts)
            bar.update(len(index))
    return journal.assemble(rows, F.RESPONSES)


# --- entry point -----------------------------------------------------------------------------

_SHORT_DTYPES = {"float32": "fp32", "bfloat16": "bf16"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hybridflow generate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", action="append", default=[], metavar="FILE", help="YAML config file (repeatable)")
    parser.add_argument("overrides", nargs="*", help="key=value, e.g. data.path=test.parquet data.n_samples=4")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    keep_freed_memory()
    try:
        cfg = load_generation_config(args.config, args.overrides)
        torch.manual_seed(cfg.seed)
        device = resolve_device(cfg.device)
        # The resolved dtype enters the resume fingerprint: part files sampled in bf16 on one
        # machine are not continued in fp32 on another.
        resolved = resolve_compute_dtype(_SHORT_DTYPES.get(cfg.rollout.dtype, cfg.rollout.dtype), device)
        dtype: Literal["fp32", "bf16"] = "bf16" if resolved == "bf16" else "fp32"  # it returns one of the two
        cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, dtype=dtype))
        model, tokenizer = load_model_and_tokenizer(
            cfg.model.path, dtype=dtype, trust_remote_code=cfg.model.trust_remote_code
        )
        model = model.to(device)
        folder = resolve_model_path(cfg.model.path)
        processor = load_processor(folder) if is_vision_language_folder(folder) else None
        output = generate_file(cfg, build_rollout(cfg, model, tokenizer), tokenizer, processor=processor)
    except (InputError, FileNotFoundError, ValueError) as err:  # ValueError: bad sizes found while sampling
        if debug_enabled():
            raise
        print(f"hybridflow generate: {one_paragraph(err)}", file=sys.stderr)
        return 2
    print(f"wrote {output} ({cfg.data.n_samples} responses per prompt in column {F.RESPONSES!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
