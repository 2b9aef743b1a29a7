"""A 2-step GRPO run whose tool is a verl-signature class named by its class path (issue 30,
part 5): each trajectory creates, executes and releases its own instance, and the reward the
tool computes with ``calc_reward`` reaches the batch as the step reward (``tool_rewards``)."""

from __future__ import annotations

from collections import Counter

from hybridflow.models.tiny import build_tiny_tokenizer
from hybridflow.protocol import DataProto
from tests.forced_tool_call import ForcedToolCall

CALL_TEXT = '<tool_call>\n{"name": "check_answer", "arguments": {"answer": "84"}}\n</tool_call>'
STEPS, BATCH, N = 2, 4, 2


def test_two_grpo_steps_drive_a_verl_tool(verl_tools, tiny_task_dir, tiny_model_dir, tmp_path, monkeypatch):
    from hybridflow.config import load_config
    from hybridflow.entrypoints.train import build_trainer
    from hybridflow.trainer.phases import PolicyUpdate
    from hybridflow.workers.rollout import agent_loop as agent_loop_module

    real_client = agent_loop_module.InProcessClient
    tok = build_tiny_tokenizer()
    monkeypatch.setattr(
        agent_loop_module,
        "InProcessClient",
        lambda engine, stop_token_ids=None: ForcedToolCall(tok, real_client(engine, stop_token_ids), CALL_TEXT),
    )
    seen: list[DataProto] = []
    real_adv = PolicyUpdate.compute_advantage

    def record(self, batch):
        seen.append(batch)
        return real_adv(self, batch)

    monkeypatch.setattr(PolicyUpdate, "compute_advantage", record)
    tools_yaml = tmp_path / "tools.yaml"
    tools_yaml.write_text(
        f"tools:\n  - class_name: {verl_tools.__name__}.AnswerCheckTool\n"
        "    config: {type: native, bonus: 0.75, expected: '84'}\n"
        "    tool_schema:\n      type: function\n      function:\n        name: check_answer\n"
        "        description: Check an answer.\n        parameters:\n          type: object\n"
        "          properties: {answer: {type: string}}\n          required: [answer]\n"
    )
    verl_tools.EVENTS.clear()
    cfg = load_config(
        None,
        [
            f"data.train_files=[{tiny_task_dir / 'train.parquet'}]",
            "data.val_files=[]",
            f"data.train_batch_size={BATCH}",
            "data.max_prompt_length=640",
            "data.max_response_length=96",
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "actor_rollout_ref.model.dtype=fp32",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            f"actor_rollout_ref.rollout.n={N}",
            f"trainer.total_training_steps={STEPS}",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={tmp_path / 'run'}",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools_yaml}",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
            "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        ],
    )
    trainer = build_trainer(cfg)
    try:
        last = trainer.fit()
    finally:
        trainer.close()
    assert trainer.global_steps == STEPS and len(seen) == STEPS
    trajectories = STEPS * BATCH * N
    kinds = Counter(event[0] for event in verl_tools.EVENTS)
    assert kinds == {"create": trajectories, "execute": trajectories, "release": trajectories}
    created = [e[2] for e in verl_tools.EVENTS if e[0] == "create"]
    assert len(set(created)) == trajectories  # one instance per trajectory, under the tool's own id
    assert sorted(e[1] for e in verl_tools.EVENTS if e[0] == "release") == sorted(created)
    assert all(e[2] == 0.75 for e in verl_tools.EVENTS if e[0] == "execute")  # calc_reward's value
    for batch in seen:
        assert [list(r) for r in batch.non_tensor_batch["tool_rewards"]] == [[0.75]] * (BATCH * N)
    assert last["tool_call_counts/mean"] == 1.0
