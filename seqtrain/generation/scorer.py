"""--score-reference: the references scored by the model instead of generated, as fairseq's SequenceScorer.

One teacher-forced forward pass per batch and member (the decoder sees `</s> reference` and predicts the
reference); each reference token's log-probability, summed and divided by the reference's length (EOS counted, no
length penalty) is the score. With an ensemble the members' probabilities are averaged, then the log taken
(fairseq's order: add, divide, log). The output is one hypothesis per example, the reference itself, shaped like
SequenceGenerator's, so the S-/T-/H-/D-/P- lines and result files are written as for generation.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from seqtrain.errors import SeqtrainError
from seqtrain.generation.ensemble import EnsembleModel
from seqtrain.generation.sequence_generator import encode

Hypothesis = dict[str, Any]


class SequenceScorer:
    """Scores each example's reference under `model` (one model, or an EnsembleModel)."""

    def __init__(self, model: torch.nn.Module, tgt_dict: Any, packed_encoder: bool | None = None):
        """`packed_encoder` as SequenceGenerator's: the encoder pass packed, padded, or the encoder's choice."""
        self.model = model
        self.pad = tgt_dict.pad()
        self.packed_encoder = packed_encoder

    def _target_probs(
        self, member: torch.nn.Module, net_input: dict[str, Any], target: Tensor, log: bool
    ) -> Tensor:
        """B x T: the member's (log-)probability of each target token, in float32."""
        # The decoder runs padded, without the collater's layout: a packed decoder pass would return only the
        # real target rows, and this gathers from B x T x V. The encoder pass is generation's (`encode`): its
        # output is laid out B x S either way.
        encoder_out = encode(
            member, net_input["src_tokens"], net_input.get("src_lengths"), self.packed_encoder
        )
        logits, _ = member.decoder(net_input["prev_output_tokens"], encoder_out)
        norm = F.log_softmax if log else F.softmax
        return norm(logits.float(), dim=-1).gather(2, target.unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def score_batch(self, sample: dict[str, Any]) -> list[tuple[int, list[Hypothesis]]]:
        """[(sample id, [the reference as a hypothesis])] in the batch's row order, as generate_batch returns."""
        target = sample.get("target")
        if target is None:
            raise SeqtrainError(
                "--score-reference: the split has no target side; there is no reference to score"
            )
        members = list(self.model.models) if isinstance(self.model, EnsembleModel) else [self.model]
        was_training = self.model.training
        self.model.eval()
        try:
            probs = None
            for member in members:
                p = self._target_probs(member, sample["net_input"], target, log=len(members) == 1)
                probs = p if probs is None else probs + p
        finally:
            self.model.train(was_training)
        if len(members) > 1:
            probs = (probs / len(members)).log()
        target, probs = target.cpu(), probs.cpu()
        ids = sample["id"].tolist() if torch.is_tensor(sample["id"]) else list(sample["id"])
        out = []
        for row, sid in enumerate(ids):
            ref = target[row][target[row].ne(self.pad)]
            positional = probs[row, : ref.numel()]
            hypo = {
                "tokens": ref,
                "score": positional.sum() / ref.numel(),
                "attention": None,
                "alignment": None,
                "positional_scores": positional,
            }
            out.append((sid, [hypo]))
        return out
