"""The built-in visual task ``shapes``: images, ground truths, splits, CLI files, RLDataset read-back."""

from __future__ import annotations

import hashlib
import io

import numpy as np
import pytest
from PIL import Image

from hybridflow.data.io import read_rows
from hybridflow.data.rl_dataset import RLDataset
from hybridflow.data.tasks import TASKS, shapes
from hybridflow.data.tasks.shapes import COLOURS, DATA_SOURCE, ShapesSettings, generate_shapes
from hybridflow.entrypoints.data import main
from hybridflow.models.tiny_vlm import IMAGE_PAD, VISION_START, build_tiny_vlm_processor


@pytest.fixture(scope="module")
def processor():
    return build_tiny_vlm_processor()


def _pixels(row: dict) -> np.ndarray:
    (image,) = row["images"]
    return np.asarray(Image.open(io.BytesIO(image["bytes"])).convert("RGB"))


def _components(mask: np.ndarray) -> int:
    """4-connected components of a boolean mask (flood fill)."""
    seen = np.zeros_like(mask)
    count = 0
    for start in zip(*np.nonzero(mask), strict=True):
        if seen[start]:
            continue
        count += 1
        stack = [start]
        seen[start] = True
        while stack:
            y, x = stack.pop()
            for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                if 0 <= ny < mask.shape[0] and 0 <= nx < mask.shape[1] and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    stack.append((ny, nx))
    return count


def test_every_ground_truth_is_what_the_image_shows() -> None:
    train, test = generate_shapes(40, 10, seed=3)
    kinds = set()
    for row in train + test:
        pixels = _pixels(row)
        assert pixels.shape == (56, 56, 3)
        drawn = (pixels != 255).any(axis=-1)
        truth = row["reward_model"]["ground_truth"]
        kind = row["extra_info"]["kind"]
        kinds.add(kind)
        if kind == "count":
            assert _components(drawn) == int(truth)
            assert row["prompt"][0]["content"].startswith("<image>How many dots are in the image?")
        else:
            assert {tuple(p) for p in pixels[drawn]} == {COLOURS[truth]}  # one colour, the named one
            assert _components(drawn) == 1
            assert row["prompt"][0]["content"].startswith("<image>What colour is the square?")
    assert kinds == {"count", "colour"}


def test_rows_are_verl_multimodal_rows() -> None:
    train, _ = generate_shapes(2, 1, seed=0)
    row = train[0]
    assert sorted(row) == ["ability", "data_source", "extra_info", "images", "prompt", "reward_model"]
    assert row["data_source"] == DATA_SOURCE == "hybridflow/shapes"
    assert row["reward_model"]["style"] == "rule"
    assert row["extra_info"]["split"] == "train" and row["extra_info"]["index"] == 0
    assert len(row["prompt"]) == 1 and row["prompt"][0]["content"].count("<image>") == 1
    assert row["images"][0]["path"] is None and row["images"][0]["bytes"].startswith(b"\x89PNG")


def test_deterministic_from_the_seed_and_splits_disjoint() -> None:
    assert generate_shapes(30, 10, seed=5) == generate_shapes(30, 10, seed=5)
    other, _ = generate_shapes(30, 10, seed=6)
    assert other != generate_shapes(30, 10, seed=5)[0]
    train, test = generate_shapes(300, 100, seed=0)
    digest = [hashlib.sha256(_pixels(r).tobytes()).hexdigest() for r in train + test]
    assert len(set(digest)) == 400  # no image twice, in or across the splits


