"""Well-known ``DataProto`` field names, in one place.

Code refers to ``F.RESPONSES`` rather than the string ``"responses"`` so a typo is an
``AttributeError`` at import time, not a silent ``KeyError`` mid-run. The names are verl's,
so batches move between the two frameworks unchanged.

Shape patterns: ``B`` rows; ``L`` = prompt + response length; ``P`` prompt length;
``T`` response length; ``()`` a per-row non-tensor (numpy object array of length B).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Field:
    name: str
    shape: str  # "(B, L)", "(B, T)", "(B,)" or "()" for non-tensor per-row values
    tensor: bool
    doc: str


# --- tensors produced by the rollout -------------------------------------------------------
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
PROMPTS = "prompts"
RESPONSES = "responses"
RESPONSE_MASK = "response_mask"
ROLLOUT_LOG_PROBS = "rollout_log_probs"
# --- tensors added by the controller's phases ----------------------------------------------
OLD_LOG_PROBS = "old_log_probs"
REF_LOG_PROB = "ref_log_prob"
TEACHER_LOG_PROB = "teacher_log_prob"
TEACHER_TOPK_LOG_PROBS = "teacher_topk_log_probs"
TEACHER_TOPK_IDS = "teacher_topk_ids"
ENTROPYS = "entropys"
VALUES = "values"
TOKEN_LEVEL_SCORES = "token_level_scores"
RM_SCORES = "rm_scores"
TOKEN_LEVEL_REWARDS = "token_level_rewards"
ADVANTAGES = "advantages"
RETURNS = "returns"
REWARD_BASELINES = "reward_baselines"
SUM_PI_SQUARED = "sum_pi_squared"
ROLLOUT_IS_WEIGHTS = "rollout_is_weights"
# --- per-row non-tensors ---------------------------------------------------------------------
UID = "uid"
DATA_SOURCE = "data_source"
REWARD_MODEL = "reward_model"
EXTRA_INFO = "extra_info"
RAW_PROMPT = "raw_prompt"
# Per response (agent loops): the weight versions of its first and last generated tokens; they
# differ only when a partial rollout was resumed across a weight update (int64, -1 = no token).
WEIGHT_VERSION_MIN = "weight_version_min"
WEIGHT_VERSION_MAX = "weight_version_max"

FIELDS: dict[str, Field] = {
    f.name: f
    for f in [
        Field(INPUT_IDS, "(B, L)", True, "prompt (left-padded) followed by response (right-padded)"),
        Field(ATTENTION_MASK, "(B, L)", True, "1 on real tokens, 0 on padding"),
        Field(POSITION_IDS, "(B, L)", True, "positions counted over real tokens only"),
        Field(PROMPTS, "(B, P)", True, "left-padded prompt token ids"),
        Field(RESPONSES, "(B, T)", True, "right-padded response token ids"),
        Field(RESPONSE_MASK, "(B, T)", True, "1 on response tokens up to and including EOS"),
        Field(ROLLOUT_LOG_PROBS, "(B, T)", True, "log-probs the rollout engine sampled with"),
        Field(OLD_LOG_PROBS, "(B, T)", True, "actor log-probs before the update (ℓ_old)"),
        Field(REF_LOG_PROB, "(B, T)", True, "reference-policy log-probs (ℓ_ref)"),
        Field(TEACHER_LOG_PROB, "(B, T)", True, "distillation teacher's log-probs of the response tokens"),
        Field(TEACHER_TOPK_LOG_PROBS, "(B, T, K)", True, "the teacher's K largest log-probs per response position"),
        Field(TEACHER_TOPK_IDS, "(B, T, K)", True, "the token ids of those log-probs (int64)"),
        Field(ENTROPYS, "(B, T)", True, "per-token entropy of the actor's distribution"),
        Field(VALUES, "(B, T)", True, "critic values V_t"),
        Field(RM_SCORES, "(B, T)", True, "reward-model scores at each response's last token"),
        Field(TOKEN_LEVEL_SCORES, "(B, T)", True, "reward-function scores placed on tokens"),
        Field(TOKEN_LEVEL_REWARDS, "(B, T)", True, "scores minus in-reward KL, if any"),
        Field(ADVANTAGES, "(B, T)", True, "advantage estimates"),
        Field(RETURNS, "(B, T)", True, "return targets for the critic"),
        Field(REWARD_BASELINES, "(B,)", True, "per-row baseline score (ReMax greedy sample)"),
        Field(SUM_PI_SQUARED, "(B, T)", True, "Σ_v π_v² under the old policy"),
        Field(ROLLOUT_IS_WEIGHTS, "(B, T)", True, "rollout-correction importance weights"),
        Field(UID, "()", False, "group id: rows sampled from the same prompt share it"),
        Field(DATA_SOURCE, "()", False, "dataset name used to pick the scorer"),
        Field(REWARD_MODEL, "()", False, "dict with style and ground_truth"),
        Field(EXTRA_INFO, "()", False, "dict of per-row extras (split, index, ...)"),
        Field(RAW_PROMPT, "()", False, "the chat messages before templating"),
    ]
}
