"""The teacher role (on-policy distillation): a frozen model scores the student's own tokens.

It is the reference role pointed at another model: the same forward pass over the rollout rows,
at the sampling temperature, micro-batched, in the teacher's ``dtype`` by the auto rule. It adds
the teacher's top-K log-probs and their token ids when the distillation loss needs them. The
teacher may differ from the student in size, never in tokenizer: it scores the student's token
ids, so a different vocabulary is refused when the model loads. One worker holds one teacher of
``distillation.teacher_models``; the controller routes each row to its teacher
(hybridflow/trainer/teachers.py).
"""

from __future__ import annotations

from functools import partial

import torch
from transformers import PreTrainedTokenizerBase

from hybridflow import fields as FK
from hybridflow.algorithms.distillation import uses_topk
from hybridflow.config import ActorRolloutRefConfig
from hybridflow.config.distillation import DistillationConfig, TeacherModelConfig
from hybridflow.controller import Dispatch, Worker, register
from hybridflow.engine.forward import response_log_probs
from hybridflow.engine.micro_batch_runner import infer_micro_batches
from hybridflow.models import load_model_and_tokenizer, policy_attn_implementation
from hybridflow.models.loader import load_tokenizer
from hybridflow.models.sources import resolve_model_path
from hybridflow.protocol import DataProto
from hybridflow.utils.precision import resolve_compute_dtype
from hybridflow.workers.actor import log_prob_temperature
from hybridflow.workers.ppo_loop import micro_batch_spec, require_fields


def check_same_tokenizer(
    teacher: PreTrainedTokenizerBase,
    student: PreTrainedTokenizerBase,
    teacher_path: str,
    student_path: str,
    name: str = "teacher",
) -> None:
    """Raise ValueError unless both tokenizers map the same strings to the same ids (``name``:
    the teacher's entry in ``distillation.teacher_models``, for the message)."""
    t_vocab, s_vocab = teacher.get_vocab(), student.get_vocab()
    if t_vocab == s_vocab:
        return
    t_ids = {i: tok for tok, i in t_vocab.items()}
    s_ids = {i: tok for tok, i in s_vocab.items()}
    differ = sorted(i for i in set(t_ids) | set(s_ids) if t_ids.get(i) != s_ids.get(i))
    first = differ[0]
    raise ValueError(
        f"distillation.teacher_models.{name}.model_path={teacher_path} has a different tokenizer from the student "
        f"({student_path}): {len(t_vocab)} vs {len(s_vocab)} tokens, {len(differ)} ids differ (first: id {first} is "
        f"{t_ids.get(first)!r} for the teacher, {s_ids.get(first)!r} for the student). The teacher scores the "
        "student's token ids, so both must share one tokenizer"
    )


def pick_teacher(distillation: DistillationConfig, name: str | None) -> tuple[str, TeacherModelConfig]:
    """``(name, config)`` of teacher ``name`` of a resolved ``distillation`` (None: its only one)."""
    teachers = distillation.teacher_models
    if not teachers:
        raise ValueError(
            "TeacherWorker needs a resolved distillation config: load_config puts every teacher in "
            "distillation.teacher_models (the older distillation.teacher_model too)"
        )
    if name is None and len(teachers) > 1:
        raise ValueError(f"TeacherWorker: name one of the teachers {', '.join(teachers)}")
    name = next(iter(teachers)) if name is None else name
    if name not in teachers:
        raise ValueError(f"TeacherWorker: no teacher {name!r} in distillation.teacher_models ({', '.join(teachers)})")
    return name, teachers[name]


class TeacherWorker(Worker):
    """Computes ``teacher_log_prob`` (B, T), plus ``teacher_topk_log_probs`` / ``teacher_topk_ids``
    (B, T, K) for a top-K loss, with teacher ``name`` of ``distillation.teacher_models`` (None:
    the only one). ``student_tokenizer``: the policy's tokenizer folder (null: the policy model's)."""

    def __init__(
        self,
        distillation: DistillationConfig,
        policy: ActorRolloutRefConfig,
        device: str = "cpu",
        student_tokenizer: str | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__()
        self.distillation = distillation
        self.name, self.teacher = pick_teacher(distillation, name)
        self.policy = policy
        self.device = torch.device(device)
        self.student_tokenizer = student_tokenizer or policy.model.path
        self._module: torch.nn.Module | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the frozen teacher after checking that it shares the student's tokenizer."""
        teacher = self.teacher
        if not teacher.model_path:
            raise ValueError(f"distillation.teacher_models.{self.name}.model_path is missing")
        student = load_tokenizer(resolve_model_path(self.student_tokenizer))
        module, tokenizer = load_model_and_tokenizer(
            teacher.model_path,
            dtype=resolve_compute_dtype(teacher.dtype, self.device),
            trust_remote_code=teacher.trust_remote_code,
            attn_implementation=policy_attn_implementation(self.policy, self.device),
        )
        check_same_tokenizer(tokenizer, student, teacher.model_path, self.student_tokenizer, self.name)
        module.requires_grad_(False)
        self._module = module.to(self.device)

    @property
    def topk(self) -> int:
        """K of the top-K log-probs returned (0: the loss needs only the sampled token's)."""
        loss = self.distillation.distillation_loss
        return int(loss.topk or 0) if uses_topk(loss.loss_mode) else 0

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        """The teacher's log-probs of the response tokens at the sampling temperature (and its
        top-K per position when the loss needs them); exactly 0 on padding."""
        if self._module is None:
            raise RuntimeError("TeacherWorker.init_model() has not been called")
        if data.batch is None or len(data) == 0:
            raise ValueError("compute_teacher_log_prob needs a DataProto with a non-empty tensor batch")
        require_fields(data.batch, (FK.INPUT_IDS, FK.ATTENTION_MASK, FK.RESPONSES), "compute_teacher_log_prob")
        teacher = self.teacher
        assert teacher.log_prob_micro_batch_size_per_gpu is not None  # = the ref's, resolved at load
        spec = micro_batch_spec(
            bool(teacher.log_prob_use_dynamic_bsz),
            teacher.log_prob_micro_batch_size_per_gpu,
            teacher.log_prob_max_token_len_per_gpu,
            real_tokens=self.policy.model.use_remove_padding,
        )
        forward = partial(
            response_log_probs, temperature=log_prob_temperature(self.policy.rollout.temperature), topk=self.topk
        )
        out = infer_micro_batches(self._module, data.batch, forward, spec, self.device)
        tensors = {FK.TEACHER_LOG_PROB: out["log_probs"]}
        if self.topk:
            tensors[FK.TEACHER_TOPK_LOG_PROBS] = out["topk_log_probs"]
            tensors[FK.TEACHER_TOPK_IDS] = out["topk_ids"]
        return DataProto.from_dict(tensors=tensors)