def test_settings_shape_the_problems() -> None:
    settings = ShapesSettings(image_size=84, kinds=("count",), min_dots=2, max_dots=3)
    train, _ = generate_shapes(20, 0, seed=1, settings=settings)
    assert {r["reward_model"]["ground_truth"] for r in train} == {"2", "3"}
    assert all(_pixels(r).shape == (84, 84, 3) for r in train)


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"image_size": 20}, "image_size must be in 28..448"),
        ({"kinds": ("size",)}, "kinds must be a non-empty selection of count, colour"),
        ({"min_dots": 4, "max_dots": 3}, "need 1 <= min_dots <= max_dots <= 12"),
    ],
)
def test_bad_settings_are_refused(kwargs, problem) -> None:
    with pytest.raises(ValueError, match=problem):
        ShapesSettings(**kwargs)


def test_too_few_distinct_images_is_a_clear_error(monkeypatch) -> None:
    blank = Image.new("RGB", (56, 56), "white")
    monkeypatch.setattr(shapes, "make_problem", lambda rng, settings: ("count", "0", blank))
    with pytest.raises(ValueError, match="found only 1 of 2 distinct test images"):
        generate_shapes(0, 2, seed=0)


def test_cli_writes_images_rows_and_sft_split(tmp_path, capsys) -> None:
    out = tmp_path / "shapes"
    assert main(["shapes", "--out", str(out), "--train-size", "6", "--test-size", "3", "--seed", "2"]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["images", "sft.jsonl", "sft.parquet", "test.jsonl", "test.parquet", "train.jsonl", "train.parquet"]
    assert len(list((out / "images").iterdir())) == 9
    assert "6 train rows, 3 test rows" in capsys.readouterr().out
    expected_train, _ = generate_shapes(6, 3, seed=2)
    for split in ("train", "test"):
        parquet, jsonl = read_rows(out / f"{split}.parquet"), read_rows(out / f"{split}.jsonl")
        for k, (p, j) in enumerate(zip(parquet, jsonl, strict=True)):
            path = f"images/{split}-{k:05d}.png"
            assert j["images"] == [{"bytes": None, "path": path}]
            assert p["images"] == [{"bytes": (out / path).read_bytes(), "path": path}]
            assert {**p, "images": None} == {**j, "images": None}
    assert [r["images"][0]["bytes"] for r in read_rows(out / "train.parquet")] == [
        r["images"][0]["bytes"] for r in expected_train
    ]
    sft = read_rows(out / "sft.parquet")
    assert [m["role"] for m in sft[0]["messages"]] == ["user", "assistant"]
    assert [r["messages"][1]["content"] for r in sft] == [r["reward_model"]["ground_truth"] for r in expected_train]


def test_cli_refuses_a_prompt_template(tmp_path, capsys) -> None:
    assert main(["shapes", "--out", str(tmp_path), "--prompt-template", "Q: {question}\\nA:"]) == 2
    assert "need the chat template" in capsys.readouterr().err


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_written_files_read_back_through_rl_dataset(tmp_path, processor, suffix) -> None:
    out = tmp_path / "shapes"
    assert main(["shapes", "--out", str(out), "--train-size", "5", "--test-size", "2"]) == 0
    rows = read_rows(out / f"train{suffix}")
    ds = RLDataset(out / f"train{suffix}", processor.tokenizer, processor=processor, max_prompt_length=64)
    assert ds.multimodal and len(ds) == 5
    image_pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    vision_start = processor.tokenizer.convert_tokens_to_ids(VISION_START)
    for k, row in enumerate(rows):
        item = ds[k]
        ids = item["raw_prompt_ids"]
        # one image of 56×56: a 4×4 grid of 14-pixel patches, merged 2×2 into 4 image tokens
        assert item["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4]]
        assert item["multi_modal_inputs"]["pixel_values"].shape == (16, 1176)
        assert ids.count(vision_start) == 1 and ids.count(image_pad) == 4
        assert len(item["multi_modal_data"]["image"]) == 1
        assert item["position_ids"].shape == (3, 64)
        assert item["reward_model"]["ground_truth"] == row["reward_model"]["ground_truth"]
        assert item["data_source"] == DATA_SOURCE


def test_registered_as_a_task() -> None:
    assert "shapes" in TASKS
