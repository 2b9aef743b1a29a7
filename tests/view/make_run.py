"""Records the tiny run the view tests load: a real ``hybridflow train`` run (GRPO on the tiny
model, the calculator tool agent, rollout and validation dumps with per-token values).

Each trajectory's first turn is a forced calculator call (the random tiny model never writes
one), so every rollout has a model turn, a tool turn and a model turn again. Run as a script to
write one for a look: ``python tests/view/make_run.py OUT_DIR``.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

SCORER = '''
import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Dense (share of lowercase letters) so groups vary; pred and acc as verl's math scorers."""
    numbers = re.findall(r"-?\\d+", solution_str)
    pred = numbers[-1] if numbers else ""
    dense = sum("a" <= ch <= "z" for ch in solution_str) / max(len(solution_str), 1)
    return {"score": dense, "acc": float(pred == str(ground_truth)), "pred": pred}
'''
CALL_TEXT = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>'
STEPS = 3
TOKEN_ROWS = 4


def overrides(task_dir: Path, model_dir: Path, run_dir: Path, scorer: Path, tools: Path) -> list[str]:
    return [
        f"data.train_files=[{task_dir / 'train.parquet'}]",
        f"data.val_files=[{task_dir / 'test.parquet'}]",
        "data.train_batch_size=4",
        "data.max_prompt_length=640",
        "data.max_response_length=128",
        "data.val_max_samples=4",
        "data.apply_chat_template_kwargs.enable_thinking=false",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.model.dtype=fp32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        f"custom_reward_function.path={scorer}",
        f"trainer.total_training_steps={STEPS}",
        "trainer.val_before_train=false",
        "trainer.test_freq=2",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={run_dir}",
        f"trainer.rollout_data_dir={run_dir / 'rollouts'}",
        f"trainer.validation_data_dir={run_dir / 'validation'}",
        f"trainer.rollout_token_rows={TOKEN_ROWS}",
    ]


def record_run(out: Path, model_dir: Path, task_dir: Path) -> Path:
    """Train the tiny run into ``out / 'run'`` and return that folder."""
    import hybridflow.workers.rollout.agent_loop as agent_loop_module
    from hybridflow.config import load_config
    from hybridflow.entrypoints.train import run
    from tests.forced_tool_call import ForcedToolCall

    scorer, tools, run_dir = out / "scorer.py", out / "tools.yaml", out / "run"
    scorer.write_text(SCORER)
    tools.write_text("tools:\n  - class_name: hybridflow.tools.calculator.CalculatorTool\n    config: {type: native}\n")
    real_client = agent_loop_module.InProcessClient
    agent_loop_module.InProcessClient = lambda engine, stop_token_ids=None: ForcedToolCall(  # type: ignore[misc]
        _tokenizer(model_dir), real_client(engine, stop_token_ids), CALL_TEXT
    )
    try:
        run(load_config(None, overrides(task_dir, model_dir, run_dir, scorer, tools)))
    finally:
        agent_loop_module.InProcessClient = real_client  # type: ignore[misc]
    return run_dir


@functools.cache
def _tokenizer(model_dir: Path) -> Any:
    from hybridflow.models.loader import load_tokenizer

    return load_tokenizer(str(model_dir))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests/forced_tool_call.py
    from hybridflow.entrypoints.data import main as data_main
    from hybridflow.models.tiny import save_tiny_model

    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    model = save_tiny_model(target / "tiny-llama", arch="llama", seed=0)
    assert (
        data_main(
            ["arithmetic", "--out", str(target / "task"), "--train-size", "32", "--test-size", "8", "--digits", "1"]
        )
        == 0
    )
    print(record_run(target, model, target / "task"))
