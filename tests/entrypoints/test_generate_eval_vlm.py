"""``hybridflow generate`` and ``hybridflow eval`` on rows with images (tiny Qwen2-VL, fp32, CPU):
generate gives the sampler the same pixels and 3-D positions as the trainer's rollout, its greedy
text equals the rollout's own on the same rows, eval scores the shapes task's image rows, and a
text-only model given image rows is a clear error."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hybridflow import fields as F
from hybridflow.cli import main as cli_main
from hybridflow.config.actor_rollout_ref import RolloutConfig
from hybridflow.data import RLDataset, collate_fn, read_rows, write_rows
from hybridflow.entrypoints.generate import encode_image_row, load_generation_config
from hybridflow.entrypoints.generate_images import prompt_batch
from hybridflow.models import load_model_and_tokenizer
from hybridflow.models.loader import is_vision_language_folder
from hybridflow.models.processor import load_processor
from hybridflow.models.tiny_vlm import save_tiny_vlm
from hybridflow.protocol import DataProto
from hybridflow.reward.scorers import shapes
from hybridflow.trainer.offline_eval import evaluate, load_eval_config
from hybridflow.workers.rollout.torch_rollout import TorchRollout
from tests.rollout.vlm_rows import write_vlm_parquet

pytestmark = pytest.mark.usefixtures("one_torch_thread")
RESPONSE = 8


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny-qwen2-vl")


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory) -> Path:
    return write_vlm_parquet(tmp_path_factory.mktemp("data") / "vl.parquet", 4, seed=2)


def _generate(folder: Path, data: Path, out: Path, *extra: str) -> int:
    return cli_main([
        "generate", f"data.path={data}", f"data.output_path={out}", f"model.path={folder}",
        "data.batch_size=4", "rollout.prompt_length=64", f"rollout.response_length={RESPONSE}",
        "rollout.dtype=fp32", "device=cpu", "resume=false", *extra,
    ])  # fmt: skip


def _dataset_batch(folder: Path, path: Path) -> tuple[DataProto, object]:
    """The trainer's view of the rows: RLDataset + collate, padded to exactly the longest prompt."""
    processor = load_processor(folder)
    wide = RLDataset(path, processor.tokenizer, processor=processor, max_prompt_length=64)
    width = max(len(wide[i]["raw_prompt_ids"]) for i in range(len(wide)))
    ds = RLDataset(path, processor.tokenizer, processor=processor, max_prompt_length=width)
    return DataProto.from_single_dict(collate_fn([ds[i] for i in range(len(ds))])), processor


def test_the_loader_picks_the_vision_language_class(folder, tiny_model_dir) -> None:
    model, _ = load_model_and_tokenizer(folder, dtype="fp32")
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    assert is_vision_language_folder(folder) and not is_vision_language_folder(tiny_model_dir)
    assert not is_vision_language_folder(folder / "missing")


def test_generate_batches_carry_the_datasets_pixels_and_positions(folder, rows_file) -> None:
    expected, processor = _dataset_batch(folder, rows_file)
    cfg = load_generation_config(None, [f"data.path={rows_file}", "rollout.prompt_length=64"])
    rows = read_rows(str(rows_file))
    prompts = [encode_image_row(processor, row, i, cfg.data, str(rows_file)) for i, row in enumerate(rows)]
    batch = prompt_batch([p.input_ids for p in prompts], processor.tokenizer.pad_token_id, prompts, processor)
    for key in (F.INPUT_IDS, F.ATTENTION_MASK, F.POSITION_IDS):
        assert torch.equal(batch.batch[key], expected.batch[key]), key
    assert batch.batch[F.POSITION_IDS].shape[1] == 3
    for got, want in zip(batch.non_tensor_batch[F.MULTI_MODAL_INPUTS], expected.non_tensor_batch[F.MULTI_MODAL_INPUTS]):
        assert sorted(got) == sorted(want)
        for name in want:
            assert torch.equal(got[name], want[name]), name
    assert sum(len(m) > 0 for m in batch.non_tensor_batch[F.MULTI_MODAL_INPUTS]) == 3  # row 3 has no image


def test_generate_greedy_equals_the_rollouts_greedy_output(folder, rows_file, tmp_path) -> None:
    out = tmp_path / "gen.parquet"
    assert _generate(folder, rows_file, out, "rollout.do_sample=false", "data.n_samples=2") == 0
    got = [row[F.RESPONSES] for row in read_rows(str(out))]

    batch, processor = _dataset_batch(folder, rows_file)
    model, tokenizer = load_model_and_tokenizer(folder, dtype="fp32")
    config = replace(RolloutConfig(), response_length=RESPONSE, do_sample=False, prompt_length=64, seed=0)
    batch.meta_info.update({F.META_N: 1, F.META_SEED: 0})
    result = TorchRollout(config, model, tokenizer, dtype=torch.float32).generate_sequences(batch)
    lengths = result.batch[F.RESPONSE_MASK].sum(dim=1).tolist()
    want = tokenizer.batch_decode(
        [r[: int(k)].tolist() for r, k in zip(result.batch[F.RESPONSES], lengths)], skip_special_tokens=True
    )
    assert [list(g) for g in got] == [[w, w] for w in want]
    assert all(len(w) > 0 for w in want)


def test_eval_scores_the_shapes_image_rows(folder, tmp_path, capsys) -> None:
    data = tmp_path / "shapes"
    assert cli_main(["data", "shapes", "--out", str(data), "--train-size", "4", "--test-size", "4"]) == 0
    test_rows = read_rows(str(data / "test.parquet"))
    assert all(len(row["images"]) == 1 for row in test_rows)
    gen = tmp_path / "gen.parquet"
    assert _generate(folder, data / "test.parquet", gen, "data.n_samples=2", "rollout.temperature=1.0") == 0
    rows = read_rows(str(gen))
    assert [len(row[F.RESPONSES]) for row in rows] == [2, 2, 2, 2]
    # row 0 answered right twice, so the expected mean is known whatever the random model wrote
    truth = rows[0][F.REWARD_MODEL]["ground_truth"]
    rows[0][F.RESPONSES] = [f"\\boxed{{{truth}}}", f"It is \\boxed{{{truth}}}."]
    write_rows(rows, tmp_path / "scored.parquet")
    scores = [
        [shapes.compute_score(r, row[F.REWARD_MODEL]["ground_truth"])["score"] for r in row[F.RESPONSES]]
        for row in rows
    ]
    assert scores[0] == [1.0, 1.0]
    cfg = load_eval_config(None, [f"data.path={tmp_path / 'scored.parquet'}", "reward_model.executor=inline"])
    source = evaluate(cfg)["data_sources"][shapes.DATA_SOURCE]
    mean = sum(sum(s) / 2 for s in scores) / 4
    assert source["metrics"]["mean@2"]["value"] == pytest.approx(mean) and mean >= 0.25


def test_image_rows_with_a_text_model_are_a_clear_error(tiny_model_dir, rows_file, tmp_path, capsys) -> None:
    assert _generate(tiny_model_dir, rows_file, tmp_path / "gen.parquet") == 2
    err = capsys.readouterr().err
    assert "rows have images (column 'images')" in err and "not a vision-language model" in err
    assert not (tmp_path / "gen.parquet").exists()
