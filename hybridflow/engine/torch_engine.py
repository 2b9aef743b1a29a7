"""The single-process torch engine (CPU or one GPU): AdamW, warm-up schedule, grad clipping."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator

import torch
from tensordict import TensorDict

from hybridflow.engine.base import ENGINES, EngineSpec, ForwardFn, LossFn, StepResult, TrainEngine
from hybridflow.engine.checkpoint import load_engine_state, save_engine_state
from hybridflow.engine.micro_batch import MicroBatchSpec
from hybridflow.engine.micro_batch_runner import infer_micro_batches, plan_chunks, train_chunks
from hybridflow.engine.schedules import build_lr_lambda, resolve_warmup_steps
from hybridflow.engine.weights import iter_sync_weights


@ENGINES.register("torch", meta=EngineSpec(multi_process=False))
class TorchEngine(TrainEngine):
    """Trains ``module`` in this process.

    Args:
        lr, betas, eps, weight_decay: AdamW over every trainable parameter.
        warmup_steps / warmup_ratio / total_steps / scheduler_type / min_lr_ratio / num_cycles:
            the lr schedule (see :mod:`hybridflow.engine.schedules`); ``warmup_steps > 0``
            wins over ``warmup_ratio``.
        grad_clip: max global L2 norm of the gradients (``None`` or ≤ 0: no clipping; the
            norm is still measured and a non-finite norm still skips the step).
        micro_batch_size / max_token_len: default micro-batching for ``forward_backward``
            (at most one; neither = the whole mini-batch at once).
        device: where the module and each micro-batch live.
        autocast_dtype: e.g. ``torch.bfloat16`` to compute in bf16 with fp32 parameters.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        warmup_steps: int = 0,
        warmup_ratio: float = 0.0,
        total_steps: int | None = None,
        scheduler_type: str = "constant",
        min_lr_ratio: float = 0.0,
        num_cycles: float = 0.5,
        grad_clip: float | None = 1.0,
        micro_batch_size: int | None = None,
        max_token_len: int | None = None,
        real_token_budget: bool = False,
        device: str | torch.device = "cpu",
        autocast_dtype: torch.dtype | None = None,
    ) -> None:
        if lr < 0:
            raise ValueError(f"learning rate must be >= 0, got {lr}")
        self._device = torch.device(device)
        self._module = module.to(self._device)
        self._params = [p for p in module.parameters() if p.requires_grad]
        if not self._params:
            raise ValueError("the module has no trainable parameters")
        # The fused kernel is ~6× faster than the foreach one on CPU (135M params: 0.8 s vs 5 s).
        fused = self._device.type in ("cpu", "cuda")
        self._optimizer = torch.optim.AdamW(
            self._params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused
        )
        warmup = resolve_warmup_steps(warmup_steps, warmup_ratio, total_steps)
        lr_lambda = build_lr_lambda(scheduler_type, warmup, total_steps, min_lr_ratio, num_cycles)
        self._scheduler = torch.optim.lr_scheduler.LambdaLR(self._optimizer, lr_lambda)
        self._grad_clip = grad_clip if grad_clip is not None and grad_clip > 0 else math.inf
        self._train_spec = _spec_or_none(micro_batch_size, max_token_len, real_token_budget)
        self._autocast_dtype = autocast_dtype
        self._weights_version = 0

    @property
    def module(self) -> torch.nn.Module:
        return self._module

    @property
    def weights_version(self) -> int:
        return self._weights_version

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    def infer(
        self, batch: TensorDict, forward_fn: ForwardFn, micro_batch: MicroBatchSpec | None = None
    ) -> dict[str, torch.Tensor]:
        spec = micro_batch if micro_batch is not None else self._train_spec
        return infer_micro_batches(self._module, batch, forward_fn, spec, self._device, self._autocast_dtype)

    def forward_backward(
        self, batch: TensorDict, forward_fn: ForwardFn, loss_fn: LossFn, micro_batch: MicroBatchSpec | None = None
    ) -> list[dict[str, torch.Tensor]]:
        spec = micro_batch if micro_batch is not None else self._train_spec
        chunks = plan_chunks(self._module, batch, forward_fn, spec, training=True)
        return train_chunks(self._module, batch, forward_fn, loss_fn, chunks, self._device, self._autocast_dtype)

    def optimizer_step(self) -> StepResult:
        lr = self.current_lr()
        grad_norm = float(self._clip_grad_norm())
        skipped = not math.isfinite(grad_norm)
        if not skipped:
            self._optimizer.step()
            self._weights_version += 1
        self.zero_grad()
        return StepResult(grad_norm=grad_norm, lr=lr, skipped=skipped)

    def _clip_grad_norm(self) -> torch.Tensor:
        """Clip in place to ``grad_clip``; the global L2 norm before clipping."""
        return torch.nn.utils.clip_grad_norm_(self._params, max_norm=self._grad_clip)

    def lr_scheduler_step(self) -> float:
        self._scheduler.step()
        return self.current_lr()

    def current_lr(self) -> float:
        return float(self._optimizer.param_groups[0]["lr"])

    def zero_grad(self) -> None:
        self._optimizer.zero_grad(set_to_none=True)

    def iter_sync_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter_sync_weights(self._module)

    def save_checkpoint(self, path: str | os.PathLike) -> None:
        save_engine_state(path, self._module, self._optimizer, self._scheduler)

    def load_checkpoint(self, path: str | os.PathLike, load_optimizer: bool = True) -> None:
        load_engine_state(path, self._module, self._optimizer, self._scheduler, load_optimizer=load_optimizer)
        self._weights_version += 1


def _spec_or_none(micro_batch_size: int | None, max_token_len: int | None, real_tokens: bool) -> MicroBatchSpec | None:
    if micro_batch_size is None and max_token_len is None:
        return None
    return MicroBatchSpec(size=micro_batch_size, max_token_len=max_token_len, real_tokens=real_tokens)
