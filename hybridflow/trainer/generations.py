"""What the trainer writes about its generations: rollout and validation dumps, printed samples.

* ``trainer.rollout_data_dir``: ``{step}.jsonl`` of every training row — ``step``, ``uid``,
  ``prompt``, ``response``, ``score``, ``response_length`` (tokens), ``gts`` and ``data_source``
  when the row has them, the scorer's scalar extras (``acc``, ``pred``...), and ``turns`` for a
  multi-turn row (model and tool turns, split where ``response_mask`` changes).
  ``trainer.rollout_token_rows`` = k adds, to the first k rows, ``tokens`` (each response
  token's text), ``token_mask`` and one list per per-token tensor the batch holds, under
  verl's names (``advantages``, ``old_log_probs``, ``rollout_log_probs``, ``entropys`` — the
  old-log-prob pass's, kept in the batch for this dump only —, ``rollout_is_weights``,
  ``teacher_log_prob``...) — what ``hybridflow view`` colours tokens by.
* ``trainer.validation_data_dir``: ``{step}.jsonl`` of every validation row in verl's fields —
  ``input`` (the prompt text), ``output`` (the response), ``gts`` (the ground truth), ``score``
  (the summed reward), ``step``, plus one field per key the scorer returned (``acc``, ``pred``...).
* ``trainer.log_val_generations``: the first k validation samples printed after validation.

Prompts are decoded without their left padding and responses up to their last valid token.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hybridflow import fields as F
from hybridflow.protocol import DataProto


def decode_rows(
    tokenizer: Any, batch: DataProto, rows: range | list[int], skip_special: bool = True
) -> list[tuple[str, str]]:
    """``(prompt, response)`` texts of ``rows``."""
    td = batch.require_batch()
    width = td[F.PROMPTS].shape[1]
    out = []
    for i in rows:
        prompt = tokenizer.decode(
            td[F.PROMPTS][i][td[F.ATTENTION_MASK][i, :width].bool()], skip_special_tokens=skip_special
        )
        response = tokenizer.decode(td[F.RESPONSES][i][td[F.RESPONSE_MASK][i].bool()], skip_special_tokens=skip_special)
        out.append((prompt, response))
    return out


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, default=_plain) + "\n")
    return path


def _plain(value: Any) -> Any:
    """numpy scalars and arrays in scorer extras become JSON numbers and lists."""
    return value.tolist() if hasattr(value, "tolist") else str(value)


# per-token tensors the rollout dump copies (verl's batch keys), where the batch holds them
TOKEN_VALUE_KEYS: tuple[str, ...] = (
    F.ADVANTAGES,
    F.OLD_LOG_PROBS,
    F.ROLLOUT_LOG_PROBS,
    F.REF_LOG_PROB,
    F.ENTROPYS,
    F.ROLLOUT_IS_WEIGHTS,
    F.TEACHER_LOG_PROB,
    F.VALUES,
    F.TOKEN_LEVEL_REWARDS,
)
# non-tensor columns that are the row's plumbing, not the scorer's extras
_NOT_EXTRAS = {F.UID, F.DATA_SOURCE, F.REWARD_MODEL, F.EXTRA_INFO, F.RAW_PROMPT, "index", "agent_name"}
_EXTRA_TEXT_LIMIT = 500  # a scorer's long string extra (a judge's reasoning) stays out of every row


def dump_rollouts(out_dir: str | Path, step: int, tokenizer: Any, batch: DataProto, token_rows: int = 0) -> Path:
    """``trainer.rollout_data_dir``: one row per training response of this step; the first
    ``token_rows`` rows also carry per-token values (bounded: k rows × the response length)."""
    td = batch.require_batch()
    scores = td[F.TOKEN_LEVEL_SCORES].sum(-1).tolist()
    texts = decode_rows(tokenizer, batch, range(len(batch)), skip_special=False)
    valid = _response_valid(batch)
    rows = []
    for i, (prompt, response) in enumerate(texts):
        row: dict[str, Any] = {"step": step, "uid": str(batch.non_tensor_batch[F.UID][i]), "prompt": prompt}
        row |= {"response": response, "score": scores[i], "response_length": int(valid[i].sum())}
        row |= _row_facts(batch, i)
        turns = _turns(tokenizer, batch, i, valid[i])
        if turns is not None:
            row["turns"] = turns
        if i < token_rows:
            row |= _token_values(tokenizer, batch, i, valid[i])
        rows.append(row)
    return write_jsonl(Path(out_dir) / f"{step}.jsonl", rows)


def _response_valid(batch: DataProto) -> Any:
    """(B, T) bool: the response positions that hold a token (model or tool), not padding."""
    td = batch.require_batch()
    width = td[F.RESPONSES].shape[1]
    return td[F.ATTENTION_MASK][:, -width:].bool()


def _row_facts(batch: DataProto, i: int) -> dict[str, Any]:
    """``gts``, ``data_source``, ``num_turns`` and the scorer's scalar extras of row ``i``."""
    nt = batch.non_tensor_batch
    out: dict[str, Any] = {}
    if F.REWARD_MODEL in nt and isinstance(nt[F.REWARD_MODEL][i], dict):
        out["gts"] = _plain_scalar(nt[F.REWARD_MODEL][i].get("ground_truth"))
    if F.DATA_SOURCE in nt:
        out["data_source"] = str(nt[F.DATA_SOURCE][i])
    if "__num_turns__" in nt:
        out["num_turns"] = int(nt["__num_turns__"][i])
    for key, values in nt.items():
        if key in _NOT_EXTRAS or key.startswith("__") or key in out:
            continue
        value = _plain_scalar(values[i])
        if value is not None:
            out[key] = value
    return out


