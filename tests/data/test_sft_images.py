"""SFT rows with images (verl's multi-turn SFT layout) through SFTDataset with the tiny VLM's processor,
and one SFT loss step on the tiny VLM with them."""

from __future__ import annotations

import io
import json
from functools import partial

import numpy as np
import pytest
import torch
from PIL import Image

from hybridflow import fields as FK
from hybridflow.data.collate import collate_fn
from hybridflow.data.io import write_rows
from hybridflow.data.schema import DataRowError
from hybridflow.data.sft_dataset import LOSS_MASK, SFTDataset
from hybridflow.engine.micro_batch import MicroBatchSpec
from hybridflow.engine.multimodal_inputs import image_model_kwargs
from hybridflow.engine.torch_engine import TorchEngine
from hybridflow.entrypoints.data import main as data_main
from hybridflow.models.tiny_vlm import IMAGE_PAD, build_tiny_vlm, build_tiny_vlm_processor
from hybridflow.trainer.supervised.sft_loss import sft_loss, token_log_probs
from hybridflow.trainer.supervised.sft_trainer import to_tensordict

MAX_LENGTH = 96


@pytest.fixture(scope="module")
def processor():
    return build_tiny_vlm_processor()


def _png(size: tuple[int, int], seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _image(size=(56, 56), seed=0) -> dict:
    return {"bytes": _png(size, seed), "path": None}


def _dataset(tmp_path, processor, rows, name="sft.parquet", **kwargs) -> SFTDataset:
    path = write_rows(rows, tmp_path / name)
    kwargs.setdefault("messages_key", "messages")
    return SFTDataset(path, processor.tokenizer, processor=processor, max_length=MAX_LENGTH, **kwargs)


def _encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def test_one_image_item_matches_hand_expectations(tmp_path, processor) -> None:
    tok = processor.tokenizer
    rows = [
        {
            "messages": [{"role": "user", "content": "<image>How many?"}, {"role": "assistant", "content": "3"}],
            "images": [_image()],
        }
    ]
    ds = _dataset(tmp_path, processor, rows)
    item = ds[0]
    pad = tok.convert_tokens_to_ids(IMAGE_PAD)
    # a 56×56 image is a 4×4 grid of 14-pixel patches, merged 2×2: 4 image tokens
    head = _encode(tok, "<|im_start|>user\n<|vision_start|>")
    middle = _encode(tok, "<|vision_end|>How many?<|im_end|>\n<|im_start|>assistant\n")
    reply, tail = _encode(tok, "3<|im_end|>"), _encode(tok, "\n")
    expected = head + [pad] * 4 + middle + reply + tail
    n = len(expected)
    assert item["input_ids"][:n].tolist() == expected
    assert item["attention_mask"].tolist() == [1] * n + [0] * (MAX_LENGTH - n)
    assert item[LOSS_MASK].tolist() == [0] * (n - len(reply) - 1) + [1] * len(reply) + [0] * (MAX_LENGTH - n + 1)
    # the processor's own expansion of the whole conversation gives the same ids
    text = processor.apply_chat_template(
        [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]},
            {"role": "assistant", "content": "3"},
        ],
        tokenize=False,
    )
    image = Image.open(io.BytesIO(rows[0]["images"][0]["bytes"])).convert("RGB")
    assert processor(text=[text], images=[image])["input_ids"][0] == expected
    inputs = item["multi_modal_inputs"]
    assert inputs["image_grid_thw"].tolist() == [[1, 4, 4]] and inputs["pixel_values"].shape == (16, 1176)
    # 3-D positions: text 0..3 on every axis, the image's 2×2 tokens at 4 + (0, row, column), the
    # text after it resumes at 4 + max(2, 2) = 6; padding at 0
    positions = item["position_ids"]
    assert positions.shape == (3, MAX_LENGTH)
    k = len(head)
    assert positions[:, :k].tolist() == [list(range(k))] * 3
    assert positions[:, k : k + 4].tolist() == [[k] * 4, [k, k, k + 1, k + 1], [k, k + 1, k, k + 1]]
    assert positions[:, k + 4].tolist() == [k + 2] * 3
    assert positions[:, n:].abs().sum() == 0


