"""Log-probs and values of vision-language rows (tiny Qwen2-VL) through the engine's micro-batches."""

from __future__ import annotations

import logging
from functools import partial

import numpy as np
import pytest
import torch
from PIL import Image
from tensordict import TensorDict

from hybridflow import fields as FK
from hybridflow.data.multimodal import encode_multimodal_prompt, rope_index, rope_settings
from hybridflow.engine.forward import response_log_probs, response_values, response_window, worth_packing
from hybridflow.engine.micro_batch import MicroBatchSpec
from hybridflow.engine.micro_batch_runner import infer_micro_batches, make_plan, plan_chunks
from hybridflow.engine.multimodal_inputs import (
    engine_batch,
    image_model_kwargs,
    model_position_ids,
    with_multi_modal_inputs,
)
from hybridflow.engine.torch_engine import TorchEngine
from hybridflow.models.tiny_vlm import build_tiny_vlm, build_tiny_vlm_processor
from hybridflow.models.value_model import ValueHeadModel
from hybridflow.protocol import DataProto

# (prompt text with <image> placeholders, image sizes (w, h), response length)
ROWS = [
    ("<image>What is here?", [(56, 56)], 3),
    ("Compare <image> with <image> and say which is brighter, briefly.", [(84, 56), (112, 112)], 5),
    ("Count: <image>", [(56, 84)], 4),
]
RESPONSE_WIDTH = 6


@pytest.fixture(scope="module")
def processor():
    return build_tiny_vlm_processor()


@pytest.fixture(scope="module")
def model():
    return build_tiny_vlm(seed=0).float()


