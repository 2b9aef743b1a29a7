"""Several teachers (distillation.teacher_models): each row is scored by the teacher whose key is
its data source, exactly as that teacher alone scores it; rows come back in order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hybridflow import fields as FK
from hybridflow.models.tiny import save_tiny_model
from hybridflow.protocol import DataProto
from hybridflow.trainer.teachers import TeacherGroups, TeacherRoute, route_rows, teacher_routes
from hybridflow.workers.teacher import TeacherWorker

SOURCES = np.array(["a", "b", "b", "a", "b", "a", "a", "b"], dtype=object)
TOPK = ("distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=4")


@pytest.fixture(scope="module")
def second_teacher_dir(tmp_path_factory) -> Path:
    """A tiny llama with the student's tokenizer and other weights (seed 5)."""
    return save_tiny_model(tmp_path_factory.mktemp("teacher_b") / "tiny-b", arch="llama", seed=5)


def _two_teachers(a: Path, b: Path, *extra: str) -> tuple[str, ...]:
    return (
        "distillation.enabled=true",
        f"distillation.teacher_models.ta.model_path={a}",
        "distillation.teacher_models.ta.key=a",
        "distillation.teacher_models.ta.dtype=fp32",
        f"distillation.teacher_models.tb.model_path={b}",
        "distillation.teacher_models.tb.key=b",
        "distillation.teacher_models.tb.dtype=fp32",
        *extra,
    )


def _workers(cfg) -> dict[str, TeacherWorker]:
    workers = {}
    for name in cfg.distillation.teacher_models:
        workers[name] = TeacherWorker(cfg.distillation, cfg.actor_rollout_ref, name=name)
        workers[name].init_model()
    return workers


def _batch(make_rollout_batch, seed: int = 3) -> DataProto:
    data = make_rollout_batch(seed=seed)
    data.non_tensor_batch["data_source"] = SOURCES.copy()
    return data


@pytest.mark.parametrize("topk", [False, True])
def test_each_row_is_scored_exactly_by_the_teacher_of_its_data_source(
    make_config, make_rollout_batch, tiny_model_dir, second_teacher_dir, topk
):
    cfg = make_config(*_two_teachers(tiny_model_dir, second_teacher_dir, *(TOPK if topk else ())))
    workers = _workers(cfg)
    data = _batch(make_rollout_batch)
    routed = TeacherGroups(teacher_routes(cfg.distillation, workers), "data_source").compute_teacher_log_prob(data)
    keys = [FK.TEACHER_LOG_PROB, *((FK.TEACHER_TOPK_LOG_PROBS, FK.TEACHER_TOPK_IDS) if topk else ())]
    assert sorted(routed.batch.keys()) == sorted(keys) and len(routed) == len(data)
    alone = {name: w.compute_teacher_log_prob(data).batch for name, w in workers.items()}  # every row, one teacher
    for i, source in enumerate(SOURCES):
        mine, other = ("ta", "tb") if source == "a" else ("tb", "ta")
        for key in keys:
            assert torch.equal(routed.batch[key][i], alone[mine][key][i]), (i, key)
        assert not torch.equal(routed.batch[FK.TEACHER_LOG_PROB][i], alone[other][FK.TEACHER_LOG_PROB][i])


def test_a_data_source_without_a_teacher_is_an_error(
    make_config, make_rollout_batch, tiny_model_dir, second_teacher_dir
):
    cfg = make_config(*_two_teachers(tiny_model_dir, second_teacher_dir))
    data = _batch(make_rollout_batch)
    data.non_tensor_batch["data_source"][5] = "gsm8k"
    groups = TeacherGroups(teacher_routes(cfg.distillation, _workers(cfg)), "data_source")
    with pytest.raises(ValueError, match=r"data source 'gsm8k' match no teacher.* are 'a', 'b'"):
        groups.compute_teacher_log_prob(data)
    del data.non_tensor_batch["data_source"]
    with pytest.raises(ValueError, match="column 'data_source'"):
        groups.compute_teacher_log_prob(data)


def test_the_older_teacher_model_scores_like_one_teacher_without_a_key(
    make_config, make_rollout_batch, tiny_model_dir, second_teacher_dir
):
    legacy = make_config(
        "distillation.enabled=true",
        f"distillation.teacher_model.model_path={second_teacher_dir}",
        "distillation.teacher_model.dtype=fp32",
    )
    new = make_config(
        "distillation.enabled=true",
        f"distillation.teacher_models.only.model_path={second_teacher_dir}",
        "distillation.teacher_models.only.dtype=fp32",
    )
    assert list(legacy.distillation.teacher_models) == ["teacher"]
    assert legacy.distillation.teacher_models["teacher"] == new.distillation.teacher_models["only"]
    data = _batch(make_rollout_batch)
    data.non_tensor_batch["data_source"][:] = "anything"  # no key: every row, whatever its source
    out = [
        TeacherGroups(teacher_routes(c.distillation, _workers(c)), "data_source").compute_teacher_log_prob(data)
        for c in (legacy, new)
    ]
    assert torch.equal(out[0].batch[FK.TEACHER_LOG_PROB], out[1].batch[FK.TEACHER_LOG_PROB])


class _Ranks:
    """A teacher group of ``world_size`` ranks that records the row counts it is given."""

    def __init__(self, world_size: int, value: float) -> None:
        self.world_size, self.value, self.seen = world_size, value, []

    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        self.seen.append(len(data))
        rows = data.batch[FK.RESPONSES].shape
        ids = torch.arange(len(data), dtype=torch.float32)[:, None].expand(rows)
        return DataProto.from_dict(tensors={FK.TEACHER_LOG_PROB: self.value + ids})


def test_each_teachers_share_is_padded_to_its_ranks_and_rows_come_back_in_order(make_rollout_batch):
    a, b = _Ranks(3, 100.0), _Ranks(2, 200.0)
    data = _batch(make_rollout_batch)
    data.non_tensor_batch["data_source"] = np.array(["b", "a", "a", "b", "a", "a", "b", "a"], dtype=object)
    out = TeacherGroups([TeacherRoute("x", "a", a), TeacherRoute("y", "b", b)], "data_source")
    values = out.compute_teacher_log_prob(data).batch[FK.TEACHER_LOG_PROB][:, 0].tolist()
    # five a-rows padded to 6 (3 ranks), three b-rows padded to 4 (2 ranks); each row gets its own
    assert a.seen == [6] and b.seen == [4]
    assert values == [200.0, 100.0, 101.0, 201.0, 102.0, 103.0, 202.0, 104.0]


def test_route_rows_one_teacher_with_a_key_still_checks_every_row():
    routes = [TeacherRoute("t", "a", None)]
    assert [p.tolist() for p in route_rows(["a", "a"], routes)] == [[0, 1]]
    with pytest.raises(ValueError, match="'b' match no teacher"):
        route_rows(["a", "b"], routes)
    assert [p.tolist() for p in route_rows(["x", "y"], [TeacherRoute("t", None, None)])] == [[0, 1]]
