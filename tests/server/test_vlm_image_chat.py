"""Chat messages with ``image_url`` parts served by a vision-language model (tiny Qwen2-VL, fp32,
in this process through raw ASGI calls): the served greedy reply equals the plain sampler's on
the same image and prompt, alone, joining a running batch, and from a model folder through
``hybridflow serve``'s own builder; remote URLs and text-only models get a 400 that says why."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hybridflow.data.multimodal import encode_multimodal_prompt, rope_index, rope_settings
from hybridflow.engine.multimodal_inputs import vision_token_ids
from hybridflow.inference.batcher_types import GenRequest
from hybridflow.inference.generation import generate
from hybridflow.inference.generation_engine import GenerationEngine
from hybridflow.inference.hf_decoder import HFDecoder
from hybridflow.inference.sampling import GenerationParams
from hybridflow.models.processor import declare_processor_class
from hybridflow.models.tiny import build_tiny_model, build_tiny_tokenizer
from hybridflow.models.tiny_vlm import build_tiny_vlm, build_tiny_vlm_processor
from hybridflow.server.app import build_app
from hybridflow.server.state import ServerState
from hybridflow.server.text import TextCodec
from tests.rollout.vlm_rows import png
from tests.server.test_app import TIMEOUT_S, asgi_post

pytestmark = pytest.mark.usefixtures("one_torch_thread")
MAX_TOKENS = 8
QUESTION = "What colour is this?"


@pytest.fixture(scope="module")
def processor():
    return build_tiny_vlm_processor()


@pytest.fixture(scope="module")
def model():
    """The tiny VLM with std-0.3 random matrices, so that greedy answers depend on the pixels
    and positions (the default initialisation repeats one token whatever the input)."""
    model = build_tiny_vlm(seed=0).float().eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    return model


@pytest.fixture(scope="module")
def model_folder(model, processor, tmp_path_factory) -> Path:
    """:func:`model` and its processor saved as a standard Qwen2-VL folder."""
    folder = tmp_path_factory.mktemp("served") / "tiny-vl"
    model.save_pretrained(folder, safe_serialization=True)
    processor.save_pretrained(folder)
    declare_processor_class(folder, "Qwen2VLProcessor")
    return folder


def _state(model, tokenizer, processor) -> ServerState:
    return ServerState(engine=GenerationEngine(model, tokenizer.pad_token_id, decoder="hf"), codec=TextCodec(tokenizer),
                       model_name="tiny-vl", max_model_len=512, eos_token_ids=(tokenizer.eos_token_id,),
                       processor=processor)  # fmt: skip


@pytest.fixture(scope="module")
def served(model, processor) -> Iterator[tuple[ServerState, object]]:
    state = _state(model, processor.tokenizer, processor)
    state.engine.start()
    yield state, build_app(state)
    state.engine.shutdown()


def _data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


def _chat(url: str, text: str = QUESTION, **extra) -> dict:
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]
    return {"model": "tiny-vl", "messages": [{"role": "user", "content": content}], "temperature": 0,
            "max_tokens": MAX_TOKENS, **extra}  # fmt: skip


def _post(app, body: dict) -> tuple[int, dict]:
    return asyncio.run(asyncio.wait_for(asgi_post(app, "/v1/chat/completions", body), TIMEOUT_S))


def _sampler_text(model, processor, image: bytes, text: str = QUESTION) -> str:
    """The plain sampler (``generate`` on the HF decoder) on the same image and prompt."""
    from io import BytesIO

    from PIL import Image

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    prompt = encode_multimodal_prompt(processor, messages, [Image.open(BytesIO(image)).convert("RGB")])
    ids = torch.tensor([prompt.input_ids])
    token_id, merge = rope_settings(processor)
    grid = prompt.multi_modal_inputs["image_grid_thw"]
    positions = rope_index(ids[0], torch.ones_like(ids[0]), grid, image_token_id=token_id, spatial_merge_size=merge)
    params = GenerationParams(max_new_tokens=MAX_TOKENS, do_sample=False, suppress_token_ids=vision_token_ids(model),
                              stop_token_ids=(processor.tokenizer.eos_token_id,))  # fmt: skip
    out = generate(HFDecoder(model), ids, torch.ones_like(ids), positions[None], params,
                   processor.tokenizer.pad_token_id, images=[prompt.multi_modal_inputs])  # fmt: skip
    return processor.tokenizer.decode(out.responses[0, : int(out.lengths[0])].tolist(), skip_special_tokens=True)


def test_an_image_chat_gets_the_plain_samplers_greedy_reply(served, model, processor) -> None:
    _, app = served
    images = [png(56, 56, 1), png(84, 56, 2)]
    expected = [_sampler_text(model, processor, image) for image in images]
    assert expected[0] != expected[1]  # the reply depends on the pixels: a lost image would show
    for image, want in zip(images, expected):
        status, body = _post(app, _chat(_data_url(image)))
        assert status == 200, body
        assert body["choices"][0]["message"]["content"] == want
        assert body["usage"]["completion_tokens"] >= 1


def test_the_command_line_server_loads_the_processor_and_takes_image_parts(model_folder, model, processor) -> None:
    from hybridflow.entrypoints.serve import build_state, parse_args

    state = build_state(parse_args(["--model", str(model_folder), "--dtype", "fp32", "--served-model-name", "tiny-vl"]))
    assert type(state.processor).__name__ == "ImagesOnlyQwen2VLProcessor"
    image = png(84, 56, 2)
    state.engine.start()
    try:
        status, body = _post(build_app(state), _chat(_data_url(image)))
    finally:
        state.engine.shutdown()
    assert status == 200, body
    assert body["choices"][0]["message"]["content"] == _sampler_text(model, processor, image)


def test_image_requests_joining_a_running_batch_keep_their_own_pixels(served, model, processor) -> None:
    """Two image requests and a text one through the engine at once: each reply is the one it
    gets alone (joins re-prefill the running rows with their own images and positions)."""
    state, _ = served
    from hybridflow.server.images import image_prompt
    from hybridflow.server.schemas import ChatCompletionRequest

    images = [png(56, 56, 1), png(84, 56, 2)]
    requests = []
    params = GenerationParams(max_new_tokens=MAX_TOKENS, do_sample=False,
                              stop_token_ids=(processor.tokenizer.eos_token_id,))  # fmt: skip
    for image in images:
        ids, inputs, positions = image_prompt(processor, "tiny-vl", ChatCompletionRequest(**_chat(_data_url(image))))
        requests.append(GenRequest(tuple(ids), params, images=inputs, prompt_positions=positions))
    text_ids = state.codec.chat_prompt_ids([{"role": "user", "content": QUESTION}])
    requests.insert(1, GenRequest(tuple(text_ids), params))
    alone = [state.engine.submit(r).result(TIMEOUT_S)[0].token_ids for r in requests]
    before = state.engine.metrics()["forward_requests_histogram"]
    together = [f.result(TIMEOUT_S)[0].token_ids for f in [state.engine.submit(r) for r in requests]]
    assert together == alone
    after = state.engine.metrics()["forward_requests_histogram"]
    shared = sum(after.get(k, 0) - before.get(k, 0) for k in ("2", "3"))
    assert shared >= 1  # some forwards served several of these requests at once
    decode = processor.tokenizer.decode
    assert [decode(alone[0], skip_special_tokens=True), decode(alone[2], skip_special_tokens=True)] == [
        _sampler_text(model, processor, image) for image in images
    ]


def test_a_remote_image_url_is_refused_without_a_fetch(served) -> None:
    _, app = served
    status, body = _post(app, _chat("https://example.com/cat.png"))
    assert status == 400
    assert "remote image URLs are not fetched" in body["error"]["message"]
    status, body = _post(app, _chat("file:///etc/passwd"))
    assert status == 400 and "only data:image/<format>;base64" in body["error"]["message"]
    status, body = _post(app, _chat("data:image/png;base64,@@not-base64@@"))
    assert status == 400 and "does not decode" in body["error"]["message"]
    status, body = _post(app, _chat(_data_url(b"not a png")))
    assert status == 400 and "cannot be read as an image" in body["error"]["message"]


def test_a_text_only_model_refuses_image_parts() -> None:
    tokenizer = build_tiny_tokenizer()
    state = ServerState(engine=GenerationEngine(build_tiny_model(tokenizer, seed=0), tokenizer.pad_token_id),
                        codec=TextCodec(tokenizer), model_name="tiny-vl", max_model_len=512,
                        eos_token_ids=(tokenizer.eos_token_id,))  # fmt: skip
    state.engine.start()
    try:
        status, body = _post(build_app(state), _chat(_data_url(png(56, 56, 1))))
    finally:
        state.engine.shutdown()
    assert status == 400
    assert "does not take images: it is a text-only model" in body["error"]["message"]
