"""TeacherWorker: the reference's forward pass on another model, plus top-K; same tokenizer only.
The actor's distillation term: masked tokens carry no loss and no gradient."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from hybridflow import fields as FK
from hybridflow.algorithms.aggregation import GlobalBatchInfo
from hybridflow.models.tiny import build_tiny_tokenizer, save_tiny_model
from hybridflow.workers.distillation_term import DistillationTerm
from hybridflow.workers.reference import ReferenceWorker
from hybridflow.workers.teacher import TeacherWorker


def _teacher(make_config, path, *extra: str) -> TeacherWorker:
    cfg = make_config("distillation.enabled=true", f"distillation.teacher_model.model_path={path}",
                      "distillation.teacher_model.dtype=fp32", *extra)
    worker = TeacherWorker(cfg.distillation, cfg.actor_rollout_ref)
    worker.init_model()
    return worker


def test_a_teacher_on_the_policy_model_scores_exactly_like_the_reference(make_config, make_rollout_batch,
                                                                         tiny_model_dir):
    cfg = make_config()
    ref = ReferenceWorker(cfg.actor_rollout_ref, share_name=None)
    ref.init_model()
    teacher = _teacher(make_config, tiny_model_dir)
    data = make_rollout_batch(seed=3)
    expected = ref.compute_ref_log_prob(data).batch[FK.REF_LOG_PROB]
    out = teacher.compute_teacher_log_prob(data).batch
    assert torch.equal(out[FK.TEACHER_LOG_PROB], expected)
    assert FK.TEACHER_TOPK_IDS not in out.keys()  # an estimator loss needs no top-K


@pytest.mark.parametrize("packed", [False, True])
def test_topk_is_the_teachers_own_top_k_of_the_full_distribution(make_config, make_rollout_batch, tiny_model_dir,
                                                                 packed):
    extra = ("distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=5",
             "distillation.distillation_loss.use_policy_gradient=false",
             f"actor_rollout_ref.model.use_remove_padding={str(packed).lower()}",
             "distillation.teacher_model.log_prob_micro_batch_size_per_gpu=3")
    teacher = _teacher(make_config, tiny_model_dir, *extra)
    data = make_rollout_batch(seed=4)
    out = teacher.compute_teacher_log_prob(data).batch
    ids, values = out[FK.TEACHER_TOPK_IDS], out[FK.TEACHER_TOPK_LOG_PROBS]
    assert ids.shape == values.shape == (*data.batch[FK.RESPONSES].shape, 5) and ids.dtype == torch.int64
    # brute force, row by row, with the plain HF forward
    model = teacher._module
    b = data.batch
    prompt_len = b[FK.PROMPTS].shape[1]
    for i in range(len(data)):
        real = b[FK.ATTENTION_MASK][i].bool()
        logits = model(input_ids=b[FK.INPUT_IDS][i][real][None]).logits[0].float()
        n_prompt = int(b[FK.ATTENTION_MASK][i, :prompt_len].sum())
        n_resp = int(b[FK.RESPONSE_MASK][i].sum())
        log_probs = torch.log_softmax(logits[n_prompt - 1 : n_prompt - 1 + n_resp], dim=-1)
        top_v, top_i = log_probs.topk(5, dim=-1)
        torch.testing.assert_close(values[i, :n_resp], top_v, atol=2e-5, rtol=0)
        assert torch.equal(ids[i, :n_resp], top_i)
        sampled = log_probs.gather(-1, b[FK.RESPONSES][i, :n_resp, None])[:, 0]
        torch.testing.assert_close(out[FK.TEACHER_LOG_PROB][i, :n_resp], sampled, atol=2e-5, rtol=0)
        assert (values[i, n_resp:] == 0).all() and (ids[i, n_resp:] == 0).all()  # padding is 0


def test_a_teacher_with_another_tokenizer_is_refused(make_config, tmp_path):
    other = save_tiny_model(tmp_path / "other", tokenizer=build_tiny_tokenizer(vocab_size=300), seed=1)
    with pytest.raises(ValueError, match=r"different tokenizer from the student .*300 vs 512 tokens"):
        _teacher(make_config, other)


def _micro(mask: torch.Tensor, teacher: torch.Tensor, topk_values: torch.Tensor) -> TensorDict:
    b = mask.shape[0]
    return TensorDict({FK.RESPONSE_MASK: mask, FK.TEACHER_LOG_PROB: teacher, FK.TEACHER_TOPK_LOG_PROBS: topk_values,
                       FK.TEACHER_TOPK_IDS: torch.zeros(*topk_values.shape, dtype=torch.long)}, batch_size=[b])


@pytest.mark.parametrize("loss_mode", ["k3", "forward_kl_topk", "jsd_topk"])
def test_masked_tokens_carry_no_distillation_loss_or_gradient(make_config, loss_mode):
    cfg = make_config("distillation.enabled=true", "distillation.teacher_model.model_path=x",
                      f"distillation.distillation_loss.loss_mode={loss_mode}",
                      "distillation.distillation_loss.use_policy_gradient=false")
    term = DistillationTerm.from_config(cfg.distillation, "token-mean")
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])  # a tool-output hole, then padding
    student = torch.log_softmax(torch.randn(2, 4, 6, generator=g), -1)
    teacher_topk = torch.log_softmax(torch.randn(2, 4, 6, generator=g), -1)
    info = GlobalBatchInfo(batch_num_tokens=mask.sum(), global_batch_size=torch.tensor(2.0))
    results = []
    for garbage in (0.0, -50.0):
        log_probs = student[..., 0].clone().requires_grad_(True)
        topk = student.clone().requires_grad_(True)
        teacher = torch.where(mask.bool(), teacher_topk[..., 0], torch.full_like(mask, garbage))
        t_topk = torch.where(mask.bool()[..., None], teacher_topk, torch.full_like(teacher_topk, garbage))
        loss, metrics = term({"log_probs": log_probs, "topk_log_probs": topk}, _micro(mask, teacher, t_topk), mask, info)
        loss.backward()
        grad = log_probs.grad if loss_mode == "k3" else topk.grad
        assert (grad[mask == 0] == 0).all()
        results.append((loss.item(), metrics["distill/kl"].item(), metrics["distill/teacher_logp"].item()))
    assert results[0] == results[1]
