"""Sharing the actor's live policy with colocated roles in the same process.

When actor, rollout and reference are colocated (the default placement), the rollout samples
from the actor's module and, with LoRA, the reference is that module with its adapters
disabled: one model in memory, no weight copy. The roles are separate classes built one
after another inside one process, so the actor *publishes* its policy under an explicit
name and the other roles, given the same name in their init arguments, *look it up*.

The table is per process and keyed by ``(name, rank)``: roles placed in other processes
simply do not find it, and must load their own model and receive weight pushes instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from hybridflow.engine.base import TrainEngine

DEFAULT_SHARE_NAME = "actor_rollout_ref"


@dataclass(frozen=True)
class SharedPolicy:
    """What the actor offers its colocated roles.

    ``module`` is the live training module (a ``peft.PeftModel`` when ``is_lora``), ``engine``
    its training engine (for ``iter_sync_weights``).
    """

    module: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    engine: TrainEngine
    is_lora: bool
    device: torch.device


_TABLE: dict[tuple[str, int], SharedPolicy] = {}


def publish_policy(name: str, rank: int, policy: SharedPolicy) -> None:
    """Offer ``policy`` to roles of this process under ``(name, rank)``; replaces an older one."""
    _TABLE[(name, rank)] = policy


def lookup_policy(name: str, rank: int) -> SharedPolicy:
    """The policy published under ``(name, rank)`` in this process; a clear error if none."""
    try:
        return _TABLE[(name, rank)]
    except KeyError:
        published = ", ".join(f"{n}@rank{r}" for n, r in sorted(_TABLE)) or "none"
        raise LookupError(
            f"no actor policy shared as {name!r} for rank {rank} in this process (published: {published}); "
            "colocate the actor role before this role and call the actor's init_model first"
        ) from None


def withdraw_policy(name: str, rank: int) -> None:
    """Forget ``(name, rank)`` (no error if absent)."""
    _TABLE.pop((name, rank), None)
