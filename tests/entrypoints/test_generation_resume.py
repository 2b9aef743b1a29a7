"""Batch generation survives a crash: finished batches stay on disk and are not sampled again.

The sampler runs for real (tiny Llama, temperature 1), so "the resumed file equals the
uninterrupted one" holds only because batch b is always sampled with seed + b.
"""

from __future__ import annotations

import pytest

from hybridflow import fields as F
from hybridflow.data import read_rows, write_rows
from hybridflow.data.generation_journal import GenerationJournal
from hybridflow.entrypoints.generate import (
    build_rollout,
    generate_file,
    load_generation_config,
)
from hybridflow.models import load_model_and_tokenizer
from hybridflow.protocol import DataProto
from hybridflow.workers.rollout.base import BaseRollout

TEXTS = ["What is 7 + 5?", "Hi", "Compute 123 * 4", "The quick brown fox", "abc"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Crash(RuntimeError):
    pass


class FlakyRollout(BaseRollout):
    """Delegates to a real rollout; raises :class:`Crash` on call number ``crash_on`` (1-based)."""

    def __init__(self, inner: BaseRollout, crash_on: int | None = None) -> None:
        self.inner, self.crash_on, self.calls = inner, crash_on, 0

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        self.calls += 1
        if self.calls == self.crash_on:
            raise Crash(f"simulated crash in call {self.calls}")
        return self.inner.generate_sequences(prompts)

    def update_weights(self, weights) -> None:
        raise NotImplementedError


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("gen")
    data = write_rows([{"prompt": [{"role": "user", "content": t}], "id": i} for i, t in enumerate(TEXTS)],
                      folder / "prompts.parquet")
    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    cfg = _config(data, folder / "reference.parquet", tiny_model_dir)
    rollout = build_rollout(cfg, model, tokenizer)
    reference = read_rows(generate_file(cfg, rollout, tokenizer, progress=False))
    return data, tiny_model_dir, tokenizer, rollout, reference


def _config(data, out, model_dir, *extra: str):
    return load_generation_config(None, [
        f"data.path={data}", f"data.output_path={out}", f"model.path={model_dir}", "data.n_samples=2",
        "data.batch_size=2", "rollout.temperature=1.0", "rollout.response_length=8", "rollout.dtype=fp32", "seed=5",
        *extra,
    ])


def test_a_crashed_run_resumes_where_it_stopped_and_matches_an_uninterrupted_one(setup, tmp_path):
    data, model_dir, tokenizer, rollout, reference = setup
    out = tmp_path / "gen.jsonl"
    cfg = _config(data, out, model_dir)
    with pytest.raises(Crash):
        generate_file(cfg, FlakyRollout(rollout, crash_on=3), tokenizer, progress=False)
    parts = tmp_path / "gen.jsonl.parts"
    assert sorted(p.name for p in parts.glob("batch-*")) == ["batch-000000.jsonl", "batch-000001.jsonl"]
    assert not out.exists()
    assert [r["row"] for r in read_rows(parts / "batch-000001.jsonl")] == [2, 3]

    resumed = FlakyRollout(rollout)
    rows = read_rows(generate_file(cfg, resumed, tokenizer, progress=False))
    assert resumed.calls == 1  # only the last batch (row 4) was sampled again
    assert rows == reference
    assert len({tuple(r[F.RESPONSES]) for r in rows}) == len(TEXTS)  # really sampled, not all equal
    assert not parts.exists()


def test_other_settings_do_not_mix_with_an_unfinished_run(setup, tmp_path):
    data, model_dir, tokenizer, rollout, reference = setup
    out = tmp_path / "gen.parquet"
    with pytest.raises(Crash):
        generate_file(_config(data, out, model_dir), FlakyRollout(rollout, crash_on=2), tokenizer, progress=False)
    other = _config(data, out, model_dir, "rollout.temperature=0.5")
    with pytest.raises(ValueError, match="unfinished run with other inputs or settings"):
        generate_file(other, FlakyRollout(rollout), tokenizer, progress=False)
    restart = _config(data, out, model_dir, "resume=false")
    fresh = FlakyRollout(rollout)
    assert read_rows(generate_file(restart, fresh, tokenizer, progress=False)) == reference
    assert fresh.calls == 3


def test_journal_batches_and_assembly(tmp_path):
    journal = GenerationJournal(tmp_path / "o.jsonl", "abc", num_rows=5, batch_size=2)
    assert journal.num_batches == 3 and list(journal.batch_rows(2)) == [4]
    assert journal.open(resume=True) == set()
    journal.write_batch(1, [["c"], ["d"]])
    assert GenerationJournal(tmp_path / "o.jsonl", "abc", 5, 2).open(resume=True) == {1}
    with pytest.raises(ValueError, match="batch 0 has 2 rows"):
        journal.write_batch(0, [["a"]])
    journal.write_batch(0, [["a"], ["b"]])
    journal.write_batch(2, [["e"]])
    rows = read_rows(journal.assemble([{"q": i} for i in range(5)], "responses"))
    assert rows == [{"q": i, "responses": [x]} for i, x in enumerate("abcde")]
