"""Sharing the actor's live policy with colocated roles in the same process.

When actor, rollout and reference are colocated (the default placement), the rollout samples
from the actor's module and, with LoRA, the reference is that module with its adapters
disabled: one model in memory, no weight copy. The roles are separate classes built one
after another inside one process, so the actor *publishes* its policy under an explicit
name and the other roles, given the same name in their init arguments, *look it up*.

The table is per process and keyed by ``(name, rank)``: roles placed in other processes
simply do not find it, and must load their own model and receive weight pushes instead.
It holds the policy *weakly*: the actor owns its module, engine (with the optimizer) and
tokenizer, and an entry ends when any of them is freed — so a closed trainer's model and
optimizer are not kept alive by the table, and a role that looks up a policy whose actor is
gone gets an error saying so.
"""

from __future__ import annotations

import threading
import weakref
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


@dataclass(frozen=True)
class _Entry:
    """A published policy held by weak references to the objects its actor owns."""

    module: weakref.ref
    tokenizer: weakref.ref
    engine: weakref.ref
    is_lora: bool
    device: torch.device

    def resolve(self) -> SharedPolicy | None:
        module, tokenizer, engine = self.module(), self.tokenizer(), self.engine()
        if module is None or tokenizer is None or engine is None:
            return None
        return SharedPolicy(module, tokenizer, engine, self.is_lora, self.device)


_TABLE: dict[tuple[str, int], _Entry] = {}
_LOCK = threading.RLock()  # re-entrant: a weakref callback may fire during a gc inside the lock


def publish_policy(name: str, rank: int, policy: SharedPolicy) -> None:
    """Offer ``policy`` to roles of this process under ``(name, rank)``; replaces an older one.

    Only weak references are kept: the entry lasts while the publisher keeps the module,
    tokenizer and engine alive, and is dropped when the first of them is freed.
    """
    key = (name, rank)

    def drop(_: weakref.ref, key: tuple[str, int] = key) -> None:
        with _LOCK:
            if _TABLE.get(key) is entry:  # not a newer policy published under the same key
                del _TABLE[key]

    try:
        entry = _Entry(
            weakref.ref(policy.module, drop),
            weakref.ref(policy.tokenizer, drop),
            weakref.ref(policy.engine, drop),
            policy.is_lora,
            policy.device,
        )
    except TypeError as exc:
        raise TypeError(
            f"cannot share the policy as {name!r}: its module, tokenizer and engine must support weak references ({exc})"
        ) from exc
    with _LOCK:
        _TABLE[key] = entry


def lookup_policy(name: str, rank: int) -> SharedPolicy:
    """The policy published under ``(name, rank)`` in this process; a clear error if none."""
    with _LOCK:
        entry = _TABLE.get((name, rank))
        policy = entry.resolve() if entry is not None else None
        if policy is not None:
            return policy
        live = sorted(key for key, e in _TABLE.items() if e.resolve() is not None)
    published = ", ".join(f"{n}@rank{r}" for n, r in live) or "none"
    raise LookupError(
        f"no actor policy shared as {name!r} for rank {rank} in this process (published: {published}); "
        "colocate the actor role before this role and call the actor's init_model first "
        "(a policy is shared only while its actor worker is alive)"
    )


def withdraw_policy(name: str, rank: int) -> None:
    """Forget ``(name, rank)`` (no error if absent)."""
    with _LOCK:
        _TABLE.pop((name, rank), None)


def published_policies() -> list[tuple[str, int]]:
    """The ``(name, rank)`` keys whose policy is still alive in this process."""
    with _LOCK:
        return sorted(key for key, entry in _TABLE.items() if entry.resolve() is not None)