def test_multi_turn_images_in_two_user_turns(tmp_path, processor) -> None:
    tok = processor.tokenizer
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "<image>Colour?"},
        {"role": "assistant", "content": "red"},
        {"role": "user", "content": "And <image>?"},
        {"role": "assistant", "content": "blue"},
    ]
    rows = [{"messages": messages, "images": [_image((56, 56), 1), _image((112, 56), 2)]}]
    item = _dataset(tmp_path, processor, rows)[0]
    pad = tok.convert_tokens_to_ids(IMAGE_PAD)
    ids, mask = item["input_ids"].tolist(), item[LOSS_MASK].tolist()
    assert ids.count(pad) == 4 + 8  # 56×56: 4 tokens; 112×56: a 4×8 patch grid, 8 tokens
    assert item["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 8]]
    # targets: exactly the two replies with their end-of-turn tokens
    targets = [t for t, m in zip(ids, mask, strict=True) if m]
    assert targets == _encode(tok, "red<|im_end|>") + _encode(tok, "blue<|im_end|>")
    assert all(m == 0 for t, m in zip(ids, mask, strict=True) if t == pad)


def test_single_turn_prompt_response_rows_with_an_image(tmp_path, processor) -> None:
    rows = [{"prompt": [{"role": "user", "content": "<image>Shape?"}], "response": "square", "images": [_image()]}]
    path = write_rows(rows, tmp_path / "single.parquet")
    ds = SFTDataset(path, processor.tokenizer, processor=processor, max_length=MAX_LENGTH)
    ids, mask = ds.token_ids(0)
    assert [t for t, m in zip(ids, mask, strict=True) if m] == _encode(processor.tokenizer, "square<|im_end|>")


def test_a_text_row_beside_image_rows_gets_3d_text_positions(tmp_path, processor) -> None:
    rows = [
        {
            "messages": [{"role": "user", "content": "<image>Hi"}, {"role": "assistant", "content": "ok"}],
            "images": [_image()],
        },
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "ok"}], "images": []},
    ]
    ds = _dataset(tmp_path, processor, rows)
    assert ds.multimodal
    item = ds[1]
    n = int(item["attention_mask"].sum())
    assert item["multi_modal_inputs"] == {}
    assert item["position_ids"][:, :n].tolist() == [list(range(n))] * 3


def test_without_images_the_dataset_is_unchanged(tmp_path, processor) -> None:
    rows = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "ok"}], "images": None}]
    ds = _dataset(tmp_path, processor, rows)
    assert not ds.multimodal
    item = ds[0]
    assert item["position_ids"].shape == (MAX_LENGTH,) and "multi_modal_inputs" not in item


def _conversation(text="<image>Hi", reply="ok"):
    return [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]


@pytest.mark.parametrize(
    ("row", "field", "problem"),
    [
        (
            {"messages": _conversation("<image><image>Hi"), "images": [_image()]},
            "images",
            "the prompt has 2 <image> placeholders but the row has 1 images",
        ),
        (
            {"messages": _conversation("Hi"), "images": [_image()]},
            "images",
            "the prompt has 0 <image> placeholders but the row has 1 images",
        ),
        (
            {"messages": _conversation(), "images": [{"bytes": None, "path": "missing.png"}]},
            "images",
            "image 0: cannot be read as an image: .*missing.png.* not found",
        ),
        (
            {"messages": _conversation(), "images": [{"bytes": b"not an image", "path": None}]},
            "images",
            "image 0: cannot be read as an image",
        ),
        (
            {
                "messages": [{"role": "user", "content": "<image>Hi"}, {"role": "assistant", "content": "see <image>"}],
                "images": [_image(), _image(seed=1)],
            },
            "images",
            "an image is inside a trained assistant turn",
        ),
        (
            {"messages": _conversation(), "images": [_image()], "videos": ["clip.mp4"]},
            "videos",
            "videos are not supported yet",
        ),
    ],
)
def test_bad_rows_name_file_row_and_column(tmp_path, processor, row, field, problem) -> None:
    good = {"messages": _conversation(), "images": [_image()], **({"videos": None} if "videos" in row else {})}
    with pytest.raises(DataRowError, match=rf"bad.parquet: row 1: field '{field}': {problem}"):
        _dataset(tmp_path, processor, [good, row], name="bad.parquet")


