"""``hybridflow view`` in a real browser (headless system Chromium): curves, the rollout table,
a tool conversation, the token overlay, live updates, the exported file, bad input.

Every test also fails on any console error (the ``page`` fixture)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from hybridflow.tracking import JsonlBackend


def wait_for(driver: Any, script: str, timeout: float = 20.0) -> Any:
    """Poll ``return <script>`` in the page until it is truthy; its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = driver.execute_script(f"return {script}")
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for: {script}"
        time.sleep(0.05)


def open_page(driver: Any, url: str) -> None:
    driver.get(url)
    wait_for(driver, "document.body.dataset.ready === '1'")
    if "tab=" not in url:
        curves_drawn(driver)


def curves_drawn(driver: Any) -> None:
    """Charts are drawn visible-first, the rest in the background: wait for all of them."""
    wait_for(driver, "document.body.dataset.curves === 'done'")


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def metric_groups(run: Path) -> set[str]:
    keys = {k for row in rows_of(run / "metrics.jsonl") for k in row if k != "step"}
    return {k.split("/")[0] if "/" in k else "other" for k in keys}


CHARTS_WITH_DATA = """[...document.querySelectorAll('details.group')].map(g => [g.dataset.group,
  [...g.querySelectorAll('.chart')].filter(c => c.data && c.data.some(t => t.y.some(v => v !== null))).length])"""


def test_curves_render_a_chart_per_group(page, serve, recorded_run):
    open_page(page, serve(recorded_run).url)
    groups = dict(page.execute_script(f"return {CHARTS_WITH_DATA}"))
    assert set(groups) == metric_groups(recorded_run)
    assert {"actor", "critic", "timing_s", "perf", "val-core"} <= set(groups)
    assert all(n >= 1 for n in groups.values()), groups
    # one chart per metric: the actor group has exactly the run's actor/ keys
    actor_keys = {k for row in rows_of(recorded_run / "metrics.jsonl") for k in row if k.startswith("actor/")}
    assert groups["actor"] == len(actor_keys)
    # the name filter leaves one chart (and makes the redraws below cheap)
    page.find_element("id", "metric-filter").send_keys("critic/score/mean")
    curves_drawn(page)
    visible = page.execute_script("return [...document.querySelectorAll('.chart')].filter(c => c.offsetParent)")
    assert [c.get_attribute("data-metric") for c in visible] == ["critic/score/mean"]
    # smoothing and log scale redraw the charts
    page.execute_script(
        "const s = document.getElementById('smoothing'); s.value = 0.9; s.dispatchEvent(new Event('input'))"
    )
    curves_drawn(page)
    smoothed = page.execute_script(
        "return document.querySelector('.chart[data-metric=\"critic/score/mean\"]').data[0].y"
    )
    raw = [r["critic/score/mean"] for r in rows_of(recorded_run / "metrics.jsonl")]
    assert smoothed[:2] == pytest.approx([raw[0], 0.9 * raw[0] + 0.1 * raw[1]])  # W&B's moving average
    page.find_element("id", "log-scale").click()
    curves_drawn(page)
    axis = page.execute_script(
        "return document.querySelector('.chart[data-metric=\"critic/score/mean\"]').layout.yaxis.type"
    )
    assert axis == "log"
    # wall time: metrics.jsonl has no clock, so the x-axis is the running sum of the step times
    page.execute_script(
        "const x = document.getElementById('x-axis'); x.value = 'wall'; x.dispatchEvent(new Event('input'))"
    )
    curves_drawn(page)
    xs = page.execute_script("return document.querySelector('.chart[data-metric=\"critic/score/mean\"]').data[0].x")
    rows = rows_of(recorded_run / "metrics.jsonl")
    total = 0.0
    expected = []
    for row in rows:
        total += row["timing_s/step"] + (row.get("timing_s/testing") or 0.0)
        expected.append(round(total, 2))
    assert xs == pytest.approx(expected, abs=0.01)


def open_rollouts(page: Any, url: str) -> None:
    open_page(page, url + "?tab=rollouts")
    wait_for(page, "document.querySelectorAll('#ro-table tbody tr').length > 0")


def test_rollout_table_rows_sort_and_filter(page, serve, recorded_run):
    open_rollouts(page, serve(recorded_run).url)
    last = max(int(p.stem) for p in (recorded_run / "rollouts").glob("*.jsonl"))
    expected = rows_of(recorded_run / "rollouts" / f"{last}.jsonl")
    assert page.execute_script("return document.getElementById('ro-step').value") == str(last)
    assert len(page.find_elements("css selector", "#ro-table tbody tr")) == len(expected) == 8
    headers = [th.text.split(" ")[0] for th in page.find_elements("css selector", "#ro-table th")]
    assert {"prompt", "response", "score", "response_length", "pred", "acc"} <= set(headers)
    page.find_element("css selector", '#ro-table th[data-key="score"]').click()  # ascending
    page.find_element("css selector", '#ro-table th[data-key="score"]').click()  # descending
    shown = [float(td.text) for td in page.find_elements("css selector", '#ro-table td[data-key="score"]')]
    assert shown == pytest.approx(sorted((r["score"] for r in expected), reverse=True), rel=1e-3)
    cut = sorted(r["score"] for r in expected)[4]
    page.find_element("id", "ro-min").send_keys(str(cut))
    wanted = sum(r["score"] >= cut for r in expected)
    wait_for(page, f"document.querySelectorAll('#ro-table tbody tr').length === {wanted}")
    assert page.find_element("id", "ro-count").text == f"{wanted} of 8 rows"


