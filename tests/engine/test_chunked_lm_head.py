"""The LM head run chunk by chunk from the hidden states against the model's own head.

The chunked path must give the same log-probs (float32: within 1e-6, usually bit for bit —
only the grouping of rows in the head's matrix product differs) and the same gradients
(within 1e-5 relative) as the plain path that materialises all logits, and must never keep
a (rows × V) tensor for the backward.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from hybridflow import fields as FK
from hybridflow.algorithms.aggregation import agg_loss
from hybridflow.algorithms.utils import entropy_from_logits, logprobs_from_logits
from hybridflow.engine import FSDPEngine, MicroBatchSpec, TorchEngine, chunked_lm_head, forward
from hybridflow.engine.chunked_lm_head import LMHead, find_lm_head, head_log_probs
from hybridflow.engine.forward import response_log_probs
from hybridflow.models.tiny import build_tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _tiny_gemma3(softcap: float | None = 3.0) -> torch.nn.Module:
    """A tiny random Gemma 3 text model; a small soft-cap so that it bends the logits."""
    config = Gemma3TextConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=8,
        final_logit_softcapping=softcap,
        pad_token_id=3,
        bos_token_id=0,
        eos_token_id=2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Gemma3ForCausalLM(config)
        # Gemma's head is the (tied) embedding, initialised small: widen it so the cap matters.
        model.get_output_embeddings().weight.data.mul_(40.0)
    return model.eval()


MODELS = {
    "llama-tied": lambda: build_tiny_model(seed=2),
    "llama-untied": lambda: build_tiny_model(seed=2, tie_word_embeddings=False),
    "qwen2": lambda: build_tiny_model(arch="qwen2", seed=2),
    "tiny-gemma3": lambda: build_tiny_model(arch="gemma3", seed=2),
    "gemma3-softcap": _tiny_gemma3,
}


def _run(model, micro, chunked: bool, monkeypatch, **kwargs):
    """Log-probs, entropy and every parameter's gradient of Σ w·log π, one path forced."""
    monkeypatch.setattr(forward, "CHUNKED_HEAD_MIN_BYTES", 0 if chunked else 1 << 62)
    monkeypatch.setattr(chunked_lm_head, "CHUNK_BYTES", 7 * 4 * 512)  # 7 rows: several chunks, one partial
    model.zero_grad(set_to_none=True)
    out = response_log_probs(model, micro, calculate_entropy=True, entropy_requires_grad=False, **kwargs)
    weights = torch.linspace(-1.0, 2.0, out["log_probs"].numel()).reshape(out["log_probs"].shape)
    (out["log_probs"] * weights).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return out["log_probs"].detach(), out["entropy"].detach(), grads


