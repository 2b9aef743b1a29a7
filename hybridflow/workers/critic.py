"""The critic role: a value head on the policy architecture, trained with the clipped value loss.

``compute_values`` gives V at the positions that predict each response token (the state
before the token is generated); ``update_critic`` regresses them onto ``returns`` with
``½·agg(max((v̂ − R)², (clip(v̂, V ± ε_v) − R)²))`` over mini-batches and epochs exactly as
the actor does (same batch-size semantics, same split invariance).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from hybridflow import fields as FK
from hybridflow.algorithms.aggregation import GlobalBatchInfo
from hybridflow.algorithms.utils import masked_mean
from hybridflow.algorithms.value_loss import compute_value_loss
from hybridflow.config import CriticConfig
from hybridflow.controller import Dispatch, Worker, register
from hybridflow.engine import TrainEngine
from hybridflow.engine.forward import response_values
from hybridflow.engine.multimodal_inputs import engine_batch
from hybridflow.models import choose_attn_implementation, load_value_model
from hybridflow.models.packed_attention import packed_name
from hybridflow.protocol import DataProto
from hybridflow.workers.data_parallel import DP_METRICS, dp_global_batch_info
from hybridflow.workers.engine_factory import build_engine, needs_process_group
from hybridflow.workers.ppo_loop import (
    NUM_TOKENS_KEY,
    iter_mini_batches,
    load_shuffle_state,
    mean_over_steps,
    micro_batch_spec,
    reduce_micro_metrics,
    require_fields,
    response_mask_of,
    rows_per_mini_batch,
    save_shuffle_state,
)

_MODEL_INPUTS = (FK.INPUT_IDS, FK.ATTENTION_MASK, FK.RESPONSES)
ADDITIVE_CRITIC_METRICS = frozenset({"critic/vf_loss"})


@dataclass(frozen=True)
class ValueLoss:
    """``loss_fn(outputs, micro)`` for the critic (see :func:`compute_value_loss`)."""

    cliprange_value: float
    loss_agg_mode: str
    batch_info: GlobalBatchInfo

    def __call__(
        self, outputs: dict[str, torch.Tensor], micro: TensorDict
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        vpreds = outputs["values"]
        mask = response_mask_of(micro).to(vpreds.dtype)
        loss, clipfrac = compute_value_loss(
            vpreds,
            micro[FK.RETURNS],
            micro[FK.VALUES],
            mask,
            self.cliprange_value,
            self.loss_agg_mode,
            global_batch_info=self.batch_info,
        )
        metrics = {
            "critic/vf_loss": loss.detach(),
            "critic/vf_clipfrac": clipfrac,
            "critic/vpred_mean": masked_mean(vpreds.detach(), mask),
            NUM_TOKENS_KEY: mask.sum().detach(),
        }
        return loss, metrics


def _critic_attention(cfg: CriticConfig, device: torch.device, max_tokens: int | None) -> str:
    """The critic's HF attention kernel: the chosen one, packed when ``use_remove_padding``."""
    base = choose_attn_implementation(cfg.model.attn_implementation or "auto", device, max_tokens)
    return packed_name(base) if cfg.model.use_remove_padding else base


