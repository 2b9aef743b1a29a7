"""On-policy distillation end to end on the tiny model: the reverse-KL loss term against a
teacher equal to the initial student is exactly the KL loss against the reference; the folded
per-token reward is exactly 0 for such a teacher; top-K losses, LoRA students and checkpoints."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from hybridflow.config import ConfigError, load_config
from hybridflow.entrypoints.train import run
from hybridflow.models.tiny import save_tiny_model
from hybridflow.trainer.phases import PolicyUpdate
from tests.numerics import TINY_DEPTH, TINY_WIDTH, assert_close_across

from .conftest import cut_then_resume, tiny_overrides

FOLDED = "distillation.distillation_loss.use_policy_gradient=true"  # the divergence as a per-token reward


@pytest.fixture(scope="module")
def other_teacher_dir(tmp_path_factory) -> Path:
    """Another tiny model with the same tokenizer and different weights; its (tied) embeddings
    are scaled up so its next-token distributions are peaked, unlike the near-uniform student."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = save_tiny_model(tmp_path_factory.mktemp("teacher") / "tiny-teacher", arch="llama", seed=7)
    model = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(4.0)
    model.save_pretrained(folder)
    return folder


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _train(task_dir, run_dir, model_dir, *extra: str) -> list[dict]:
    run(load_config(None, tiny_overrides(task_dir, run_dir, model_dir, *extra)))
    return _rows(run_dir)


def _distill(teacher: Path, *extra: str) -> tuple[str, ...]:
    return ("distillation.enabled=true", f"distillation.teacher_model.model_path={teacher}",
            "distillation.teacher_model.dtype=fp32", *extra)


def _without(row: dict, prefixes: tuple[str, ...]) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(prefixes)}


def test_reverse_kl_term_against_the_initial_student_is_the_kl_loss(tiny_task_dir, tmp_path, tiny_model_dir):
    """Same batches, same seeds: distill/loss (k3 vs the teacher) = actor/kl_loss (k3 vs the
    reference) at every step, and every other metric matches (the updates are identical)."""
    kl = _train(tiny_task_dir, tmp_path / "kl", tiny_model_dir, "trainer.total_training_steps=3",
                "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=k3",
                "actor_rollout_ref.actor.kl_loss_coef=0.5")
    distill = _train(tiny_task_dir, tmp_path / "distill", tiny_model_dir, "trainer.total_training_steps=3",
                     *_distill(tiny_model_dir, "distillation.distillation_loss.loss_mode=k3",
                               "distillation.distillation_loss.use_policy_gradient=false",
                               "distillation.distillation_loss.distillation_loss_coef=0.5",
                               "distillation.distillation_loss.loss_max_clamp=null",
                               "distillation.distillation_loss.log_prob_min_clamp=null"))
    # bitwise by construction: one process, the teacher is the reference's forward pass on the same
    # weights and the k3 term the same function over the same tensors
    assert [r["distill/loss"] for r in distill] == [r["actor/kl_loss"] for r in kl]
    assert kl[-1]["actor/kl_loss"] > 0  # the policy has moved away from its start
    skip = ("timing_s/", "perf/", "distill/", "actor/kl_loss")
    assert [_without(r, skip) for r in distill] == [_without(r, skip) for r in kl]


def test_folded_reward_of_an_identical_teacher_is_zero(tiny_task_dir, tmp_path, tiny_model_dir):
    """k1 as a per-token reward, no task reward: a teacher equal to the student gives every token
    reward 0 at step 1, so the policy gradient is exactly 0."""
    rows = _train(tiny_task_dir, tmp_path / "run", tiny_model_dir, "trainer.total_training_steps=1",
                  *_distill(tiny_model_dir, "distillation.distillation_loss.loss_mode=k1", FOLDED,
                            "distillation.reward_weight=0"))
    first = rows[0]
    assert first["distill/token_reward_mean"] == 0.0
    assert first["distill/kl"] == 0.0
    assert first["actor/grad_norm"] == 0.0
    assert first["actor/pg_loss"] == 0.0


