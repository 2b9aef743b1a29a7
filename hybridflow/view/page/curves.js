// Curves: one chart per logged metric, in sections by the metric's prefix (as W&B groups them:
// actor/, critic/, val-core/, timing_s/, perf/, ...), every run overlaid with its colour.
"use strict";
// Charts are drawn visible-first: a redraw marks every chart stale, draws the ones on screen at
// once, and the rest a few at a time in the background (a run logs hundreds of metrics).
const CURVES = { generation: 0, observer: null };

function curveGroups() {
  const keys = new Set();
  for (const rows of Object.values(HF.rows)) for (const r of rows) for (const k of Object.keys(r)) if (k !== "step") keys.add(k);
  const groups = {};
  for (const key of [...keys].sort()) {
    const group = key.includes("/") ? key.split("/")[0] : "other";
    (groups[group] = groups[group] || []).push(key);
  }
  return groups;
}

function curveTraces(key, opts) {
  const traces = [];
  for (const run of HF.runs) {
    const rows = HF.rows[run.id] || [];
    const x = hfXValues(rows, opts.xMode);
    const pairs = rows.map((r, i) => [x[i], r[key]]).filter((p) => p[1] !== undefined);
    if (!pairs.some((p) => p[1] !== null)) continue;
    const y = pairs.map((p) => (opts.log && p[1] !== null && p[1] <= 0 ? null : p[1]));
    traces.push({
      x: pairs.map((p) => p[0]), y: hfSmooth(y, opts.smoothing), name: run.name, type: "scatter",
      mode: pairs.length < 30 ? "lines+markers" : "lines", line: { color: hfColor(run.id), width: 1.6 },
      marker: { size: 4 }, connectgaps: false, legendgroup: run.name, showlegend: HF.runs.length > 1,
    });
  }
  return traces;
}

function curveOptions() {
  return {
    smoothing: Number(document.getElementById("smoothing").value),
    log: document.getElementById("log-scale").checked,
    xMode: document.getElementById("x-axis").value,
    filter: document.getElementById("metric-filter").value.trim().toLowerCase(),
  };
}

function renderCurves() {
  const opts = curveOptions();
  document.getElementById("smoothing-value").textContent = opts.smoothing.toFixed(2);
  const root = document.getElementById("groups");
  for (const [group, keys] of Object.entries(curveGroups())) {
    let section = root.querySelector(`details.group[data-group="${CSS.escape(group)}"]`);
    if (!section) {
      section = hfEl("details", { class: "group", "data-group": group, open: "" },
        hfEl("summary", { text: group }), hfEl("div", { class: "charts" }));
      root.append(section);
    }
    const shown = keys.filter((k) => !opts.filter || k.toLowerCase().includes(opts.filter));
    section.hidden = shown.length === 0;
    section.querySelector("summary").textContent = `${group} (${shown.length})`;
    for (const key of shown) chartDiv(section.querySelector(".charts"), key).dataset.stale = "1";
    for (const div of section.querySelectorAll(".chart")) div.hidden = !shown.includes(div.dataset.metric);
  }
  drawStaleCharts(opts);
}

function chartDiv(container, key) {
  let div = container.querySelector(`.chart[data-metric="${CSS.escape(key)}"]`);
  if (!div) {
    div = hfEl("div", { class: "chart", "data-metric": key });
    container.append(div);
    CURVES.observer.observe(div);
  }
  return div;
}

function drawStaleCharts(opts) {
  const generation = ++CURVES.generation;
  if (document.getElementById("tab-curves").hidden) return;  // drawn when the tab is shown
  document.body.dataset.curves = "drawing";
  const stale = [...document.querySelectorAll("#groups .chart[data-stale]:not([hidden])")];
  const rect = (div) => div.getBoundingClientRect();
  for (const div of stale) if (rect(div).bottom > 0 && rect(div).top < window.innerHeight) renderChart(div, opts);
  const step = () => {
    if (generation !== CURVES.generation) return;  // a newer redraw took over
    const rest = [...document.querySelectorAll("#groups .chart[data-stale]:not([hidden])")].slice(0, 6);
    for (const div of rest) renderChart(div, opts);
    if (rest.length) setTimeout(step, 0); else document.body.dataset.curves = "done";
  };
  setTimeout(step, 0);
}

function renderChart(div, opts) {
  if (!div.dataset.stale) return;
  delete div.dataset.stale;
  const key = div.dataset.metric;
  const layout = {
    title: { text: key, font: { size: 12 } }, margin: { l: 48, r: 10, t: 28, b: 32 },
    xaxis: { title: { text: opts.xMode === "wall" ? "wall time (s)" : "step", font: { size: 10 } } },
    yaxis: { type: opts.log ? "log" : "linear" }, legend: { font: { size: 10 } },
  };
  Plotly.react(div, curveTraces(key, opts), layout, { displayModeBar: false, responsive: true });
}

function initCurves() {
  CURVES.observer = new IntersectionObserver((entries) => {
    const opts = curveOptions();
    for (const e of entries) if (e.isIntersecting) renderChart(e.target, opts);
  });
  for (const id of ["smoothing", "log-scale", "x-axis", "metric-filter"]) {
    document.getElementById(id).addEventListener("input", renderCurves);
  }
}