def test_image_rows_without_a_processor_are_an_error(tmp_path, processor) -> None:
    path = write_rows([{"messages": _conversation(), "images": [_image()]}], tmp_path / "x.parquet")
    with pytest.raises(DataRowError, match="row 0: field 'images': the row has images but no processor was given"):
        SFTDataset(path, processor.tokenizer, messages_key="messages", max_length=MAX_LENGTH)


def test_placeholders_without_images_in_a_text_dataset_are_an_error(tmp_path, processor) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"messages": _conversation(), "images": []}) + "\n")
    with pytest.raises(
        DataRowError, match="row 0: field 'images': the prompt has 1 <image> placeholders but the row has 0"
    ):
        SFTDataset(path, processor.tokenizer, messages_key="messages", processor=processor)


def test_image_rows_are_never_truncated(tmp_path, processor) -> None:
    rows = [{"messages": _conversation(reply="x" * 200), "images": [_image()]}]
    with pytest.raises(DataRowError, match=r"more than data.max_length=96; raise data.max_length \(rows with images"):
        _dataset(tmp_path, processor, rows, truncation="left")


def test_image_files_relative_to_the_data_file(tmp_path, processor) -> None:
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "a.png").write_bytes(_png((56, 56), 3))
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"messages": _conversation(), "images": [{"bytes": None, "path": "pics/a.png"}]}) + "\n")
    ds = SFTDataset(path, processor.tokenizer, messages_key="messages", processor=processor, max_length=MAX_LENGTH)
    assert ds[0]["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4]]


def _shapes_sft_batch(tmp_path, processor):
    """Four SFT rows of the built-in visual task, collated as the SFT loader does."""
    assert data_main(["shapes", "--out", str(tmp_path / "shapes"), "--train-size", "4", "--test-size", "1"]) == 0
    ds = SFTDataset(
        tmp_path / "shapes" / "sft.parquet",
        processor.tokenizer,
        messages_key="messages",
        processor=processor,
        max_length=80,
    )
    return to_tensordict(collate_fn([ds[i] for i in range(len(ds))]))


@pytest.mark.parametrize("spec", [MicroBatchSpec(size=1), MicroBatchSpec(size=4), MicroBatchSpec(max_token_len=120)])
def test_one_sft_step_with_images_reaches_the_vision_tower(tmp_path, processor, spec) -> None:
    """The SFT trainer's own forward (``sft_loss.token_log_probs``) on image rows, by count and by
    token budget: each micro-batch gets exactly its rows' images."""
    batch = _shapes_sft_batch(tmp_path, processor)
    module = build_tiny_vlm(processor.tokenizer, seed=0).float()
    engine = TorchEngine(module, lr=1e-3, grad_clip=None, micro_batch_size=2)
    n_tokens = int(batch[LOSS_MASK].sum())
    metrics = engine.forward_backward(batch, token_log_probs, partial(sft_loss, batch_num_tokens=n_tokens), spec)
    loss = sum(float(m["loss"]) for m in metrics)
    # the same loss from the HF model alone: its own positions (get_rope_index) and its own loss
    labels = torch.where(batch[LOSS_MASK].bool(), batch[FK.INPUT_IDS], -100)
    reference = build_tiny_vlm(processor.tokenizer, seed=0).float()
    with torch.no_grad():
        expected = reference(
            input_ids=batch[FK.INPUT_IDS],
            attention_mask=batch[FK.ATTENTION_MASK],
            labels=labels,
            mm_token_type_ids=(batch[FK.INPUT_IDS] == processor.image_token_id).int(),
            **image_model_kwargs(batch, torch.device("cpu")),
        ).loss
    assert np.isfinite(loss) and abs(loss - float(expected)) <= 1e-5
    grads = [p.grad for p in module.model.visual.parameters()]
    assert grads and all(g is not None and torch.isfinite(g).all() and g.abs().max() > 0 for g in grads)
