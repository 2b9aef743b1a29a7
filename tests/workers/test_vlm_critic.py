"""A critic on a vision-language folder (tiny Qwen2-VL, fp32): ``load_value_model`` builds the
value head on the VLM's base model (vision tower + language model), and the critic worker's
values take the rows' images and 3-D positions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForImageTextToText

from hybridflow import fields as FK
from hybridflow.config import load_config
from hybridflow.data import RLDataset, collate_fn
from hybridflow.engine.forward import response_values
from hybridflow.engine.multimodal_inputs import engine_batch
from hybridflow.models.processor import load_processor
from hybridflow.models.tiny_vlm import save_tiny_vlm
from hybridflow.models.value_model import load_value_model
from hybridflow.protocol import DataProto
from hybridflow.workers.critic import CriticWorker
from hybridflow.workers.rollout.torch_rollout import response_positions
from tests.rollout.vlm_rows import write_vlm_parquet

RESPONSE = 4
SHORT_ROW, SHORT_LEN = 1, 2  # one response ends early (right padding)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny-qwen2-vl")


@pytest.fixture(scope="module")
def data(folder, tmp_path_factory) -> DataProto:
    """4 rows (1, 2, 1 and 0 images) with seeded text responses, as the rollout returns them."""
    processor = load_processor(folder)
    path = write_vlm_parquet(tmp_path_factory.mktemp("data") / "vl.parquet", 4)
    ds = RLDataset(path, processor.tokenizer, processor=processor, max_prompt_length=64)
    prompts = collate_fn([ds[i] for i in range(len(ds))])
    rows = len(ds)
    responses = torch.randint(4, 512, (rows, RESPONSE), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(rows, RESPONSE, dtype=torch.long)
    mask[SHORT_ROW, SHORT_LEN:] = 0
    returns = torch.randn(rows, RESPONSE, generator=torch.Generator().manual_seed(1)) * mask
    tensors = {
        FK.INPUT_IDS: torch.cat([prompts[FK.INPUT_IDS], responses], dim=1),
        FK.ATTENTION_MASK: torch.cat([prompts[FK.ATTENTION_MASK], mask], dim=1),
        FK.POSITION_IDS: torch.cat(
            [prompts[FK.POSITION_IDS], response_positions(prompts[FK.POSITION_IDS], RESPONSE)], dim=-1
        ),
        FK.RESPONSES: responses,
        FK.RESPONSE_MASK: mask,
        FK.RETURNS: returns,
    }
    return DataProto.from_dict(tensors=tensors, non_tensors={FK.MULTI_MODAL_INPUTS: prompts[FK.MULTI_MODAL_INPUTS]})


def _critic(folder: Path, *extra: str) -> CriticWorker:
    cfg = load_config(
        None,
        [
            f"actor_rollout_ref.model.path={folder}",
            "actor_rollout_ref.model.dtype=fp32",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.n=1",
            "algorithm.adv_estimator=gae",
            "critic.ppo_micro_batch_size_per_gpu=2",
            "critic.optim.lr=1e-3",
            *extra,
        ],
    )
    worker = CriticWorker(cfg.critic, rollout_n=1)
    worker.init_model()
    return worker


def _with_images(data: DataProto, rows: list) -> DataProto:
    """A copy of ``data`` whose rows hold ``rows``' image inputs."""
    out = data.select_idxs(list(range(len(data))))
    column = np.empty(len(rows), dtype=object)
    column[:] = rows
    out.non_tensor_batch[FK.MULTI_MODAL_INPUTS] = column
    return out


def _reference_values(folder: Path, critic: CriticWorker, data: DataProto) -> torch.Tensor:
    """Each row alone, unpadded, through the VLM's own base model (its own rotary positions from
    ``mm_token_type_ids``), then the critic's value head: V at the positions predicting each
    response token."""
    vlm = AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True).float().eval()
    head = critic.engine.module.v_head
    token = vlm.config.image_token_id
    out = torch.zeros(len(data), RESPONSE)
    for i in range(len(data)):
        real = data.batch[FK.ATTENTION_MASK][i].bool()
        ids = data.batch[FK.INPUT_IDS][i][real][None]
        images = data.non_tensor_batch[FK.MULTI_MODAL_INPUTS][i] or {}
        with torch.no_grad():
            hidden = vlm.model(
                input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=(ids == token).int(), **images
            ).last_hidden_state
            values = head(hidden.float())[0, :, 0]
        n = int(data.batch[FK.RESPONSE_MASK][i].sum())
        prompt = ids.shape[1] - n
        out[i, :n] = values[prompt - 1 : prompt - 1 + n]
    return out


def test_the_value_model_is_the_vlm_base_model_with_a_head(folder) -> None:
    model, tokenizer = load_value_model(folder)
    assert type(model.backbone).__name__ == "Qwen2VLModel"
    assert model.v_head.in_features == 64 and tokenizer.convert_tokens_to_ids("<|image_pad|>") == 514
    vision = [n for n, _ in model.named_parameters() if n.startswith("backbone.visual.")]
    assert len(vision) == 31


def test_values_take_the_images_and_3d_positions(folder, data) -> None:
    critic = _critic(folder)
    values = critic.compute_values(data).batch[FK.VALUES]
    assert values.shape == (4, RESPONSE) and (values[SHORT_ROW, SHORT_LEN:] == 0).all()
    expected = _reference_values(folder, critic, data)
    assert (values - expected).abs().max() < 1e-5
    # other pixels for row 0 (same size, so the same ids and positions): its values move, the others do not
    rows = list(data.non_tensor_batch[FK.MULTI_MODAL_INPUTS])
    first = dict(rows[0])
    first["pixel_values"] = torch.flip(first["pixel_values"], dims=[0])
    moved = critic.compute_values(_with_images(data, [first, *rows[1:]])).batch[FK.VALUES]
    assert (moved[0] - values[0]).abs().min() > 1e-5
    assert (moved[1:] - values[1:]).abs().max() < 1e-6


def test_the_value_loss_reaches_the_head_and_the_vision_tower(folder, data) -> None:
    critic = _critic(folder)
    module = critic.engine.module
    module.zero_grad()
    values = response_values(module, engine_batch(data))["values"]
    (values * data.batch[FK.RESPONSE_MASK]).sum().backward()
    named = dict(module.named_parameters())
    vision = {n: p for n, p in named.items() if n.startswith("backbone.visual.")}
    assert named["v_head.weight"].grad is not None and named["v_head.weight"].grad.abs().max() > 0
    assert len(vision) == 31
    assert all(p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().max() > 0 for p in vision.values())


def test_an_updated_critic_round_trips_through_its_checkpoint(folder, data, tmp_path) -> None:
    critic = _critic(folder)
    before = critic.compute_values(data).batch[FK.VALUES]
    batch = data.union(DataProto.from_dict(tensors={FK.VALUES: before}))
    metrics = critic.update_critic(batch)
    assert np.isfinite(metrics["critic/vf_loss"]) and metrics["critic/grad_norm"] > 0
    trained = critic.compute_values(data).batch[FK.VALUES]
    assert (trained - before).abs().max() > 1e-4
    critic.save_checkpoint(str(tmp_path / "critic"))
    reloaded = _critic(folder)
    assert (reloaded.compute_values(data).batch[FK.VALUES] - before).abs().max() < 1e-6  # a fresh head first
    reloaded.load_checkpoint(str(tmp_path / "critic"))
    assert torch.equal(reloaded.compute_values(data).batch[FK.VALUES], trained)
    saved = critic.engine.module.state_dict()
    assert all(torch.equal(v, saved[k]) for k, v in reloaded.engine.module.state_dict().items())
