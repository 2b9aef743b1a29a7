"""The real ``hybridflow serve`` process, called with the official ``openai`` client.

One server (tiny-llama, CPU) serves the whole module; tests run in file order and the weight
update test restores the original weights at its end. Expected outputs come from the built-in
sampler (:class:`TorchRollout`) run in this process on the same model folder.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading

import openai
import pytest
import torch

from hybridflow import fields as F
from hybridflow.config import RolloutConfig
from hybridflow.models import load_model_and_tokenizer, resolve_model_path
from hybridflow.models.tiny import save_tiny_model
from hybridflow.protocol import DataProto
from hybridflow.workers.rollout.torch_rollout import TorchRollout

MODEL = "tiny-llama"
# The tiny model's ChatML turn as raw text: a random tiny model repeats itself after most raw
# prompts, but answers this one with varied tokens, which makes comparisons meaningful.
PROMPT = "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def local():
    """The same model in this process, for expected greedy outputs."""
    model, tokenizer = load_model_and_tokenizer(MODEL)
    return model, tokenizer


def sampler_greedy(model, tokenizer, prompt_ids: list[int], max_new: int) -> tuple[list[int], list[float]]:
    """Greedy response ids and log-probs from the built-in sampler."""
    config = dataclasses.replace(RolloutConfig(), response_length=max_new, do_sample=False)
    rollout = TorchRollout(config, model, tokenizer)
    ids = torch.tensor([prompt_ids])
    mask = torch.ones_like(ids)
    batch = DataProto.from_dict(tensors={F.INPUT_IDS: ids, F.ATTENTION_MASK: mask, F.POSITION_IDS: mask.cumsum(1) - 1})
    out = rollout.generate_sequences(batch)
    length = int(out.batch[F.RESPONSE_MASK][0].sum())
    return out.batch[F.RESPONSES][0, :length].tolist(), out.batch[F.ROLLOUT_LOG_PROBS][0, :length].tolist()


def chat_ids(tokenizer, content: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                         tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_greedy_completion_equals_the_sampler(client, local):
    model, tokenizer = local
    ids, logprobs = sampler_greedy(model, tokenizer, tokenizer(PROMPT)["input_ids"], 12)
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, logprobs=2)
    choice = out.choices[0]
    assert choice.text == tokenizer.decode(ids, skip_special_tokens=True)
    assert choice.finish_reason == ("stop" if ids[-1] == tokenizer.eos_token_id else "length")
    assert choice.logprobs.token_logprobs == pytest.approx(logprobs, abs=1e-5)
    assert choice.logprobs.tokens == [tokenizer.decode([i]) for i in ids]
    for token, lp, top in zip(choice.logprobs.tokens, choice.logprobs.token_logprobs, choice.logprobs.top_logprobs):
        assert len(top) <= 2 and top[token] == pytest.approx(lp) and max(top.values()) == pytest.approx(lp)
    assert out.usage.prompt_tokens == len(tokenizer(PROMPT)["input_ids"])
    assert out.usage.completion_tokens == len(ids)


def test_generate_endpoint_is_token_in_token_out(server, local):
    model, tokenizer = local
    prompt = chat_ids(tokenizer, "Hi")
    ids, logprobs = sampler_greedy(model, tokenizer, prompt, 10)
    status, body = server.request("POST", "/generate", {
        "input_ids": [prompt, prompt], "sampling_params": {"max_new_tokens": 10, "temperature": 0, "n": 2}})
    assert status == 200
    assert [o["prompt_index"] for o in body["outputs"]] == [0, 0, 1, 1]
    for output in body["outputs"]:
        assert output["output_ids"] == ids
        assert output["logprobs"] == pytest.approx(logprobs, abs=1e-5)


def test_chat_completion_uses_the_chat_template(client, local):
    model, tokenizer = local
    ids, _ = sampler_greedy(model, tokenizer, chat_ids(tokenizer, "Hi there"), 10)
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi there"}],
                                         max_tokens=10, temperature=0, logprobs=True, top_logprobs=2)
    choice = out.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == tokenizer.decode(ids, skip_special_tokens=True)
    assert [t.token for t in choice.logprobs.content] == [tokenizer.decode([i]) for i in ids]
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob == pytest.approx(t.logprob)
               for t in choice.logprobs.content)
    assert out.usage.prompt_tokens == len(chat_ids(tokenizer, "Hi there"))


def test_n_choices_for_each_prompt(client):
    out = client.completions.create(model=MODEL, prompt=["Hi", PROMPT], n=3, max_tokens=6, temperature=1.0, seed=7)
    assert [c.index for c in out.choices] == list(range(6))
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=2,
                                          max_tokens=6, temperature=0)
    assert len(chat.choices) == 2 and chat.choices[0].message.content == chat.choices[1].message.content
    again = client.completions.create(model=MODEL, prompt=["Hi", PROMPT], n=3, max_tokens=6, temperature=1.0, seed=7)
    assert [c.text for c in again.choices] == [c.text for c in out.choices]  # a seeded request repeats


def test_stop_strings_cut_the_text(client):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0).choices[0]
    stop = full.text[4:6]
    cut = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop, "@@@"])
    assert cut.choices[0].text == full.text[: full.text.index(stop)]
    assert 0 < len(cut.choices[0].text) < len(full.text) - 2
    assert cut.choices[0].finish_reason == "stop"


def test_concurrent_requests_share_forward_passes(server, client):
    before = server.request("GET", "/metrics")[1]
    results: list = [None] * 8
    errors: list = []

    def call(i: int) -> None:
        try:
            results[i] = client.completions.create(model=MODEL, prompt=f"Request {i}: {PROMPT}", max_tokens=48,
                                                   temperature=1.0, extra_body={"ignore_eos": True})
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert all(r.usage.completion_tokens == 48 for r in results)
    after = server.request("GET", "/metrics")[1]
    assert after["requests_finished"] - before["requests_finished"] == 8
    assert after["max_requests_per_forward"] > 1
    # with everything batched, far fewer forwards than 8 requests × 48 tokens
    assert after["forwards"] - before["forwards"] < 8 * 48


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": "no-such-model", "prompt": "x"}, "not served here"),
        ({"model": MODEL, "prompt": "x", "max_tokens": -1}, "max_tokens"),
        ({"model": MODEL, "prompt": "x", "temperature": "hot"}, "temperature"),
        ({"model": MODEL, "prompt": "x", "max_tokens": 5000}, "exceeds the model's context"),
        ({"model": MODEL, "prompt": [999999]}, "outside the vocabulary"),
        ({"model": MODEL, "prompt": "x", "extra_body": {"unknown_knob": 1}}, "unknown_knob"),
    ],
)
def test_bad_requests_get_400_and_the_server_stays_up(client, kwargs, message):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(**kwargs)
    assert info.value.status_code == 400
    assert message in info.value.message
    assert client.models.list().data[0].id == MODEL


def test_bad_bodies_on_the_other_endpoints(server):
    status, body = server.request("POST", "/v1/chat/completions", {"model": MODEL, "messages": []})
    assert status == 400 and "messages" in body["error"]["message"]
    image = [{"type": "image_url", "image_url": {"url": "x"}}]
    status, body = server.request("POST", "/v1/chat/completions",
                                  {"model": MODEL, "messages": [{"role": "user", "content": image}]})
    assert status == 400 and "only {'type': 'text'" in body["error"]["message"]
    status, body = server.request("POST", "/generate", {"input_ids": [1, 2], "sampling_params": {"n": True}})
    assert status == 400 and body["error"]["param"] == "sampling_params.n"
    status, body = server.request("GET", "/health")
    assert status == 200 and body["status"] == "ok"


def test_update_weights_from_disk(server, local):
    model, tokenizer = local
    prompt = chat_ids(tokenizer, "Hi")
    request = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    original = server.request("POST", "/generate", request)[1]["outputs"][0]["output_ids"]
    other_dir = save_tiny_model(server.weights_root / "seed3", tokenizer, seed=3)
    other, _ = load_model_and_tokenizer(other_dir)
    expected, _ = sampler_greedy(other, tokenizer, prompt, 8)
    assert expected != original  # otherwise the test could not tell the weights apart

    status, body = server.request("POST", "/update_weights_from_disk", {"model_path": str(other_dir)})
    assert status == 200 and body["success"] is True
    assert server.request("POST", "/generate", request)[1]["outputs"][0]["output_ids"] == expected

    status, body = server.request("POST", "/update_weights_from_disk", {"model_path": "missing"})
    assert status == 400 and "not a folder of *.safetensors weights inside" in body["error"]["message"]

    shutil.copytree(resolve_model_path(MODEL), server.weights_root / "original")
    status, _ = server.request("POST", "/update_weights_from_disk", {"model_path": "original"})
    assert status == 200
    assert server.request("POST", "/generate", request)[1]["outputs"][0]["output_ids"] == original
