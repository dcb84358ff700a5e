"""toy_double_cross_entropy: cross entropy counted twice (loss and gradient doubled; nll_loss as logged)."""

from seqtrain.criterions import CrossEntropyCriterion
from seqtrain.registry import CRITERIONS


@CRITERIONS.register("toy_double_cross_entropy")
class DoubleCrossEntropy(CrossEntropyCriterion):
    def forward(self, model, sample, reduce=True):
        loss, sample_size, logging_output = super().forward(model, sample, reduce)
        logging_output["loss"] = logging_output["loss"] * 2
        return loss * 2, sample_size, logging_output
