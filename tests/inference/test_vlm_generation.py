"""Sampling from image + text prompts (tiny Qwen2-VL): the same tokens as transformers' own
``generate``, one vision-tower pass per distinct prompt, no merging of prompts whose ids match
but whose images differ, and no vision special token ever sampled."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from hybridflow.data.multimodal import render_prompt, rope_index, rope_settings
from hybridflow.engine.multimodal_inputs import vision_token_ids
from hybridflow.engine.shared_prompt import distinct_prompts
from hybridflow.inference.decoders import build_decoder
from hybridflow.inference.generation import generate
from hybridflow.inference.hf_decoder import HFDecoder
from hybridflow.inference.sampling import GenerationParams, sample_next
from hybridflow.models.tiny_vlm import build_tiny_vlm, build_tiny_vlm_processor

STEPS = 10


def _image(width: int, height: int, seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.fixture(scope="module")
def processor():
    proc = build_tiny_vlm_processor()
    proc.tokenizer.padding_side = "left"
    return proc


@pytest.fixture(scope="module")
def model():
    """The tiny VLM with larger random matrices: the default initialisation (std 0.02) gives
    near-uniform logits whose greedy answer repeats one token whatever the positions, so a
    position error would go unseen."""
    model = build_tiny_vlm(seed=0).float()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    return model


def _prompts(processor, rows):
    """Left-padded ids, mask, (B, 3, P) positions, per-row image inputs, and the processor's
    features (for transformers' generate)."""
    texts = [render_prompt(processor, [{"role": "user", "content": text}]) for text, _ in rows]
    images = [im for _, ims in rows for im in ims]
    features = processor(text=texts, images=images, return_tensors="pt", padding=True)
    token_id, merge = rope_settings(processor)
    grids = features["image_grid_thw"]
    per_row, start_grid, start_patch = [], 0, 0
    for _, ims in rows:
        grid = grids[start_grid : start_grid + len(ims)]
        patches = int(grid.prod(dim=-1).sum())
        per_row.append(
            {"pixel_values": features["pixel_values"][start_patch : start_patch + patches], "image_grid_thw": grid}
        )
        start_grid, start_patch = start_grid + len(ims), start_patch + patches
    ids, mask = features["input_ids"], features["attention_mask"]
    positions = torch.stack(
        [
            rope_index(ids[i], mask[i], per_row[i]["image_grid_thw"], image_token_id=token_id, spatial_merge_size=merge)
            for i in range(len(rows))
        ]
    )
    return ids, mask, positions, per_row, features


ROWS = [
    ("<image>What is here?", [_image(56, 56, 1)]),
    ("Compare <image> with <image>, please.", [_image(84, 56, 2), _image(112, 112, 3)]),
    ("Only words here.", []),
]


def test_greedy_tokens_and_log_probs_equal_transformers_generate(processor, model) -> None:
    ids, mask, positions, images, features = _prompts(processor, ROWS)
    suppress = vision_token_ids(model)
    assert suppress == (512, 513, 514, 515)
    ref = model.generate(
        **features,
        max_new_tokens=STEPS,
        min_new_tokens=STEPS,
        do_sample=False,
        suppress_tokens=list(suppress),
        pad_token_id=processor.tokenizer.pad_token_id,
        output_logits=True,
        return_dict_in_generate=True,
    )
    expected = ref.sequences[:, ids.shape[1] :]
    params = GenerationParams(max_new_tokens=STEPS, do_sample=False, suppress_token_ids=suppress)
    out = generate(HFDecoder(model), ids, mask, positions, params, processor.tokenizer.pad_token_id, images=images)
    assert torch.equal(out.responses, expected)
    assert len(set(expected[1].tolist())) > 3  # the answer moves: positions and pixels matter
    ref_lp = torch.stack([torch.log_softmax(step.float(), -1) for step in ref.logits], 1)
    ref_lp = ref_lp.gather(-1, expected[..., None])[..., 0]
    assert (out.log_probs - ref_lp).abs().max() < 1e-5
    # the 3-D positions matter: the height axis's positions given to every axis change the answer
    flat = generate(
        HFDecoder(model), ids, mask, positions[:, 1], params, processor.tokenizer.pad_token_id, images=images
    )
    assert (flat.log_probs - out.log_probs).abs().max() > 0.1


def test_the_vision_tower_runs_once_per_distinct_prompt(processor, model) -> None:
    rows = [ROWS[0], ROWS[1], ROWS[0]]
    ids, mask, positions, images, _ = _prompts(processor, rows)
    images[2] = dict(images[0])  # equal tensors in another dict: still the same prompt
    calls: list[int] = []
    hook = model.model.visual.register_forward_hook(lambda mod, args, out: calls.append(int(args[0].shape[0])))
    try:
        params = GenerationParams(max_new_tokens=4, do_sample=True, n=3)
        out = generate(
            HFDecoder(model), ids, mask, positions, params, 0, torch.Generator().manual_seed(0), images=images
        )
    finally:
        hook.remove()
    assert out.responses.shape == (9, 4)
    assert calls == [int(images[0]["pixel_values"].shape[0] + images[1]["pixel_values"].shape[0])]


def test_same_ids_with_other_images_are_other_prompts(processor, model) -> None:
    rows = [("<image>Describe.", [_image(56, 56, 7)]), ("<image>Describe.", [_image(56, 56, 8)])]
    ids, mask, positions, images, _ = _prompts(processor, rows)
    assert torch.equal(ids[0], ids[1]) and torch.equal(positions[0], positions[1])
    first, which = distinct_prompts(ids, mask, positions, images)
    assert first.tolist() == [0, 1] and which.tolist() == [0, 1]
    assert distinct_prompts(ids, mask, positions, [images[0], images[0]])[1].tolist() == [0, 0]
    params = GenerationParams(max_new_tokens=STEPS, do_sample=False)
    both = generate(HFDecoder(model), ids, mask, positions, params, 0, images=images)
    for i in range(2):
        alone = generate(
            HFDecoder(model), ids[i : i + 1], mask[i : i + 1], positions[i : i + 1], params, 0, images=images[i : i + 1]
        )
        assert torch.equal(both.responses[i], alone.responses[0])
    assert not torch.equal(both.log_probs[0], both.log_probs[1])


def test_suppressed_tokens_are_never_chosen_but_log_probs_are_the_full_vocabulary() -> None:
    logits = torch.randn(6, 520, generator=torch.Generator().manual_seed(0))
    logits[:, 512:516] += 50.0  # the vision tokens would win every draw
    for params in (
        GenerationParams(max_new_tokens=1, do_sample=False, suppress_token_ids=(512, 513, 514, 515)),
        GenerationParams(max_new_tokens=1, temperature=0.7, suppress_token_ids=(512, 513, 514, 515)),
        GenerationParams(max_new_tokens=1, top_k=8, top_p=0.9, suppress_token_ids=(512, 513, 514, 515)),
    ):
        tokens, log_probs = sample_next(logits, params, torch.Generator().manual_seed(1))
        assert not bool(((tokens >= 512) & (tokens < 516)).any())
        scaled = logits / (params.temperature if not params.greedy else 1.0)
        expected = torch.log_softmax(scaled, -1).gather(-1, tokens[:, None])[:, 0]
        torch.testing.assert_close(log_probs, expected)  # what the actor recomputes: no renormalisation
    unsuppressed, _ = sample_next(logits, GenerationParams(max_new_tokens=1, do_sample=False), None)
    assert bool(((unsuppressed >= 512) & (unsuppressed < 516)).all())


def test_vision_language_models_take_the_hf_decoder(model, caplog) -> None:
    with pytest.raises(ValueError, match="qwen2_vl is a vision-language model: the lean decoder has no vision tower"):
        build_decoder(model, "lean")
    with caplog.at_level("WARNING"):
        assert isinstance(build_decoder(model, "auto"), HFDecoder)
    assert "decoder: hf (qwen2_vl is a vision-language model" in caplog.text


def test_image_prompts_on_a_decoder_without_images_fail_clearly(processor, model) -> None:
    ids, mask, positions, images, _ = _prompts(processor, ROWS[:1])

    class TextOnly(HFDecoder):
        prefill_multimodal = None  # type: ignore[assignment]

    with pytest.raises(ValueError, match="TextOnly cannot take image inputs"):
        generate(TextOnly(model), ids, mask, positions, GenerationParams(max_new_tokens=2), 0, images=images)
    with pytest.raises(ValueError, match="images: 2 entries for 1 prompt rows"):
        generate(HFDecoder(model), ids, mask, positions, GenerationParams(max_new_tokens=2), 0, images=images * 2)
