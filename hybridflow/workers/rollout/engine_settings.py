"""The rollout config's engine settings, spelled as vLLM and SGLang take them.

``actor_rollout_ref.rollout`` carries verl's engine keys (``gpu_memory_utilization``,
``tensor_model_parallel_size``, ``max_model_len`` …). Each external engine names them its own
way; this module is the one table that maps them:

============================  =========================  ==================================
rollout key                   vLLM (``AsyncEngineArgs``)  SGLang (``sglang.Engine``)
============================  =========================  ==================================
dtype                         dtype                      dtype
gpu_memory_utilization        gpu_memory_utilization     mem_fraction_static
tensor_model_parallel_size    tensor_parallel_size       tp_size
max_model_len                 max_model_len              context_length
enforce_eager                 enforce_eager              disable_cuda_graph
max_num_seqs                  max_num_seqs               max_running_requests
max_num_batched_tokens        max_num_batched_tokens     —
enable_chunked_prefill        enable_chunked_prefill     chunked_prefill_size=-1 when false
enable_prefix_caching         enable_prefix_caching      disable_radix_cache (negated)
load_format                   load_format                load_format
disable_log_stats             disable_log_stats          —
seed                          seed                       random_seed
============================  =========================  ==================================

``engine_kwargs.<engine>`` is added on top; a key there that a rollout setting (or the adapter
itself) already sets is an error, so one value never silently beats another. A setting an
engine does not read, changed from its default, gets one warning line at start-up naming it —
which is every GPU-engine setting for the built-in sampler (``rollout.name=torch``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from hybridflow.config.actor_rollout_ref import RolloutConfig

# The rollout keys that only configure a GPU serving engine (vLLM / SGLang).
ENGINE_KEYS: tuple[str, ...] = (
    "dtype",
    "gpu_memory_utilization",
    "tensor_model_parallel_size",
    "max_model_len",
    "enforce_eager",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "load_format",
    "disable_log_stats",
)

# What each adapter sets itself (its sleep / weight-update machinery depends on them).
ADAPTER_OWNED: dict[str, tuple[str, ...]] = {
    "vllm": ("model", "enable_sleep_mode", "worker_extension_cls", "logprobs_mode"),
    "sglang": ("model_path", "enable_memory_saver"),
}


def _vllm(cfg: RolloutConfig) -> dict[str, Any]:
    return {
        "dtype": cfg.dtype,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "tensor_parallel_size": cfg.tensor_model_parallel_size,
        "max_model_len": cfg.max_model_len,
        "enforce_eager": cfg.enforce_eager,
        "max_num_seqs": cfg.max_num_seqs,
        "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "enable_chunked_prefill": cfg.enable_chunked_prefill,
        "enable_prefix_caching": cfg.enable_prefix_caching,
        "load_format": cfg.load_format,
        "disable_log_stats": cfg.disable_log_stats,
        "seed": cfg.seed,
    }


def _sglang(cfg: RolloutConfig) -> dict[str, Any]:
    args = {
        "dtype": cfg.dtype,
        "mem_fraction_static": cfg.gpu_memory_utilization,
        "tp_size": cfg.tensor_model_parallel_size,
        "context_length": cfg.max_model_len,
        "disable_cuda_graph": cfg.enforce_eager,
        "max_running_requests": cfg.max_num_seqs,
        "disable_radix_cache": not cfg.enable_prefix_caching,
        "load_format": cfg.load_format,
        "random_seed": cfg.seed,
    }
    if not cfg.enable_chunked_prefill:
        args["chunked_prefill_size"] = -1  # SGLang's "off"; when on, its own chunk size stays
    return args


_MAPPERS: dict[str, Callable[[RolloutConfig], dict[str, Any]]] = {"vllm": _vllm, "sglang": _sglang}
# The rollout keys each engine reads (the rest of ENGINE_KEYS are warned about when changed).
READS: dict[str, frozenset[str]] = {
    "vllm": frozenset(ENGINE_KEYS),
    "sglang": frozenset(ENGINE_KEYS) - {"max_num_batched_tokens", "disable_log_stats"},
}


def engine_args(cfg: RolloutConfig) -> dict[str, Any]:
    """The constructor arguments of ``cfg.name``'s engine (vllm or sglang): the mapped rollout
    settings plus ``engine_kwargs.<name>`` (null values, here and there, leave the key to the
    engine's default, as verl does). Raises ValueError for an ``engine_kwargs`` key that is
    already set."""
    if cfg.name not in _MAPPERS:
        raise ValueError(f"no engine settings for rollout.name={cfg.name!r}; engines: {', '.join(_MAPPERS)}")
    mapped = {key: value for key, value in _MAPPERS[cfg.name](cfg).items() if value is not None}
    extra = {key: value for key, value in getattr(cfg.engine_kwargs, cfg.name).items() if value is not None}
    owned = set(ADAPTER_OWNED[cfg.name])
    clash = sorted(set(extra) & (set(mapped) | owned))
    if clash:
        raise ValueError(
            f"actor_rollout_ref.rollout.engine_kwargs.{cfg.name} sets {clash}, which "
            f"{'the adapter sets itself' if set(clash) <= owned else 'rollout settings already set'}; "
            f"use the rollout keys instead (the table in hybridflow/workers/rollout/engine_settings.py)"
        )
    return mapped | extra


def unread_settings(cfg: RolloutConfig) -> list[str]:
    """One warning line per engine setting that ``cfg.name``'s engine does not read although it
    differs from its default (or an ``engine_kwargs`` entry for another engine)."""
    defaults = RolloutConfig()
    reads = READS.get(cfg.name, frozenset())
    lines = []
    for key in ENGINE_KEYS:
        value = getattr(cfg, key)
        if key not in reads and value != getattr(defaults, key):
            lines.append(f"ignored by rollout.name={cfg.name}: actor_rollout_ref.rollout.{key}={value!r}")
    for field in dataclasses.fields(cfg.engine_kwargs):
        if field.name != cfg.name and getattr(cfg.engine_kwargs, field.name):
            lines.append(f"ignored by rollout.name={cfg.name}: actor_rollout_ref.rollout.engine_kwargs.{field.name}")
    return lines
