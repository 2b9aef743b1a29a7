"""The controller resolves every model a run's workers will load before it starts them, so a Hub id
is downloaded once (not by each Ray worker, judge or teacher process at the same time)."""

from __future__ import annotations

from hybridflow.config import load_config
from hybridflow.entrypoints.train import other_model_paths


def test_hub_ids_of_critic_reward_model_and_teachers_are_listed(tmp_path):
    cfg = load_config(
        None,
        [
            "trainer.device=cpu",
            "critic.model.path=org/critic@v1",
            "reward_model.enable=true",
            "reward_model.model.path=org/rm",
            f"data.tokenizer={tmp_path}",  # a local folder: nothing to fetch
            "distillation.enabled=true",
            "distillation.teacher_models.big.model_path=org/teacher",
        ],
    )
    assert other_model_paths(cfg) == ["org/critic@v1", "org/rm", "org/teacher"]


def test_a_reward_model_that_is_off_is_not_fetched():
    cfg = load_config(None, ["trainer.device=cpu", "reward_model.model.path=org/rm"])
    assert other_model_paths(cfg) == []