def test_tool_conversation_turns_and_token_overlay(page, serve, recorded_run):
    open_rollouts(page, serve(recorded_run).url)
    page.find_element("css selector", '#ro-table tbody tr[data-line="1"]').click()
    wait_for(page, "document.querySelector('#ro-conversation .turn')")
    roles = [
        t.get_attribute("data-role") for t in page.find_elements("css selector", "#ro-conversation .turn[data-role]")
    ]
    assert roles[:3] == ["assistant", "tool", "assistant"]  # the forced call, the calculator's result, the model
    tool = page.find_element("css selector", '#ro-conversation .turn[data-role="tool"]').text
    assert "84" in tool  # 12*7
    assert page.find_element("id", "ro-overlay").get_attribute("value") == "advantages"
    colours = page.execute_script(
        "return [...document.querySelectorAll('#ro-conversation .tok')].map(s => s.style.backgroundColor)"
    )
    row = rows_of(recorded_run / "rollouts" / "3.jsonl")[0]
    assert len(colours) == len(row["tokens"])
    nonzero = sum(a not in (0.0, None) for a in row["advantages"])
    assert sum(c not in ("", "transparent", "rgba(0, 0, 0, 0)") for c in colours) == nonzero > 0
    options = page.execute_script("return [...document.querySelectorAll('#ro-overlay option')].map(o => o.value)")
    assert {"advantages", "old_log_probs", "rollout_log_probs", "entropys", "is_ratio"} <= set(options)
    for key in ("old_log_probs", "entropys"):
        page.execute_script(
            f"const o = document.getElementById('ro-overlay'); o.value = '{key}'; o.dispatchEvent(new Event('change'))"
        )
        titles = page.execute_script("return [...document.querySelectorAll('#ro-conversation .tok')].map(s => s.title)")
        assert titles[0].endswith(f"{key}={_js_format(row[key][0])}")
    legend = page.find_element("css selector", "#ro-detail p.hint").text
    assert legend.startswith("entropy: ") and min(row["entropys"]) >= 0.0


def _js_format(v: float) -> str:
    return f"{v:.4g}" if not float(v).is_integer() else str(int(v))


def test_follow_a_prompt_across_steps(page, serve, recorded_run):
    open_rollouts(page, serve(recorded_run).url)
    page.find_element("css selector", '#ro-table tbody tr[data-line="1"]').click()
    page.find_element("id", "ro-follow").click()
    wait_for(page, "document.querySelectorAll('.follow-table tr').length > 1")
    prompt = rows_of(recorded_run / "rollouts" / "3.jsonl")[0]["prompt"]
    steps = [
        int(p.stem)
        for p in (recorded_run / "rollouts").glob("*.jsonl")
        if any(r["prompt"] == prompt for r in rows_of(p))
    ]
    shown = [
        int(tr.find_elements("css selector", "td")[0].text)
        for tr in page.find_elements("css selector", ".follow-table tr")[1:]
    ]
    assert shown == sorted(steps) and 3 in shown


def test_timing_tab_stacks_the_phases(page, serve, recorded_run):
    open_page(page, serve(recorded_run).url + "?tab=timing")
    wait_for(page, "document.getElementById('timing-phases-0') && document.getElementById('timing-phases-0').data")
    names = page.execute_script("return document.getElementById('timing-phases-0').data.map(t => t.name)")
    keys = {k for row in rows_of(recorded_run / "metrics.jsonl") for k in row if k.startswith("timing_s/")}
    phases = {k[len("timing_s/") :] for k in keys} - {"step", "weight_sync_transfer"}
    assert set(names) == phases | {"step (total)"}
    assert page.execute_script("return document.getElementById('timing-phases-0').layout.barmode") == "stack"
    perf = page.execute_script("return document.getElementById('timing-perf-0').data.map(t => t.name)")
    assert "perf/throughput" in perf


def test_live_page_picks_up_a_new_step(page, serve, run_copy, recorded_run):
    open_page(page, serve(run_copy, recorded_run).url + "?poll=200")  # two runs, overlaid
    assert page.execute_script("return document.getElementById('live-status').dataset.steps") == "6"
    chart = "document.querySelector('.chart[data-metric=\"critic/score/mean\"]')"
    names = page.execute_script(f"return {chart}.data.map(t => t.name)")
    assert len(names) == 2 and len(set(names)) == 2 and all(n.endswith("/run") for n in names)
    assert page.execute_script(f"return {chart}.layout.showlegend !== false && {chart}.data[0].showlegend")
    backend = JsonlBackend(run_copy)  # the trainer's own writer appends the next step
    backend.log({"critic/score/mean": 0.75, "live/new_metric": 1.5, "timing_s/step": 1.0}, step=4)
    backend.finish()
    wait_for(page, "document.getElementById('live-status').dataset.steps === '7'", timeout=10)
    wait_for(page, "document.querySelector('.chart[data-metric=\"live/new_metric\"]')")
    curves_drawn(page)
    ys = page.execute_script("return document.querySelector('.chart[data-metric=\"critic/score/mean\"]').data[0].y")
    assert len(ys) == 4 and ys[-1] == 0.75
    assert len(page.execute_script(f"return {chart}.data[1].y")) == 3  # the other run did not move
    assert page.execute_script("return performance.getEntriesByType('navigation').length") == 1  # no reload