def _assert_grads_close(chunked: dict, plain: dict, tolerance: float) -> None:
    assert chunked.keys() == plain.keys() and plain
    for name, grad in plain.items():
        scale = grad.abs().max().clamp(min=1e-12)
        assert (chunked[name] - grad).abs().max() / scale <= tolerance, name


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_and_gradients_match_the_plain_head(name, temperature, make_rollout_batch, monkeypatch) -> None:
    model = MODELS[name]()
    micro = make_rollout_batch(num_rows=5, prompt_len=6, response_len=7, seed=4).batch.clone()
    assert find_lm_head(model) is not None
    plain = _run(model, micro, False, monkeypatch, temperature=temperature)
    chunked = _run(model, micro, True, monkeypatch, temperature=temperature)
    torch.testing.assert_close(chunked[0], plain[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(chunked[1], plain[1], atol=1e-5, rtol=0)
    assert (plain[0][micro[FK.RESPONSE_MASK] == 0] == 0).all() and (chunked[0] != 0).any()
    _assert_grads_close(chunked[2], plain[2], 1e-5)


def test_bf16_autocast_matches_the_plain_head(make_rollout_batch, monkeypatch) -> None:
    model = build_tiny_model(seed=2, tie_word_embeddings=False)
    micro = make_rollout_batch(num_rows=4, prompt_len=5, response_len=6, seed=5).batch.clone()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = _run(model, micro, False, monkeypatch)
        chunked = _run(model, micro, True, monkeypatch)
    torch.testing.assert_close(chunked[0], plain[0], atol=1e-6, rtol=0)  # same bf16 logits, same float32 softmax
    _assert_grads_close(chunked[2], plain[2], 2e-2)  # bf16 products summed per chunk


def test_lora_gradients_match(make_rollout_batch, monkeypatch) -> None:
    peft = pytest.importorskip("peft")
    base = build_tiny_model(seed=2)
    lora = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    for name, p in lora.named_parameters():  # non-zero B, so the adapters' gradients are not trivial
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1, generator=torch.Generator().manual_seed(1))
    micro = make_rollout_batch(num_rows=4, prompt_len=5, response_len=6, seed=6).batch.clone()
    assert find_lm_head(lora) is not None
    plain = _run(lora, micro, False, monkeypatch)
    chunked = _run(lora, micro, True, monkeypatch)
    torch.testing.assert_close(chunked[0], plain[0], atol=1e-6, rtol=0)
    assert all("lora_" in name for name in plain[2])
    _assert_grads_close(chunked[2], plain[2], 1e-5)


def test_hand_built_softcap_and_bias_against_stock_ops() -> None:
    g = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(8, 40, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(40, 8, generator=g))
        linear.bias.copy_(torch.randn(40, generator=g))
    hidden = torch.randn(3, 5, 8, generator=g)
    labels = torch.randint(0, 40, (3, 5), generator=g)
    upstream = torch.randn(3, 5, generator=g)

    ref_linear = copy.deepcopy(linear)
    ref_hidden = hidden.clone().requires_grad_(True)
    capped = torch.tanh(ref_linear(ref_hidden) / 2.5) * 2.5
    stock = logprobs_from_logits(capped, labels, 0.8)
    (stock * upstream).sum().backward()

    ours_hidden = hidden.clone().requires_grad_(True)
    log_probs, entropy = head_log_probs(ours_hidden, LMHead(linear, 2.5), labels, 0.8, with_entropy=True)
    (log_probs * upstream).sum().backward()

    torch.testing.assert_close(log_probs, stock, atol=1e-6, rtol=0)
    torch.testing.assert_close(entropy, entropy_from_logits(capped.detach(), 0.8), atol=1e-5, rtol=0)
    for ours, ref in (
        (ours_hidden.grad, ref_hidden.grad),
        (linear.weight.grad, ref_linear.weight.grad),
        (linear.bias.grad, ref_linear.bias.grad),
    ):
        torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-5)


