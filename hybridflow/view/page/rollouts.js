// Rollouts: one step's rows of a dump folder as a sortable, filterable table; a row as a
// conversation (tool turns as their own turns) with tokens coloured by a per-token value;
// the same prompt followed across the dump's steps.
"use strict";
const RO = { rows: [], sort: { key: "_line", dir: 1 }, selected: null };
const RO_SKIP = new Set(["prompt", "response", "turns", "tokens", "token_mask", "uid", "step", "_line"]);
const RO_LABELS = {
  advantages: "advantage", old_log_probs: "log-prob (trainer)", rollout_log_probs: "log-prob (rollout)",
  ref_log_prob: "log-prob (reference)", entropys: "entropy", rollout_is_weights: "importance weight",
  teacher_log_prob: "log-prob (teacher)", values: "value", token_level_rewards: "token reward",
  teacher_kl: "teacher KL (log π − log π_teacher)", is_ratio: "importance ratio exp(ℓ_trainer − ℓ_rollout)",
};

function roDump() {
  const run = HF.runs[Number(document.getElementById("ro-run").value)];
  return run ? [run, run.dumps[Number(document.getElementById("ro-dump").value)]] : [null, null];
}

function roFillSelectors() {
  const runSel = document.getElementById("ro-run");
  const keep = [runSel.value, document.getElementById("ro-dump").value, document.getElementById("ro-step").value];
  runSel.replaceChildren(...HF.runs.map((r) => hfEl("option", { value: r.id, text: r.name })));
  if (keep[0] !== "") runSel.value = keep[0];
  const run = HF.runs[Number(runSel.value)] || HF.runs[0];
  const dumpSel = document.getElementById("ro-dump");
  dumpSel.replaceChildren(...(run ? run.dumps : []).map((d) => hfEl("option", { value: d.id, text: `${d.name} (${d.kind})` })));
  if (keep[1] !== "" && run && run.dumps[Number(keep[1])]) dumpSel.value = keep[1];
  const dump = run && run.dumps[Number(dumpSel.value)];
  const stepSel = document.getElementById("ro-step");
  stepSel.replaceChildren(...(dump ? dump.steps : []).map((s) => hfEl("option", { value: s, text: s })));
  if (dump && dump.steps.length) stepSel.value = dump.steps.includes(Number(keep[2])) ? keep[2] : dump.steps[dump.steps.length - 1];
}

async function roLoadStep() {
  const [run, dump] = roDump();
  const step = document.getElementById("ro-step").value;
  if (!run || !dump || step === "") { RO.rows = []; roRenderTable(); return; }
  const data = await hfGet(`/api/runs/${run.id}/dumps/${dump.id}/${step}`);
  hfSetNotes(`${run.name}/${dump.name}/${step}.jsonl`, data.notes);
  RO.rows = data.rows;
  RO.selected = null;
  roRenderTable();
}

function roColumns() {
  const cols = ["_line", "prompt", "response", "score", "response_length"];
  for (const row of RO.rows.slice(0, 200)) {
    for (const [k, v] of Object.entries(row)) {
      if (!cols.includes(k) && !RO_SKIP.has(k) && (v === null || typeof v !== "object")) cols.push(k);
    }
  }
  return cols;
}

function roVisibleRows() {
  const lo = parseFloat(document.getElementById("ro-min").value);
  const hi = parseFloat(document.getElementById("ro-max").value);
  const text = document.getElementById("ro-text").value.toLowerCase();
  const { key, dir } = RO.sort;
  return RO.rows.filter((r) => (isNaN(lo) || r.score >= lo) && (isNaN(hi) || r.score <= hi) &&
      (!text || (r.prompt + "\n" + r.response).toLowerCase().includes(text)))
    .sort((a, b) => {
      const x = a[key], y = b[key];
      if (x === y) return 0;
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * dir;
    });
}

function roRenderTable() {
  const cols = roColumns();
  const head = hfEl("tr", {}, ...cols.map((c) => {
    const th = hfEl("th", { "data-key": c, text: (c === "_line" ? "#" : c) + (RO.sort.key === c ? (RO.sort.dir > 0 ? " ▲" : " ▼") : "") });
    th.addEventListener("click", () => { RO.sort = { key: c, dir: RO.sort.key === c ? -RO.sort.dir : 1 }; roRenderTable(); });
    return th;
  }));
  document.querySelector("#ro-table thead").replaceChildren(head);
  const rows = roVisibleRows();
  document.querySelector("#ro-table tbody").replaceChildren(...rows.map((row) => {
    const tr = hfEl("tr", { "data-line": row._line, class: row === RO.selected ? "selected" : "" },
      ...cols.map((c) => c === "prompt" || c === "response"
        ? hfEl("td", { class: "text" }, hfEl("div", { class: "clip", text: c === "prompt" ? "…" + row.prompt.slice(-160) : row.response.slice(0, 240) }))
        : hfEl("td", { "data-key": c, text: hfFormat(row[c]) })));
    tr.addEventListener("click", () => { RO.selected = row; roRenderTable(); roShowRow(row); });
    return tr;
  }));
  document.getElementById("ro-count").textContent = `${rows.length} of ${RO.rows.length} rows`;
}

// per-token series of a row: the recorded ones and two derived from them
function roTokenSeries(row) {
  const series = {};
  for (const key of Object.keys(RO_LABELS)) if (Array.isArray(row[key])) series[key] = row[key];
  const sub = (a, b) => a.map((v, i) => (v === null || b[i] === null ? null : v - b[i]));
  if (series.old_log_probs && series.teacher_log_prob) series.teacher_kl = sub(series.old_log_probs, series.teacher_log_prob);
  if (!series.rollout_is_weights && series.old_log_probs && series.rollout_log_probs) {
    series.is_ratio = sub(series.old_log_probs, series.rollout_log_probs).map((d) => (d === null ? null : Math.exp(d)));
  }
  return series;
}
