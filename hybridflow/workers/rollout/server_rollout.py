"""``ServerRollout``: generation on an inference server, through the agent loops.

The rollout for an engine that is not a module in this process: a ``hybridflow serve``
process (``rollout.checkpoint_engine.backend=http``) or a vLLM / SGLang engine
(``rollout.name=vllm|sglang``). It holds no model; every row goes through its agent loop
(``single_turn_agent`` unless the row or ``rollout.agent.default_agent_loop`` says otherwise)
against the server's :class:`~hybridflow.inference.protocol.InferenceServer` client, which
returns the server's own tokens and log-probs, so the output has the same verl fields as the
built-in rollout. Weights reach the server through the rollout worker's weight sync.
"""

from __future__ import annotations

from typing import Any

import torch

from hybridflow.config.actor_rollout_ref import RolloutConfig
from hybridflow.inference.protocol import InferenceServer
from hybridflow.protocol import DataProto
from hybridflow.workers.rollout.agent_loop import AgentLoops, batch_seed
from hybridflow.workers.rollout.base import BaseRollout, NamedTensors, RolloutOutput
from hybridflow.workers.rollout.torch_rollout import pad_token_id, rollout_sampling


class ServerRollout(BaseRollout):
    """Arguments: the rollout config, the server's client, the policy's tokenizer."""

    def __init__(self, config: RolloutConfig, server: InferenceServer, tokenizer: Any) -> None:
        if config.response_length is None:
            raise ValueError("rollout.response_length is null; set it (or data.max_response_length)")
        self.config = config
        self.server = server
        self.tokenizer = tokenizer
        self.loops = AgentLoops(config, tokenizer)
        self.generator = torch.Generator().manual_seed(config.seed if config.seed is not None else 0)
        eos = tokenizer.eos_token_id
        self.default_eos = () if eos is None else (int(eos),)
        pad = tokenizer.pad_token_id
        self.default_pad = int(pad) if pad is not None else (self.default_eos[0] if self.default_eos else None)

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        return self.generate_with_metrics(prompts).data

    def generate_with_metrics(self, prompts: DataProto) -> RolloutOutput:
        meta = dict(prompts.meta_info)
        params = rollout_sampling(self.config, meta, self.default_eos)
        if params.ignore_eos:
            raise ValueError("rollout.ignore_eos=true is not supported on a server rollout (the server stops at EOS)")
        pad = pad_token_id(meta, self.default_pad)
        width = prompts.batch["input_ids"].shape[1] if prompts.batch is not None else 0
        limit = self.config.prompt_length
        if limit is not None and width > limit:
            raise ValueError(f"prompt length {width} exceeds rollout.prompt_length={limit}")
        return self.loops.run(
            prompts,
            self.server,
            params,
            seed=batch_seed(meta, self.generator),
            pad=pad,
            prompt_length=limit or width,
        )

    def update_weights(self, weights: NamedTensors) -> None:
        raise TypeError("a server rollout receives weights through the rollout worker's weight sync")
