"""verl's multimodal rows: images decoded from parquet, image tokens expanded, 3-D positions equal to
the model's, and each bad row named in its error."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from PIL import Image

from hybridflow.data import RLDataset, collate_fn
from hybridflow.data.io import DataFileError, write_rows
from hybridflow.data.multimodal import (
    MULTI_MODAL_DATA,
    MULTI_MODAL_INPUTS,
    count_placeholders,
    decode_images,
    rope_index,
    to_processor_messages,
)
from hybridflow.data.schema import DataRowError
from hybridflow.models.processor import load_processor
from hybridflow.models.tiny_vlm import IMAGE_PAD, TINY_VLM_MAX_PIXELS, save_tiny_vlm

MERGE = 2  # the tiny processor's merge size: 2 x 2 patches per image token


def png(width: int, height: int, color: tuple[int, int, int] = (200, 40, 40)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buffer, format="PNG")
    return buffer.getvalue()


def vl_row(content: str, images: list | None, index: int) -> dict:
    return {
        "data_source": "geo",
        "prompt": [{"role": "user", "content": content}],
        "reward_model": {"style": "rule", "ground_truth": "1"},
        "extra_info": {"index": index},
        "images": images,
    }


def image(data: bytes | None = None, path: str | None = None) -> dict:
    return {"bytes": data, "path": path}  # how HF datasets stores an Image feature in parquet


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny-qwen2-vl")


@pytest.fixture(scope="module")
def processor(folder):
    return load_processor(folder)


@pytest.fixture(scope="module")
def model(folder):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True).eval()


def dataset(tmp_path: Path, rows: list[dict], processor, name: str = "vl.parquet", **kwargs) -> RLDataset:
    path = write_rows(rows, tmp_path / name)
    return RLDataset(
        path, processor.tokenizer, processor=processor, max_prompt_length=kwargs.pop("length", 64), **kwargs
    )


def test_placeholders_become_content_parts() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "<image>A<image> and B"}]
    assert count_placeholders(messages) == (2, 0)
    assert to_processor_messages(messages) == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "image"},
                {"type": "text", "text": "A"},
                {"type": "image"},
                {"type": "text", "text": " and B"},
            ],
        },
    ]


def test_image_forms_decode_alike(tmp_path: Path) -> None:
    data = png(30, 20, (1, 2, 3))
    (tmp_path / "a.png").write_bytes(data)
    forms = [
        image(data),
        image(None, "a.png"),
        data,
        "a.png",
        f"file://{tmp_path / 'a.png'}",
        Image.open(io.BytesIO(data)),
    ]
    decoded = decode_images(forms, ValueError, base_dir=tmp_path, max_pixels=TINY_VLM_MAX_PIXELS)
    assert [(im.mode, im.size, im.getpixel((5, 5))) for im in decoded] == [("RGB", (30, 20), (1, 2, 3))] * 6


def test_rows_expand_image_tokens_and_carry_tensors(tmp_path: Path, processor) -> None:
    # 84x56 → 4 x 6 patches → 6 tokens; 56x112 → 8 x 4 patches → 8 tokens
    rows = [
        vl_row("<image>What is this? <image>", [image(png(84, 56)), image(png(56, 112))], 0),
        vl_row("No picture here.", [], 1),
    ]
    ds = dataset(tmp_path, rows, processor)
    item = ds[0]
    grids = [[1, 4, 6], [1, 8, 4]]
    inputs = item[MULTI_MODAL_INPUTS]
    assert inputs["image_grid_thw"].tolist() == grids
    assert inputs["pixel_values"].shape == (24 + 32, 3 * 2 * 14 * 14)
    assert set(inputs) == {"pixel_values", "image_grid_thw"}
    assert [im.size for im in item[MULTI_MODAL_DATA]["image"]] == [(84, 56), (56, 112)]
    ids = item["raw_prompt_ids"]
    expected_pads = sum(t * h * w // MERGE**2 for t, h, w in grids)
    assert ids.count(processor.image_token_id) == expected_pads == 14
    # the same ids as writing the vision blocks by hand, each pad repeated once per image token
    text = (
        "<|im_start|>user\n<|vision_start|>"
        + IMAGE_PAD * 6
        + "<|vision_end|>What is this? <|vision_start|>"
        + IMAGE_PAD * 8
        + "<|vision_end|><|im_end|>\n<|im_start|>assistant\n"
    )
    assert ids == processor.tokenizer.encode(text, add_special_tokens=False)
    assert item["input_ids"].tolist()[-len(ids) :] == ids and item["attention_mask"].sum().item() == len(ids)
    assert item["position_ids"].shape == (3, 64)
    text_item = ds[1]
    assert text_item[MULTI_MODAL_INPUTS] == {} and text_item[MULTI_MODAL_DATA] == {"image": []}
    n = len(text_item["raw_prompt_ids"])
    assert text_item["position_ids"][:, -n:].tolist() == [list(range(n))] * 3
    batch = collate_fn([item, text_item])
    assert batch["position_ids"].shape == (2, 3, 64)
    assert batch[MULTI_MODAL_INPUTS][0]["image_grid_thw"].tolist() == grids


def test_rope_index_by_hand() -> None:
    # text a b, one image of 1 x 4 x 4 patches (2 x 2 tokens), text c; one pad in front
    ids = torch.tensor([0, 7, 8, 9, 9, 9, 9, 5])
    mask = torch.tensor([0, 1, 1, 1, 1, 1, 1, 1])
    got = rope_index(ids, mask, torch.tensor([[1, 4, 4]]), image_token_id=9, spatial_merge_size=2)
    assert got.tolist() == [
        [0, 0, 1, 2, 2, 2, 2, 4],  # time: the image sits at its start position 2
        [0, 0, 1, 2, 2, 3, 3, 4],  # height: rows 0, 0, 1, 1
        [0, 0, 1, 2, 3, 2, 3, 4],  # width: columns 0, 1, 0, 1; text resumes at 2 + max(2, 2)
    ]
    with pytest.raises(ValueError, match="2 image grids but 1 image token runs"):
        rope_index(ids, mask, torch.tensor([[1, 4, 4], [1, 4, 4]]), image_token_id=9, spatial_merge_size=2)


def test_rope_index_equals_the_models(tmp_path: Path, processor, model) -> None:
    rows = [
        vl_row("Look: <image> then <image>, which is wider?", [image(png(112, 56)), image(png(28, 84))], 0),
        vl_row("<image>", [image(png(56, 56))], 1),
    ]
    ds = dataset(tmp_path, rows, processor, length=64)
    for k in range(len(ds)):
        item = ds[k]
        ids, mask = item["input_ids"][None], item["attention_mask"][None]
        expected, _ = model.model.get_rope_index(
            ids,
            mm_token_type_ids=(ids == processor.image_token_id).int(),
            image_grid_thw=item[MULTI_MODAL_INPUTS]["image_grid_thw"],
            attention_mask=mask,
        )
        assert torch.equal(item["position_ids"], expected[:, 0]), k
        with torch.no_grad():  # the model runs on the dataset's tensors and positions
            out = model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=item["position_ids"][:, None],
                **item[MULTI_MODAL_INPUTS],
            )
        assert torch.isfinite(out.logits).all()


def test_overlong_multimodal_prompts_filter_or_fail(tmp_path: Path, processor) -> None:
    # 12 text tokens around the image: 28 with a 112x112 image (16 tokens), 16 with a 56x56 one (4 tokens)
    rows = [vl_row("<image>Hi", [image(png(112, 112))], 0), vl_row("<image>Hi", [image(png(56, 56))], 1)]
    filtered = dataset(tmp_path, rows, processor, length=20, filter_overlong_prompts=True)
    assert (len(filtered), filtered.num_filtered, filtered[0]["index"]) == (1, 1, 1)
    with pytest.raises(
        DataRowError,
        match=r"row 0: field 'prompt': prompt is 28 tokens .*image tokens included.*"
        r"never truncated",
    ):
        dataset(tmp_path, rows, processor, length=20, truncation="left")


BAD_ROWS = {
    "missing file": (
        [image(None, "nope.png")],
        "<image>x",
        r"image 0: cannot be read as an image: .*nope.png.* not found",
    ),
    "corrupt bytes": ([image(b"not an image")], "<image>x", r"image 0: cannot be read as an image"),
    "truncated png": ([image(png(64, 64)[:60])], "<image>x", r"image 0: cannot be"),
    "empty dict": (
        [image(None, None)],
        "<image>x",
        r"image 0: cannot be read as an image: a dict with neither 'bytes' nor 'path'",
    ),
    "too few images": (
        [image(png(30, 30))],
        "<image><image>x",
        r"the prompt has 2 <image> placeholders but the row has 1 images",
    ),
    "too many images": (
        [image(png(30, 30))] * 2,
        "<image>x",
        r"the prompt has 1 <image> placeholders but the row has 2 images",
    ),
    "far too large": (
        [image(png(500, 450))],
        "<image>x",
        r"image 0: 500x450 = 225000 pixels, more than 16× the processor's max_pixels \(12544\)",
    ),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_bad_image_rows_are_named(tmp_path: Path, processor, case: str) -> None:
    images, content, problem = BAD_ROWS[case]
    rows = [vl_row("<image>ok", [image(png(30, 30))], 0), vl_row(content, images, 1)]
    with pytest.raises(DataRowError, match=r"vl.parquet: row 1: field 'images': " + problem):
        dataset(tmp_path, rows, processor)


def test_images_column_must_be_a_list() -> None:
    with pytest.raises(ValueError, match="expected a list of images .one per <image> placeholder., got dict"):
        decode_images(image(png(30, 30)), ValueError)


def test_videos_are_refused_by_row(tmp_path: Path, processor) -> None:
    rows = [vl_row("<image>ok", [image(png(30, 30))], 0), {**vl_row("<video>x", [], 1), "videos": None}]
    rows[0]["videos"] = None
    with pytest.raises(DataRowError, match=r"row 1: field 'videos': videos are not supported yet"):
        dataset(tmp_path, rows, processor)


def test_text_rows_and_missing_processor(tmp_path: Path, processor, tokenizer) -> None:
    text_rows = [vl_row("plain question", [], 0)]
    text = dataset(tmp_path, text_rows, processor, name="t.parquet")
    assert not text.multimodal and text[0]["position_ids"].shape == (64,) and MULTI_MODAL_INPUTS not in text[0]
    with pytest.raises(
        DataRowError,
        match=r"row 0: field 'images': the prompt has 1 <image> placeholders but the "
        r"row has 0 images",
    ):
        dataset(tmp_path, [vl_row("<image>?", [], 0)], processor, name="t2.parquet")
    path = write_rows([vl_row("<image>?", [image(png(30, 30))], 0)], tmp_path / "m.parquet")
    with pytest.raises(DataFileError, match="rows have images or videos .* but no processor was given"):
        RLDataset(path, tokenizer, max_prompt_length=64)

