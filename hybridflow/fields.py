"""Well-known ``DataProto`` field names, in one place.

Code refers to ``F.RESPONSES`` rather than the string ``"responses"`` so a typo is an
``AttributeError`` at import time, not a silent ``KeyError`` mid-run. The names are verl's,
so batches move between the two frameworks unchanged.

Shape patterns: ``B`` rows; ``L`` = prompt + response length; ``P`` prompt length;
``T`` response length; ``()`` a per-row non-tensor (numpy object array of length B).

The keys of ``DataProto.meta_info`` (per-batch facts) are declared here too, as ``META_*``
constants with their meaning in :data:`META_KEYS`. ``meta_info`` carries facts about the
batch's data (how to sample it, which weights generated it), never a worker's options or
its metrics: options are arguments of the worker method, metrics its return value.
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
# Vision-language rows: the processor's image tensors of the prompt (pixel_values, image_grid_thw).
MULTI_MODAL_INPUTS = "multi_modal_inputs"
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
        Field(MULTI_MODAL_INPUTS, "()", False, "the prompt's image tensors: pixel_values, image_grid_thw"),
    ]
}


# --- meta_info keys (per-batch facts; verl's names) -----------------------------------------
@dataclass(frozen=True)
class MetaKey:
    name: str
    doc: str


# Set by the caller of a rollout, for that call only (unset: the rollout's configuration).
META_EOS_TOKEN_ID = "eos_token_id"
META_STOP_TOKEN_IDS = "stop_token_ids"
META_PAD_TOKEN_ID = "pad_token_id"
META_DO_SAMPLE = "do_sample"
META_TEMPERATURE = "temperature"
META_TOP_K = "top_k"
META_TOP_P = "top_p"
META_VALIDATE = "validate"
META_N = "n"
META_RESPONSE_LENGTH = "response_length"
META_SEED = "seed"
META_PROGRESS_DESC = "progress_desc"
META_CHAT_TEMPLATE_KWARGS = "chat_template_kwargs"
# Set by the rollout worker on what it generated.
META_WEIGHT_VERSION = "weight_version"
# verl's metrics key: ``DataProto.concat`` merges it into one list per name. hybridflow's worker
# methods return metrics as values; only the agent loops' collate (hybridflow.agent) still
# hands its metrics to the rollout under this key, and the rollout takes them out.
META_METRICS = "metrics"

META_KEYS: dict[str, MetaKey] = {
    k.name: k
    for k in [
        MetaKey(META_EOS_TOKEN_ID, "rollout: int or list of ints that end a response ([]: none; default: EOS)"),
        MetaKey(META_STOP_TOKEN_IDS, "rollout: extra stop token ids besides the EOS ids"),
        MetaKey(META_PAD_TOKEN_ID, "rollout: fill id after the stop token; default the tokenizer's pad (else EOS)"),
        MetaKey(META_DO_SAMPLE, "rollout: sample (true) or take the argmax (false)"),
        MetaKey(META_TEMPERATURE, "rollout: sampling temperature; compute_log_prob's output: the τ it scored at"),
        MetaKey(META_TOP_K, "rollout: top-k cut-off (-1 / 0: none)"),
        MetaKey(META_TOP_P, "rollout: nucleus mass (1.0: none)"),
        MetaKey(META_VALIDATE, "rollout: sample with rollout.val_kwargs instead of the training settings"),
        MetaKey(META_N, "rollout: responses per input row, interleaved (row i answers prompt i // n)"),
        MetaKey(META_RESPONSE_LENGTH, "rollout: most new tokens per response"),
        MetaKey(META_SEED, "rollout: seed of a fresh generator for this call (the trainer's per-step seed)"),
        MetaKey(META_PROGRESS_DESC, "rollout: title of a progress bar over the response tokens (none: no bar)"),
        MetaKey(META_CHAT_TEMPLATE_KWARGS, "agent loops: chat-template kwargs for rendering turns (the dataset's)"),
        MetaKey(META_WEIGHT_VERSION, "rollout output: the weight version (global step) that generated the batch"),
        MetaKey(META_METRICS, "verl's metrics dict (concat merges it into lists); only the agent collate sets it"),
    ]
}
