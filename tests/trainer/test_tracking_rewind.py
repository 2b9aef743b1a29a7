"""Tracking.rewind: on resume every backend drops what was logged at or past the first step the
resumed run logs, so each step has one row; dropped jsonl rows are kept aside, not lost."""

from __future__ import annotations

import json

from hybridflow.tracking import JsonlBackend, Tracking, read_jsonl_metrics


def _steps(path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def test_jsonl_rewind_drops_rows_past_the_checkpoint_and_keeps_them_aside(tmp_path, capsys):
    tracking = Tracking(["jsonl"], tmp_path)
    for step in (1, 2, 3, 4):
        tracking.log({"loss": float(step)}, step=step)
    tracking.finish()
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "lo')  # a line cut short by the crash
    resumed = Tracking(["jsonl"], tmp_path)
    resumed.rewind(3)  # resumed from the checkpoint of step 2
    assert _steps(tmp_path / "metrics.jsonl") == [1, 2]
    dropped = (tmp_path / JsonlBackend.DROPPED_FILE).read_text().splitlines()
    assert [json.loads(line)["step"] for line in dropped[:2]] == [3, 4] and dropped[2] == '{"step": 5, "lo'
    assert "3 row(s) from step 3 on" in capsys.readouterr().out
    resumed.log({"loss": 30.0}, step=3)
    resumed.finish()
    rows = read_jsonl_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["loss"] == 30.0


def test_jsonl_rewind_with_nothing_past_it_changes_nothing(tmp_path):
    tracking = Tracking(["jsonl"], tmp_path)
    tracking.log({"a": 1.0}, step=0)
    tracking.log({"a": 2.0}, step=1)
    before = (tmp_path / "metrics.jsonl").read_bytes()
    tracking.rewind(2)
    tracking.finish()
    assert (tmp_path / "metrics.jsonl").read_bytes() == before
    assert not (tmp_path / JsonlBackend.DROPPED_FILE).exists()


def test_fresh_start_rewinds_to_before_step_zero(tmp_path):
    # a run that crashed before its first checkpoint starts over: its rows (and step 0's
    # validation row, logged again) go aside
    tracking = Tracking(["jsonl"], tmp_path)
    for step in (0, 1, 2):
        tracking.log({"a": 1.0}, step=step)
    tracking.rewind(0)
    tracking.log({"a": 5.0}, step=0)
    tracking.finish()
    assert _steps(tmp_path / "metrics.jsonl") == [0]
    assert _steps(tmp_path / JsonlBackend.DROPPED_FILE) == [0, 1, 2]


def test_tensorboard_rewind_purges_the_steps_logged_again(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = Tracking(["tensorboard"], tmp_path)
    for step in (1, 2, 3, 4):
        first.log({"loss": float(step)}, step=step)
    first.finish()
    resumed = Tracking(["tensorboard"], tmp_path)
    resumed.rewind(3)
    for step in (3, 4):
        resumed.log({"loss": 10.0 * step}, step=step)
    resumed.finish()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = [(e.step, e.value) for e in events.Scalars("loss")]
    assert scalars == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]


def test_console_rewind_is_a_no_op(tmp_path):
    lines: list[str] = []
    tracking = Tracking(["console"], tmp_path, print_fn=lines.append)
    tracking.log({"critic/score/mean": 0.5}, step=1)
    tracking.rewind(1)
    assert lines == ["step 1 | score 0.5"]
