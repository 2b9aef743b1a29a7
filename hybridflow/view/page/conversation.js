// One rollout row as a conversation: the prompt, then the response's turns (the model's and
// the tool results, split where token_mask changes), tokens coloured by a chosen per-token value.
"use strict";

// turns of a row: from its tokens (token_mask 1 = the model, 0 = inserted tool/user text),
// else from the dump's "turns", else the whole response as one model turn
function convTurns(row) {
  if (Array.isArray(row.tokens)) {
    const mask = row.token_mask || row.tokens.map(() => 1);
    const turns = [];
    row.tokens.forEach((tok, i) => {
      const role = mask[i] ? "assistant" : "tool";
      if (!turns.length || turns[turns.length - 1].role !== role) turns.push({ role, indices: [] });
      turns[turns.length - 1].indices.push(i);
    });
    return turns;
  }
  if (Array.isArray(row.turns)) return row.turns.map((t) => ({ role: t.role, text: t.text }));
  return [{ role: "assistant", text: row.response }];
}

// a colour for v: diverging around 0 (blue < 0 < red) for signed values, else white → orange
function convColor(v, lo, hi, signed) {
  if (v === null || v === undefined) return "transparent";
  if (signed) {
    if (v === 0) return "transparent";
    const m = Math.max(Math.abs(lo), Math.abs(hi)) || 1;
    const a = Math.min(Math.abs(v) / m, 1) * 0.75;
    return v >= 0 ? `rgba(214,39,40,${a.toFixed(3)})` : `rgba(31,119,180,${a.toFixed(3)})`;
  }
  const a = hi > lo ? (v - lo) / (hi - lo) : 0.5;
  return `rgba(255,127,14,${(0.08 + 0.72 * a).toFixed(3)})`;
}

function convRender(row, key) {
  const series = key ? roTokenSeries(row)[key] : null;
  const finite = (series || []).filter((v) => v !== null && v !== undefined);
  const lo = finite.length ? Math.min(...finite) : 0, hi = finite.length ? Math.max(...finite) : 0;
  const signed = key === "advantages" || key === "teacher_kl" || key === "token_level_rewards" || lo < 0 && hi > 0;
  // the prompt folded to its end (a chat template's system text can fill the panel); click for all
  const tail = row.prompt.length > 240 ? "…" + row.prompt.slice(-240) : row.prompt;
  const prompt = hfEl("details", { class: "turn user" },
    hfEl("summary", {}, hfEl("span", { class: "role", text: `prompt (${row.prompt.length} characters)` }), tail),
    hfEl("div", { class: "whole", text: row.prompt }));
  prompt.addEventListener("toggle", () => { prompt.querySelector("summary").lastChild.textContent = prompt.open ? "" : tail; });
  const box = hfEl("div", { class: "conversation" }, prompt);
  for (const turn of convTurns(row)) {
    const div = hfEl("div", { class: `turn ${turn.role}`, "data-role": turn.role }, hfEl("span", { class: "role", text: turn.role }));
    if (turn.indices) {
      for (const i of turn.indices) {
        const v = series ? series[i] : null;
        const span = hfEl("span", { class: "tok", title: series ? `${row.tokens[i]} ${key}=${hfFormat(v)}` : row.tokens[i] }, row.tokens[i]);
        span.style.backgroundColor = series ? convColor(v, lo, hi, signed) : "transparent";
        div.append(span);
      }
    } else div.append(turn.text);
    box.append(div);
  }
  const legend = series ? hfEl("p", { class: "hint", text: `${RO_LABELS[key]}: ${hfFormat(lo)} … ${hfFormat(hi)}` }) : "";
  return [legend, box];
}

function roShowRow(row) {
  const detail = document.getElementById("ro-detail");
  const keys = Object.keys(roTokenSeries(row));
  const facts = Object.entries(row).filter(([k, v]) => !RO_SKIP.has(k) && !RO_LABELS[k] && (v === null || typeof v !== "object"));
  const head = hfEl("p", { text: facts.map(([k, v]) => `${k}=${hfFormat(v)}`).join("  ") });
  const overlay = hfEl("select", { id: "ro-overlay" }, hfEl("option", { value: "", text: "no colour" }),
    ...keys.map((k) => hfEl("option", { value: k, text: RO_LABELS[k] })));
  const body = hfEl("div", { id: "ro-conversation" });
  const draw = () => body.replaceChildren(...convRender(row, overlay.value));
  overlay.addEventListener("change", draw);
  if (keys.includes("advantages")) overlay.value = "advantages";
  const follow = hfEl("button", { id: "ro-follow", text: "follow this prompt across steps" });
  follow.addEventListener("click", () => roFollow(row.prompt));
  const tokenNote = keys.length ? "colour tokens by " : "no per-token values for this row (trainer.rollout_token_rows)";
  detail.replaceChildren(head, hfEl("p", {}, tokenNote, keys.length ? overlay : "", " ", follow), body,
    hfEl("div", { id: "ro-follow-out" }));
  draw();
}

async function roFollow(prompt) {
  const [run, dump] = roDump();
  const out = document.getElementById("ro-follow-out");
  let points;
  if (HF.exported) {
    points = dump.steps.map((s) => {
      const rows = (HF.exported.api[`/api/runs/${run.id}/dumps/${dump.id}/${s}`] || { rows: [] }).rows.filter((r) => r.prompt === prompt);
      const sc = rows.map((r) => r.score).filter((v) => typeof v === "number");
      return { step: s, n: rows.length, mean_score: sc.length ? sc.reduce((a, b) => a + b, 0) / sc.length : null, rows };
    }).filter((p) => p.n);
  } else {
    points = await hfGet(`/api/runs/${run.id}/dumps/${dump.id}/follow?prompt=${encodeURIComponent(prompt)}`);
  }
  const chart = hfEl("div", { class: "chart", id: "ro-follow-chart" });
  const table = hfEl("table", { class: "follow-table" }, hfEl("tr", {}, ...["step", "rows", "mean score", "a response"].map((t) => hfEl("th", { text: t }))),
    ...points.map((p) => hfEl("tr", {}, ...[p.step, p.n, hfFormat(p.mean_score), (p.rows[0] || {}).response || ""].map((t) => hfEl("td", { text: String(t).slice(0, 200) })))));
  out.replaceChildren(hfEl("h3", { text: `this prompt in ${points.length} step(s)` }), chart, table);
  Plotly.react(chart, [{ x: points.map((p) => p.step), y: points.map((p) => p.mean_score), mode: "lines+markers", name: "mean score" }],
    { margin: { l: 40, r: 10, t: 10, b: 30 }, xaxis: { title: { text: "step" } }, yaxis: { title: { text: "mean score" } } }, { displayModeBar: false });
}

function initRollouts() {
  document.getElementById("ro-run").addEventListener("change", () => { roFillSelectors(); roLoadStep(); });
  document.getElementById("ro-dump").addEventListener("change", () => { roFillSelectors(); roLoadStep(); });
  document.getElementById("ro-step").addEventListener("change", roLoadStep);
  for (const id of ["ro-min", "ro-max", "ro-text"]) document.getElementById(id).addEventListener("input", roRenderTable);
}
