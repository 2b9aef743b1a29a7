"""The reward-model role: each response scored by a sequence-classification model.

``compute_rm_score(batch)`` returns ``rm_scores`` (B, T): zeros except the model's score of
prompt + response at the response's last valid token (verl's layout). The reward manager then
takes them as the reward (``reward_model.rule_reward``: or adds / logs the rule score).

Each response is decoded with the policy's tokenizer and rendered with the reward model's
chat template from the row's ``raw_prompt`` + an assistant turn — the rendering ``hybridflow rm``
trains on (:func:`hybridflow.data.pair_dataset.render_for_reward`) and verl's default
(``input_tokenizer`` = the policy's). So a reward model with another vocabulary or template
reads its own format, and one sharing the policy's reads exactly what it was trained on
(the rollout's tokens end at eos, a rendered chat after the template's closing text). An
agent loop's response, tool turns included, becomes one assistant turn. Rows are
micro-batched by count or token budget, longest first.
"""

from __future__ import annotations

import torch

from hybridflow import fields as F
from hybridflow.config.ppo import RewardModelConfig
from hybridflow.controller import Dispatch, Worker, register
from hybridflow.data.pair_dataset import render_for_reward
from hybridflow.engine.micro_batch import plan_micro_batches, restore_order
from hybridflow.models import load_tokenizer
from hybridflow.models.reward_model import last_token_scores, load_reward_model
from hybridflow.protocol import DataProto
from hybridflow.reward.base import place_scores, response_lengths
from hybridflow.utils.precision import resolve_compute_dtype
from hybridflow.workers.ppo_loop import micro_batch_spec, require_fields

DEFAULT_MICRO_BATCH = 4  # reward_model.micro_batch_size_per_gpu = null


class RewardModelWorker(Worker):
    """Scores responses with ``reward_model.model.path``. ``policy_tokenizer``: the folder or
    name of the policy's tokenizer (``reward_model.model.input_tokenizer`` overrides it)."""

    def __init__(self, config: RewardModelConfig, policy_tokenizer: str, device: str = "cpu") -> None:
        super().__init__()
        self.config = config
        self.policy_tokenizer_path = config.model.input_tokenizer or policy_tokenizer
        self.device = torch.device(device)
        self._model: torch.nn.Module | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the frozen reward model and the tokenizer that decodes the policy's responses."""
        model_cfg = self.config.model
        assert model_cfg.path is not None  # reward_model.enable needs it (a config rule)
        model, self.tokenizer = load_reward_model(
            model_cfg.path,
            dtype=resolve_compute_dtype(model_cfg.dtype, self.device),
            trust_remote_code=model_cfg.trust_remote_code,
        )
        model.requires_grad_(False)
        module: torch.nn.Module = model  # (transformers types PreTrainedModel.to wrongly)
        self._model = module.to(self.device)
        self.policy_tokenizer = load_tokenizer(
            self.policy_tokenizer_path, trust_remote_code=model_cfg.trust_remote_code
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores`` (B, T) float32: each row's score at its last valid response token."""
        if self._model is None:
            raise RuntimeError("RewardModelWorker.init_model() has not been called")
        require_fields(data.require_batch(), (F.ATTENTION_MASK, F.RESPONSES), "compute_rm_score")
        rows = self._rendered_rows(data)
        if self.config.max_length is not None:
            rows = [row[-self.config.max_length :] for row in rows]  # keep the end: the score is read there
        scores = self._score(rows)
        width = data.require_batch()[F.RESPONSES].shape[-1]
        return DataProto.from_dict(tensors={F.RM_SCORES: place_scores(scores, response_lengths(data), width)})

    def _rendered_rows(self, data: DataProto) -> list[list[int]]:
        if F.RAW_PROMPT not in data.non_tensor_batch:
            raise KeyError(
                f"the reward model renders each response with the prompt's chat messages, but the batch has no "
                f"{F.RAW_PROMPT!r} column (the trainer sets data.return_raw_chat with reward_model.enable)"
            )
        responses = data.require_batch()[F.RESPONSES]
        lengths = response_lengths(data).tolist()
        texts = self.policy_tokenizer.batch_decode(
            [row[:n].tolist() for row, n in zip(responses, lengths)], skip_special_tokens=True
        )
        return [
            render_for_reward(self.tokenizer, list(messages), text)
            for messages, text in zip(data.non_tensor_batch[F.RAW_PROMPT], texts)
        ]

    def _score(self, rows: list[list[int]]) -> torch.Tensor:
        cfg, model = self.config, self._model
        assert model is not None  # compute_rm_score checked that init_model ran
        spec = micro_batch_spec(
            cfg.use_dynamic_bsz, cfg.micro_batch_size_per_gpu or DEFAULT_MICRO_BATCH, cfg.forward_max_token_len_per_gpu
        )
        plan = plan_micro_batches([len(row) for row in rows], spec)
        pad = self.tokenizer.pad_token_id
        parts = []
        with torch.no_grad():
            for micro in plan:
                width = max(len(rows[i]) for i in micro)
                ids = torch.full((len(micro), width), pad, dtype=torch.long)
                mask = torch.zeros((len(micro), width), dtype=torch.long)
                for k, i in enumerate(micro):
                    ids[k, : len(rows[i])] = torch.tensor(rows[i], dtype=torch.long)
                    mask[k, : len(rows[i])] = 1
                parts.append(last_token_scores(model, ids.to(self.device), mask.to(self.device)).cpu())
        return restore_order(parts, plan)