def _image(size: tuple[int, int], seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _encode_rows(processor, rows, seed: int = 0):
    """Per row: (prompt ids, response ids, image inputs)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for k, (text, sizes, n_resp) in enumerate(rows):
        images = [_image(size, seed=100 * k + j + seed) for j, size in enumerate(sizes)]
        prompt = encode_multimodal_prompt(processor, [{"role": "user", "content": text}], images)
        response = torch.randint(4, 512, (n_resp,), generator=gen)  # text ids only, no vision tokens
        out.append((torch.tensor(prompt.input_ids), response, prompt.multi_modal_inputs))
    return out


def _batch(processor, encoded) -> TensorDict:
    """Left-padded prompts, right-padded responses, (B, 3, L) positions, image inputs attached."""
    pad = processor.tokenizer.pad_token_id
    width = max(len(p) for p, _, _ in encoded)
    token_id, merge = rope_settings(processor)
    ids, masks, positions, responses = [], [], [], []
    for prompt, response, mm in encoded:
        left, right = width - len(prompt), RESPONSE_WIDTH - len(response)
        row = torch.cat([torch.full((left,), pad), prompt, response, torch.full((right,), pad)])
        mask = torch.cat([torch.zeros(left), torch.ones(len(prompt) + len(response)), torch.zeros(right)]).long()
        ids.append(row)
        masks.append(mask)
        positions.append(
            rope_index(row, mask, mm.get("image_grid_thw"), image_token_id=token_id, spatial_merge_size=merge)
        )
        responses.append(torch.cat([response, torch.full((right,), pad)]))
    batch = TensorDict(
        {
            FK.INPUT_IDS: torch.stack(ids),
            FK.ATTENTION_MASK: torch.stack(masks),
            FK.POSITION_IDS: torch.stack(positions),
            FK.RESPONSES: torch.stack(responses),
        },
        batch_size=[len(encoded)],
    )
    return with_multi_modal_inputs(batch, [mm for _, _, mm in encoded])


def _reference_log_probs(model, processor, encoded) -> torch.Tensor:
    """Each row alone through the HF model, its positions computed by the model itself."""
    out = torch.zeros(len(encoded), RESPONSE_WIDTH)
    token_id, _ = rope_settings(processor)
    for i, (prompt, response, mm) in enumerate(encoded):
        ids = torch.cat([prompt, response])[None]
        with torch.no_grad():
            logits = model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                mm_token_type_ids=(ids == token_id).int(),
                use_cache=False,
                **mm,
            ).logits[0]
        predicting = logits[len(prompt) - 1 : ids.shape[1] - 1].float().log_softmax(-1)
        out[i, : len(response)] = predicting.gather(-1, response[:, None])[:, 0]
    return out


def test_log_probs_equal_each_row_alone(model, processor) -> None:
    encoded = _encode_rows(processor, ROWS)
    assert [int(mm["image_grid_thw"].shape[0]) for _, _, mm in encoded] == [1, 2, 1]
    expected = _reference_log_probs(model, processor, encoded)
    got = infer_micro_batches(
        model, _batch(processor, encoded), response_log_probs, MicroBatchSpec(size=3), torch.device("cpu")
    )
    diff = (got["log_probs"] - expected).abs().max().item()
    assert diff <= 1e-5, diff
    assert (got["log_probs"][0, 3:] == 0).all() and (got["log_probs"][2, 4:] == 0).all()


def test_model_gets_the_rows_3d_positions_as_3_b_l(model, processor) -> None:
    """The language model receives (3, b, columns) positions equal to the model's own rope
    index of those rows (the padded window: common left padding cut, last column dropped)."""
    encoded = _encode_rows(processor, ROWS)
    batch = _batch(processor, encoded)
    token_id, _ = rope_settings(processor)
    seen = []
    hook = model.model.language_model.register_forward_pre_hook(
        lambda _m, _a, kwargs: seen.append(kwargs["position_ids"]), with_kwargs=True
    )
    try:
        infer_micro_batches(model, batch, response_log_probs, MicroBatchSpec(size=3), torch.device("cpu"))
    finally:
        hook.remove()
    (order,) = make_plan(batch, MicroBatchSpec(size=3))  # the micro-batch's rows, longest first
    assert order != [0, 1, 2]
    ids, mask = batch[FK.INPUT_IDS][order], batch[FK.ATTENTION_MASK][order]
    grids = torch.cat([encoded[i][2]["image_grid_thw"] for i in order])
    expected, _ = model.model.get_rope_index(
        ids, image_grid_thw=grids, attention_mask=mask, mm_token_type_ids=(ids == token_id).int()
    )
    (got,) = seen
    window = response_window(mask, RESPONSE_WIDTH)
    cols = slice(window.lo, window.hi - 1)
    assert window.lo == 0 and window.hi - 1 < ids.shape[1] - 1  # the longest row has a padded response
    assert got.shape == (3, 3, window.hi - 1)
    assert torch.equal(got, expected[:, :, cols])


@pytest.mark.parametrize("spec", [MicroBatchSpec(size=1), MicroBatchSpec(size=2), MicroBatchSpec(max_token_len=80)])
def test_micro_batch_split_does_not_change_log_probs(model, processor, spec) -> None:
    batch = _batch(processor, _encode_rows(processor, ROWS))
    whole = infer_micro_batches(model, batch, response_log_probs, MicroBatchSpec(size=3), torch.device("cpu"))
    split = infer_micro_batches(model, batch, response_log_probs, spec, torch.device("cpu"))
    assert (split["log_probs"] - whole["log_probs"]).abs().max().item() <= 1e-5


def test_images_follow_their_rows(model, processor) -> None:
    """Swapping two rows' images (same grids) changes exactly those rows' log-probs."""
    rows = [("<image>Same prompt.", [(56, 56)], 4)] * 3
    encoded = _encode_rows(processor, rows)
    assert torch.equal(encoded[0][0], encoded[1][0])  # identical prompt ids, different pixels
    batch = _batch(processor, encoded)
    swapped = with_multi_modal_inputs(batch, [encoded[1][2], encoded[0][2], encoded[2][2]])
    a = infer_micro_batches(model, batch, response_log_probs, MicroBatchSpec(size=1), torch.device("cpu"))["log_probs"]
    b = infer_micro_batches(model, swapped, response_log_probs, MicroBatchSpec(size=3), torch.device("cpu"))[
        "log_probs"
    ]
    assert (a[2] - b[2]).abs().max() <= 1e-5
    assert (a[0] - b[0]).abs().max() > 1e-4 and (a[1] - b[1]).abs().max() > 1e-4


def test_shared_prompts_step_aside_for_images(model, processor, caplog) -> None:
    """Rows with equal prompt ids but other images must not share one prompt pass."""
    rows = [("<image>Same prompt.", [(56, 56)], 4)] * 2 + [("<image>Other.", [(56, 56)], 3)]
    encoded = _encode_rows(processor, rows, seed=7)
    batch = _batch(processor, encoded)
    with caplog.at_level(logging.INFO, logger="hybridflow.engine.multimodal_inputs"):
        chunks = plan_chunks(model, batch, response_log_probs, MicroBatchSpec(size=2), training=False)
    assert not any(chunk.shared_prompts for chunk in chunks)
    got = infer_micro_batches(model, batch, response_log_probs, MicroBatchSpec(size=2), torch.device("cpu"))
    diff = (got["log_probs"] - _reference_log_probs(model, processor, encoded)).abs().max().item()
    assert diff <= 1e-5, diff


def _vision_grads(processor, micro_batch_size: int) -> list[torch.Tensor]:
    module = build_tiny_vlm(seed=0).float()
    batch = _batch(processor, _encode_rows(processor, ROWS))
    engine = TorchEngine(module, lr=1e-3, grad_clip=None, micro_batch_size=micro_batch_size)

    def loss_fn(outputs, micro):
        return -outputs["log_probs"].sum(), {}

    engine.forward_backward(batch, partial(response_log_probs, calculate_entropy=True), loss_fn)
    return [p.grad for p in module.model.visual.parameters() if p.requires_grad]


def test_backward_reaches_the_vision_tower(processor) -> None:
    grads = _vision_grads(processor, micro_batch_size=2)
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert all(g.abs().max() > 0 for g in grads)  # every vision parameter gets a gradient
    # the split of the rows into micro-batches does not change them
    single = _vision_grads(processor, micro_batch_size=1)
    for a, b in zip(grads, single, strict=True):
        assert (a - b).abs().max() <= 1e-5 * max(1.0, float(b.abs().max()))


def test_values_of_image_rows_do_not_depend_on_the_split(processor) -> None:
    vlm = build_tiny_vlm(seed=0).float()
    critic = ValueHeadModel(vlm.model, hidden_size=vlm.config.text_config.hidden_size, init_std=0.02, seed=0)
    encoded = _encode_rows(processor, ROWS)
    batch = _batch(processor, encoded)
    alone = [
        infer_micro_batches(critic, batch[i : i + 1], response_values, None, torch.device("cpu"))["values"]
        for i in range(3)
    ]
    together = infer_micro_batches(critic, batch, response_values, MicroBatchSpec(size=3), torch.device("cpu"))
    assert (together["values"] - torch.cat(alone)).abs().max() <= 1e-5
    assert together["values"][0, :3].abs().min() > 0 and (together["values"][0, 3:] == 0).all()
    # the image reaches the value: other pixels, other values
    other = with_multi_modal_inputs(batch, [_encode_rows(processor, ROWS, seed=5)[0][2], *[e[2] for e in encoded[1:]]])
    changed = infer_micro_batches(critic, other, response_values, None, torch.device("cpu"))["values"]
    assert (changed[0] - together["values"][0]).abs().max() > 1e-6


def test_packing_steps_aside_for_image_rows(processor) -> None:
    batch = _batch(processor, _encode_rows(processor, ROWS))
    assert not worth_packing(batch, RESPONSE_WIDTH, min_padding=0.0)
    text_only = batch.exclude(FK.MULTI_MODAL_INPUTS)
    text_only[FK.POSITION_IDS] = text_only[FK.POSITION_IDS][:, 0]
    assert worth_packing(text_only, RESPONSE_WIDTH, min_padding=0.0)


def test_helpers_concatenate_in_row_order_and_transpose_positions(processor) -> None:
    encoded = _encode_rows(processor, ROWS)
    batch = _batch(processor, encoded)
    micro = batch[torch.tensor([2, 0])]
    kwargs = image_model_kwargs(micro, torch.device("cpu"))
    assert torch.equal(
        kwargs["pixel_values"], torch.cat([encoded[2][2]["pixel_values"], encoded[0][2]["pixel_values"]])
    )
    assert torch.equal(
        kwargs["image_grid_thw"], torch.cat([encoded[2][2]["image_grid_thw"], encoded[0][2]["image_grid_thw"]])
    )
    positions = micro[FK.POSITION_IDS]
    assert model_position_ids(positions).shape == (3, 2, positions.shape[-1])
    four = torch.cat([positions[:, :1], positions], dim=1)  # verl's (B, 4, L): text row first
    assert torch.equal(model_position_ids(four), model_position_ids(positions))
    with pytest.raises(ValueError, match="position_ids"):
        model_position_ids(positions[:, :2])
    with pytest.raises(ValueError, match="2 entries for a batch of 3"):
        with_multi_modal_inputs(batch, [None, None])


def test_engine_batch_attaches_a_data_protos_image_inputs(processor) -> None:
    encoded = _encode_rows(processor, ROWS)
    batch = _batch(processor, encoded).exclude(FK.MULTI_MODAL_INPUTS)
    rows = np.empty(3, dtype=object)
    rows[:] = [encoded[0][2], None, encoded[2][2]]  # a row without images in a mixed batch
    data = DataProto(batch=batch, non_tensor_batch={FK.MULTI_MODAL_INPUTS: rows})
    attached = engine_batch(data)
    assert FK.MULTI_MODAL_INPUTS not in batch.keys()  # a copy: the DataProto's batch is untouched
    kwargs = image_model_kwargs(attached[torch.tensor([1, 2])], torch.device("cpu"))
    assert torch.equal(kwargs["image_grid_thw"], encoded[2][2]["image_grid_thw"])
    assert engine_batch(DataProto(batch=batch)) is batch


def test_chunked_lm_head_would_serve_image_rows(model, processor, monkeypatch) -> None:
    """The chunked head knows no qwen2_vl (so image rows take the plain head); listed as a
    plain head, it gives the same log-probs on image rows: it only sees the hidden states."""
    import hybridflow.engine.chunked_lm_head as chunked
    import hybridflow.engine.forward as forward

    encoded = _encode_rows(processor, ROWS)
    batch = _batch(processor, encoded)
    assert forward.chunked_head(model, 10**9) is None
    monkeypatch.setattr(chunked, "_PLAIN_HEAD", chunked._PLAIN_HEAD | {"qwen2_vl"})
    monkeypatch.setattr(forward, "CHUNKED_HEAD_MIN_BYTES", 0)
    assert forward.chunked_head(model, 1) is not None
    got = infer_micro_batches(model, batch, response_log_probs, MicroBatchSpec(size=2), torch.device("cpu"))
    diff = (got["log_probs"] - _reference_log_probs(model, processor, encoded)).abs().max().item()
    assert diff <= 1e-5, diff


def test_shuffled_mini_batches_keep_each_rows_images(model, processor) -> None:
    """The actor's mini-batching (row indexing of the TensorDict) carries the image inputs."""
    from hybridflow.workers.ppo_loop import iter_mini_batches

    batch = _batch(processor, _encode_rows(processor, ROWS))
    whole = infer_micro_batches(model, batch, response_log_probs, None, torch.device("cpu"))["log_probs"]
    generator = torch.Generator().manual_seed(3)
    order = torch.randperm(3, generator=torch.Generator().manual_seed(3)).tolist()
    assert order != [0, 1, 2]
    for row, mini in zip(order, iter_mini_batches(batch, 1, 1, True, generator)):
        got = infer_micro_batches(model, mini, response_log_probs, None, torch.device("cpu"))["log_probs"]
        assert (got[0] - whole[row]).abs().max() <= 1e-5


def test_text_rows_keep_the_old_paths(make_rollout_batch) -> None:
    """Text rows ((B, L) positions, no images, with or without an all-None image column)
    still share their repeated prompts, and give the same log-probs bit for bit."""
    from hybridflow.engine.forward import compute_position_ids
    from hybridflow.models.tiny import build_tiny_model

    model = build_tiny_model(seed=0)
    batch = make_rollout_batch(num_rows=4, prompt_len=6, response_len=5, seed=1).batch.clone()
    ids, mask = batch[FK.INPUT_IDS].clone(), batch[FK.ATTENTION_MASK].clone()
    ids[:, :6], mask[:, :6] = ids[0, :6], mask[0, :6]  # every row repeats row 0's prompt
    batch[FK.INPUT_IDS], batch[FK.ATTENTION_MASK] = ids, mask
    batch[FK.POSITION_IDS] = compute_position_ids(mask)
    with_none = with_multi_modal_inputs(batch, [None, {}, None, None])
    spec = MicroBatchSpec(size=2)
    for b in (batch, with_none):
        chunks = plan_chunks(model, b, response_log_probs, spec, training=False)
        assert all(chunk.shared_prompts for chunk in chunks)
    plain = infer_micro_batches(model, batch, response_log_probs, spec, torch.device("cpu"))["log_probs"]
    none = infer_micro_batches(model, with_none, response_log_probs, spec, torch.device("cpu"))["log_probs"]
    assert torch.equal(plain, none) and plain.abs().sum() > 0


def test_a_real_token_budget_counts_padded_size_for_image_rows(processor) -> None:
    """Image rows run padded, so a packing budget (real tokens) is applied to rows × longest."""
    batch = _batch(processor, _encode_rows(processor, ROWS))
    lengths = batch[FK.ATTENTION_MASK].sum(-1).tolist()
    budget = int(sum(lengths))  # every row fits by real tokens, not by padded size
    plan = make_plan(batch, MicroBatchSpec(max_token_len=budget, real_tokens=True))
    assert len(plan) > 1
    assert all(len(micro) * max(lengths[i] for i in micro) <= budget for micro in plan)
    text = batch.exclude(FK.MULTI_MODAL_INPUTS)
    text[FK.POSITION_IDS] = text[FK.POSITION_IDS][:, 0]
    assert make_plan(text, MicroBatchSpec(max_token_len=budget, real_tokens=True)) == [[1, 2, 0]]


def test_an_image_token_in_a_response_is_a_clear_error(model, processor) -> None:
    encoded = _encode_rows(processor, ROWS)
    token_id, _ = rope_settings(processor)
    batch = _batch(processor, encoded)
    prompt_width = batch[FK.INPUT_IDS].shape[1] - RESPONSE_WIDTH
    batch[FK.INPUT_IDS][0, prompt_width + 1] = token_id  # as if the rollout had sampled the image token
    batch[FK.RESPONSES][0, 1] = token_id
    with pytest.raises(ValueError, match="a response holds the image token"):
        infer_micro_batches(model, batch, response_log_probs, MicroBatchSpec(size=3), torch.device("cpu"))
