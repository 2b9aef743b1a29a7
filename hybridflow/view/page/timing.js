// Where the time went: per run, the phases of each step (timing_s/*) as stacked bars,
// throughput (perf/*), and for asynchronous runs the staleness histogram and overlap fractions.
"use strict";
// not phases of their own: the whole step (drawn as a line), and the transfer inside sync_weights
const TIMING_NOT_PHASES = new Set(["timing_s/step", "timing_s/weight_sync_transfer"]);

function timingChart(parent, id, traces, layout) {
  let div = document.getElementById(id);
  if (!div) { div = hfEl("div", { class: "chart wide", id }); parent.append(div); }
  Plotly.react(div, traces, Object.assign({ margin: { l: 48, r: 10, t: 28, b: 32 }, legend: { font: { size: 10 } } }, layout),
    { displayModeBar: false, responsive: true });
}

function timingRun(run, root) {
  const rows = HF.rows[run.id] || [];
  const keys = (prefix) => [...new Set(rows.flatMap((r) => Object.keys(r)))].filter((k) => k.startsWith(prefix)).sort();
  let box = root.querySelector(`[data-run="${run.id}"]`);
  if (!box) {
    box = hfEl("div", { class: "group", "data-run": run.id }, hfEl("h3", { text: run.name }), hfEl("div", { class: "charts" }));
    root.append(box);
  }
  const charts = box.querySelector(".charts");
  const steps = rows.map((r) => r.step);
  const phases = keys("timing_s/").filter((k) => !TIMING_NOT_PHASES.has(k));
  const bars = phases.map((k) => ({ x: steps, y: rows.map((r) => r[k] ?? null), name: k.slice(9), type: "bar" }));
  if (rows.some((r) => r["timing_s/step"] !== undefined)) {
    bars.push({ x: steps, y: rows.map((r) => r["timing_s/step"] ?? null), name: "step (total)", mode: "lines+markers", type: "scatter", line: { color: "#000" } });
  }
  timingChart(charts, `timing-phases-${run.id}`, bars, { barmode: "stack", title: { text: "seconds per phase", font: { size: 12 } } });
  const perf = keys("perf/").filter((k) => k.includes("throughput"));  // tokens/s; token counts have another scale
  timingChart(charts, `timing-perf-${run.id}`, perf.map((k) => ({ x: steps, y: rows.map((r) => r[k] ?? null), name: k, mode: "lines+markers" })),
    { title: { text: "throughput", font: { size: 12 } } });
  const hist = keys("fully_async/staleness_hist/");
  if (hist.length) {
    const mean = (k) => { const v = rows.map((r) => r[k]).filter((x) => typeof x === "number"); return v.reduce((a, b) => a + b, 0) / Math.max(v.length, 1); };
    timingChart(charts, `timing-staleness-${run.id}`, [{ x: hist.map((k) => k.split("/").pop()), y: hist.map(mean), type: "bar", name: "share of samples" }],
      { title: { text: "staleness (weight versions behind), mean share over steps", font: { size: 12 } }, xaxis: { type: "category" } });
  }
  const overlap = [...new Set(rows.flatMap((r) => Object.keys(r)))].filter((k) => k.includes("overlap")).sort();
  if (overlap.length) {
    timingChart(charts, `timing-overlap-${run.id}`, overlap.map((k) => ({ x: steps, y: rows.map((r) => r[k] ?? null), name: k, mode: "lines+markers" })),
      { title: { text: "generation/training overlap", font: { size: 12 } } });
  }
}

function renderTiming() {
  const root = document.getElementById("timing");
  for (const run of HF.runs) timingRun(run, root);
}
