import pytest

from hybridflow.tracking import Tracking, read_jsonl_metrics
from hybridflow.trainer.metrics import Timer, reduce_metrics, validation_extra_metrics, validation_metrics


def test_jsonl_and_console(tmp_path):
    lines = []
    t = Tracking(["console", "jsonl"], tmp_path, print_fn=lines.append)
    t.log({"critic/score/mean": 0.5, "timing_s/step": 2.0, "note": "text is dropped"}, step=1)
    t.log({"critic/score/mean": 0.75}, step=2)
    t.finish()
    rows = read_jsonl_metrics(tmp_path)
    assert rows == [{"step": 1, "critic/score/mean": 0.5, "timing_s/step": 2.0}, {"step": 2, "critic/score/mean": 0.75}]
    assert lines[0] == "step 1 | score 0.5 | step_s 2"


def test_unknown_backend_is_named(tmp_path):
    with pytest.raises(ValueError, match="mlflow"):
        Tracking(["console", "mlflow"], tmp_path)


def test_tensorboard_writes_events(tmp_path):
    t = Tracking(["tensorboard"], tmp_path)
    t.log({"a": 1.0}, step=0)
    t.finish()
    assert list((tmp_path / "tensorboard").glob("events.*"))


def test_validation_metrics_by_hand():
    # prompt p1: scores 1,0 (answers "4","5"); p2: 0,0 ("7","7"); p3 (other source): 1
    m = validation_metrics(
        data_sources=["a", "a", "a", "a", "b"],
        prompt_ids=["p1", "p1", "p2", "p2", "p3"],
        scores=[1.0, 0.0, 0.0, 0.0, 1.0],
        preds=["4", "5", "7", "7", "9"],
    )
    assert m["val-core/a/reward/mean@2"] == pytest.approx(0.25)
    assert m["val-core/a/reward/best@2"] == pytest.approx(0.5)
    # p1 tie → first most common ("4", score 1); p2 → "7" (0) → mean 0.5
    assert m["val-core/a/reward/maj@2"] == pytest.approx(0.5)
    assert m["val-core/b/reward/mean@1"] == 1.0
    assert "val-core/b/reward/best@1" not in m


def test_validation_extra_metrics_by_hand():
    # p1: acc 1, 0 → 0.5; p2: acc 0, 0 → 0; p3 (source b): True → 1; "pred" is not a number
    m = validation_extra_metrics(
        ["a", "a", "a", "a", "b"],
        ["p1", "p1", "p2", "p2", "p3"],
        {"acc": [1.0, 0.0, 0, 0, True], "pred": ["4", "5", "7", "7", "9"], "passed": [3, 1, 0, 2, 4]},
    )
    assert m == {
        "val-aux/a/acc/mean@2": pytest.approx(0.25), "val-aux/b/acc/mean@1": 1.0,
        "val-aux/a/passed/mean@2": pytest.approx(1.5), "val-aux/b/passed/mean@1": 4.0,
    }


def test_reduce_and_timer():
    assert reduce_metrics({"x": [1.0, 3.0], "y": 2}) == {"x": 2.0, "y": 2.0}
    timer = Timer()
    with timer.phase("gen"):
        pass
    assert set(timer.metrics()) == {"timing_s/gen"} and timer.metrics()["timing_s/gen"] >= 0
