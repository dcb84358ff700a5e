"""Ensembles of checkpoints (`--path a.pt:b.pt`), decoded together as fairseq's EnsembleModel does.

Every member runs its own encoder and its own incremental decoder (each with its own key/value cache, kept in the
generator's one incremental-state dict under the member's index). At each step the next-token distribution is the
average of the members' probabilities, computed in log space as fairseq does:
logsumexp_i(log_softmax(logits_i / temperature)) - log(n). `EnsembleModel` looks to SequenceGenerator like one
model: `encoder`, `decoder` (whose output stacks the members' logits on a member axis, B x T x n x V),
`max_positions()` (the smallest of the members') and `next_token_log_probs`, which the generator calls instead of
its own log_softmax.

The members must share the dictionaries (load_ensemble checks it); the tokenizer, sequence convention and other
settings are the first member's, as in fairseq.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class _Encoders:
    """The members' encoders, called as one: the encoder output is the list of the members' outputs."""

    def __init__(self, models: nn.ModuleList):
        self.models = models

    @property
    def supports_packed(self) -> bool:
        """Whether every member's encoder can run a padded batch packed (BartEncoder's `packed=`)."""
        return all(getattr(m.encoder, "supports_packed", False) for m in self.models)

    def __call__(self, src_tokens: Tensor, src_lengths: Tensor | None, **kw: Any) -> list[Any]:
        return [m.encoder(src_tokens, src_lengths, **kw) for m in self.models]

    def reorder_encoder_out(self, encoder_outs: list[Any], new_order: Tensor) -> list[Any]:
        return [m.encoder.reorder_encoder_out(out, new_order) for m, out in zip(self.models, encoder_outs)]


class _Decoders:
    """The members' decoders, called as one; member i keeps its cache in `incremental_state[i]`."""

    def __init__(self, models: nn.ModuleList):
        self.models = models

    def __call__(
        self,
        prev_output_tokens: Tensor,
        encoder_out: list[Any],
        incremental_state: dict[int, Any] | None = None,
    ) -> tuple[Tensor, None]:
        logits = []
        for i, (model, enc) in enumerate(zip(self.models, encoder_out)):
            state = None if incremental_state is None else incremental_state.setdefault(i, {})
            out, _ = model.decoder(prev_output_tokens, enc, incremental_state=state)
            logits.append(out)
        return torch.stack(logits, dim=2), None

    def reorder_incremental_state(
        self, incremental_state: dict[int, Any], new_order: Tensor, encoder_order: Tensor | None = None
    ) -> None:
        for i, model in enumerate(self.models):
            model.decoder.reorder_incremental_state(incremental_state[i], new_order, encoder_order)


class EnsembleModel(nn.Module):
    """Several encoder-decoder models over one dictionary, generating as one (see the module docstring)."""

    def __init__(self, models: Sequence[nn.Module]):
        super().__init__()
        if len(models) < 2:
            raise ValueError("an ensemble needs two models or more; use the model itself for one")
        self.models = nn.ModuleList(models)
        # plain objects, not submodules: the members' parameters belong to self.models only
        self.encoder = _Encoders(self.models)
        self.decoder = _Decoders(self.models)

    def max_positions(self) -> tuple[int, int]:
        limits = [m.max_positions() for m in self.models]
        return min(s for s, _ in limits), min(t for _, t in limits)

    @staticmethod
    def next_token_log_probs(logits: Tensor, temperature: float) -> Tensor:
        """The decoder output's last position (B x T x n x V) -> the ensemble's log-probabilities (B x V, float32):
        the log of the members' mean probability, as fairseq's EnsembleModel.forward_decoder computes it."""
        last = logits[:, -1].float()
        member = F.log_softmax(last if temperature == 1.0 else last / temperature, dim=-1)
        return torch.logsumexp(member, dim=1) - math.log(member.size(1))
