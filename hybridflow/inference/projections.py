"""Linear projections of the lean decoder, read from a Hugging Face module's own layers.

A :class:`Projection` computes ``y = x @ cat(W_1, …, W_k)^T + cat(b_1, …, b_k)`` for one or
more ``nn.Linear`` layers that share an input (q/k/v, or gate/up), as one output tensor.

Two ways to hold the weights (``weight_format``):

* ``"shared"`` — no copy at all: every step reads ``linear.weight`` itself (one ``F.linear``
  per source layer), so an in-place update by a colocated actor is seen at once.
* ``"packed"`` — one fused copy, on CPU in oneDNN's blocked layout (``torch.ops.mkldnn``),
  i.e. one matmul per group with a weight layout prepared for the CPU kernel (on a 2-core
  AVX-512 machine 2–4× faster than ``F.linear`` for decode-sized inputs); on other devices a
  plain contiguous copy used with ``F.linear``. The copy is rebuilt when any
  source parameter changes: :meth:`Projection.refresh` compares, per parameter, the in-place
  version counter (bumped by ``copy_`` / ``load_state_dict`` / foreach optimizers), the
  storage pointer, and the number of optimizer steps that included it (fused optimizers
  write without bumping the counter, so an optimizer step hook counts them; it is registered
  while any packed Projection exists and keeps no parameter alive) with those seen at packing
  time; :meth:`Projection.invalidate` forces a rebuild (e.g. after a write through ``.data``).

The packed copy may be in another dtype than the module (``dtype``): a colocated actor keeps
fp32 master weights while the rollout samples in bf16 from a bf16 copy, refreshed the same way.
A source may also be a ``peft`` LoRA linear: the packed copy then holds the merged weight
``W + Σ_active (α/r)·B·A`` (the module itself is never modified), and the LoRA tensors and
adapter switches are part of the staleness check. ``shared`` can do neither (it has no copy).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeGuard

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.weak import WeakIdKeyDictionary

WEIGHT_FORMATS: tuple[str, ...] = ("shared", "packed")

# parameter → optimizer steps that updated it. Keys are weak (by identity): an entry goes with
# its parameter, so a closed trainer's parameters are neither kept alive nor counted forever.
_OPTIMIZER_STEPS: WeakIdKeyDictionary = WeakIdKeyDictionary()
# The process-wide step hook exists only while a packed Projection does: the first one
# registers it, the last one's finalizer removes it. Re-entrant: a finalizer may run from a
# garbage collection that starts while the lock is held.
_HOOK_LOCK = threading.RLock()
_HOOK_HANDLE: Any = None
_HOOK_USERS = 0


def _count_optimizer_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    for group in optimizer.param_groups:
        for param in group["params"]:
            _OPTIMIZER_STEPS[param] = _OPTIMIZER_STEPS.get(param, 0) + 1


def _watch_optimizer_steps(owner: object) -> None:
    """Count optimizer steps for as long as ``owner`` lives."""
    global _HOOK_HANDLE, _HOOK_USERS
    with _HOOK_LOCK:
        if _HOOK_HANDLE is None:
            _HOOK_HANDLE = register_optimizer_step_post_hook(_count_optimizer_step)
        _HOOK_USERS += 1
    weakref.finalize(owner, _unwatch_optimizer_steps)


def _unwatch_optimizer_steps() -> None:
    global _HOOK_HANDLE, _HOOK_USERS
    with _HOOK_LOCK:
        _HOOK_USERS -= 1
        if _HOOK_USERS == 0 and _HOOK_HANDLE is not None:
            _HOOK_HANDLE.remove()
            _HOOK_HANDLE = None
            # Counts only matter against a stamp taken by a live Projection; there is none.
            _OPTIMIZER_STEPS.clear()


def optimizer_step_watch() -> tuple[int, int]:
    """(packed Projections watching optimizer steps, parameters with a step count): for leak checks."""
    with _HOOK_LOCK:
        return _HOOK_USERS, len(_OPTIMIZER_STEPS)


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    """True when oneDNN weight packing works for ``dtype`` on ``device`` (CPU only)."""
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    return hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


class LoraLinear(Protocol):
    """The parts of a ``peft`` LoRA layer over an ``nn.Linear`` that the lean path reads."""

    base_layer: nn.Linear
    lora_A: Mapping[str, nn.Linear]  # an nn.ModuleDict: adapter name → A (r × in)
    lora_B: Mapping[str, nn.Linear]  # adapter name → B (out × r)
    disable_adapters: bool
    merged: bool
    active_adapters: list[str]

    def get_delta_weight(self, adapter: str) -> torch.Tensor: ...


def is_lora_linear(module: nn.Module) -> TypeGuard[LoraLinear]:
    """A ``peft`` LoRA layer wrapping a plain ``nn.Linear`` (duck-typed: peft stays optional)."""
    return (
        hasattr(module, "base_layer")
        and hasattr(module, "lora_A")
        and hasattr(module, "get_delta_weight")
        and type(module.base_layer) is nn.Linear
    )


def linear_unsupported_reason(module: nn.Module) -> str | None:
    """Why ``module`` cannot be a Projection source, or ``None``."""
    if type(module) is nn.Linear:
        return None
    if not is_lora_linear(module):
        return f"{type(module).__name__} is neither nn.Linear nor a LoRA-wrapped nn.Linear"
    if getattr(module, "lora_variant", {}) or getattr(module, "fan_in_fan_out", False):
        return "LoRA variants (DoRA, ...) and fan_in_fan_out layers are not merged by the lean path"
    return None


def _linear_parts(module: nn.Module) -> tuple[nn.Linear, list[str]]:
    """(the plain linear holding W and b, active LoRA adapters whose deltas add to W)."""
    if type(module) is nn.Linear:
        return module, []
    if not is_lora_linear(module):  # Projection admits nothing else (linear_unsupported_reason)
        raise TypeError(f"{type(module).__name__} is neither nn.Linear nor a LoRA-wrapped nn.Linear")
    if module.disable_adapters or module.merged:
        return module.base_layer, []
    return module.base_layer, [name for name in module.active_adapters if name in module.lora_A]


def _effective_weight(module: nn.Module) -> torch.Tensor:
    base, adapters = _linear_parts(module)
    weight = base.weight.detach()
    if is_lora_linear(module):  # a plain nn.Linear has no adapters
        for name in adapters:
            weight = weight + module.get_delta_weight(name).detach().to(weight.dtype)
    return weight


def _tracked(module: nn.Module) -> list[torch.Tensor]:
    base, _ = _linear_parts(module)
    tensors = [t for t in (base.weight, base.bias) if t is not None]
    if is_lora_linear(module):
        for name in module.lora_A:
            tensors += [module.lora_A[name].weight, module.lora_B[name].weight]
    return tensors


def _stamp(modules: Sequence[nn.Module]) -> tuple:
    # _version is bumped by every in-place op on the tensor (optimizer steps, copy_ under
    # no_grad); data_ptr catches a parameter whose storage was swapped; adapter switches
    # change which tensors count.
    stamp: list = []
    for module in modules:
        if is_lora_linear(module):
            stamp.append((module.disable_adapters, module.merged, tuple(module.active_adapters)))
        stamp.extend((t._version, t.data_ptr(), _OPTIMIZER_STEPS.get(t, 0)) for t in _tracked(module))
    return tuple(stamp)


class Projection:
    """One fused linear over ``linears`` (all with the same ``in_features``)."""

    def __init__(self, linears: Sequence[nn.Linear], weight_format: str, dtype: torch.dtype | None = None) -> None:
        if weight_format not in WEIGHT_FORMATS:
            raise ValueError(f"unknown weight_format {weight_format!r}; valid: {', '.join(WEIGHT_FORMATS)}")
        if not linears:
            raise ValueError("a Projection needs at least one nn.Linear")
        for lin in linears:
            reason = linear_unsupported_reason(lin)
            if reason is not None:
                raise ValueError(f"cannot project through {type(lin).__name__}: {reason}")
        has_lora = any(is_lora_linear(lin) for lin in linears)
        if weight_format == "shared" and has_lora:
            raise ValueError("weight_format 'shared' cannot merge LoRA adapters; use 'packed'")
        source_dtype = _linear_parts(linears[0])[0].weight.dtype
        self.dtype = source_dtype if dtype is None else dtype
        if weight_format == "shared" and self.dtype != source_dtype:
            raise ValueError(
                f"weight_format 'shared' computes in the module's dtype {source_dtype}; "
                f"use 'packed' to compute in {self.dtype}"
            )
        in_features = {lin.in_features for lin in linears}
        if len(in_features) != 1:
            raise ValueError(f"fused linears must share in_features, got {sorted(in_features)}")
        self.linears = tuple(linears)
        self.weight_format = weight_format
        self.out_features = sum(lin.out_features for lin in linears)
        self._packed_weight: torch.Tensor | None = None
        self._packed_bias: torch.Tensor | None = None
        self._onednn = False
        self._seen: tuple | None = None
        if weight_format == "packed":
            _watch_optimizer_steps(self)

    def refresh(self) -> bool:
        """Re-pack if a source parameter changed since packing; returns whether it re-packed."""
        if self.weight_format != "packed":
            return False
        stamp = _stamp(self.linears)
        if self._packed_weight is not None and stamp == self._seen:
            return False
        with torch.no_grad():
            weight = torch.cat([_effective_weight(lin) for lin in self.linears], dim=0).to(self.dtype)
            self._onednn = packing_available(weight.device, self.dtype)
            self._packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, None) if self._onednn else weight
            bases = [_linear_parts(lin)[0] for lin in self.linears]
            if any(base.bias is not None for base in bases):
                self._packed_bias = torch.cat(
                    [
                        base.bias.detach() if base.bias is not None else base.weight.new_zeros(base.out_features)
                        for base in bases
                    ]
                ).to(self.dtype)
            else:
                self._packed_bias = None
        self._seen = stamp
        return True

    def invalidate(self) -> None:
        """Drop the packed copy; the next :meth:`refresh` rebuilds it."""
        self._packed_weight = None
        self._packed_bias = None
        self._seen = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (..., in_features) → (..., out_features)."""
        if self._onednn_ready():
            return torch.ops.mkldnn._linear_pointwise(x, self._packed_weight, self._packed_bias, "none", [], "")
        return self._linear(x)

    # Fused epilogues: one oneDNN call (matmul + element-wise op) on packed weights, which
    # saves a pass over the output and a parallel region; the same ops in HF's order otherwise.
    def silu(self, x: torch.Tensor) -> torch.Tensor:
        """``silu(x·Wᵀ + b)``."""
        if self._onednn_ready():
            return torch.ops.mkldnn._linear_pointwise(x, self._packed_weight, self._packed_bias, "swish", [], "")
        return F.silu(self._linear(x))

    def gelu_tanh(self, x: torch.Tensor) -> torch.Tensor:
        """``gelu(x·Wᵀ + b)`` with the tanh approximation (Gemma's ``gelu_pytorch_tanh``)."""
        if self._onednn_ready():
            return torch.ops.mkldnn._linear_pointwise(x, self._packed_weight, self._packed_bias, "gelu", [], "tanh")
        return F.gelu(self._linear(x), approximate="tanh")

    def times(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """``(x·Wᵀ + b) ⊙ other``."""
        if self._onednn_ready():
            return torch.ops.mkldnn._linear_pointwise.binary(x, other, self._packed_weight, self._packed_bias, "mul")
        return self._linear(x) * other

    def plus(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual + (x·Wᵀ + b)``."""
        if self._onednn_ready():
            return torch.ops.mkldnn._linear_pointwise.binary(x, residual, self._packed_weight, self._packed_bias, "add")
        return residual + self._linear(x)

    def _onednn_ready(self) -> bool:
        if self.weight_format != "packed":
            return False
        self._packed()
        return self._onednn

    def _packed(self) -> torch.Tensor:
        if self._packed_weight is None:
            raise RuntimeError("packed Projection used before refresh(); call refresh() first")
        return self._packed_weight

    def _linear(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight_format == "packed":
            return F.linear(x, self._packed(), self._packed_bias)
        if len(self.linears) == 1:
            lin = self.linears[0]
            return F.linear(x, lin.weight, lin.bias)
        return torch.cat([F.linear(x, lin.weight, lin.bias) for lin in self.linears], dim=-1)

    def packed_bytes(self) -> int:
        """Bytes held by the packed copy (0 when sharing the module's weights)."""
        if self._packed_weight is None:
            return 0
        size = self._packed_weight.numel() * self._packed_weight.element_size()
        if self._packed_bias is not None:
            size += self._packed_bias.numel() * self._packed_bias.element_size()
        return size
