"""What the trainer writes about its generations: rollout and validation dumps, printed samples.

* ``trainer.rollout_data_dir``: ``{step}.jsonl`` of every training row — ``step``, ``uid``,
  ``prompt``, ``response``, ``score``.
* ``trainer.validation_data_dir``: ``{step}.jsonl`` of every validation row in verl's fields —
  ``input`` (the prompt text), ``output`` (the response), ``gts`` (the ground truth), ``score``
  (the summed reward), ``step``, plus one field per key the scorer returned (``acc``, ``pred``...).
* ``trainer.log_val_generations``: the first k validation samples printed after validation.

Prompts are decoded without their left padding and responses up to their last valid token.
"""

from __future__ import annotations

import json
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


def dump_rollouts(out_dir: str | Path, step: int, tokenizer: Any, batch: DataProto) -> Path:
    """``trainer.rollout_data_dir``: one row per training response of this step."""
    scores = batch.require_batch()[F.TOKEN_LEVEL_SCORES].sum(-1).tolist()
    texts = decode_rows(tokenizer, batch, range(len(batch)), skip_special=False)
    uids = batch.non_tensor_batch[F.UID]
    rows = [
        {"step": step, "uid": str(uids[i]), "prompt": p, "response": r, "score": scores[i]}
        for i, (p, r) in enumerate(texts)
    ]
    return write_jsonl(Path(out_dir) / f"{step}.jsonl", rows)


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