def _largest_saved_logits_rows(model, micro) -> int:
    """Rows of the largest vocabulary-wide non-parameter tensor autograd saves for the backward."""
    vocab = model.config.vocab_size
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    largest = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal largest
        if vocab in t.shape and t.untyped_storage().data_ptr() not in weights:
            largest = max(largest, t.numel() // vocab)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        response_log_probs(model, micro)
    return largest


def test_frozen_head_gradient_is_kept_from_the_forward() -> None:
    # A frozen head (LoRA) takes the path that keeps ∂ℓ/∂h from the forward: same gradient.
    g = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(8, 40, bias=True).requires_grad_(False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(40, 8, generator=g))
    hidden = torch.randn(9, 8, generator=g)
    labels = torch.randint(0, 40, (9,), generator=g)
    upstream = torch.randn(9, generator=g)
    ref_hidden = hidden.clone().requires_grad_(True)
    (logprobs_from_logits(torch.tanh(linear(ref_hidden) / 2.5) * 2.5, labels, 1.3) * upstream).sum().backward()
    ours = hidden.clone().requires_grad_(True)
    (head_log_probs(ours, LMHead(linear, 2.5), labels, 1.3)[0] * upstream).sum().backward()
    torch.testing.assert_close(ours.grad, ref_hidden.grad, atol=1e-6, rtol=1e-5)


def test_the_chunked_head_is_chosen_by_the_size_of_the_logits(monkeypatch) -> None:
    model = build_tiny_model(seed=0)  # 512-token vocabulary: 2 KiB of float32 logits per row
    monkeypatch.setattr(forward, "CHUNKED_HEAD_MIN_BYTES", 10 * 2048)
    assert forward.chunked_head(model, rows=9) is None
    assert forward.chunked_head(model, rows=10).linear is model.lm_head


def test_no_rows_by_vocab_tensor_is_kept_for_backward(make_rollout_batch, monkeypatch) -> None:
    model = build_tiny_model(seed=2)
    micro = make_rollout_batch(num_rows=6, prompt_len=5, response_len=8, seed=7).batch.clone()
    monkeypatch.setattr(forward, "CHUNKED_HEAD_MIN_BYTES", 1 << 62)
    assert _largest_saved_logits_rows(model, micro) >= 6 * 8  # the plain path keeps every position's logits
    monkeypatch.setattr(forward, "CHUNKED_HEAD_MIN_BYTES", 0)
    assert _largest_saved_logits_rows(model, micro) == 0


def test_heads_the_chunked_path_does_not_know_fall_back() -> None:
    peft = pytest.importorskip("peft")
    assert find_lm_head(build_tiny_model(seed=0)).softcap is None
    assert find_lm_head(_tiny_gemma3()).softcap == 3.0
    assert find_lm_head(_tiny_gemma3(softcap=None)).softcap is None
    adapted = peft.get_peft_model(build_tiny_model(seed=0), peft.LoraConfig(r=2, target_modules=["lm_head"]))
    assert find_lm_head(adapted) is None  # a LoRA-adapted head is not a plain Linear
    other = build_tiny_model(seed=0)
    other.config.model_type = "some_new_model"  # its forward may do anything to the logits
    assert find_lm_head(other) is None


def test_other_threads_calls_are_left_alone() -> None:
    import threading

    model = build_tiny_model(seed=0)
    head = find_lm_head(model)
    ids = torch.tensor([[5, 6, 7]])
    expected = model(input_ids=ids).logits
    seen = []
    with chunked_lm_head.capture_head_log_probs(head, torch.zeros(1, 3, dtype=torch.long), 1.0, False):
        thread = threading.Thread(target=lambda: seen.append(model(input_ids=ids).logits))
        thread.start()
        thread.join()
    torch.testing.assert_close(seen[0], expected, atol=0, rtol=0)


def test_bad_input_is_named() -> None:
    head = find_lm_head(build_tiny_model(seed=0))
    with pytest.raises(ValueError, match="temperature"):
        head_log_probs(torch.zeros(2, 128), head, torch.zeros(2, dtype=torch.long), temperature=0.0)
    with pytest.raises(ValueError, match="disagree"):
        head_log_probs(torch.zeros(2, 128), head, torch.zeros(3, dtype=torch.long))


def _fsdp_step(engine, batch) -> tuple[float, float]:
    mask = batch[FK.RESPONSE_MASK]

    def loss_fn(outputs, micro):
        loss = agg_loss(
            -micro[FK.ADVANTAGES] * outputs["log_probs"],
            micro[FK.RESPONSE_MASK],
            "token-mean",
            batch_num_tokens=mask.sum(),
        )
        return loss, {"loss": loss.detach()}

    metrics = engine.forward_backward(batch, response_log_probs, loss_fn, MicroBatchSpec(size=3))
    return engine.optimizer_step().grad_norm, sum(float(m["loss"]) for m in metrics)


def test_fsdp_with_the_chunked_head_matches_the_torch_engine(one_rank_group, make_rollout_batch, monkeypatch) -> None:
    # The head's weight (tied to the embedding) lives in FSDP's root unit: its gradient must
    # still be reduced and stepped, through the hooks the empty logits output keeps alive.
    batch = make_rollout_batch(num_rows=6, seed=3).batch
    plain = TorchEngine(build_tiny_model(seed=0), lr=1e-2)
    norm_plain, loss_plain = _fsdp_step(plain, batch)
    monkeypatch.setattr(forward, "CHUNKED_HEAD_MIN_BYTES", 0)
    calls = []
    monkeypatch.setattr(chunked_lm_head, "head_log_probs", lambda *a, **k: calls.append(1) or head_log_probs(*a, **k))
    sharded = FSDPEngine(build_tiny_model(seed=0), lr=1e-2)
    norm_sharded, loss_sharded = _fsdp_step(sharded, batch)
    assert len(calls) == 2  # 6 rows in micro-batches of 3, each through the chunked head
    assert norm_sharded == pytest.approx(norm_plain, rel=1e-5) and loss_sharded == pytest.approx(loss_plain, rel=1e-5)
    synced, expected = dict(sharded.iter_sync_weights()), dict(plain.iter_sync_weights())
    embed = "model.embed_tokens.weight"
    assert not torch.equal(expected[embed], build_tiny_model(seed=0).state_dict()[embed])  # the step moved it
    torch.testing.assert_close(synced[embed], expected[embed], atol=1e-6, rtol=1e-5)
