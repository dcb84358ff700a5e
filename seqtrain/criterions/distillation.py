"""`label_smoothed_cross_entropy_with_distillation`: word-level knowledge distillation as DistilBART did.

Named after fairseq's `label_smoothed_cross_entropy_with_alignment` / `_with_ctc` family (the label-smoothed loss
plus one more term), so `--criterion` reads as what it computes. With T = --distill-temperature and
a = --distill-alpha, summed over the non-pad target tokens t:

    loss = (1 - a) * label_smoothed_ce  +  a * T^2 * sum_t KL( softmax(z_teacher_t / T) || softmax(z_student_t / T) )

transformers' seq2seq-distillation/distillation.py: KLDivLoss of the softened distributions times T^2 (so the
gradient's scale does not shrink as 1/T^2), mixed by alpha_ce (0.8) with the student's own loss (alpha_mlm, 0.2);
its defaults T = 2 and alpha 0.8 are ours. The sum is normalised by sample_size as the other criteria do
(tokens, or sentences with --sentence-avg). The logged nll_loss is the student's plain NLL of the references;
`distill_loss` is the KD term alone (T^2 * KL, base 2, per sample_size).

The teacher (--teacher-path) is loaded once, frozen, in eval mode (no dropout), run without grad on the
student's device, in the student's dtype and under the same autocast; it lives in the criterion, not in the
model, so it is not in the student's checkpoints (a resume loads it again from --teacher-path). The student is
usually the teacher with fewer decoder layers: `--finetune-from-model TEACHER --decoder-layers-to-keep 0,5,11`.

Both models' logits are made whole for the scored rows (KL needs every vocabulary entry), so this criterion does
not use the projected loss's chunking: its memory is 2 x N x V for N target tokens.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
from torch import Tensor

from seqtrain.config import setting, settings
from seqtrain.criterions.cross_entropy import (
    CriterionConfig,
    CrossEntropyCriterion,
    _output_layer,
    _sum,
    _target_rows,
    _zero_invalid,
    count_correct,
    smoothed_nll_loss,
    step_logging_output,
)
from seqtrain.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import PROBABILITY, Bounds
from seqtrain.registry import CRITERIONS

NAME = "label_smoothed_cross_entropy_with_distillation"
MIN_TEMPERATURE = (
    0.01  # T^2 * KL's gradient scales with T: far below this the KD term vanishes (1e-30: exactly 0)
)


@settings
class DistillationConfig(CriterionConfig):
    """criterion: the settings of --criterion label_smoothed_cross_entropy_with_distillation (the teacher)"""

    teacher_path: str | None = setting(None, f"the teacher checkpoint of --criterion {NAME}", metavar="CKPT")
    distill_temperature: float = setting(
        2.0,
        "softmax temperature of teacher and student in the KD term (DistilBART: 2; at least 0.01: the term's "
        "gradient scales with T)",
        type=float,
        metavar="T",
        bounds=Bounds(MIN_TEMPERATURE, 1000),
    )
    distill_alpha: float = setting(
        0.8,
        "weight of the KD term; the label-smoothed loss gets 1 - A (DistilBART: 0.8)",
        type=float,
        metavar="A",
        bounds=PROBABILITY,
    )


def distillation_kl(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> Tensor:
    """Per-row T^2 * KL(softmax(teacher / T) || softmax(student / T)), in fp32 (fp64 kept)."""
    dtype = torch.float64 if student_logits.dtype == torch.float64 else torch.float32
    log_s = torch.log_softmax(student_logits.to(dtype) / temperature, dim=-1)
    log_t = torch.log_softmax(teacher_logits.to(dtype) / temperature, dim=-1)
    return (log_t.exp() * (log_t - log_s)).sum(-1) * (temperature * temperature)


def _check_dictionary(teacher_dict: Any, data_dict: Any, teacher_path: str, data_file: str) -> None:
    if data_dict is None or teacher_dict is None:
        return
    if list(teacher_dict.symbols) != list(data_dict.symbols):
        raise SeqtrainError(
            f"--teacher-path {teacher_path}: its dictionary differs from {data_file} "
            f"({teacher_dict.difference(data_dict)}); teacher and student must share one dictionary"
        )


def _check_positions(teacher: tuple[int, int], student: tuple[int, int], teacher_path: str) -> None:
    """Every example the student trains on must fit the teacher: the run's limits (--max-source-positions,
    --max-target-positions) at most the teacher's. Before, a longer example ended the first update with the
    teacher's own error naming the student's flag (`source of 10 tokens exceeds --max-source-positions 8`)."""
    if teacher[0] >= student[0] and teacher[1] >= student[1]:
        return
    raise SeqtrainError(
        f"--teacher-path {teacher_path}: the teacher reads at most {teacher[0]} source and {teacher[1]} target "
        f"tokens (its max_source_positions / max_target_positions), fewer than this run's --max-source-positions "
        f"{student[0]} / --max-target-positions {student[1]}; give the student at most the teacher's "
        f"(--max-source-positions {min(teacher[0], student[0])} --max-target-positions "
        f"{min(teacher[1], student[1])}), so every example fits both"
    )


@CRITERIONS.register(NAME, config=DistillationConfig)
class LabelSmoothedCrossEntropyWithDistillationCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(
        self,
        padding_idx: int,
        teacher: torch.nn.Module,
        distill_temperature: float = 2.0,
        distill_alpha: float = 0.8,
        label_smoothing: float = 0.0,
        sentence_avg: bool = False,
        report_accuracy: bool = False,
        ignore_prefix_size: int = 0,
    ):
        if not (math.isfinite(distill_temperature) and MIN_TEMPERATURE <= distill_temperature <= 1000):
            raise SeqtrainError(
                f"--distill-temperature must be between {MIN_TEMPERATURE} and 1000, got {distill_temperature}"
            )
        if not 0.0 <= distill_alpha <= 1.0:
            raise SeqtrainError(f"--distill-alpha must be between 0 and 1, got {distill_alpha}")
        super().__init__(
            padding_idx,
            label_smoothing=label_smoothing,
            sentence_avg=sentence_avg,
            report_accuracy=report_accuracy,
            ignore_prefix_size=ignore_prefix_size,
        )
        self.teacher = teacher.eval().requires_grad_(False)
        self.temperature = float(distill_temperature)
        self.alpha = float(distill_alpha)

    needs_task = True  # from_config takes the task (it loads the teacher and checks its dictionaries)

    @classmethod
    def from_config(
        cls, cfg: DistillationConfig, task: Any
    ) -> LabelSmoothedCrossEntropyWithDistillationCriterion:
        """Load --teacher-path and check its dictionaries against the task's data-bin (when given a task)."""
        path = cfg.teacher_path
        if not path:
            raise SeqtrainError(f"--criterion {NAME} needs --teacher-path CKPT (the teacher's checkpoint)")
        if not os.path.exists(path):
            raise SeqtrainError(f"--teacher-path {path}: no such file or folder")
        if not hasattr(task, "load_teacher"):  # criteria sit below the checkpoint readers: the task loads it
            raise SeqtrainError(f"--criterion {NAME}: build it from a task (task.build_criterion(cfg))")
        teacher = task.load_teacher(path)
        _check_positions(teacher.model.max_positions(), task.max_positions(), path)
        pad = task.target_dictionary.pad() if hasattr(task, "target_dictionary") else task.tgt_dict.pad()
        for side, ours, theirs in (
            ("source", getattr(task, "src_dict", None), teacher.src_dict),
            ("target", getattr(task, "tgt_dict", None), teacher.tgt_dict),
        ):
            _check_dictionary(theirs, ours, path, task.dictionary_file(side))
        return cls(
            pad,
            teacher.model,
            distill_temperature=cfg.distill_temperature,
            distill_alpha=cfg.distill_alpha,
            label_smoothing=cfg.label_smoothing,
            sentence_avg=cfg.sentence_avg,
            report_accuracy=cfg.report_accuracy,
            ignore_prefix_size=cfg.ignore_prefix_size,
        )

    def to(self, device: Any) -> LabelSmoothedCrossEntropyWithDistillationCriterion:
        """The trainer moves the criterion to the student's device."""
        self.teacher = self.teacher.to(device)
        return self

    def _logits(
        self, model: Any, sample: dict[str, Any], reduce: bool
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        project = _output_layer(model)
        rows, target, valid = _target_rows(
            model, sample, self.padding_idx, self.ignore_prefix_size, project is not None, use_rows=reduce
        )
        return (project(rows) if project is not None else rows), target, valid

    def forward(
        self, model: Any, sample: dict[str, Any], reduce: bool = True
    ) -> tuple[Tensor, Any, dict[str, Any]]:
        logits, target, valid = self._logits(model, sample, reduce)
        # the student's precision: a bf16 compute copy (--bf16-mode fairseq) gets a bf16 teacher; under
        # autocast both run the same low-precision matmuls
        dtype = next(iter(getattr(model, "module", model).parameters())).dtype
        if next(iter(self.teacher.parameters())).dtype != dtype:
            self.teacher = self.teacher.to(dtype)
        with torch.no_grad():
            teacher_logits, _, _ = self._logits(self.teacher, sample, reduce)
        ce, nll = smoothed_nll_loss(logits, target, self.eps)
        kd = distillation_kl(logits, teacher_logits, self.temperature)
        loss = (1.0 - self.alpha) * ce + self.alpha * kd.to(ce.dtype)
        loss, nll, kd = _zero_invalid(loss, valid), _zero_invalid(nll, valid), _zero_invalid(kd, valid)
        if reduce:
            loss, nll, kd = loss.sum(), nll.sum(), kd.sum()
        n_correct = count_correct(logits, target, valid) if self.report_accuracy else None
        sample_size, logging_output = step_logging_output(
            sample,
            target,
            valid,
            self.sentence_avg,
            {"loss": loss, "nll_loss": nll, "distill_loss": kd},
            n_correct,
        )
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs: list[dict[str, Any]]) -> dict[str, float]:
        out = CrossEntropyCriterion.reduce_metrics(logging_outputs)
        size = out["sample_size"]
        out["distill_loss"] = _sum(logging_outputs, "distill_loss") / size / math.log(2) if size else 0.0
        return out
