"""The FSDP2 engine (registry name ``"fsdp"``): data-parallel training over torch.distributed.

Every rank of the default process group (gloo on CPU, NCCL on GPU — joined beforehand with
``Worker.init_process_group()``) builds the same module; :func:`shard_module` applies
``torch.distributed.fsdp.fully_shard`` to each transformer block (the classes a Hugging Face
model lists in ``_no_split_modules``) and then to the root, so parameters, gradients and
AdamW state are DTensors holding 1/world_size of the rows (``Shard(0)``) on each rank. Each
forward all-gathers a block's weights just in time; each backward reduce-scatters its
gradients, *averaged* over ranks — the loss contract of
:mod:`hybridflow.algorithms.aggregation` (global counts, × dp_size) makes the average the
gradient of the whole mini-batch, so DP=N equals DP=1.

What the engine adds to :class:`~hybridflow.engine.torch_engine.TorchEngine` (whose optimizer,
lr schedule and micro-batch loops it reuses):

* every rank runs the same number of micro-batches (forward passes are collectives): the
  local plan is split until it has the largest count of any rank (``split_plan_to``). For
  the same reason prompts repeated across rows are not run once per batch here
  (:mod:`hybridflow.engine.shared_prompt`): whether a rank has repeats, and so an extra
  forward pass, is its own data's business;
* mixed precision: with ``autocast_dtype`` (bf16) the blocks all-gather and compute in that
  dtype (``MixedPrecisionPolicy(param_dtype)``), gradients are reduced in fp32, the fp32
  master weights stay sharded, and the root's own layers run under autocast;
* gradient clipping over the global norm of the sharded gradients;
* ``iter_sync_weights`` gathers full tensors (collective) for the rollout's copy;
* sharded checkpoints (:mod:`hybridflow.engine.fsdp_checkpoint`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from hybridflow.engine.base import ENGINES, EngineSpec, ForwardFn, LossFn
from hybridflow.engine.fsdp_checkpoint import load_sharded_state, save_sharded_state
from hybridflow.engine.micro_batch import MicroBatchSpec, split_plan_to
from hybridflow.engine.micro_batch_runner import (
    infer_plan,
    make_plan,
    train_micro_batches,
)
from hybridflow.engine.torch_engine import TorchEngine
from hybridflow.engine.weights import iter_sync_weights
from hybridflow.utils.distributed import all_reduce_max_int


def block_class_names(module: torch.nn.Module) -> set[str]:
    """Class names of the transformer blocks: the union of ``_no_split_modules`` declared by
    any Hugging Face model inside ``module`` (a PeftModel or a value-head wrapper included)."""
    names: set[str] = set()
    for sub in module.modules():
        declared = getattr(sub, "_no_split_modules", None)
        if declared:
            names.update(declared)
    return names


def shard_module(
    module: torch.nn.Module,
    mesh: DeviceMesh,
    param_dtype: torch.dtype | None = None,
    reshard_after_forward: bool = True,
) -> int:
    """``fully_shard`` each transformer block, then the root (which keeps the rest: embeddings,
    final norm, heads — tied weights stay one parameter). Returns the number of blocks.

    ``param_dtype``: the dtype blocks all-gather and compute in (None: the parameters' own);
    gradients are always reduced in fp32. The root keeps its parameters' dtype (the caller
    runs it under autocast), so heads that must stay fp32 (a value head) do.
    """
    names = block_class_names(module)
    blocks = [sub for sub in module.modules() if sub is not module and type(sub).__name__ in names]
    block_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=block_policy, reshard_after_forward=reshard_after_forward)
    fully_shard(module, mesh=mesh, mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.float32))
    return len(blocks)


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a sharded DTensor (all-gather: collective); plain tensors pass."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _resolve_device(device: str | torch.device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


@ENGINES.register("fsdp", meta=EngineSpec(multi_process=True))
class FSDPEngine(TorchEngine):
    """Trains ``module`` sharded over every rank of the default process group.

    Args:
        module: the full module, identical on every rank (it is sharded in place).
        device: ``cpu`` (gloo) or ``cuda``/``cuda:i`` (NCCL; ``cuda`` = the current device).
        autocast_dtype: compute dtype (e.g. ``torch.bfloat16``), see the module docstring.
        reshard_after_forward: free each block's gathered weights after its forward (less
            memory, one more all-gather in backward).
        **torch_engine_args: everything else :class:`TorchEngine` takes (lr, betas, eps,
            weight_decay, warm-up and schedule, grad_clip, micro_batch_size, max_token_len).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        device: str | torch.device = "cpu",
        autocast_dtype: torch.dtype | None = None,
        reshard_after_forward: bool = True,
        **torch_engine_args: Any,
    ) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "the fsdp engine needs torch.distributed: call Worker.init_process_group() on every rank "
                "before building it (or use the torch engine for a single process)"
            )
        resolved = _resolve_device(device)
        self._mesh = init_device_mesh(resolved.type, (dist.get_world_size(),))
        self._num_blocks = shard_module(module.to(resolved), self._mesh, autocast_dtype, reshard_after_forward)
        super().__init__(module, device=resolved, autocast_dtype=autocast_dtype, **torch_engine_args)

    @property
    def shards_parameters(self) -> bool:
        return True

    @property
    def world_size(self) -> int:
        return int(self._mesh.size())

    @property
    def num_blocks(self) -> int:
        """How many transformer blocks were sharded on their own (0: only the root)."""
        return self._num_blocks

    def _same_count_plan(self, batch: TensorDict, spec: MicroBatchSpec | None) -> list[list[int]]:
        """This rank's plan, split so that every rank runs the same number of micro-batches."""
        plan = make_plan(batch, spec)
        count = all_reduce_max_int(len(plan))
        if count > sum(len(micro) for micro in plan):
            raise ValueError(
                f"rank {dist.get_rank()} holds {int(batch.batch_size[0])} rows but another rank runs {count} "
                "micro-batches; data-parallel ranks must receive the same number of rows"
            )
        return split_plan_to(plan, count)

    def infer(
        self, batch: TensorDict, forward_fn: ForwardFn, micro_batch: MicroBatchSpec | None = None
    ) -> dict[str, torch.Tensor]:
        plan = self._same_count_plan(batch, micro_batch if micro_batch is not None else self._train_spec)
        return infer_plan(self._module, batch, forward_fn, plan, self._device, self._autocast_dtype)

    def forward_backward(
        self, batch: TensorDict, forward_fn: ForwardFn, loss_fn: LossFn, micro_batch: MicroBatchSpec | None = None
    ) -> list[dict[str, torch.Tensor]]:
        plan = self._same_count_plan(batch, micro_batch if micro_batch is not None else self._train_spec)
        return train_micro_batches(self._module, batch, forward_fn, loss_fn, plan, self._device, self._autocast_dtype)

    def _clip_grad_norm(self) -> torch.Tensor:
        # The norm of sharded gradients is a DTensor: its full value is the global norm.
        return full_tensor(torch.nn.utils.clip_grad_norm_(self._params, max_norm=self._grad_clip))

    def iter_sync_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full tensors, gathered one at a time (collective: iterate on every rank together)."""
        return iter_sync_weights(self._module, gather=full_tensor)

    def save_checkpoint(self, path: str | os.PathLike) -> None:
        save_sharded_state(path, self._module, self._optimizer, self._scheduler)

    def load_checkpoint(self, path: str | os.PathLike, load_optimizer: bool = True) -> None:
        load_sharded_state(path, self._module, self._optimizer, self._scheduler, load_optimizer=load_optimizer)
        self._weights_version += 1
