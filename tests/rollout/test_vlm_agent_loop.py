"""Image rows through the agent engine (tiny Qwen2-VL, fp32): a two-turn ``tool_agent`` trajectory
whose every request carries the row's images, single-turn against the plain sampler, and partial
rollout (abort / resume) on image rows — each checked against the actor's log-probs."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest
import torch

import hybridflow.workers.rollout.agent_loop as agent_loop_module
from hybridflow import fields as F
from hybridflow.agent.collate import NUM_TURNS, TOOL_CALL_COUNTS
from hybridflow.agent.images import VisionTokens, expand_image_tokens
from hybridflow.agent.runner import AGENT_NAME
from hybridflow.config.actor_rollout_ref import RolloutConfig
from hybridflow.data import RLDataset, collate_fn
from hybridflow.inference.client import HttpClient, InferenceRequestError
from hybridflow.inference.protocol import PromptImages, SamplingParams, TokenOutput
from hybridflow.models.processor import load_processor
from hybridflow.protocol import DataProto
from hybridflow.utils.async_run import run_coroutine
from hybridflow.workers.rollout.agent_loop import AgentLoopRollout
from tests.rollout.test_vlm_rollout import actor, folder  # noqa: F401 - module fixtures reused
from tests.rollout.vlm_rows import write_vlm_parquet

TOOL_FILE = '''
from hybridflow.tools.base import function_tool


@function_tool
def f(x: str) -> str:
    """Echo.

    Args:
        x: text.
    """
    return "got " + x
'''
CALL_TEXT = '<tool_call>\n{"name": "f", "arguments": {"x": "ab"}}\n</tool_call>'
MAX_DIFF, MEAN_DIFF = 3e-5, 6e-6


@pytest.fixture(scope="module")
def prompts(folder, tmp_path_factory) -> DataProto:  # noqa: F811
    """The four verl-layout rows (1, 2, 1 and 0 images) with their chat messages (``raw_prompt``)."""
    processor = load_processor(folder)
    path = write_vlm_parquet(tmp_path_factory.mktemp("data") / "vl.parquet", 4)
    ds = RLDataset(path, processor.tokenizer, processor=processor, max_prompt_length=64, return_raw_chat=True)
    return DataProto.from_single_dict(collate_fn([ds[i] for i in range(len(ds))]))


def _config(**settings) -> RolloutConfig:
    base = RolloutConfig()
    multi_turn = replace(base.multi_turn, enable=True, **settings.pop("multi_turn", {}))
    return replace(base, seed=0, multi_turn=multi_turn, **settings)


def _image_rows(prompts: DataProto, n: int = 1) -> DataProto:  # noqa: F811 - the fixture's value
    rows = [i for i in range(len(prompts)) for _ in range(n)]  # ×n interleaved, as the trainer repeats
    return prompts.select_idxs(rows)


class ScriptedFirstTurn:
    """A client whose first turn of each trajectory is a fixed tool call (the random tiny model
    calls no tool); every later turn goes to the real engine, images included."""

    def __init__(self, tokenizer, inner) -> None:
        self.tokenizer, self.inner = tokenizer, inner
        self.turns: dict[str, int] = {}
        self.images: list[PromptImages | None] = []

    async def generate(self, request_id, prompt_ids, sampling, max_tokens, images=None) -> TokenOutput:
        turn = self.turns.get(request_id, 0)
        self.turns[request_id] = turn + 1
        self.images.append(images)
        if turn > 0:
            return await self.inner.generate(request_id, prompt_ids, sampling, max_tokens, images=images)
        ids = self.tokenizer.encode(CALL_TEXT, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return TokenOutput(ids, [float("nan")] * len(ids), "completed", 0)  # no sampler made these


def test_tool_agent_on_image_rows_matches_the_actors_log_probs(actor, prompts, tmp_path, monkeypatch) -> None:  # noqa: F811
    tools = tmp_path / "tools.py"
    tools.write_text(TOOL_FILE)
    clients: list[ScriptedFirstTurn] = []
    real = agent_loop_module.InProcessClient

    def client(engine, stop_token_ids=None):
        clients.append(ScriptedFirstTurn(actor.tokenizer, real(engine, stop_token_ids)))
        return clients[-1]

    monkeypatch.setattr(agent_loop_module, "InProcessClient", client)
    config = _config(
        response_length=160, prompt_length=860, temperature=1.0, do_sample=True,
        multi_turn={"function_tool_path": str(tools), "max_assistant_turns": 2},
        agent=replace(RolloutConfig().agent, default_agent_loop="tool_agent"),
    )  # fmt: skip
    data = _image_rows(prompts)
    data.meta_info[F.META_SEED] = 5
    rollout = AgentLoopRollout(config, actor.module, actor.tokenizer, dtype=torch.float32)
    out = rollout.generate_sequences(data)
    rollout.close()
    assert out.non_tensor_batch[TOOL_CALL_COUNTS].tolist() == [1] * len(data)
    assert (out.non_tensor_batch[NUM_TURNS] == 4).all()  # user, call, tool, the model's answer
    # every request of an image row carried the row's images; the text row's none
    sent = [images for images in clients[0].images if images is not None]
    assert len(sent) == 2 * 3 and {id(images.inputs) for images in sent} == {
        id(data.non_tensor_batch[F.MULTI_MODAL_INPUTS][i]) for i in range(3)
    }
    positions = out.batch[F.POSITION_IDS]
    P = out.batch[F.PROMPTS].shape[1]
    assert positions.shape == (len(data), 3, out.batch[F.INPUT_IDS].shape[1])
    start = positions[:, :, :P].amax(dim=(1, 2))
    for axis in range(3):  # the whole response (call, tool turn, answer) continues past the largest position
        assert torch.equal(positions[:, axis, P:], start[:, None] + torch.arange(1, 161)[None])
    old = actor.compute_log_prob(out).batch[F.OLD_LOG_PROBS]
    logp = out.batch[F.ROLLOUT_LOG_PROBS]
    sampled = out.batch[F.RESPONSE_MASK].bool() & ~torch.isnan(logp)  # the engine's own tokens (turn 2)
    assert int(sampled.sum(dim=1).min()) >= 2
    diff = (old - logp)[sampled].abs()
    print(
        f"tool agent, images: {int(sampled.sum())} tokens, max {float(diff.max()):.2e}, mean {float(diff.mean()):.2e}"
    )
    assert float(diff.max()) <= MAX_DIFF and float(diff.mean()) <= MEAN_DIFF


def test_single_turn_seeded_sampling_repeats_on_the_one_engine(actor, prompts) -> None:  # noqa: F811
    """Seeded sampling is per request (row i's seed from the batch seed and i), so the agent engine
    does not draw the plain sampler's tokens (one generator for the whole batch), but it repeats
    itself exactly, call after call on the same engine."""
    rollout = AgentLoopRollout(
        _config(response_length=8, temperature=1.0, do_sample=True), actor.module, actor.tokenizer, dtype=torch.float32
    )
    runs = []
    for _ in range(2):
        data = _image_rows(prompts, n=2)
        data.meta_info[F.META_SEED] = 9
        runs.append(rollout.generate_sequences(data))
    assert rollout.engines.engines_built == 1
    rollout.close()
    assert torch.equal(runs[0].batch[F.RESPONSES], runs[1].batch[F.RESPONSES])
    old = actor.compute_log_prob(runs[0]).batch[F.OLD_LOG_PROBS]
    mask = runs[0].batch[F.RESPONSE_MASK].bool()
    diff = (old - runs[0].batch[F.ROLLOUT_LOG_PROBS])[mask].abs()
    assert float(diff.max()) <= MAX_DIFF and float(diff.mean()) <= MEAN_DIFF


def test_partial_rollout_on_image_rows_resumes_with_the_images(actor, prompts) -> None:  # noqa: F811
    config = _config(response_length=300, do_sample=False, ignore_eos=True)
    rollout = AgentLoopRollout(config, actor.module, actor.tokenizer, dtype=torch.float32)
    whole = rollout.generate_sequences(_image_rows(prompts))  # uninterrupted, greedy
    rollout.set_partial_rollout(True)
    engine = rollout.engines.engine
    before = engine.batcher.stats.tokens_generated
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("out", rollout.generate_sequences(_image_rows(prompts))))
    thread.start()
    while rollout.live_engine is None or engine.batcher.stats.tokens_generated < before + 40:
        assert thread.is_alive(), "the generation finished before the test could abort it"
        time.sleep(0.001)
    aborted = rollout.abort_generation()
    rollout.resume_generation()
    thread.join(120)
    rollout.close()
    out = result["out"]
    assert aborted == len(prompts) and engine.batcher.stats.requests_aborted >= len(prompts)
    # resubmitted requests kept their images: the greedy answer is the uninterrupted one
    assert torch.equal(out.batch[F.RESPONSES], whole.batch[F.RESPONSES])
    assert torch.equal(out.batch[F.POSITION_IDS], whole.batch[F.POSITION_IDS])
    old = actor.compute_log_prob(out).batch[F.OLD_LOG_PROBS]
    mask = out.batch[F.RESPONSE_MASK].bool()
    assert int(mask.sum()) == 300 * len(prompts)
    diff = (old - out.batch[F.ROLLOUT_LOG_PROBS])[mask].abs()
    print(f"partial rollout, images: max {float(diff.max()):.2e}, mean {float(diff.mean()):.2e}")
    assert float(diff.max()) <= MAX_DIFF and float(diff.mean()) <= MEAN_DIFF


def test_image_tokens_are_expanded_per_image_and_checked() -> None:
    vision = VisionTokens(image_token_id=9, merge_size=2)
    grids = torch.tensor([[1, 4, 4], [1, 2, 4]])  # 4 and 2 tokens
    assert expand_image_tokens([1, 9, 2, 9, 3], grids, vision) == [1, 9, 9, 9, 9, 2, 9, 9, 3]
    with pytest.raises(ValueError, match="holds 1 image tokens .id 9. for 2 images"):
        expand_image_tokens([1, 9, 2], grids, vision)


def test_prompt_images_extend_text_positions_from_the_largest() -> None:
    images = PromptImages(inputs={}, positions=torch.tensor([[0, 1, 1, 3], [0, 1, 2, 3], [0, 1, 2, 2]]))
    assert images.positions_for(6)[:, 4:].tolist() == [[4, 5]] * 3
    with pytest.raises(ValueError, match="shorter than the 4 tokens"):
        images.positions_for(3)


def test_http_client_refuses_images() -> None:
    images = PromptImages(inputs={}, positions=torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(InferenceRequestError, match="token ids only"):
        run_coroutine(HttpClient("http://127.0.0.1:9").generate("r", [1, 2], SamplingParams(), 4, images=images))


def test_a_model_without_vision_refuses_image_rows(prompts) -> None:  # noqa: F811
    from hybridflow.models.tiny import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    rollout = AgentLoopRollout(_config(response_length=4), build_tiny_model(), tokenizer)
    data = _image_rows(prompts).select_idxs([0])
    data.non_tensor_batch[AGENT_NAME] = data.non_tensor_batch[F.MULTI_MODAL_INPUTS].copy()
    data.non_tensor_batch[AGENT_NAME][0] = "single_turn_agent"
    with pytest.raises(ValueError, match="single_turn_agent got a row with images but its context names no"):
        rollout.generate_sequences(data)
    rollout.close()