def test_folded_reward_is_the_teachers_log_ratio_per_token(
    tiny_task_dir, tmp_path, tiny_model_dir, other_teacher_dir, monkeypatch
):
    """A = w·A_task + c·(ℓ_teacher − ℓ_old) on response tokens, 0 on padding (k1, w = 0.5, c = 2)."""
    seen = []
    original = PolicyUpdate.update_actor

    def spy(self, batch):
        seen.append({k: batch.batch[k].clone() for k in ("advantages", "old_log_probs", "teacher_log_prob",
                                                         "response_mask", "token_level_rewards")})
        return original(self, batch)

    monkeypatch.setattr(PolicyUpdate, "update_actor", spy)
    _train(tiny_task_dir, tmp_path / "run", tiny_model_dir, "trainer.total_training_steps=2",
           *_distill(other_teacher_dir, "distillation.distillation_loss.loss_mode=k1", FOLDED,
                     "distillation.reward_weight=0.5", "distillation.distillation_loss.distillation_loss_coef=2",
                     "distillation.distillation_loss.loss_max_clamp=null",
                     "distillation.distillation_loss.log_prob_min_clamp=null"))
    from hybridflow.algorithms.advantages import compute_advantage
    from hybridflow.config.params import advantage_params

    cfg = load_config(None, tiny_overrides(tiny_task_dir, tmp_path / "x", tiny_model_dir))
    for b in seen:
        mask = b["response_mask"]
        index = [str(i // 2) for i in range(mask.shape[0])]  # rollout.n = 2, interleaved
        task, _ = compute_advantage("grpo", token_level_rewards=b["token_level_rewards"], response_mask=mask,
                                    index=index, params=advantage_params(cfg.algorithm))
        expected = (0.5 * task + 2.0 * (b["teacher_log_prob"] - b["old_log_probs"])) * mask
        assert torch.allclose(b["advantages"], expected, atol=1e-6)
        assert (b["advantages"][mask == 0] == 0).all()


def test_topk_forward_kl_moves_the_student_towards_the_teacher(
    tiny_task_dir, tmp_path, tiny_model_dir, other_teacher_dir
):
    rows = _train(tiny_task_dir, tmp_path / "run", tiny_model_dir, "trainer.total_training_steps=12",
                  "actor_rollout_ref.actor.optim.lr=1e-2", "distillation.reward_weight=0",
                  *_distill(other_teacher_dir, "distillation.distillation_loss.loss_mode=forward_kl_topk",
                            "distillation.distillation_loss.topk=32",
                            "distillation.distillation_loss.use_policy_gradient=false"))
    kls, losses = [r["distill/kl"] for r in rows], [r["distill/loss"] for r in rows]
    assert kls[0] > 2.0  # a peaked teacher against a near-uniform student
    assert max(kls[-2:]) < 0.6 * kls[0] and max(losses[-2:]) < 0.6 * losses[0]


def test_topk_forward_kl_on_a_lora_student(tiny_task_dir, tmp_path, tiny_model_dir, other_teacher_dir):
    rows = _train(tiny_task_dir, tmp_path / "run", tiny_model_dir, "trainer.total_training_steps=2",
                  "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
                  *_distill(other_teacher_dir, "distillation.distillation_loss.loss_mode=forward_kl_topk",
                            "distillation.distillation_loss.topk=16",
                            "distillation.distillation_loss.use_policy_gradient=false"))
    for r in rows:
        assert r["distill/loss"] > 0 and r["actor/grad_norm"] > 0
        assert 0 < r["distill/topk_teacher_mass"] <= 1 + 1e-6
        assert 0 < r["distill/topk_student_mass"] <= 1 + 1e-6


def test_a_distillation_run_resumes_exactly_and_saves_no_teacher(
    tiny_task_dir, tmp_path, tiny_model_dir, other_teacher_dir, monkeypatch
):
    extra = ("trainer.total_training_steps=4", "trainer.save_freq=2",
             *_distill(other_teacher_dir, "distillation.distillation_loss.loss_mode=k3",
                       "distillation.distillation_loss.use_policy_gradient=false"))
    full = _train(tiny_task_dir, tmp_path / "full", tiny_model_dir, *extra)
    cut = cut_then_resume(lambda: _train(tiny_task_dir, tmp_path / "cut", tiny_model_dir, *extra), monkeypatch)
    skip = ("timing_s/", "perf/")
    assert [_without(r, skip) for r in cut] == [_without(r, skip) for r in full]
    saved = [p.relative_to(tmp_path / "cut") for p in (tmp_path / "cut").rglob("*") if p.is_file()]
    assert saved and not [p for p in saved if "teacher" in str(p).lower()]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("distillation.enabled=true",), "needs distillation.teacher_model.model_path"),
        (("distillation.distillation_loss.loss_mode=nope",), "unknown distillation loss 'nope'"),
        (("distillation.enabled=true", "distillation.teacher_model.model_path=x",
          "distillation.distillation_loss.loss_mode=forward_kl_topk", FOLDED),
         "set distillation.distillation_loss.use_policy"),
        (("distillation.enabled=true", "distillation.teacher_model.model_path=x",
          "distillation.distillation_loss.loss_mode=k1", "distillation.distillation_loss.use_policy_gradient=false"),
         "does not depend on the teacher"),
        (("distillation.distillation_loss.use_task_rewards=false", "distillation.reward_weight=1"),
         "use_task_rewards=false means no task reward"),
        (("distillation.enabled=true", "distillation.teacher_model.model_path=x",
          "distillation.teacher_model.enable_resource_pool=true", "distillation.teacher_model.n_gpus_per_node=1",
          "distillation.teacher_model.nnodes=1"), "needs trainer.backend=ray"),
        (("distillation.distillation_loss.jsd_beta=1",), "jsd_beta"),
    ],
)
def test_bad_distillation_configs_are_refused(make_config, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        make_config(*overrides)


def test_verl_use_task_rewards_false_means_reward_weight_zero(make_config):
    assert make_config("distillation.distillation_loss.use_task_rewards=false").distillation.reward_weight == 0.0
    assert make_config().distillation.reward_weight == 1.0
    cfg = make_config("distillation.teacher_model.model_path=x",
                      "distillation.teacher_model.log_prob_micro_batch_size_per_gpu=null",
                      "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4")
    assert cfg.distillation.teacher_models["teacher"].log_prob_micro_batch_size_per_gpu == 4


@pytest.mark.ray
def test_a_teacher_on_ray_trains_like_the_in_process_one(
    ray_session, tiny_task_dir, tmp_path, tiny_model_dir, other_teacher_dir
):
    extra = ("trainer.total_training_steps=2",
             *_distill(other_teacher_dir, "distillation.distillation_loss.loss_mode=k3",
                       "distillation.distillation_loss.use_policy_gradient=false"))
    local = _train(tiny_task_dir, tmp_path / "local", tiny_model_dir, *extra)
    own_group = _train(tiny_task_dir, tmp_path / "ray", tiny_model_dir, *extra, "trainer.backend=ray",
                       "distillation.teacher_model.enable_resource_pool=true",
                       "distillation.teacher_model.n_gpus_per_node=1", "distillation.teacher_model.nnodes=1")
    colocated = _train(tiny_task_dir, tmp_path / "ray_colocated", tiny_model_dir, *extra, "trainer.backend=ray")
    skip = ("timing_s/", "perf/")
    # Ray's worker processes run other thread counts (and so other kernel orders) than this one:
    # fp32 tolerance of the tiny model through two training steps
    expected = [_without(r, skip) for r in local]
    for name, rows in (("own pool", own_group), ("colocated", colocated)):
        assert_close_across([_without(r, skip) for r in rows], expected, dtype=torch.float32,
                            reduction_size=TINY_WIDTH, depth=2 * TINY_DEPTH, what=name)
    assert "timing_s/teacher" in own_group[0]


def test_distillation_runs_one_step_off(tiny_task_dir, tmp_path, tiny_model_dir, other_teacher_dir):
    """The asynchronous trainer shares the phases: the teacher scores each batch the rollouter
    made, against ℓ_old = the sampler's log-probs (bypass mode)."""
    rows = _train(tiny_task_dir, tmp_path / "run", tiny_model_dir, "trainer.total_training_steps=3",
                  "async_training.mode=one_step_off",
                  *_distill(other_teacher_dir, "distillation.distillation_loss.loss_mode=k1", FOLDED))
    assert len(rows) == 3 and all(math.isfinite(r["distill/kl"]) and r["distill/kl"] > 0 for r in rows)
    assert [r["fully_async/staleness/max"] for r in rows] == [0, 1, 1]


def test_distillation_with_ppo_and_a_critic(tiny_task_dir, tmp_path, tiny_model_dir, other_teacher_dir):
    """GAE: the teacher's reward joins the advantages after the estimator; the critic still learns
    the task's returns."""
    rows = _train(tiny_task_dir, tmp_path / "run", tiny_model_dir, "trainer.total_training_steps=2",
                  "algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.n=1",
                  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                  *_distill(other_teacher_dir, "distillation.distillation_loss.loss_mode=k1", FOLDED,
                            "distillation.reward_weight=0.5"))
    for r in rows:
        assert math.isfinite(r["critic/vf_loss"]) and math.isfinite(r["distill/kl"])
        assert r["distill/token_reward_mean"] < 0  # the student's tokens are less likely under the peaked teacher


@pytest.fixture(scope="module")
def two_source_task_dir(tiny_task_dir, tmp_path_factory) -> Path:
    """The tiny arithmetic task with its training rows' data source alternating a, b."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = tmp_path_factory.mktemp("two_sources")
    table = pq.read_table(tiny_task_dir / "train.parquet")
    sources = pa.array(["a" if i % 2 == 0 else "b" for i in range(table.num_rows)])
    pq.write_table(table.set_column(table.schema.get_field_index("data_source"), "data_source", sources),
                   out / "train.parquet")
    pq.write_table(pq.read_table(tiny_task_dir / "test.parquet"), out / "test.parquet")
    return out


def test_two_teachers_each_score_the_rows_of_their_data_source(
    two_source_task_dir, tmp_path, tiny_model_dir, other_teacher_dir, monkeypatch
):
    """Teacher a = the initial student, teacher b = a peaked other model; k1 folded. At step 1 the
    a-rows' teacher log-probs equal the student's old log-probs exactly, the b-rows' do not."""
    seen = []
    original = PolicyUpdate.update_actor

    def spy(self, batch):
        seen.append((batch.non_tensor_batch["data_source"].copy(),
                     *(batch.batch[k].clone() for k in ("teacher_log_prob", "old_log_probs", "response_mask"))))
        return original(self, batch)

    monkeypatch.setattr(PolicyUpdate, "update_actor", spy)
    m = "distillation.teacher_models"
    rows = _train(two_source_task_dir, tmp_path / "run", tiny_model_dir, "trainer.total_training_steps=2",
                  "distillation.enabled=true", "distillation.distillation_loss.loss_mode=k1", FOLDED,
                  f"{m}.ta.model_path={tiny_model_dir}", f"{m}.ta.key=a", f"{m}.ta.dtype=fp32",
                  f"{m}.tb.model_path={other_teacher_dir}", f"{m}.tb.key=b", f"{m}.tb.dtype=fp32")
    assert len(rows) == 2 and all(math.isfinite(r["distill/kl"]) for r in rows)
    sources, teacher, old, mask = seen[0]
    a, b = torch.tensor(sources == "a"), torch.tensor(sources == "b")
    assert a.any() and b.any() and bool((a | b).all())
    assert torch.equal(teacher[a] * mask[a], old[a] * mask[a])
    gap = ((teacher[b] - old[b]).abs() * mask[b]).sum(-1)
    assert bool((gap > 0).all())  # every b-row was scored by the other teacher


def test_a_training_row_without_a_teacher_fails_at_start_up(two_source_task_dir, tmp_path, tiny_model_dir):
    m = "distillation.teacher_models"
    with pytest.raises(ValueError, match=r"data source 'b' match no teacher; .* are 'a'"):
        _train(two_source_task_dir, tmp_path / "run", tiny_model_dir, "distillation.enabled=true",
               f"{m}.ta.model_path={tiny_model_dir}", f"{m}.ta.key=a", f"{m}.ta.dtype=fp32")


@pytest.mark.ray
def test_two_teachers_in_the_shared_teacher_pool_train_like_in_process(
    ray_session, two_source_task_dir, tmp_path, tiny_model_dir, other_teacher_dir
):
    """distillation.nnodes × n_gpus_per_node: both teachers colocated in one worker group of their
    own (Ray) give the metrics of the in-process teachers."""
    m = "distillation.teacher_models"
    extra = ("trainer.total_training_steps=2", "distillation.enabled=true",
             "distillation.distillation_loss.loss_mode=k3",
             f"{m}.ta.model_path={tiny_model_dir}", f"{m}.ta.key=a", f"{m}.ta.dtype=fp32",
             f"{m}.tb.model_path={other_teacher_dir}", f"{m}.tb.key=b", f"{m}.tb.dtype=fp32")
    local = _train(two_source_task_dir, tmp_path / "local", tiny_model_dir, *extra)
    shared = _train(two_source_task_dir, tmp_path / "shared", tiny_model_dir, *extra, "trainer.backend=ray",
                    "distillation.nnodes=1", "distillation.n_gpus_per_node=1")
    skip = ("timing_s/", "perf/")
    assert_close_across([_without(r, skip) for r in shared], [_without(r, skip) for r in local],
                        dtype=torch.float32, reduction_size=TINY_WIDTH, depth=2 * TINY_DEPTH, what="shared pool")
    assert local[0]["distill/loss"] > 0