def test_exported_file_opens_offline(page, recorded_run, tmp_path):
    from hybridflow.entrypoints.view import main

    out = tmp_path / "report.html"
    assert main([str(recorded_run), "--export", str(out)]) == 0
    html = out.read_text()
    assert '<script src="' not in html and '<link rel="stylesheet"' not in html
    assert "default-src 'none'" in html  # the file may fetch nothing at all
    open_page(page, out.as_uri())  # file://...html: no "tab=" in it, so the curves are awaited
    groups = dict(page.execute_script(f"return {CHARTS_WITH_DATA}"))
    assert set(groups) == metric_groups(recorded_run) and all(groups.values())
    page.find_element("css selector", '.tab[data-tab="rollouts"]').click()
    wait_for(page, "document.querySelectorAll('#ro-table tbody tr').length === 8")
    page.find_element("css selector", '#ro-table tbody tr[data-line="1"]').click()
    page.find_element("id", "ro-follow").click()
    wait_for(page, "document.querySelectorAll('.follow-table tr').length > 1")
    assert (
        page.execute_script(
            "return performance.getEntriesByType('resource').filter(r => !r.name.startsWith('data:')).length"
        )
        == 0
    )


def test_bad_input_shows_what_it_can_and_says_what_it_skipped(page, serve, run_copy, tmp_path):
    with (run_copy / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "critic/score/mean": NaN, "actor/entropy": 6.1}\n')
        f.write('{"step": 5, "critic/score/mea')  # a crash mid-line
    huge = run_copy / "rollouts" / "4.jsonl"
    with huge.open("w") as f:
        for i in range(2500):
            f.write(
                json.dumps(
                    {
                        "step": 4,
                        "uid": str(i),
                        "prompt": f"p{i}",
                        "response": "r" * (25_000 if i < 3 else 5),
                        "score": i / 2500,
                    }
                )
                + "\n"
            )
    only_dumps = tmp_path / "only_dumps"  # a second run folder without metrics.jsonl
    (only_dumps / "rollouts").mkdir(parents=True)
    (only_dumps / "rollouts" / "1.jsonl").write_text(json.dumps({"prompt": "a", "response": "b", "score": 1}) + "\n")
    open_page(page, serve(run_copy, only_dumps).url)
    notes = page.execute_script("return [...document.querySelectorAll('#notes-list li')].map(li => li.textContent)")
    assert any("line 5: cut short" in n for n in notes), notes
    assert any("critic/score/mean: 1 NaN" in n for n in notes), notes
    assert any("only_dumps/metrics.jsonl: metrics.jsonl: missing" in n for n in notes), notes
    ys = page.execute_script("return document.querySelector('.chart[data-metric=\"critic/score/mean\"]').data[0].y")
    assert len(ys) == 4 and ys[3] is None  # the NaN is a gap, the cut line is absent
    page.find_element("css selector", '.tab[data-tab="rollouts"]').click()
    wait_for(page, "document.querySelectorAll('#ro-table tbody tr').length === 2000")
    notes = page.execute_script("return [...document.querySelectorAll('#notes-list li')].map(li => li.textContent)")
    assert any("4.jsonl: 2500 rows, showing the first 2000" in n for n in notes), notes
    assert any("cut to fit the page" in n for n in notes), notes


def test_async_run_shows_staleness_and_overlap(page, serve, tmp_path):
    backend = JsonlBackend(tmp_path)  # fully_async metrics as trainer/schedules/plan.py names them
    for step, (fresh, stale) in enumerate([(0.75, 0.25), (0.5, 0.5)], start=1):
        backend.log(
            {
                "timing_s/step": 2.0,
                "timing_s/gen": 1.5,
                "fully_async/staleness_hist/0": fresh,
                "fully_async/staleness_hist/1": stale,
                "fully_async/overlap_fraction": 0.4 * step,
            },
            step=step,
        )
    backend.finish()
    open_page(page, serve(tmp_path).url + "?tab=timing")
    wait_for(
        page, "document.getElementById('timing-staleness-0') && document.getElementById('timing-staleness-0').data"
    )
    hist = page.execute_script("const t = document.getElementById('timing-staleness-0').data[0]; return [t.x, t.y]")
    assert hist[0] == ["0", "1"] and hist[1] == pytest.approx([0.625, 0.375])  # mean share over the steps
    overlap = page.execute_script("return document.getElementById('timing-overlap-0').data[0].y")
    assert overlap == pytest.approx([0.4, 0.8])
