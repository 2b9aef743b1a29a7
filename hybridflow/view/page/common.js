// Shared state and helpers of the page: where data comes from (the server's JSON API, or the
// data embedded by --export), the runs and their metric rows, colours, notes.
"use strict";
const HF = {
  exported: window.HF_EXPORT || null,
  runs: [],            // [{id, name, path, dumps}]
  rows: {},            // run id -> metric rows, in step order
  notes: {},           // source -> [note]
  colors: ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"],
};

async function hfGet(path) {
  if (HF.exported) {
    if (!(path in HF.exported.api)) throw new Error("not in this exported report: " + path);
    return HF.exported.api[path];
  }
  const response = await fetch(path, { cache: "no-store" });
  if (!response.ok) throw new Error(path + ": HTTP " + response.status);
  return response.json();
}

function hfColor(runId) { return HF.colors[runId % HF.colors.length]; }

function hfSetNotes(source, notes) {
  HF.notes[source] = notes || [];
  const all = Object.entries(HF.notes).flatMap(([src, list]) => list.map((n) => src + ": " + n));
  const box = document.getElementById("notes");
  box.hidden = all.length === 0;
  document.getElementById("notes-summary").textContent =
    all.length + " thing(s) skipped or cut while reading the runs";
  const list = document.getElementById("notes-list");
  list.replaceChildren(...all.map((n) => { const li = document.createElement("li"); li.textContent = n; return li; }));
}

// x values of a run's rows: the step, or wall time. metrics.jsonl has no clock, so wall time is
// the running sum of each step's timing_s/step plus its timing_s/testing (validation).
function hfXValues(rows, mode) {
  if (mode !== "wall") return rows.map((r) => r.step);
  let t = 0;
  return rows.map((r) => {
    t += (r["timing_s/step"] || 0) + (r["timing_s/testing"] || 0);
    return Math.round(t * 100) / 100;
  });
}

// W&B-style exponential moving average; gaps (null) stay gaps and do not reset the average
function hfSmooth(values, weight) {
  if (!weight) return values;
  let last = null;
  return values.map((v) => {
    if (v === null || v === undefined) return null;
    last = last === null ? v : last * weight + (1 - weight) * v;
    return last;
  });
}

function hfEl(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") el.className = v; else if (k === "text") el.textContent = v; else el.setAttribute(k, v);
  }
  el.append(...children);
  return el;
}

function hfFormat(v) {
  if (v === null || v === undefined) return "";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toPrecision(4);
  return String(v);
}
