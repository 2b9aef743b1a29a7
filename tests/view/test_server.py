"""``hybridflow view`` without a browser: reading run folders (tolerant of bad lines), the JSON
API and its path confinement, the exported file, the command line, the rollout dump's fields."""

from __future__ import annotations

import http.client
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from hybridflow import fields as F
from hybridflow.protocol import DataProto
from hybridflow.tracking import JsonlBackend
from hybridflow.trainer.generations import dump_rollouts, write_jsonl
from hybridflow.view.run_reader import MAX_ROWS, open_run, read_dump, read_metrics


def small_run(root: Path) -> Path:
    """A run folder as the trainer writes it: metrics.jsonl (its own writer) and a rollout dump."""
    backend = JsonlBackend(root)
    for step in (1, 2, 3):
        backend.log({"critic/score/mean": step / 10, "actor/entropy": float("nan") if step == 2 else 1.0}, step=step)
    backend.finish()
    rows = [{"step": 2, "uid": "a", "prompt": "1+1?", "response": "2", "score": 1.0, "pred": "2"}]
    write_jsonl(root / "rollouts" / "2.jsonl", rows)
    write_jsonl(root / "val_generations" / "3.jsonl", [{"input": "q", "output": "a", "score": 0.0, "step": 3}])
    return root


def get(port: int, path: str, host: str | None = None, origin: str | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Host": host or f"127.0.0.1:{port}"} | ({"Origin": origin} if origin else {})
    conn.request("GET", path, headers=headers)
    response = conn.getresponse()
    return response.status, response.read()


def test_read_metrics_keeps_good_rows_and_notes_the_rest(tmp_path):
    run = small_run(tmp_path)
    with (run / "metrics.jsonl").open("a") as f:
        f.write("not json\n")
        f.write('{"no_step": 1}\n')
        f.write('{"step": 4, "x": "text", "y": Infinity}\n')
        f.write('{"step": 5, "critic/score/me')
    rows, notes = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[1]["actor/entropy"] is None and rows[3]["x"] is None and rows[3]["y"] is None
    assert rows[2]["critic/score/mean"] == pytest.approx(0.3)
    assert notes == [
        "metrics.jsonl line 4: not JSON, skipped",
        "metrics.jsonl line 5: no numeric 'step', skipped",
        "metrics.jsonl line 7: cut short (no newline yet), skipped",
        "actor/entropy: 1 NaN/null/non-numeric value(s), shown as gaps",
        "x: 1 NaN/null/non-numeric value(s), shown as gaps",
        "y: 1 NaN/null/non-numeric value(s), shown as gaps",
    ]
    assert read_metrics(tmp_path / "nope.jsonl")[0] == []


def test_read_dump_bounds_rows_text_and_line_size(tmp_path, monkeypatch):
    import hybridflow.view.run_reader as reader

    monkeypatch.setattr(reader, "MAX_LINE_BYTES", 1000)
    path = tmp_path / "1.jsonl"
    with path.open("w") as f:
        f.write(json.dumps({"prompt": "x" * 5000, "response": "y", "score": 1}) + "\n")  # one line too long
        for i in range(MAX_ROWS + 5):
            f.write(json.dumps({"input": f"p{i}", "output": "o", "score": float("nan") if i == 0 else i}) + "\n")
    rows, notes = read_dump(path)
    assert len(rows) == MAX_ROWS and rows[0]["prompt"] == "p0" and rows[0]["response"] == "o"
    assert rows[0]["score"] is None and rows[1]["score"] == 1 and rows[0]["_line"] == 2
    assert notes == [
        "1.jsonl line 1: longer than 1000 bytes, skipped",
        f"1.jsonl: {MAX_ROWS + 5} rows, showing the first {MAX_ROWS}",
    ]


def test_open_run_finds_dumps_and_refuses_non_runs(tmp_path):
    run = open_run(small_run(tmp_path / "r"))
    assert [(d.name, d.kind, d.steps()) for d in run.dumps] == [
        ("rollouts", "rollouts", [2]),
        ("val_generations", "validation", [3]),
    ]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no metrics.jsonl and no folder of"):
        open_run(tmp_path / "empty")
    with pytest.raises(ValueError, match="not a folder"):
        open_run(tmp_path / "missing")


def test_api_serves_only_what_is_inside_the_run_folders(tmp_path, serve):
    run = small_run(tmp_path / "run")
    secret = tmp_path / "secret.jsonl"
    secret.write_text(json.dumps({"prompt": "SECRET", "response": "x", "score": 1}) + "\n")
    os.symlink(secret, run / "rollouts" / "9.jsonl")  # a link inside the run folder pointing out of it
    port = serve(run).port
    status, body = get(port, "/api/runs/0/dumps/0/2")
    assert status == 200 and json.loads(body)["rows"][0]["pred"] == "2"
    status, body = get(port, "/api/runs/0/dumps/0/9")
    assert status == 403 and b"SECRET" not in body and b"outside the run folders" in body
    for path in (
        "/assets/..%2f..%2fmetrics.jsonl",
        "/assets/../run_reader.py",
        "/api/runs/1/metrics",
        "/api/runs/0/dumps/5/2",
        "/api/runs/0/dumps/0/..%2f..%2fsecret",
    ):
        assert get(port, path)[0] in (404, 422), path
    status, body = get(port, "/api/runs/0/metrics?since=1")
    assert status == 200 and [r["step"] for r in json.loads(body)["rows"]] == [2, 3]
    assert get(port, "/api/runs", host="evil.example")[0] == 400  # DNS rebinding
    assert get(port, "/api/runs", origin="http://evil.example")[0] == 403  # another site's page
    status, body = get(port, "/assets/plotly.min.js")
    assert status == 200 and len(body) > 1_000_000  # plotly.js from the plotly package, not a CDN


def test_a_run_without_dumps_answers_404_for_them(tmp_path, serve):
    backend = JsonlBackend(tmp_path)
    backend.log({"x": 1.0}, step=1)
    backend.finish()
    port = serve(tmp_path).port
    assert get(port, "/api/runs/0/dumps/0/1")[0] == 404
    assert json.loads(get(port, "/api/runs")[1])[0]["dumps"] == []


def test_follow_prompt_across_steps(tmp_path, serve):
    run = small_run(tmp_path / "run")
    write_jsonl(run / "rollouts" / "5.jsonl", [{"prompt": "1+1?", "response": "3", "score": 0.0}] * 2)
    status, body = get(serve(run).port, "/api/runs/0/dumps/0/follow?prompt=1%2B1%3F")
    assert status == 200
    assert [(p["step"], p["n"], p["mean_score"]) for p in json.loads(body)] == [(2, 1, 1.0), (5, 2, 0.0)]


def test_export_is_one_file_with_bounded_data(tmp_path):
    from hybridflow.view.export import export_data, render_report

    run = small_run(tmp_path / "run")
    for step in range(10, 16):
        write_jsonl(
            run / "rollouts" / f"{step}.jsonl",
            [{"prompt": f"p{i}", "response": "</script>", "score": i} for i in range(5)],
        )
    data = export_data([open_run(run)], max_steps=3, max_rows=2)
    assert data["api"]["/api/runs"][0]["dumps"][0]["steps"] == [13, 14, 15]
    assert len(data["api"]["/api/runs/0/dumps/0/15"]["rows"]) == 2
    assert "rollouts: the report keeps the last 3 of 7 steps" in data["api"]["/api/runs/0/metrics"]["notes"]
    html = render_report([open_run(run)])
    assert html.count("</script>") == html.count("<script")  # the response's "</script>" cannot end a script
    assert "http://" not in html.split("<script>")[0] and "/assets/" not in html.replace("/assets/{", "")


def test_cli_names_the_install_command_without_the_extra(monkeypatch, tmp_path, capsys):
    import hybridflow.entrypoints.view as view

    monkeypatch.setattr(view.importlib.util, "find_spec", lambda name: None)
    assert view.main([str(small_run(tmp_path))]) == 2
    assert 'pip install "hybridflow[view]"' in capsys.readouterr().err


def test_cli_refuses_a_folder_that_is_no_run(tmp_path, capsys):
    from hybridflow.cli import main

    assert main(["view", str(tmp_path / "missing")]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_cli_warns_for_a_non_loopback_host(monkeypatch, tmp_path, capsys):
    import uvicorn

    import hybridflow.entrypoints.view as view

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, host, port, log_level: seen.update(host=host, port=port))
    assert view.main([str(small_run(tmp_path)), "--host", "0.0.0.0", "--port", "8123"]) == 0
    assert "not a loopback address" in capsys.readouterr().err and seen == {"host": "0.0.0.0", "port": 8123}
    assert view.main([str(tmp_path)]) == 0 and seen["host"] == "127.0.0.1" and seen["port"] > 0
    captured = capsys.readouterr()
    assert "hybridflow view: http://127.0.0.1:" in captured.out and "loopback" not in captured.err


class _CharTokenizer:
    """One character per token id (id = ord): decoding is exact, so the dump can be checked."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(int(i)) for i in ids if int(i))


def test_dump_rollouts_writes_turns_token_values_and_scorer_extras(tmp_path):
    prompt, response = [0, 0, ord("q")], [ord(c) for c in "ab12c"] + [0]
    mask = [1, 1, 0, 0, 1, 0]  # model "ab", tool "12", model "c", padding
    batch = DataProto.from_dict(
        tensors={
            F.PROMPTS: torch.tensor([prompt, prompt]),
            F.RESPONSES: torch.tensor([response, response]),
            F.RESPONSE_MASK: torch.tensor([mask, [1, 1, 1, 1, 1, 0]]),
            F.ATTENTION_MASK: torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 0]] * 2),
            F.TOKEN_LEVEL_SCORES: torch.tensor([[0, 0, 0, 0, 0.5, 0], [0, 0, 0, 0, 1.0, 0]]),
            F.ADVANTAGES: torch.tensor([[0.5, 0.5, 0.0, 0.0, 0.5, 0.0], [-0.5] * 6]),
            F.OLD_LOG_PROBS: torch.tensor([[-1.0, -2.0, -3.0, float("nan"), -5.0, 0.0]] * 2),
        },
        non_tensors={
            F.UID: np.array(["u", "u"], dtype=object),
            F.REWARD_MODEL: np.array([{"ground_truth": "12"}] * 2, dtype=object),
            "pred": np.array(["12", "1"], dtype=object),
            "acc": np.array([1.0, 0.0], dtype=object),
            "judge_notes": np.array(["x" * 10_000] * 2, dtype=object),  # too long for every row: left out
        },
    )
    path = dump_rollouts(tmp_path, 7, _CharTokenizer(), batch, token_rows=1)
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert first["turns"] == [
        {"role": "assistant", "text": "ab"},
        {"role": "tool", "text": "12"},
        {"role": "assistant", "text": "c"},
    ]
    assert first["tokens"] == ["a", "b", "1", "2", "c"] and first["token_mask"] == [1, 1, 0, 0, 1]
    assert first["advantages"] == [0.5, 0.5, 0.0, 0.0, 0.5] and first["old_log_probs"][3] is None
    assert math.isclose(first["score"], 0.5) and first["response_length"] == 5
    assert (first["gts"], first["pred"], first["acc"], second["pred"]) == ("12", "12", 1.0, "1")
    assert "judge_notes" not in first and "turns" not in second and "tokens" not in second
