"""Dotted overrides and YAML files: every value type, precedence, verl's prefixes, interpolation."""

from __future__ import annotations

import textwrap

import pytest

from hybridflow.config import ConfigError, load_config
from hybridflow.config.sources import parse_override


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("a.b=4", ("a.b", 4)),
        ("a.b=1e-6", ("a.b", 1e-6)),
        ("a.b=-2.5E+3", ("a.b", -2500.0)),
        ("a.b=True", ("a.b", True)),
        ("a.b=false", ("a.b", False)),
        ("a.b=null", ("a.b", None)),
        ("a.b=off", ("a.b", "off")),  # only true/false are booleans (YAML 1.2, OmegaConf), not off/on/yes/no
        ("a.b=yes", ("a.b", "yes")),
        ("a.b=[on, No]", ("a.b", ["on", "No"])),
        ("a.b=text", ("a.b", "text")),
        ("a.b='quoted text'", ("a.b", "quoted text")),
        ("a.b=", ("a.b", "")),
        ("a.b=[console,tensorboard]", ("a.b", ["console", "tensorboard"])),
        ("a.b=['console']", ("a.b", ["console"])),
        ("a.b={temperature: 0.6, n: 2}", ("a.b", {"temperature": 0.6, "n": 2})),
        ("+a.b=1", ("a.b", 1)),
        ("++a.b=1", ("a.b", 1)),
        ("a.b=x=y", ("a.b", "x=y")),
    ],
)
def test_parse_override_values(item, expected):
    assert parse_override(item) == expected


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("trainer.seed", "must look like key=value"),
        ("trainer..seed=1", "is not a dotted key"),
        ("a.b=[1,2", "not valid YAML"),
    ],
)
def test_parse_override_errors(item, message):
    with pytest.raises(ConfigError, match=message):
        parse_override(item)


def test_tilde_deletes_a_key_back_to_its_default(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("trainer:\n  seed: 7\n  total_epochs: 3\n")
    assert load_config([str(path)], ["~trainer.seed"]).trainer.seed == 1  # the default again
    assert load_config([str(path)], ["~trainer.seed=7"]).trainer.seed == 1
    assert load_config([str(path)], ["~trainer.nnodes"]).trainer.total_epochs == 3  # not set: nothing to delete
    with pytest.raises(ConfigError, match="trainer.seed is 7, not 8; nothing deleted"):
        load_config([str(path)], ["~trainer.seed=8"])


def test_overrides_of_every_type_reach_the_dataclasses():
    cfg = load_config(
        None,
        [
            "data.train_batch_size=16",  # int
            "actor_rollout_ref.actor.optim.lr=3e-6",  # float written without a dot
            "actor_rollout_ref.actor.entropy_coeff=1",  # int into a float key
            "actor_rollout_ref.actor.use_kl_loss=True",  # bool, verl spelling
            "trainer.val_before_train=false",
            "trainer.experiment_name=exp_1",  # str
            "trainer.project_name=2024",  # number into a str key
            "trainer.logger=[console,tensorboard]",  # list
            "data.val_files=/tmp/v.parquet",  # single item into a list key
            "trainer.total_training_steps=null",  # null
            "actor_rollout_ref.rollout.val_kwargs.n=3",  # nested
            "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",  # nested two levels
            "data.apply_chat_template_kwargs.enable_thinking=false",  # into a map key
            "actor_rollout_ref.rollout.multi_turn={enable: false, max_assistant_turns: 3}",  # map into a section
            "+trainer.seed=7",  # verl's '+' prefix
        ],
    )
    arr = cfg.actor_rollout_ref
    assert cfg.data.train_batch_size == 16
    assert arr.actor.optim.lr == 3e-6 and isinstance(arr.actor.optim.lr, float)
    assert arr.actor.entropy_coeff == 1.0 and isinstance(arr.actor.entropy_coeff, float)
    assert arr.actor.use_kl_loss is True and cfg.trainer.val_before_train is False
    assert cfg.trainer.experiment_name == "exp_1" and cfg.trainer.project_name == "2024"
    assert cfg.trainer.logger == ("console", "tensorboard")
    assert cfg.data.val_files == ("/tmp/v.parquet",)
    assert cfg.trainer.total_training_steps is None
    assert arr.rollout.val_kwargs.n == 3 and arr.rollout.val_kwargs.temperature == 0.0
    assert arr.actor.policy_loss.loss_mode == "gspo"
    assert cfg.data.apply_chat_template_kwargs == {"enable_thinking": False}
    assert arr.rollout.multi_turn.enable is False and arr.rollout.multi_turn.max_assistant_turns == 3
    assert arr.rollout.multi_turn.max_parallel_calls == 1  # untouched keys of the section keep defaults
    assert cfg.trainer.seed == 7 and arr.rollout.seed == 7


def test_files_then_overrides_in_order(tmp_path):
    first = tmp_path / "first.yaml"
    first.write_text(
        textwrap.dedent(
            """
            algorithm:
              adv_estimator: rloo
              gamma: 0.9
            trainer:
              total_training_steps: 5
              logger: [console, jsonl]
            actor_rollout_ref:
              actor:
                optim:
                  lr: 1e-5
            """
        )
    )
    second = tmp_path / "second.yaml"
    second.write_text("algorithm:\n  gamma: 0.8\n")
    cfg = load_config([str(first), str(second)], ["trainer.total_training_steps=null", "algorithm.lam=0.5"])
    assert cfg.algorithm.adv_estimator == "rloo"  # from the first file
    assert cfg.algorithm.gamma == 0.8  # the second file overrides the first
    assert cfg.algorithm.lam == 0.5  # the override
    assert cfg.trainer.total_training_steps is None  # null from the command line beats the file
    assert cfg.trainer.logger == ("console", "jsonl")
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-5


def test_empty_yaml_file_is_no_change(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config([str(empty)], []) == load_config()


def test_bad_files_name_the_file(tmp_path):
    not_a_map = tmp_path / "list.yaml"
    not_a_map.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match=r"list\.yaml: top level must be a mapping of keys, got list"):
        load_config([str(not_a_map)])
    with pytest.raises(ConfigError, match=r"missing\.yaml' cannot be read"):
        load_config([str(tmp_path / "missing.yaml")])


def test_interpolation_over_defaults_and_user_values():
    cfg = load_config(
        None,
        [
            "trainer.experiment_name=grpo_n${actor_rollout_ref.rollout.n}",
            "trainer.rollout_data_dir=runs/${trainer.project_name}/${trainer.experiment_name}",
        ],
    )
    assert cfg.trainer.experiment_name == "grpo_n4"
    assert cfg.trainer.rollout_data_dir == "runs/hybridflow/grpo_n4"
    assert cfg.trainer.default_local_dir == "checkpoints/hybridflow/grpo_n4"


def test_interpolation_of_a_missing_key_is_an_error():
    with pytest.raises(ConfigError, match="interpolation failed"):
        load_config(None, ["trainer.experiment_name=${trainer.no_such_key}"])