class CriticWorker(Worker):
    """Trains the value function. ``config`` is the resolved ``critic`` section (its ``None``
    defaults already filled from the actor's); ``rollout_n`` = ``actor_rollout_ref.rollout.n``."""

    def __init__(
        self,
        config: CriticConfig,
        rollout_n: int,
        total_training_steps: int | None = None,
        device: str = "cpu",
        seed: int = 0,
        trust_remote_code: bool = False,
        max_tokens: int | None = None,
    ) -> None:
        super().__init__()
        _check_resolved(config)
        self.max_tokens = max_tokens  # prompt + response tokens of a row (picks the attention kernel)
        self.config = config
        self.rollout_n = rollout_n
        self.total_training_steps = total_training_steps
        self.device = torch.device(device)
        self.seed = seed
        self.trust_remote_code = trust_remote_code
        shuffle_seed = seed if config.data_loader_seed is None else config.data_loader_seed
        self._shuffle_generator = torch.Generator().manual_seed(shuffle_seed + self.rank)
        self._engine: TrainEngine | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the policy backbone + a seeded value head (fp32 parameters) and its engine.

        With ``model.lora_rank > 0`` the backbone carries LoRA adapters and only they and the
        value head are trainable (the engine optimizes parameters that require grad)."""
        cfg = self.config
        # set: _check_resolved (in __init__) refuses a config with these keys None
        assert cfg.model.path is not None and cfg.model.dtype is not None and cfg.strategy is not None
        assert cfg.use_dynamic_bsz is not None and cfg.ppo_micro_batch_size_per_gpu is not None
        module, _ = load_value_model(
            cfg.model.path,
            dtype="fp32",
            gradient_checkpointing=cfg.model.enable_gradient_checkpointing,
            lora_rank=cfg.model.lora_rank,
            lora_alpha=cfg.model.lora_alpha,
            target_modules=_target_modules(cfg.model.target_modules),
            trust_remote_code=self.trust_remote_code,
            seed=self.seed,
            attn_implementation=_critic_attention(cfg, self.device, self.max_tokens),
        )
        if needs_process_group(cfg.strategy, self.world_size):
            self.init_process_group()
        self._engine = build_engine(
            module,
            cfg.optim,
            strategy=cfg.strategy,
            grad_clip=cfg.grad_clip,
            micro_batch=micro_batch_spec(
                cfg.use_dynamic_bsz,
                cfg.ppo_micro_batch_size_per_gpu,
                cfg.ppo_max_token_len_per_gpu,
                real_tokens=bool(cfg.model.use_remove_padding),
            ),
            total_training_steps=self.total_training_steps,
            device=self.device,
            dtype=cfg.model.dtype,
            world_size=self.world_size,
            owner="critic",
        )

    @property
    def engine(self) -> TrainEngine:
        if self._engine is None:
            raise RuntimeError("CriticWorker.init_model() has not been called")
        return self._engine

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` (B, T): V at the position that predicts each response token."""
        batch = _tensor_batch(data, "compute_values")
        require_fields(batch, _MODEL_INPUTS, "compute_values")
        cfg = self.config
        assert cfg.use_dynamic_bsz is not None and cfg.forward_micro_batch_size_per_gpu is not None  # _check_resolved
        spec = micro_batch_spec(
            cfg.use_dynamic_bsz,
            cfg.forward_micro_batch_size_per_gpu,
            cfg.forward_max_token_len_per_gpu,
            real_tokens=bool(cfg.model.use_remove_padding),
        )
        out = self.engine.infer(batch, response_values, spec)
        return DataProto.from_dict(tensors={FK.VALUES: out["values"]})

    @register(dispatch_mode=DP_METRICS)
    def update_critic(self, data: DataProto) -> dict[str, float]:
        """Clipped value-loss update; returns this rank's critic/* metrics (mean over steps).
        Through a worker group: ``{name: [one value per rank]}``."""
        cfg, engine = self.config, self.engine
        assert cfg.ppo_mini_batch_size is not None and cfg.ppo_epochs is not None  # _check_resolved
        assert cfg.shuffle is not None and cfg.loss_agg_mode is not None
        batch = _tensor_batch(data, "update_critic")
        require_fields(batch, (*_MODEL_INPUTS, FK.VALUES, FK.RETURNS), "update_critic")
        rows = rows_per_mini_batch(cfg.ppo_mini_batch_size, self.rollout_n, self.world_size, "critic")
        per_step: list[dict[str, float]] = []
        for mini in iter_mini_batches(batch, rows, cfg.ppo_epochs, cfg.shuffle, self._shuffle_generator):
            mask = response_mask_of(mini)
            info = dp_global_batch_info(mask, self.world_size, loss_scale_factor=float(mask.shape[1]))
            loss_fn = ValueLoss(cfg.cliprange_value, cfg.loss_agg_mode, info)
            step_metrics = reduce_micro_metrics(
                engine.forward_backward(mini, response_values, loss_fn), ADDITIVE_CRITIC_METRICS
            )
            step = engine.optimizer_step()
            step_metrics.update({"critic/grad_norm": step.grad_norm, "critic/lr": step.lr})
            per_step.append(step_metrics)
        engine.lr_scheduler_step()
        return mean_over_steps(per_step)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """Engine state to ``path`` (a sharded engine writes every rank's files there)."""
        self.engine.save_checkpoint(path)
        save_shuffle_state(path, self.rank, self._shuffle_generator)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str, load_optimizer: bool = True) -> None:
        self.engine.load_checkpoint(path, load_optimizer=load_optimizer)
        load_shuffle_state(path, self.rank, self._shuffle_generator)


def _target_modules(value: str | tuple[str, ...]) -> str | list[str]:
    """peft takes a module-name list, the frozen config a tuple."""
    return value if isinstance(value, str) else list(value)


def _tensor_batch(data: DataProto, what: str) -> TensorDict:
    if data.batch is None or len(data) == 0:
        raise ValueError(f"{what} needs a DataProto with a non-empty tensor batch")
    return engine_batch(data)  # the rows' images ride along when there are any


def _check_resolved(config: CriticConfig) -> None:
    unresolved = [
        name
        for name, value in (
            ("strategy", config.strategy),
            ("ppo_mini_batch_size", config.ppo_mini_batch_size),
            ("ppo_micro_batch_size_per_gpu", config.ppo_micro_batch_size_per_gpu),
            ("forward_micro_batch_size_per_gpu", config.forward_micro_batch_size_per_gpu),
            ("use_dynamic_bsz", config.use_dynamic_bsz),
            ("ppo_epochs", config.ppo_epochs),
            ("shuffle", config.shuffle),
            ("loss_agg_mode", config.loss_agg_mode),
            ("model.path", config.model.path),
            ("model.dtype", config.model.dtype),
            ("model.use_remove_padding", config.model.use_remove_padding),
        )
        if value is None
    ]
    if unresolved:
        raise ValueError(
            f"critic config keys {unresolved} are unresolved (None); build it with hybridflow.config.load_config, "
            "which fills them from the actor's settings"
        )
