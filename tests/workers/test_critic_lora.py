"""CriticWorker with ``critic.model.lora_rank > 0``: only the adapters and the value head train,
the base weights stay as loaded, and a checkpoint resumes the same run."""

from __future__ import annotations

import pytest
import torch

from hybridflow import fields as FK
from hybridflow.engine import FSDPEngine
from hybridflow.engine.checkpoint import CheckpointFileError
from hybridflow.engine.forward import response_values
from hybridflow.engine.fsdp import full_tensor
from hybridflow.models import load_value_model
from hybridflow.workers.critic import CriticWorker

LORA = ("algorithm.adv_estimator=gae", "critic.model.lora.rank=4", "critic.model.lora.alpha=8", "critic.optim.lr=1e-2")


def _critic(cfg) -> CriticWorker:
    torch.manual_seed(0)  # peft draws LoRA A from torch's global generator
    worker = CriticWorker(cfg.critic, rollout_n=cfg.actor_rollout_ref.rollout.n)
    worker.init_model()
    return worker


def _is_adapter_or_head(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name or name.startswith("v_head.")


def _expected_adapter_size(module: torch.nn.Module, rank: int) -> int:
    """rank · (in + out) for each adapted Linear: what LoRA on every linear layer adds."""
    from peft.tuners.lora import LoraLayer

    return sum(rank * (m.in_features + m.out_features) for m in module.modules() if isinstance(m, LoraLayer))


def test_only_adapters_and_value_head_are_trainable(make_config) -> None:
    module = _critic(make_config(*LORA)).engine.module
    trainable = {name: p.numel() for name, p in module.named_parameters() if p.requires_grad}
    assert trainable and all(_is_adapter_or_head(name) for name in trainable), sorted(trainable)
    frozen = [name for name, p in module.named_parameters() if not p.requires_grad]
    assert not any(_is_adapter_or_head(name) for name in frozen)
    head = module.v_head.weight.numel() + module.v_head.bias.numel()
    assert sum(trainable.values()) == _expected_adapter_size(module, 4) + head
    total = sum(p.numel() for p in module.parameters())
    assert sum(trainable.values()) < 0.5 * total
    full = _critic(make_config("algorithm.adv_estimator=gae")).engine.module
    assert all(p.requires_grad for p in full.parameters())  # lora_rank 0: the whole critic trains
    assert not any(".lora_" in name for name, _ in full.named_parameters())


def test_update_moves_adapters_and_head_not_the_base(make_config, make_rollout_batch) -> None:
    critic = _critic(make_config(*LORA))
    module = critic.engine.module
    before = {name: p.detach().clone() for name, p in module.named_parameters()}
    data = make_rollout_batch(seed=3)
    values_before = critic.compute_values(data).batch[FK.VALUES]
    data.batch[FK.VALUES] = values_before
    losses = [critic.update_critic(data)["critic/vf_loss"] for _ in range(3)]
    after = dict(module.named_parameters())
    changed = {name for name, p in after.items() if not torch.equal(p.detach(), before[name])}
    assert changed and all(_is_adapter_or_head(name) for name in changed), sorted(changed)
    assert any(".lora_B." in name for name in changed)  # B starts at 0: the adapters really learn
    assert {"v_head.weight", "v_head.bias"} <= changed
    values_after = critic.compute_values(data).batch[FK.VALUES]
    mask = data.batch[FK.RESPONSE_MASK] == 1
    assert (values_after[mask] - values_before[mask]).abs().max() > 1e-3
    assert losses[-1] < 0.9 * losses[0], losses


def test_checkpoint_resumes_a_lora_critic(make_config, make_rollout_batch, tmp_path) -> None:
    cfg = make_config(*LORA)
    data = make_rollout_batch(seed=4)
    first = _critic(cfg)
    first.update_critic(data)
    first.save_checkpoint(str(tmp_path / "critic"))
    expected = first.update_critic(data)
    resumed = _critic(cfg)
    resumed.load_checkpoint(str(tmp_path / "critic"))
    got = resumed.update_critic(data)
    assert got["critic/vf_loss"] == pytest.approx(expected["critic/vf_loss"], rel=1e-6, abs=1e-9)
    for (name, a), (_, b) in zip(first.engine.module.named_parameters(), resumed.engine.module.named_parameters()):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7), name
    full = _critic(make_config("algorithm.adv_estimator=gae"))
    with pytest.raises(CheckpointFileError, match="could not load weights"):
        full.load_checkpoint(str(tmp_path / "critic"))  # a LoRA checkpoint does not fit a full critic


def test_fsdp_engine_trains_and_checkpoints_a_lora_critic(one_rank_group, tiny_model_dir, make_rollout_batch, tmp_path):
    def engine() -> FSDPEngine:
        torch.manual_seed(0)
        module, _ = load_value_model(tiny_model_dir, lora_rank=4, lora_alpha=8, seed=0)
        return FSDPEngine(module, lr=1e-2)

    def loss_fn(outputs, micro):
        mask = micro[FK.RESPONSE_MASK].float()
        return ((outputs["values"] - micro[FK.RETURNS]) ** 2 * mask).sum() / mask.sum(), {}

    batch = make_rollout_batch(num_rows=4, seed=5).batch
    critic = engine()
    frozen = {n: full_tensor(p.detach()).clone() for n, p in critic.module.named_parameters() if not p.requires_grad}
    before = critic.infer(batch, response_values)["values"]
    critic.forward_backward(batch, response_values, loss_fn)
    assert critic.optimizer_step().grad_norm > 0
    after = critic.infer(batch, response_values)["values"]
    assert frozen and all(
        torch.equal(full_tensor(p.detach()), frozen[n]) for n, p in critic.module.named_parameters() if n in frozen
    )
    assert (after - before).abs().max() > 1e-3
    critic.save_checkpoint(tmp_path / "fsdp")
    resumed = engine()
    resumed.load_checkpoint(tmp_path / "fsdp")
    torch.testing.assert_close(resumed.infer(batch, response_values)["values"], after, rtol=0, atol=0)
