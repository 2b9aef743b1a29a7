"""The reference role: log-probs of the responses under the frozen initial policy (for KL).

Without LoRA the reference is its own frozen copy of the model (in ``model.dtype``: bf16
halves its memory; it is never trained). With LoRA the reference *is* the actor's module
with its adapters disabled — the base weights never change — so when the actor is colocated
(shared under ``share_name``) no second model is loaded; otherwise the base model is loaded
without adapters.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from functools import partial

import torch

from hybridflow import fields as FK
from hybridflow.config import ActorRolloutRefConfig
from hybridflow.controller import Dispatch, Worker, register
from hybridflow.engine.base import TrainEngine
from hybridflow.engine.forward import response_log_probs
from hybridflow.engine.micro_batch_runner import infer_micro_batches
from hybridflow.engine.multimodal_inputs import engine_batch
from hybridflow.models import load_model_and_tokenizer, policy_attn_implementation
from hybridflow.protocol import DataProto
from hybridflow.utils.precision import resolve_compute_dtype
from hybridflow.workers.actor import log_prob_temperature
from hybridflow.workers.engine_factory import autocast_dtype_for
from hybridflow.workers.ppo_loop import micro_batch_spec, require_fields
from hybridflow.workers.shared_policy import DEFAULT_SHARE_NAME, lookup_policy


class ReferenceWorker(Worker):
    """Computes ``ref_log_prob``. ``share_name``: where a colocated LoRA actor published its
    policy (ignored without LoRA; None: always load a model)."""

    def __init__(
        self, config: ActorRolloutRefConfig, device: str = "cpu", share_name: str | None = DEFAULT_SHARE_NAME
    ) -> None:
        super().__init__()
        self.config = config
        self.device = torch.device(device)
        self.share_name = share_name
        self._module: torch.nn.Module | None = None
        self._shares_actor = False
        self._autocast: torch.dtype | None = None
        # A sharded (FSDP) actor's module must run through its engine, which keeps every
        # rank's forward passes in step.
        self._sharded_engine: TrainEngine | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Borrow the colocated LoRA actor's module, or load a frozen copy of the base model."""
        model_cfg = self.config.model
        if model_cfg.lora_rank > 0 and self.share_name is not None:
            shared = lookup_policy(self.share_name, self.rank)
            if not shared.is_lora:
                raise ValueError("model.lora_rank > 0 but the shared actor policy has no LoRA adapters")
            self._module, self._shares_actor = shared.module, True
            self._sharded_engine = shared.engine if shared.engine.shards_parameters else None
            self._autocast = autocast_dtype_for(model_cfg.dtype, self.device)
            return
        module, _ = load_model_and_tokenizer(
            model_cfg.path,
            dtype=resolve_compute_dtype(model_cfg.dtype, self.device),
            trust_remote_code=model_cfg.trust_remote_code,
            attn_implementation=policy_attn_implementation(self.config, self.device),
        )
        module.requires_grad_(False)
        self._module = module.to(self.device)

    @property
    def shares_actor_module(self) -> bool:
        """True when the reference is the actor's module with adapters disabled."""
        return self._shares_actor

    def _base_policy(self) -> AbstractContextManager:
        if not self._shares_actor:
            return nullcontext()
        from peft import PeftModel  # imported already: the shared actor has LoRA adapters

        assert isinstance(self._module, PeftModel)  # the LoRA actor's module (see SharedPolicy)
        # peft's disable_adapter() switches every LoRA layer off for the block and back after.
        return self._module.disable_adapter()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` (B, T) of the responses at the sampling temperature."""
        if self._module is None:
            raise RuntimeError("ReferenceWorker.init_model() has not been called")
        if data.batch is None or len(data) == 0:
            raise ValueError("compute_ref_log_prob needs a DataProto with a non-empty tensor batch")
        require_fields(data.batch, (FK.INPUT_IDS, FK.ATTENTION_MASK, FK.RESPONSES), "compute_ref_log_prob")
        ref, actor = self.config.ref, self.config.actor
        use_dynamic = (
            ref.log_prob_use_dynamic_bsz if ref.log_prob_use_dynamic_bsz is not None else actor.use_dynamic_bsz
        )
        max_tokens = ref.log_prob_max_token_len_per_gpu or actor.ppo_max_token_len_per_gpu
        spec = micro_batch_spec(
            use_dynamic,
            ref.log_prob_micro_batch_size_per_gpu,
            max_tokens,
            real_tokens=self.config.model.use_remove_padding,
        )
        forward = partial(response_log_probs, temperature=log_prob_temperature(self.config.rollout.temperature))
        with self._base_policy():
            if self._sharded_engine is not None:
                out = self._sharded_engine.infer(engine_batch(data), forward, spec)
            else:
                out = infer_micro_batches(self._module, engine_batch(data), forward, spec, self.device, self._autocast)
        return DataProto.from_dict(tensors={FK.REF_LOG_PROB: out["log_probs"]})
