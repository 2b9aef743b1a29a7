// The page's start: load the runs, draw the tabs, and (served live) poll for new steps.
"use strict";
const QUERY = new URLSearchParams(location.search);
const LIVE_MS = Number(QUERY.get("poll") || 2000);
const FIRST_TAB = ["curves", "rollouts", "timing"].includes(QUERY.get("tab")) ? QUERY.get("tab") : "curves";

function showTab(name) {
  for (const b of document.querySelectorAll(".tab")) b.classList.toggle("active", b.dataset.tab === name);
  for (const p of document.querySelectorAll(".panel")) p.hidden = p.id !== `tab-${name}`;
  if (name === "timing") renderTiming();
  if (name === "curves") renderCurves();
  window.dispatchEvent(new Event("resize"));
}

function drawLegend() {
  document.getElementById("runs-legend").replaceChildren(...HF.runs.map((r) =>
    hfEl("span", { class: "run-chip", title: r.path }, hfEl("i", { style: `background:${hfColor(r.id)}` }), r.name)));
}

function lastStep(runId) {
  const rows = HF.rows[runId] || [];
  return rows.length ? rows[rows.length - 1].step : null;
}

async function loadMetrics(run, since) {
  const url = `/api/runs/${run.id}/metrics` + (since === null || since === undefined ? "" : `?since=${since}`);
  const data = await hfGet(url);
  hfSetNotes(`${run.name}/metrics.jsonl`, data.notes);
  HF.rows[run.id] = (since === null || since === undefined ? [] : HF.rows[run.id] || []).concat(data.rows);
  return data.rows.length;
}

async function poll() {
  let added = 0;
  try {
    const runs = await hfGet("/api/runs");
    const stepsBefore = JSON.stringify(HF.runs.map((r) => r.dumps));
    HF.runs = runs;
    if (JSON.stringify(runs.map((r) => r.dumps)) !== stepsBefore) roFillSelectors();
    for (const run of HF.runs) added += await loadMetrics(run, lastStep(run.id));
    if (added) {
      const tab = document.querySelector(".tab.active").dataset.tab;
      if (tab === "curves") renderCurves(); else if (tab === "timing") renderTiming();
    }
    const total = HF.runs.reduce((n, r) => n + (HF.rows[r.id] || []).length, 0);
    const status = document.getElementById("live-status");
    status.textContent = `live · ${total} steps · ${new Date().toLocaleTimeString()}`;
    status.dataset.steps = total;
  } catch (err) {
    document.getElementById("live-status").textContent = "live: " + err.message;
  }
  setTimeout(poll, LIVE_MS);
}

async function start() {
  HF.runs = await hfGet("/api/runs");
  for (const run of HF.runs) await loadMetrics(run, null);
  drawLegend();
  for (const b of document.querySelectorAll(".tab")) b.addEventListener("click", () => showTab(b.dataset.tab));
  initCurves();
  initRollouts();
  roFillSelectors();
  await roLoadStep();
  showTab(FIRST_TAB);  // a tab draws its charts when shown: ?tab=rollouts opens fast on a big run
  const total = HF.runs.reduce((n, r) => n + (HF.rows[r.id] || []).length, 0);
  const status = document.getElementById("live-status");
  status.dataset.steps = total;
  if (HF.exported) status.textContent = `exported ${HF.exported.created} · ${total} steps`;
  else setTimeout(poll, LIVE_MS);
  document.body.dataset.ready = "1";
}

start().catch((err) => { document.getElementById("live-status").textContent = "error: " + err.message; throw err; });