def _plain_scalar(value: Any) -> Any:
    """A JSON scalar (number, bool, short string) or None for anything else."""
    value = value.item() if hasattr(value, "item") and getattr(value, "ndim", 0) == 0 else value
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str) and len(value) <= _EXTRA_TEXT_LIMIT:
        return value
    return None


def _turns(tokenizer: Any, batch: DataProto, i: int, valid: Any) -> list[dict[str, str]] | None:
    """A multi-turn response cut where ``response_mask`` changes: the model's tokens (mask 1)
    and the inserted tool/user tokens (mask 0) as their own turns; None for one model turn."""
    td = batch.require_batch()
    ids = td[F.RESPONSES][i][valid].tolist()
    mask = td[F.RESPONSE_MASK][i][valid].tolist()
    if all(mask):
        return None
    turns: list[dict[str, str]] = []
    start = 0
    for j in range(1, len(ids) + 1):
        if j == len(ids) or mask[j] != mask[start]:
            role = "assistant" if mask[start] else "tool"
            turns.append({"role": role, "text": tokenizer.decode(ids[start:j], skip_special_tokens=False)})
            start = j
    return turns


def _token_values(tokenizer: Any, batch: DataProto, i: int, valid: Any) -> dict[str, Any]:
    """Row ``i``'s response tokens as text, their mask, and each per-token tensor the batch holds."""
    td = batch.require_batch()
    ids = td[F.RESPONSES][i][valid].tolist()
    out: dict[str, Any] = {
        "tokens": [tokenizer.decode([t], skip_special_tokens=False) for t in ids],
        "token_mask": [int(m) for m in td[F.RESPONSE_MASK][i][valid].tolist()],
    }
    for key in TOKEN_VALUE_KEYS:
        if key in td.keys():
            out[key] = [round(v, 5) if math.isfinite(v) else None for v in td[key][i][valid].float().tolist()]
    return out


def validation_rows(
    tokenizer: Any, batch: DataProto, scores: list[float], extra: dict[str, list[Any]], step: int
) -> list[dict[str, Any]]:
    """verl's validation dump fields for every row of one validation batch."""
    texts = decode_rows(tokenizer, batch, range(len(batch)))
    truths = [rm.get("ground_truth") if isinstance(rm, dict) else None for rm in batch.non_tensor_batch[F.REWARD_MODEL]]
    rows = []
    for i, (prompt, response) in enumerate(texts):
        row = {"input": prompt, "output": response, "gts": truths[i], "score": scores[i], "step": step}
        row.update({key: values[i] for key, values in extra.items() if len(values) == len(texts)})
        rows.append(row)
    return rows


def print_samples(rows: list[dict[str, Any]], k: int) -> None:
    """The first ``k`` validation rows, one line each."""
    for row in rows[:k]:
        prompt = str(row["input"]).strip()
        tail = prompt.splitlines()[-2:] if prompt else [""]
        print(f"[val sample] score={row['score']:.2f} prompt=…{' / '.join(tail)!r} response={row['output']!r}")
