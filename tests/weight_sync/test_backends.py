"""Weight-sync backends: every tensor arrives bit-identical (hashed), buckets bound transfers,
tied / LoRA-merged / FSDP-gathered weights, version stamping, drain-before-swap, and a failed
transfer leaves the old weights serving."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator

import pytest
import torch
from peft import LoraConfig, get_peft_model

from hybridflow.engine import FSDPEngine, TorchEngine
from hybridflow.inference.client import HttpClient, InProcessClient
from hybridflow.inference.generation_engine import GenerationEngine
from hybridflow.inference.protocol import SamplingParams
from hybridflow.inference.weights import WeightsRejected
from hybridflow.models.tiny import build_tiny_model, build_tiny_tokenizer
from hybridflow.weight_sync import WEIGHT_SYNCS, EngineTarget, ModuleTarget, build_weight_sync
from hybridflow.weight_sync.http import HttpFolderTarget
from tests.serving import serve_in_thread

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TIMEOUT_S = 60
GREEDY = SamplingParams(temperature=0.0)


def digest(tensor: torch.Tensor) -> str:
    t = tensor.detach().contiguous().cpu()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest() + str(t.dtype)


def digests(pairs) -> dict[str, str]:
    return {name: digest(t) for name, t in pairs}


def received(module: torch.nn.Module, names) -> dict[str, str]:
    state = module.state_dict()
    return {name: digest(state[name]) for name in names}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def test_backends_registered():
    assert set(WEIGHT_SYNCS.names()) >= {"shared", "inproc", "http", "disk"}


@pytest.mark.parametrize("backend", ["inproc", "disk"])
def test_module_target_receives_every_tensor_bit_identical_in_small_buckets(backend, tokenizer, tmp_path):
    actor = TorchEngine(build_tiny_model(tokenizer, seed=1), lr=1e-3)
    receiver = build_tiny_model(tokenizer, seed=0)
    swaps = []
    target = ModuleTarget(receiver, on_swap=lambda: swaps.append(1))
    kwargs = {"dir": tmp_path / "w"} if backend == "disk" else {}
    bucket = 4096  # the embedding (vocab × 128 fp32) is far larger: it travels alone
    sync = build_weight_sync(backend, target, bucket, **kwargs)
    sent = digests(actor.iter_sync_weights())
    report = sync.sync(actor.iter_sync_weights(), version=5)
    assert received(receiver, sent) == sent
    assert report.tensors == len(sent) and report.buckets > 1 and report.version == 5
    largest = max(t.numel() * t.element_size() for _, t in actor.iter_sync_weights())
    assert largest > bucket
    # tied embeddings: the head was not sent, and is still the embedding's storage
    assert "lm_head.weight" not in sent
    assert receiver.lm_head.weight.data_ptr() == receiver.model.embed_tokens.weight.data_ptr()
    assert target.weight_version == 5 and swaps == [1]
    if backend == "disk":
        assert [p.name for p in (tmp_path / "w").iterdir()] == ["v5"]
        sync.sync(actor.iter_sync_weights(), version=6)
        assert [p.name for p in (tmp_path / "w").iterdir()] == ["v6"]  # older versions removed


def test_lora_actor_arrives_merged(tokenizer):
    torch.manual_seed(0)
    peft_model = get_peft_model(build_tiny_model(tokenizer, seed=0),
                                LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    for name, param in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)  # a trained adapter: the merge changes the weights
    actor = TorchEngine(peft_model, lr=1e-3)
    receiver = build_tiny_model(tokenizer, seed=0)
    build_weight_sync("inproc", ModuleTarget(receiver), 1 << 20).sync(actor.iter_sync_weights(), version=1)
    assert received(receiver, digests(actor.iter_sync_weights())) == digests(actor.iter_sync_weights())
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(receiver(ids).logits, peft_model(input_ids=ids).logits, rtol=0, atol=1e-5)




def test_fsdp_shards_are_gathered_into_full_tensors(one_rank_group, tokenizer):
    plain = TorchEngine(build_tiny_model(tokenizer, seed=2), lr=1e-3)
    sharded = FSDPEngine(build_tiny_model(tokenizer, seed=2), lr=1e-3)
    receiver = build_tiny_model(tokenizer, seed=0)
    build_weight_sync("inproc", ModuleTarget(receiver), 8192).sync(sharded.iter_sync_weights(), version=3)
    expected = digests(plain.iter_sync_weights())
    assert received(receiver, expected) == expected


def test_shared_backend_stamps_without_copying_and_refuses_copies(tokenizer):
    actor = TorchEngine(build_tiny_model(tokenizer, seed=0), lr=1e-3)
    target = ModuleTarget(actor.module)
    report = build_weight_sync("shared", target, 1 << 20).sync(actor.iter_sync_weights(), version=4)
    assert target.weight_version == 4 and report.bytes == 0
    other = ModuleTarget(build_tiny_model(tokenizer, seed=0))
    with pytest.raises(ValueError, match="backend=inproc"):
        build_weight_sync("shared", other, 1 << 20).sync(actor.iter_sync_weights(), version=5)
    assert other.weight_version == 0


def _bad_midway(actor: TorchEngine):
    """The actor's weights with a NaN tensor in the middle: earlier buckets are fine."""
    pairs = list(actor.iter_sync_weights())
    name, tensor = pairs[len(pairs) // 2]
    pairs[len(pairs) // 2] = (name, torch.full_like(tensor, float("nan")))
    return pairs, name


@pytest.mark.parametrize("backend", ["inproc", "disk"])
def test_a_failed_sync_leaves_the_old_weights(backend, tokenizer, tmp_path):
    actor = TorchEngine(build_tiny_model(tokenizer, seed=1), lr=1e-3)
    receiver = build_tiny_model(tokenizer, seed=0)
    before = digests(receiver.state_dict().items())
    target = ModuleTarget(receiver)
    kwargs = {"dir": tmp_path} if backend == "disk" else {}
    pairs, bad = _bad_midway(actor)
    with pytest.raises(WeightsRejected, match=bad.replace(".", r"\.")):
        build_weight_sync(backend, target, 4096, **kwargs).sync(pairs, version=9)
    assert digests(receiver.state_dict().items()) == before and target.weight_version == 0


def test_engine_target_drains_running_requests_before_swapping(tokenizer):
    engine = GenerationEngine(build_tiny_model(tokenizer, seed=0), tokenizer.pad_token_id, owns_weights=True)
    engine.start()
    client = InProcessClient(engine)
    actor = TorchEngine(build_tiny_model(tokenizer, seed=1), lr=1e-3)
    try:
        async def go():
            running = asyncio.create_task(client.generate("r", [5, 6, 7, 8, 9], GREEDY, 400))
            while engine.batcher.stats.tokens_generated < 8:  # generating
                await asyncio.sleep(0.002)
            assert not running.done()
            loop = asyncio.get_running_loop()
            sync = build_weight_sync("inproc", EngineTarget(engine), 8192)
            report = await loop.run_in_executor(None, sync.sync, actor.iter_sync_weights(), 11)
            return await running, report

        out, report = asyncio.run(asyncio.wait_for(go(), TIMEOUT_S))
        assert out.stop_reason == "length" and len(out.token_ids) == 400
        assert out.weight_version == out.first_weight_version == 0  # generated on the old weights only
        assert engine.weight_version == 11 == report.version
        sent = digests(actor.iter_sync_weights())
        assert received(engine.model, sent) == sent
    finally:
        engine.shutdown()


@pytest.fixture
def server(tokenizer, tmp_path) -> Iterator[tuple[str, GenerationEngine]]:
    pytest.importorskip("fastapi")
    from hybridflow.server.app import build_app
    from hybridflow.server.state import ServerState
    from hybridflow.server.text import TextCodec

    engine = GenerationEngine(build_tiny_model(tokenizer, seed=0), tokenizer.pad_token_id, owns_weights=True)
    state = ServerState(engine=engine, codec=TextCodec(tokenizer), model_name="tiny", max_model_len=1024,
                        eos_token_ids=(tokenizer.eos_token_id,), control_routes=True, weights_root=tmp_path,
                        max_weight_bucket_bytes=1 << 20)
    with serve_in_thread(build_app(state)) as url:
        yield url, engine


def test_http_backend_posts_buckets_bit_identical(server, tokenizer):
    url, engine = server
    actor = TorchEngine(build_tiny_model(tokenizer, seed=1), lr=1e-3)
    sync = build_weight_sync("http", url, 16 * 1024)
    try:
        report = sync.sync(actor.iter_sync_weights(), version=12)
    finally:
        sync.close()
    sent = digests(actor.iter_sync_weights())
    assert received(engine.model, sent) == sent and engine.weight_version == 12
    assert report.buckets > 1 and report.tensors == len(sent)


def test_http_backend_failure_keeps_serving_the_old_weights(server, tokenizer):
    url, engine = server
    before = digests(engine.model.state_dict().items())
    pairs, bad = _bad_midway(TorchEngine(build_tiny_model(tokenizer, seed=1), lr=1e-3))
    sync = build_weight_sync("http", url, 16 * 1024)
    with pytest.raises(Exception, match=bad.replace(".", r"\.")):
        sync.sync(pairs, version=13)
    sync.close()
    assert digests(engine.model.state_dict().items()) == before and engine.weight_version == 0


def test_buckets_stay_under_the_servers_limit_and_a_larger_tensor_is_refused(server, tokenizer):
    url, engine = server
    actor = TorchEngine(build_tiny_model(tokenizer, seed=1), lr=1e-3)
    sync = build_weight_sync("http", url, 64 << 20)  # asks for one bucket of 64 MiB; the server takes 1 MiB
    report = sync.sync(actor.iter_sync_weights(), version=2)
    assert engine.weight_version == 2 and report.buckets > 1
    huge = [("model.embed_tokens.weight", torch.zeros(600_000, 2))]  # 4.8 MB: cannot be split
    with pytest.raises(Exception, match="max-weight-bucket-mb"):
        sync.sync(huge, version=3)
    sync.close()
    assert engine.weight_version == 2


def test_disk_backend_into_a_server_weights_root(server, tokenizer, tmp_path):
    url, engine = server
    actor = TorchEngine(build_tiny_model(tokenizer, seed=1), lr=1e-3)
    client = HttpClient(url)
    sync = build_weight_sync("disk", HttpFolderTarget(client), 64 * 1024, dir=tmp_path / "pushes")
    sync.sync(actor.iter_sync_weights(), version=21)
    client.close()
    sent = digests(actor.iter_sync_weights())
    assert received(engine.model, sent) == sent and engine.weight_version == 21
