"""The distillation section's teachers: verl's ``teacher_models.<name>`` map, the older single
``teacher_model`` read as one teacher, and what each layout refuses."""

from __future__ import annotations

import logging

import pytest
import yaml

from hybridflow.config import ConfigError, load_config
from hybridflow.config.build import to_dict
from hybridflow.config.distillation import DistillationConfig, TeacherModelConfig

ON = "distillation.enabled=true"
M = "distillation.teacher_models"


def test_teacher_models_are_parsed_and_resolved_per_teacher():
    cfg = load_config(
        None,
        [
            ON,
            f"{M}.a.model_path=/t/a",
            f"{M}.a.key=a",
            f"{M}.b.model_path=/t/b",
            f"{M}.b.key=7",
            f"{M}.b.log_prob_micro_batch_size_per_gpu=2",
            f"{M}.b.dtype=fp32",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=3",
        ],
    )
    a, b = cfg.distillation.teacher_models["a"], cfg.distillation.teacher_models["b"]
    assert list(cfg.distillation.teacher_models) == ["a", "b"]
    assert (a.model_path, a.key, a.dtype, a.log_prob_micro_batch_size_per_gpu) == ("/t/a", "a", "auto", 3)
    assert (b.model_path, b.key, b.dtype, b.log_prob_micro_batch_size_per_gpu) == ("/t/b", "7", "fp32", 2)
    assert cfg.distillation.teacher_model == TeacherModelConfig()  # resolved: each teacher named once


def test_the_older_teacher_model_is_one_teacher_named_teacher_without_a_key():
    cfg = load_config(None, [ON, "distillation.teacher_model.model_path=/t/x", "distillation.teacher_model.dtype=fp32"])
    assert list(cfg.distillation.teacher_models) == ["teacher"]
    t = cfg.distillation.teacher_models["teacher"]
    assert (t.model_path, t.key, t.dtype) == ("/t/x", None, "fp32")
    assert load_config(None, []).distillation.teacher_models == {}


def test_a_resolved_config_written_out_loads_back_the_same(tmp_path):
    cfg = load_config(None, [ON, "distillation.teacher_model.model_path=/t/x"])
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(to_dict(cfg)))
    assert load_config([str(path)], []).distillation == cfg.distillation


def test_verl_teacher_server_settings_are_ignored_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="hybridflow.config"):
        cfg = load_config(None, [ON, f"{M}.a.model_path=/t/a", f"{M}.a.inference.gpu_memory_utilization=0.5"])
    assert cfg.distillation.teacher_models["a"].model_path == "/t/a"
    assert "ignored: distillation.teacher_models.a.inference" in caplog.text


def test_verl_defaults_of_the_distillation_loss():
    loss = DistillationConfig().distillation_loss
    assert (loss.use_policy_gradient, loss.topk, loss.loss_max_clamp, loss.log_prob_min_clamp) == (
        False,
        32,
        None,
        None,
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ((f"{M}.a.modle_path=/t",), f"{M}.a.modle_path: unknown key; did you mean {M}.a.model_path?"),
        ((f"{M}.a.nnodes=-1",), f"{M}.a.nnodes: must be ≥ 0, got -1"),
        ((f"{M}.a.dtype=fp8",), f"{M}.a.dtype: must be one of"),
        ((f"{M}.a=3",), f"{M}.a: a teacher is a section"),
        (
            (ON, f"{M}.a.model_path=/t", "distillation.teacher_model.model_path=/u"),
            "distillation.teacher_model and distillation.teacher_models both set teachers",
        ),
        (
            (ON, f"{M}.a.model_path=/t", f"{M}.b.model_path=/u", f"{M}.b.key=b"),
            "with several teachers each needs a key .* a has none",
        ),
        (
            (ON, f"{M}.a.model_path=/t", f"{M}.a.key=x", f"{M}.b.model_path=/u", f"{M}.b.key=x"),
            "teachers a, b share key 'x'",
        ),
        ((ON, f"{M}.a.key=x"), f"{M}.a.model_path: missing"),
        ((ON,), "needs distillation.teacher_model.model_path or distillation.teacher_models.<name>.model_path"),
        ((ON, f"{M}.a.model_path=/t", "distillation.nnodes=1"), "shared pool needs both >= 1"),
        (
            (ON, f"{M}.a.model_path=/t", "distillation.nnodes=1", "distillation.n_gpus_per_node=1"),
            "needs trainer.backend=ray",
        ),
        (
            (
                ON,
                f"{M}.a.model_path=/t",
                f"{M}.a.enable_resource_pool=true",
                f"{M}.a.nnodes=1",
                f"{M}.a.n_gpus_per_node=1",
                "trainer.backend=ray",
                "distillation.nnodes=1",
                "distillation.n_gpus_per_node=1",
            ),
            "every teacher has its own",
        ),
    ],
)
def test_bad_teacher_layouts_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("?", r"\?").replace(r"\.*", ".*")):
        load_config(None, list(overrides))
