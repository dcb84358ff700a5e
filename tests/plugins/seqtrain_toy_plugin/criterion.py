"""toy_double_cross_entropy: cross entropy counted twice (loss and gradient doubled; nll_loss as logged);
toy_put_cross_entropy: cross entropy beside an operator without a deterministic kernel."""

import os

import torch

from seqtrain.criterions import CrossEntropyCriterion
from seqtrain.errors import SeqtrainError
from seqtrain.registry import CRITERIONS


@CRITERIONS.register("toy_double_cross_entropy")
class DoubleCrossEntropy(CrossEntropyCriterion):
    def forward(self, model, sample, reduce=True):
        loss, sample_size, logging_output = super().forward(model, sample, reduce)
        logging_output["loss"] = logging_output["loss"] * 2
        return loss * 2, sample_size, logging_output


@CRITERIONS.register("toy_put_cross_entropy")
class PutCrossEntropy(CrossEntropyCriterion):
    """Cross entropy that, on the last rank, also runs Tensor.put_, an operator torch has no deterministic kernel
    for: under --deterministic torch refuses it (tests of the one-line error, and that the flag reaches every
    rank). There it also checks that the rank inherited the cuBLAS setting the flag exports."""

    def forward(self, model, sample, reduce=True):
        rank, world = 0, 1
        if torch.distributed.is_initialized():
            rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        if rank == world - 1:
            if (
                torch.are_deterministic_algorithms_enabled()
                and os.environ.get("CUBLAS_WORKSPACE_CONFIG") is None
            ):
                raise SeqtrainError(f"toy_put_cross_entropy: rank {rank} has no CUBLAS_WORKSPACE_CONFIG")
            torch.zeros(2).put_(torch.tensor([1]), torch.ones(1))
        return super().forward(model, sample, reduce)
