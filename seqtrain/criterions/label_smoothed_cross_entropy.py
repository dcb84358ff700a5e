"""fairseq's `label_smoothed_cross_entropy`: with eps = --label-smoothing and V the vocabulary size,

    eps_i = eps / (V - 1)
    loss  = (1 - eps - eps_i) * nll + eps_i * sum_v(-log p_v)      (summed over non-pad target tokens)

i.e. probability 1 - eps on the target and eps / (V - 1) on every other token. The logged nll_loss is the plain
negative log-likelihood. The computation is the shared fast path in cross_entropy.py.
"""

from __future__ import annotations

from seqtrain.criterions.cross_entropy import CriterionConfig, CrossEntropyCriterion
from seqtrain.errors import SeqtrainError
from seqtrain.registry import CRITERIONS


@CRITERIONS.register("label_smoothed_cross_entropy", config=CriterionConfig)
class LabelSmoothedCrossEntropyCriterion(CrossEntropyCriterion):
    def __init__(
        self,
        padding_idx: int,
        label_smoothing: float = 0.0,
        sentence_avg: bool = False,
        report_accuracy: bool = False,
        ignore_prefix_size: int = 0,
        loss_chunk_mb: float | None = None,
    ):
        if not 0.0 <= label_smoothing < 1.0:
            raise SeqtrainError(f"--label-smoothing must be in [0, 1), got {label_smoothing}")
        super().__init__(
            padding_idx,
            sentence_avg=sentence_avg,
            report_accuracy=report_accuracy,
            ignore_prefix_size=ignore_prefix_size,
            label_smoothing=label_smoothing,
            loss_chunk_mb=loss_chunk_mb,
        )

    @classmethod
    def from_config(cls, cfg: CriterionConfig, padding_idx: int) -> LabelSmoothedCrossEntropyCriterion:
        return cls(
            padding_idx,
            label_smoothing=cfg.label_smoothing,
            sentence_avg=cfg.sentence_avg,
            report_accuracy=cfg.report_accuracy,
            ignore_prefix_size=cfg.ignore_prefix_size,
            loss_chunk_mb=cfg.loss_chunk_mb,
        )
