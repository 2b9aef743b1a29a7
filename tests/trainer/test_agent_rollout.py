"""Trainer integration of the agent loop (issue 17, part 6): the ``agent_loop`` rollout.

- single_turn_agent through the rollout equals the plain torch rollout under greedy;
- the rollout samples from the current weights (live module and update_weights);
- a forced tool call gives response_mask holes exactly on the tool tokens, and those tokens
  carry no loss in the actor's update;
- a short GRPO run with multi_turn.enable=true + tool_agent + calculator trains, validates
  through the agent loop and logs num_turns metrics.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from hybridflow import fields as F
from hybridflow.config.actor_rollout_ref import (
    AgentConfig,
    MultiTurnConfig,
    RolloutConfig,
)
from hybridflow.inference.protocol import TokenOutput
from hybridflow.models.tiny import build_tiny_model, build_tiny_tokenizer
from hybridflow.protocol import DataProto
from hybridflow.workers.rollout import agent_loop as agent_loop_module
from hybridflow.workers.rollout.agent_loop import AgentLoopRollout
from hybridflow.workers.rollout.torch_rollout import TorchRollout

from .conftest import tiny_overrides

QUESTIONS = ("What is 7 + 5?", "Hi", "Compute 12 * 7.", "The quick brown fox")
CALL_TEXT = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_model(tokenizer, arch="llama", num_layers=2, seed=0)


def _prompts(tokenizer, questions=QUESTIONS, width: int = 48) -> DataProto:
    messages = [[{"role": "user", "content": q}] for q in questions]
    texts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in messages]
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    input_ids = torch.full((len(ids), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        input_ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    raw = np.empty(len(messages), dtype=object)
    raw[:] = messages
    return DataProto.from_dict(
        tensors={F.INPUT_IDS: input_ids, F.ATTENTION_MASK: mask, F.POSITION_IDS: (mask.cumsum(-1) - 1).clamp(min=0)},
        non_tensors={F.RAW_PROMPT: raw},
        meta_info={"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id},
    )


def _config(response_length: int = 12, **multi_turn: Any) -> RolloutConfig:
    agent = AgentConfig(default_agent_loop=multi_turn.pop("default_agent_loop", "single_turn_agent"))
    return replace(
        RolloutConfig(), response_length=response_length, seed=0, do_sample=False,
        multi_turn=replace(MultiTurnConfig(), enable=True, **multi_turn), agent=agent,
    )


def test_single_turn_agent_equals_the_torch_rollout_under_greedy(model, tokenizer):
    cfg = _config()
    plain = TorchRollout(cfg, model, tokenizer).generate_sequences(_prompts(tokenizer))
    agent, metrics = AgentLoopRollout(cfg, model, tokenizer).generate_with_metrics(_prompts(tokenizer))
    for key in (F.PROMPTS, F.RESPONSES, F.INPUT_IDS, F.ATTENTION_MASK, F.POSITION_IDS, F.RESPONSE_MASK):
        assert torch.equal(plain.batch[key].long(), agent.batch[key].long()), key
    torch.testing.assert_close(plain.batch[F.ROLLOUT_LOG_PROBS], agent.batch[F.ROLLOUT_LOG_PROBS], rtol=0, atol=1e-5)
    assert agent.non_tensor_batch["__num_turns__"].tolist() == [2] * len(QUESTIONS)
    assert metrics["num_turns/mean"] == 2.0 and "metrics" not in agent.meta_info


def test_sampled_agent_rollouts_repeat_exactly_for_the_same_seed(model, tokenizer):
    cfg = replace(_config(), do_sample=True, temperature=1.0)

    def run(seed: int) -> DataProto:
        prompts = _prompts(tokenizer, questions=[QUESTIONS[0]] * 4)  # one prompt, four samples
        prompts.meta_info["seed"] = seed
        return AgentLoopRollout(cfg, model, tokenizer).generate_sequences(prompts)

    first, again, other = run(11), run(11), run(12)
    assert torch.equal(first.batch[F.RESPONSES], again.batch[F.RESPONSES])
    assert not torch.equal(first.batch[F.RESPONSES], other.batch[F.RESPONSES])
    rows = {tuple(r.tolist()) for r in first.batch[F.RESPONSES]}
    assert len(rows) > 1  # the four copies of one prompt draw from different streams


def test_plain_path_when_multi_turn_is_off_and_no_agent_name(model, tokenizer):
    cfg = replace(_config(), multi_turn=MultiTurnConfig())
    out, metrics = AgentLoopRollout(cfg, model, tokenizer).generate_with_metrics(_prompts(tokenizer))
    assert "__num_turns__" not in out.non_tensor_batch and "metrics" not in out.meta_info and metrics == {}
    prompts = _prompts(tokenizer)
    names = np.empty(len(QUESTIONS), dtype=object)
    names[:] = ["single_turn_agent", None, None, "single_turn_agent"]
    prompts.non_tensor_batch["agent_name"] = names  # an agent_name column routes through the loops
    routed = AgentLoopRollout(cfg, model, tokenizer).generate_sequences(prompts)
    assert routed.non_tensor_batch["__num_turns__"].tolist() == [2] * len(QUESTIONS)
    assert torch.equal(routed.batch[F.RESPONSES], out.batch[F.RESPONSES])


def test_the_agent_rollout_samples_from_the_current_weights(model, tokenizer):
    cfg = _config()
    own = copy.deepcopy(model)
    rollout = AgentLoopRollout(cfg, own, tokenizer)
    before = rollout.generate_sequences(_prompts(tokenizer))
    gen = torch.Generator().manual_seed(3)
    new = {name: p.detach() + 0.5 * torch.randn(p.shape, generator=gen) for name, p in own.named_parameters()}
    rollout.update_weights(list(new.items()))  # a non-shared rollout: the worker pushes weights
    after = rollout.generate_sequences(_prompts(tokenizer))
    fresh_model = copy.deepcopy(model)
    fresh_model.load_state_dict(new, strict=False)
    fresh = TorchRollout(cfg, fresh_model, tokenizer).generate_sequences(_prompts(tokenizer))
    assert not torch.equal(before.batch[F.RESPONSES], after.batch[F.RESPONSES])
    assert torch.equal(after.batch[F.RESPONSES], fresh.batch[F.RESPONSES])
    # Shared (colocated) module: an in-place optimizer-style change is seen on the next call.
    with torch.no_grad():
        for name, p in own.named_parameters():
            p.copy_(dict(model.named_parameters())[name])
    again = rollout.generate_sequences(_prompts(tokenizer))
    assert torch.equal(again.batch[F.RESPONSES], before.batch[F.RESPONSES])


class ForcedToolCall:
    """A TokenClient wrapper: each trajectory's first turn is a fixed calculator call; later
    turns come from ``inner`` (the real model) or, without one, a fixed answer."""

    def __init__(self, tokenizer, inner=None) -> None:
        self.call_ids = tokenizer.encode(CALL_TEXT, add_special_tokens=False) + [tokenizer.eos_token_id]
        self.answer_ids = tokenizer.encode("84", add_special_tokens=False) + [tokenizer.eos_token_id]
        self.inner = inner
        self.turns: dict[str, int] = {}

    async def generate(self, request_id, prompt_ids, sampling, max_tokens) -> TokenOutput:
        turn = self.turns.get(request_id, 0)
        self.turns[request_id] = turn + 1
        if turn > 0 and self.inner is not None:
            return await self.inner.generate(request_id, prompt_ids, sampling, max_tokens)
        ids = (self.call_ids if turn == 0 else self.answer_ids)[:max_tokens]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed", weight_version=0)


@pytest.fixture
def calculator_yaml(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n  - class_name: hybridflow.tools.calculator.CalculatorTool\n    config: {type: native}\n")
    return path


def _force_tool_calls(monkeypatch, tokenizer, use_model: bool) -> None:
    real = agent_loop_module.InProcessClient

    def client(engine, stop_token_ids=None):
        return ForcedToolCall(tokenizer, real(engine, stop_token_ids) if use_model else None)

    monkeypatch.setattr(agent_loop_module, "InProcessClient", client)


def _check_tool_holes(batch: DataProto, tokenizer, call_len: int) -> None:
    """Model tokens (the forced call, then the model's answer) have mask 1; the inserted tool
    turn between them has mask 0 and attention 1; padding has both 0."""
    mask = batch.batch[F.RESPONSE_MASK].long()
    T = mask.shape[1]
    attention = batch.batch[F.ATTENTION_MASK][:, -T:].long()
    for i in range(len(batch)):
        real = int(attention[i].sum())
        assert attention[i, :real].all() and not attention[i, real:].any()
        row = mask[i, :real].tolist()
        assert row[:call_len] == [1] * call_len
        holes = [j for j, m in enumerate(row) if m == 0]
        assert holes and holes == list(range(call_len, holes[-1] + 1)), "one contiguous tool turn after the call"
        assert row[holes[-1] + 1:] and all(row[holes[-1] + 1:]), "the trajectory ends on model tokens"
        inserted = tokenizer.decode(batch.batch[F.RESPONSES][i, holes[0]: holes[-1] + 1].tolist())
        assert "84" in inserted and "tool" in inserted
        assert (batch.batch[F.ROLLOUT_LOG_PROBS][i, holes] == 0).all() if F.ROLLOUT_LOG_PROBS in batch.batch.keys() else True


def test_tool_tokens_are_masked_and_carry_no_loss(model, tokenizer, calculator_yaml, monkeypatch, make_config):
    from hybridflow.workers.actor import ActorWorker

    _force_tool_calls(monkeypatch, tokenizer, use_model=False)
    cfg = _config(response_length=128, default_agent_loop="tool_agent", tool_config_path=str(calculator_yaml))
    rows = _prompts(tokenizer, QUESTIONS * 2, width=640)  # 8 rows: one mini-batch of make_config
    out, rollout_metrics = AgentLoopRollout(cfg, model, tokenizer).generate_with_metrics(rows)
    call_len = len(ForcedToolCall(tokenizer).call_ids)
    _check_tool_holes(out, tokenizer, call_len)
    assert out.non_tensor_batch["__num_turns__"].tolist() == [4] * 8  # user, call, tool, answer
    assert out.non_tensor_batch["tool_call_counts"].tolist() == [1] * 8
    assert rollout_metrics["tool_call_counts/mean"] == 1.0

    def actor():
        worker = ActorWorker(make_config().actor_rollout_ref, share_name=None)
        worker.init_model()
        return worker

    data = DataProto.from_dict(tensors={k: out.batch[k] for k in (
        F.PROMPTS, F.RESPONSES, F.RESPONSE_MASK, F.INPUT_IDS, F.ATTENTION_MASK, F.POSITION_IDS)})
    old = actor().compute_log_prob(data)
    mask = data.batch[F.RESPONSE_MASK]
    # old log-probs cover every attended token, tool tokens included (as in verl); the loss masks them
    assert (old.batch[F.OLD_LOG_PROBS][(mask == 0) & (data.batch[F.ATTENTION_MASK][:, -mask.shape[1]:] == 1)] != 0).any()
    data.batch[F.OLD_LOG_PROBS] = old.batch[F.OLD_LOG_PROBS]
    gen = torch.Generator().manual_seed(0)
    advantages = torch.randn(mask.shape, generator=gen)
    grads = []
    for tool_value in (0.0, 123.0):
        batch = DataProto.from_dict(tensors={k: v.clone() for k, v in data.batch.items()})
        batch.batch[F.ADVANTAGES] = torch.where(mask.bool(), advantages, torch.full_like(advantages, tool_value))
        worker = actor()
        captured = {}
        real_step = worker.engine.optimizer_step

        def capture_then_step(worker=worker, captured=captured, real_step=real_step):
            if not captured:
                captured.update({n: p.grad.clone() for n, p in worker.module.named_parameters() if p.grad is not None})
            return real_step()

        monkeypatch.setattr(worker.engine, "optimizer_step", capture_then_step)
        metrics = worker.update_actor(batch)
        grads.append((captured, metrics["actor/pg_loss"]))
    (g0, loss0), (g1, loss1) = grads
    assert g0 and g0.keys() == g1.keys()
    # bitwise by construction: the same process and kernels; the tool tokens' advantages are
    # multiplied by a zero mask, so 0 and 123 give the same products in the same order
    assert loss0 == loss1
    for name in g0:
        torch.testing.assert_close(g0[name], g1[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("mode", ["sync", "one_step_off", "distill"])
def test_grpo_run_with_tool_agent_trains_and_validates(tiny_task_dir, tiny_model_dir, tmp_path, calculator_yaml, monkeypatch,
                                                      mode):
    """``distill``: on-policy distillation (the teacher's per-token reward folded into the
    advantage) through the same tool loops: tool tokens get no reward and no loss."""
    from hybridflow.config import load_config
    from hybridflow.entrypoints.train import build_trainer
    from hybridflow.trainer.phases import PolicyUpdate

    tok = build_tiny_tokenizer()
    _force_tool_calls(monkeypatch, tok, use_model=True)  # first turn a calculator call, then the tiny model
    seen: list[DataProto] = []
    real_adv = PolicyUpdate.compute_advantage

    def record(self, batch):
        out = real_adv(self, batch)
        seen.append(batch)
        return out

    monkeypatch.setattr(PolicyUpdate, "compute_advantage", record)
    import hybridflow.workers.rollout.agent_loop as agent_loop_module

    contexts: list[dict] = []
    real_context = agent_loop_module.AgentContext

    def context(**kwargs):
        contexts.append(dict(kwargs["chat_template_kwargs"]))
        return real_context(**kwargs)

    monkeypatch.setattr(agent_loop_module, "AgentContext", context)
    run_dir = tmp_path / "run"
    cfg = load_config(None, tiny_overrides(
        tiny_task_dir, run_dir, tiny_model_dir,
        "data.max_prompt_length=640", "data.max_response_length=128", "data.val_max_samples=4",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={calculator_yaml}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "data.apply_chat_template_kwargs.enable_thinking=false",
        # one_step_off: the loops run on the rollouter thread
        *((f"async_training.mode={mode}",) if mode != "distill" else (
            "distillation.enabled=true", f"distillation.teacher_model.model_path={tiny_model_dir}",
            "distillation.distillation_loss.loss_mode=k1", "distillation.distillation_loss.use_policy_gradient=true",
            "distillation.teacher_model.dtype=fp32")),
    ))
    trainer = build_trainer(cfg)
    try:
        last = trainer.fit()
    finally:
        trainer.close()
    assert trainer.global_steps == 2 and len(seen) == 2
    # the loops render tool turns with the dataset's apply_chat_template kwargs (training and validation)
    assert contexts and all(c == {"enable_thinking": False} for c in contexts)
    assert last["num_turns/mean"] >= 3.0 and last["tool_call_counts/mean"] >= 1.0
    assert "val-aux/num_turns/mean" in last and last["val-aux/num_turns/max"] >= 3.0
    call_len = len(ForcedToolCall(tok).call_ids)
    for batch in seen:
        _check_tool_holes(batch, tok, call_len)
        mask = batch.batch[F.RESPONSE_MASK]
        assert (batch.batch[F.ADVANTAGES][mask == 0] == 0).all()
    if mode == "distill":
        assert math.isfinite(last["distill/kl"]) and last["distill/teacher_logp"] < 0
        assert all(b.batch[F.TEACHER_LOG_PROB].shape == b.batch[F.RESPONSE_MASK].shape for b in seen)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert any("num_turns/mean" in row for row in rows)


@pytest.mark.ray
def test_agent_loop_on_two_ray_ranks(ray_session, tiny_task_dir, tiny_model_dir, tmp_path, calculator_yaml):
    """Two Ray ranks (FSDP, gloo): each rank's rollout runs its rows' tool loops (inside a Ray
    actor, whose thread may already run an event loop) and samples from its refreshed full copy."""
    from hybridflow.config import load_config
    from hybridflow.entrypoints.train import run

    run_dir = tmp_path / "run"
    cfg = load_config(None, tiny_overrides(
        tiny_task_dir, run_dir, tiny_model_dir,
        "trainer.backend=ray", "trainer.n_gpus_per_node=2", "trainer.test_freq=-1", "data.val_files=[]",
        "data.max_prompt_length=640", "data.max_response_length=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={calculator_yaml}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
    ))
    run(cfg)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["num_turns/min"] >= 2 for r in rows)
    assert rows[1]["rollout/actor_logprob_diff"] < 1e-3  # step 2 sampled from the updated weights
