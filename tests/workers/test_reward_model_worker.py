"""The reward-model worker: the score of prompt + response read at the last valid token,
placed on the response's last token; micro-batching, max_length, re-templating, config."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hybridflow import fields as F
from hybridflow.config import ConfigError, load_config
from hybridflow.controller import ClassWithInitArgs, ResourcePool, create_worker_group
from hybridflow.data.pair_dataset import render_for_reward
from hybridflow.models import load_tokenizer
from hybridflow.models.reward_model import last_token_scores, load_reward_model, reward_model_from_lm
from hybridflow.protocol import DataProto
from hybridflow.workers.reward_model import RewardModelWorker

OTHER_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT: {% endif %}"
)
CHATS = [
    [{"role": "user", "content": "What is 2 + 3?"}],
    [{"role": "user", "content": "Add 10 and 7, please."}],
    [{"role": "user", "content": "hi"}],
]
RESPONSES = ["2 + 3 = 5\n#### 5", "It is 17", ""]


def _save_rm(folder: Path, template: str | None = None) -> Path:
    model, tokenizer = reward_model_from_lm("tiny-llama", seed=3)
    if template is not None:
        tokenizer.chat_template = template
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory) -> Path:
    return _save_rm(tmp_path_factory.mktemp("rm") / "rm")


@pytest.fixture(scope="module")
def other_template_rm_dir(tmp_path_factory) -> Path:
    return _save_rm(tmp_path_factory.mktemp("rm2") / "rm", OTHER_TEMPLATE)


def _batch(tokenizer, prompt_width: int = 24, response_width: int = 16) -> DataProto:
    """Left-padded prompts, right-padded responses ending in eos (the rollout's layout)."""
    pad = tokenizer.pad_token_id
    prompts = torch.full((len(CHATS), prompt_width), pad)
    responses = torch.full((len(CHATS), response_width), pad)
    p_mask = torch.zeros_like(prompts)
    r_mask = torch.zeros_like(responses)
    for i, (chat, text) in enumerate(zip(CHATS, RESPONSES)):
        p = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        p_ids = tokenizer(p, add_special_tokens=False)["input_ids"]
        r_ids = (tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]) if text else []
        assert len(p_ids) <= prompt_width and len(r_ids) <= response_width
        prompts[i, prompt_width - len(p_ids):] = torch.tensor(p_ids)
        p_mask[i, prompt_width - len(p_ids):] = 1
        responses[i, : len(r_ids)] = torch.tensor(r_ids, dtype=torch.long)
        r_mask[i, : len(r_ids)] = 1
    raw = np.empty(len(CHATS), dtype=object)
    raw[:] = CHATS
    return DataProto.from_dict(
        tensors={F.PROMPTS: prompts, F.RESPONSES: responses, F.INPUT_IDS: torch.cat([prompts, responses], 1),
                 F.ATTENTION_MASK: torch.cat([p_mask, r_mask], 1)},
        non_tensors={F.RAW_PROMPT: raw},
    )


def _worker_group(rm_path: Path, *overrides: str):
    cfg = load_config(None, ["reward_model.enable=true", f"reward_model.model.path={rm_path}",
                             "reward_model.model.dtype=fp32", *overrides])
    group = create_worker_group("local", ResourcePool([1]), ClassWithInitArgs(RewardModelWorker, cfg.reward_model,
                                                                               policy_tokenizer="tiny-llama"))
    group.init_model()
    return group


def _expected(model, token_rows: list[list[int]]) -> torch.Tensor:
    return torch.stack([last_token_scores(model, torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long))[0]
                        for r in token_rows])


def test_scores_the_last_valid_token_and_places_them_on_the_response(rm_dir):
    tokenizer = load_tokenizer("tiny-llama")
    batch = _batch(tokenizer)
    out = _worker_group(rm_dir).compute_rm_score(batch).batch[F.RM_SCORES]
    model, rm_tokenizer = load_reward_model(rm_dir)
    expected = _expected(model, [render_for_reward(rm_tokenizer, c, t) for c, t in zip(CHATS, RESPONSES)])
    lengths = batch.batch[F.ATTENTION_MASK][:, 24:].sum(-1)
    assert out.shape == (3, 16) and out.dtype == torch.float32
    for i in range(3):
        pos = max(int(lengths[i]) - 1, 0)  # an empty response: position 0, scored at the prompt's end
        assert out[i, pos].item() == pytest.approx(expected[i].item(), abs=1e-5)
        assert torch.count_nonzero(torch.cat([out[i, :pos], out[i, pos + 1:]])) == 0
    assert len(set(expected.tolist())) == 3  # rows really differ: the check above is not vacuous


def test_micro_batches_token_budget_and_max_length(rm_dir):
    tokenizer = load_tokenizer("tiny-llama")
    batch = _batch(tokenizer)
    whole = _worker_group(rm_dir, "reward_model.micro_batch_size_per_gpu=3").compute_rm_score(batch).batch[F.RM_SCORES]
    ones = _worker_group(rm_dir, "reward_model.micro_batch_size_per_gpu=1").compute_rm_score(batch).batch[F.RM_SCORES]
    budget = _worker_group(rm_dir, "reward_model.use_dynamic_bsz=true",
                           "reward_model.forward_max_token_len_per_gpu=40").compute_rm_score(batch).batch[F.RM_SCORES]
    torch.testing.assert_close(whole, ones, atol=1e-5, rtol=0)
    torch.testing.assert_close(whole, budget, atol=1e-5, rtol=0)
    cut = _worker_group(rm_dir, "reward_model.max_length=6").compute_rm_score(batch).batch[F.RM_SCORES]
    model, rm_tokenizer = load_reward_model(rm_dir)
    rows = [render_for_reward(rm_tokenizer, c, t)[-6:] for c, t in zip(CHATS, RESPONSES)]
    torch.testing.assert_close(cut.sum(-1), _expected(model, rows), atol=1e-5, rtol=0)


def test_a_reward_model_with_another_chat_template_reads_its_own_format(other_template_rm_dir):
    tokenizer = load_tokenizer("tiny-llama")
    batch = _batch(tokenizer)
    group = _worker_group(other_template_rm_dir)
    out = group.compute_rm_score(batch).batch[F.RM_SCORES].sum(-1)
    model, rm_tokenizer = load_reward_model(other_template_rm_dir)
    rows = [render_for_reward(rm_tokenizer, chat, text) for chat, text in zip(CHATS, RESPONSES)]
    assert rm_tokenizer.decode(rows[0]).startswith("USER: What is 2 + 3?")
    torch.testing.assert_close(out, _expected(model, rows), atol=1e-5, rtol=0)
    batch.non_tensor_batch.pop(F.RAW_PROMPT)
    with pytest.raises(Exception, match="raw_prompt"):
        group.compute_rm_score(batch)


def test_a_causal_lm_folder_is_not_a_reward_model(tiny_model_dir):
    with pytest.raises(Exception, match="not a reward model.*hybridflow rm"):
        load_reward_model(tiny_model_dir)


@pytest.mark.parametrize("overrides, message", [
    (["reward_model.enable=true"], "needs reward_model.model.path"),
    (["reward_model.rule_reward=log"], "needs reward_model.enable=true"),
    (["reward_model.enable=true", "reward_model.model.path=x", "reward_model.enable_resource_pool=true"],
     "n_gpus_per_node and reward_model.nnodes"),
    (["reward_model.model.dtype=fp16"], "auto, fp32 or bf16"),
    (["reward_model.enable=true", "reward_model.model.path=x", "reward_model.rule_reward=add",
      f"custom_reward_function.path={__file__}"], "leave it off"),
])
def test_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)
