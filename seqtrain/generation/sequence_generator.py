"""Batched beam search (and sampling) for encoder-decoder models, with fairseq's SequenceGenerator behaviour.

The encoder runs once. The decoder starts every hypothesis from the start token (EOS, fairseq's convention; mBART:
a language token) and is called once per step on all live hypotheses with an incremental key/value cache; the
decoder batch is `beam` x the encoder batch and the encoder's keys/values stay once per sentence. Each step:

1. log_softmax of the last position (float32, logits divided by the temperature), then masks: pad never, unk
   penalty, EOS forced at a sentence's max length, prefix tokens forced, EOS forbidden below min length,
   repeated n-grams blocked (on the device, no host sync). A model with a `next_token_log_probs(logits,
   temperature)` method supplies the log-probabilities itself (an ensemble of checkpoints, ensemble.py).
2. The search strategy (search.py) proposes candidates (beam search: top 2*beam over beam x vocab, cumulative
   scores; diverse beam search: the same per group of hypotheses, with a penalty between groups; sampling).
3. EOS candidates among the top `beam` are finalized: score = cumulative log-prob / len**lenpen, where len counts
   the EOS (fairseq's rule). A sentence is done when it has `beam` finalized hypotheses (fairseq's early stop) or
   reaches its max length; done sentences leave the batch (encoder output and cache follow).
4. The first `beam` non-EOS candidates continue.

Lengths (fairseq's conventions; "tokens" excludes the start token, includes the final EOS):
- step s (0-based) chooses the (s+1)-th output token; EOS is masked while s < min_len, so a hypothesis has at
  least min_len tokens before its EOS.
- max_len = min(int(max_len_a * src_len + max_len_b), max_target_positions - 1): at step max_len only EOS is
  allowed, so a hypothesis has at most max_len tokens before its EOS. src_len is the sentence's own non-pad source
  length (including its EOS). fairseq uses the padded batch width instead, which makes max_len_a > 0 depend on the
  batch; with the per-sentence length, results never depend on batch composition (identical when max_len_a = 0).

Output, per input sentence: up to nbest hypotheses, best first, each a dict like fairseq's:
{"tokens": LongTensor ending with EOS, "score": 0-dim tensor (natural log, length-normalized),
"positional_scores": FloatTensor (per-token natural-log probabilities, EOS included), "alignment": None,
"attention": None}. Tensors are returned on the CPU.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from seqtrain.distributed import to_device
from seqtrain.errors import SeqtrainError
from seqtrain.flags.generation import check_generation_args
from seqtrain.generation.ngram import NGramRepeatBlocker
from seqtrain.generation.search import BeamSearch, DiverseBeamSearch, Sampling, continue_beams
from seqtrain.generation.static_search import StaticSteps, static_generate

Hypothesis = dict[str, Any]


class SequenceGenerator:
    def __init__(
        self,
        model: torch.nn.Module,
        tgt_dict: Any,
        beam_size: int = 5,
        nbest: int | None = None,
        max_len_a: float = 0.0,
        max_len_b: int = 200,
        max_len: int = 0,
        min_len: int = 1,
        normalize_scores: bool = True,
        len_penalty: float = 1.0,
        unk_penalty: float = 0.0,
        temperature: float = 1.0,
        match_source_len: bool = False,
        no_repeat_ngram_size: int = 0,
        search_strategy: Any = None,
        bos: int | None = None,
        eos: int | None = None,
        static_decoding: bool = False,
        packed_encoder: bool | None = None,
    ):
        """`tgt_dict` gives pad()/eos()/unk(). `max_len` caps the output length (0: the model's
        max_positions()[1] - 1, as fairseq). `eos` is the token that ends a hypothesis (default: the dictionary's
        </s>; mBART's translation task: the target's `[lang]`, as fairseq's `eos=`), `bos` the decoder start token
        (default: `eos`, fairseq's convention). `nbest` hypotheses are returned per sentence (default: all
        `beam_size` finalized ones, as fairseq's generate() does). `static_decoding`: decode with
        seqtrain.generation.static_search (fixed-shape steps, CUDA graphs on CUDA, finished on the device); the
        same hypotheses. `packed_encoder`: the encoder pass on the sources' real tokens only (True), padded
        (False), or the encoder's choice (None: on CUDA in fp16/bf16, on the CPU from 20% pads; see `encode`);
        the same encoder output, so the same hypotheses."""
        if beam_size < 1:
            raise SeqtrainError(f"--beam must be >= 1, got {beam_size}")
        if temperature <= 0:
            raise SeqtrainError(f"--temperature must be > 0, got {temperature}")
        self.model = model
        self.pad, self.unk = tgt_dict.pad(), tgt_dict.unk()
        self.eos = tgt_dict.eos() if eos is None else eos
        self.bos = self.eos if bos is None else bos
        self.beam_size = beam_size
        self.nbest = beam_size if nbest is None else nbest
        self.max_len_a, self.max_len_b = max_len_a, max_len_b
        target_positions = model.max_positions()[1] if hasattr(model, "max_positions") else 1024
        self.max_len = max_len or target_positions
        self.min_len = min_len
        self.normalize_scores = normalize_scores
        self.len_penalty = len_penalty
        self.unk_penalty = unk_penalty
        self.temperature = temperature
        self.match_source_len = match_source_len
        self.ngram_blocker = NGramRepeatBlocker(no_repeat_ngram_size) if no_repeat_ngram_size > 0 else None
        self.search = search_strategy if search_strategy is not None else BeamSearch()
        # a model may bring its own next-token distribution: an ensemble (ensemble.py) averages its members'
        self._log_probs = getattr(model, "next_token_log_probs", None) or _last_log_probs
        self.static_decoding = static_decoding
        self.packed_encoder = packed_encoder
        self._static_steps: StaticSteps | None = None  # kept across batches: its buffers and CUDA graphs
        if self.max_len_a == 0 and not match_source_len and min_len > min(max_len_b, self.max_len - 1):
            raise SeqtrainError(
                f"--min-len {min_len} is larger than the max length {min(max_len_b, self.max_len - 1)}"
            )

    # ------------------------------------------------------------------ public API

    @torch.no_grad()
    def generate(
        self,
        src_tokens: Tensor,
        src_lengths: Tensor | None = None,
        prefix_tokens: Tensor | None = None,
        bos_token: int | None = None,
    ) -> list[list[Hypothesis]]:
        """src_tokens: B x S (left or right padded). prefix_tokens: B x P tokens to force first (pad = not forced).
        Returns, per sentence in src_tokens' order, its hypotheses best first."""
        was_training = self.model.training
        self.model.eval()
        try:
            return self._generate(
                src_tokens, src_lengths, prefix_tokens, self.bos if bos_token is None else bos_token
            )
        finally:
            self.model.train(was_training)

    # ------------------------------------------------------------------ the loop

    def _encode(self, src_tokens: Tensor, src_lengths: Tensor | None) -> Any:
        """The batch's encoder output (both loops' one encoder pass): `encode` with --packed-encoder's choice."""
        return encode(self.model, src_tokens, src_lengths, self.packed_encoder)

    def _max_lengths(self, src_tokens: Tensor) -> Tensor:
        """Per-sentence max output length (tokens before the final EOS). --match-source-len: the source's length
        without pads and EOS (fairseq's src_lengths; it then scores longer hypotheses -inf, here they cannot occur)."""
        if self.match_source_len:
            return (src_tokens.ne(self.pad) & src_tokens.ne(self.eos)).sum(dim=1)
        src_len = src_tokens.ne(self.pad).sum(dim=1).double()
        lens = torch.floor(self.max_len_a * src_len + self.max_len_b).long()
        return lens.clamp(min=0, max=self.max_len - 1)

    def _generate(
        self, src_tokens: Tensor, src_lengths: Tensor | None, prefix_tokens: Tensor | None, bos: int
    ) -> list[list[Hypothesis]]:
        if self.static_decoding:
            if self._static_steps is None:
                self._static_steps = StaticSteps(self.model, self.beam_size)
            return static_generate(self, src_tokens, src_lengths, prefix_tokens, bos, self._static_steps)
        model, beam, device = self.model, self.beam_size, src_tokens.device
        bsz = src_tokens.size(0)
        if bsz == 0:
            return []
        if src_lengths is None:
            src_lengths = src_tokens.ne(self.pad).sum(dim=1)
        encoder_out = self._encode(src_tokens, src_lengths)

        max_lens = self._max_lengths(src_tokens)  # bsz, on the device
        max_lens_host: list[int] = max_lens.tolist()
        steps = max(max_lens_host) if max_lens_host else 0

        tokens = torch.full((bsz * beam, steps + 2), self.pad, dtype=torch.long, device=device)
        tokens[:, 0] = bos
        scores = torch.zeros(bsz * beam, steps + 1, dtype=torch.float32, device=device)  # cumulative
        cands_to_ignore = torch.zeros(bsz, beam, dtype=torch.bool, device=device)

        # Finished hypotheses stay on the device until the search ends (_collect); the host keeps their counts.
        pending: list[tuple[list[int], Tensor, Tensor, Tensor]] = []
        counts = [0] * bsz
        active: list[int] = list(range(bsz))  # original index of each sentence still in the batch
        state: dict[str, Any] = {}
        reorder: tuple[Tensor, Tensor | None] | None = None

        for step in range(steps + 1):
            if reorder is not None:
                new_order, encoder_order = reorder
                if step == 1 and beam > 1:
                    new_order = torch.div(new_order, beam, rounding_mode="floor")
                model.decoder.reorder_incremental_state(state, new_order, encoder_order)
                if encoder_order is not None:
                    encoder_out = model.encoder.reorder_encoder_out(encoder_out, encoder_order)
            n_sent = len(active)

            if step == 0 and beam > 1:
                # The beams of a sentence are identical until the first choice: decode one row per sentence. Its
                # cache rows are per sentence, so the first reorder maps beam rows to sentences.
                logits, _ = model.decoder(tokens[::beam, :1], encoder_out, incremental_state=state)
                logits = logits.repeat_interleave(beam, dim=0)
            else:
                logits, _ = model.decoder(tokens[:, : step + 1], encoder_out, incremental_state=state)
            lprobs = self._log_probs(logits, self.temperature)
            lprobs = self._mask(step, lprobs, max_lens, prefix_tokens, step >= min(max_lens_host))
            if prefix_tokens is not None and step < prefix_tokens.size(1):
                tokens, scores, lprobs = self._replicate_first_beam_at_forced_eos(
                    step, prefix_tokens, tokens, scores, lprobs
                )
            if self.ngram_blocker is not None:
                lprobs = self.ngram_blocker(
                    tokens[:, : step + 1], lprobs, sink=self.pad
                )  # pad is -inf already

            prev = scores.view(n_sent, beam, -1)[:, :, step - 1] if step > 0 else None
            cand_scores, cand_tokens, cand_beams = self.search.step(step, lprobs.view(n_sent, beam, -1), prev)
            cand_rows = cand_beams + torch.arange(n_sent, device=device).unsqueeze(1) * beam

            eos_mask = cand_tokens.eq(self.eos) & cand_scores.ne(-math.inf)
            eos_mask[:, :beam] &= ~cands_to_ignore
            # The step's one host-device sync: which of the top candidates end here. The first `beam` finished
            # per sentence are kept, as in fairseq.
            picks = []
            for j, row in enumerate(eos_mask[:, :beam].tolist()):
                for b, ends in enumerate(row):
                    if ends and counts[active[j]] < beam:
                        counts[active[j]] += 1
                        picks.append((j, b))
            if picks:
                pending.append(
                    self._finalize(
                        step, picks, cand_rows[:, :beam], cand_scores[:, :beam], tokens, scores, active
                    )
                )

            keep = [j for j, s in enumerate(active) if counts[s] < beam and step < max_lens_host[j]]
            if not keep:
                break
            encoder_order = None
            if len(keep) < n_sent:
                keep_idx = torch.tensor(keep, dtype=torch.long, device=device)
                eos_mask, cand_rows = eos_mask[keep_idx], cand_rows[keep_idx]
                cand_scores, cand_tokens = cand_scores[keep_idx], cand_tokens[keep_idx]
                cands_to_ignore, max_lens = cands_to_ignore[keep_idx], max_lens[keep_idx]
                if prefix_tokens is not None:
                    prefix_tokens = prefix_tokens[keep_idx]
                active = [active[j] for j in keep]
                max_lens_host = [max_lens_host[j] for j in keep]
                encoder_order = keep_idx

            # Rows index the pre-removal batch, so one index_select both drops finished sentences and reorders beams.
            tokens, scores, cands_to_ignore, rows = continue_beams(
                step, beam, eos_mask, cands_to_ignore, cand_rows, cand_tokens, cand_scores, tokens, scores
            )
            reorder = (rows, encoder_order)

        return self._collect(pending, bsz)

    def _mask(
        self,
        step: int,
        lprobs: Tensor,
        max_lens: Tensor,
        prefix_tokens: Tensor | None,
        any_at_max: bool = True,
    ) -> Tensor:
        """`any_at_max` False (the caller knows no sentence is at its max length) skips the forced-EOS pass."""
        beam, eos = self.beam_size, self.eos
        lprobs = torch.nan_to_num_(lprobs, nan=-math.inf, posinf=math.inf, neginf=-math.inf)
        lprobs[:, self.pad] = -math.inf
        if self.unk_penalty:
            lprobs[:, self.unk] -= self.unk_penalty
        at_max = (step >= max_lens).repeat_interleave(beam)  # per decoder row
        if any_at_max:
            not_eos = torch.ones(lprobs.size(1), dtype=torch.bool, device=lprobs.device)
            not_eos[eos] = False
            lprobs = lprobs.masked_fill(at_max.unsqueeze(1) & not_eos, -math.inf)
        free = ~at_max
        if prefix_tokens is not None and step < prefix_tokens.size(1):
            forced_tok = prefix_tokens[:, step].repeat_interleave(beam)
            forced = forced_tok.ne(self.pad) & free
            kept = lprobs.gather(1, forced_tok.unsqueeze(1))
            only_forced = torch.full_like(lprobs, -math.inf).scatter(1, forced_tok.unsqueeze(1), kept)
            lprobs = torch.where(forced.unsqueeze(1), only_forced, lprobs)
            free = free & ~forced
        if step < self.min_len:
            lprobs[:, eos] = torch.where(free, torch.full_like(lprobs[:, eos], -math.inf), lprobs[:, eos])
        return lprobs

    def _replicate_first_beam_at_forced_eos(
        self, step: int, prefix_tokens: Tensor, tokens: Tensor, scores: Tensor, lprobs: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """A prefix that contains EOS finishes the hypothesis; give every beam slot the first beam's state so the
        sentence collects `beam` (identical) finalized hypotheses, as fairseq does."""
        beam = self.beam_size
        eos_sent = prefix_tokens[:, step].eq(self.eos)
        if not bool(eos_sent.any()):
            return tokens, scores, lprobs
        rows = torch.arange(tokens.size(0), device=tokens.device)
        first = rows - rows % beam
        src = torch.where(eos_sent.repeat_interleave(beam), first, rows)
        return tokens.index_select(0, src), scores.index_select(0, src), lprobs.index_select(0, src)

    def _finalize(
        self,
        step: int,
        picks: list[tuple[int, int]],
        rows_top: Tensor,
        scores_top: Tensor,
        tokens: Tensor,
        scores: Tensor,
        active: list[int],
    ) -> tuple[list[int], Tensor, Tensor, Tensor]:
        """The hypotheses that end with EOS at this step, `picks` = (sentence slot, candidate) in candidate
        order: (their sentences, tokens, positional scores, final scores), the tensors left on the device."""
        beam = self.beam_size
        flat = to_device(torch.tensor([j * beam + b for j, b in picks]), tokens.device)
        rows = rows_top.reshape(-1).index_select(0, flat)
        eos_scores = scores_top.reshape(-1).index_select(0, flat)
        hyp_tokens = tokens.index_select(0, rows)[:, 1 : step + 2].clone()
        hyp_tokens[:, step] = self.eos
        cum = scores.index_select(0, rows)[:, : step + 1].clone()
        cum[:, step] = eos_scores
        positional = torch.cat([cum[:, :1], cum[:, 1:] - cum[:, :-1]], dim=1)
        final = eos_scores / ((step + 1) ** self.len_penalty) if self.normalize_scores else eos_scores.clone()
        return [active[j] for j, _ in picks], hyp_tokens, positional, final

    def _collect(
        self, pending: list[tuple[list[int], Tensor, Tensor, Tensor]], bsz: int
    ) -> list[list[Hypothesis]]:
        """Every finished hypothesis brought to the host in one transfer (fp64 holds the token ids and the fp32
        scores exactly), per sentence best first (a stable sort: ties keep finalization order), nbest kept."""
        finalized: list[list[tuple[float, Hypothesis]]] = [[] for _ in range(bsz)]
        if pending:
            parts = [
                torch.cat([t.reshape(-1).double(), p.reshape(-1).double(), f.double()])
                for _, t, p, f in pending
            ]
            values = torch.cat(parts).tolist()
            offset = 0
            for sents, hyp_tokens, _, _ in pending:
                k, n = hyp_tokens.shape
                toks = torch.tensor(values[offset : offset + k * n], dtype=torch.long).view(k, n)
                pos = torch.tensor(values[offset + k * n : offset + 2 * k * n], dtype=torch.float32).view(
                    k, n
                )
                final = values[offset + 2 * k * n : offset + 2 * k * n + k]
                offset += 2 * k * n + k
                for i, sent in enumerate(sents):
                    hypo = {
                        "tokens": toks[i],
                        "score": torch.tensor(final[i], dtype=torch.float32),
                        "attention": None,
                        "alignment": None,
                        "positional_scores": pos[i],
                    }
                    finalized[sent].append((final[i], hypo))
        out = []
        for hypos in finalized:
            hypos.sort(key=lambda h: h[0], reverse=True)
            out.append([h for _, h in hypos[: self.nbest]])
        return out


def encode(
    model: torch.nn.Module, src_tokens: Tensor, src_lengths: Tensor | None, packed: bool | None
) -> Any:
    """The encoder pass of generation (and of --score-reference) on a padded batch: packed (the real tokens only,
    models/varlen.py's attention; BartEncoder.forward_padded_as_packed) when `packed`, padded when False, the
    encoder's own choice when None (BartEncoder.packs_by_default). The output is laid out as the padded pass's
    (B x S x C and the B x S pad mask), so everything above the encoder is the same either way. An encoder
    without `supports_packed` (a caller's own model) runs as it always did."""
    if getattr(model.encoder, "supports_packed", False):
        return model.encoder(src_tokens, src_lengths, packed=packed)
    return model.encoder(src_tokens, src_lengths)


def _last_log_probs(logits: Tensor, temperature: float) -> Tensor:
    """The next token's log-probabilities (float32) from the decoder's logits at the last position."""
    last = logits[:, -1, :].float()
    return F.log_softmax(last if temperature == 1.0 else last / temperature, dim=-1)


# ---------------------------------------------------------------------- builders and the batch helper


def build_generator(
    model: torch.nn.Module,
    tgt_dict: Any,
    args: argparse.Namespace,
    bos: int | None = None,
    eos: int | None = None,
) -> SequenceGenerator:
    """A generator configured from the flags of `add_generation_args` (fairseq's names and defaults); `bos` and
    `eos` as SequenceGenerator's (a task's or a model's start and end tokens)."""
    check_generation_args(args)
    if getattr(args, "sampling", False):
        device = next(model.parameters()).device
        gen = torch.Generator(device=device)
        seed = getattr(args, "seed", None)
        gen.manual_seed(1 if seed is None else seed)
        search: Any = Sampling(args.sampling_topk, args.sampling_topp, gen)
    elif getattr(args, "diverse_beam_groups", -1) > 0:
        search = DiverseBeamSearch(args.diverse_beam_groups, args.diverse_beam_strength)
    else:
        search = BeamSearch()
    static = getattr(args, "static_decoding", None)
    ensemble = hasattr(model, "next_token_log_probs")  # the static step is one model's decoder (ensemble.py)
    if static and ensemble:
        raise SeqtrainError(
            "--static-decoding decodes one model; an ensemble (--path a.pt:b.pt) runs eagerly"
        )
    if static is None:  # the default: static where the host is the bottleneck
        static = not ensemble and next(model.parameters()).device.type == "cuda"
    return SequenceGenerator(
        model,
        tgt_dict,
        beam_size=args.beam,
        nbest=args.nbest,
        max_len_a=args.max_len_a,
        max_len_b=args.max_len_b,
        min_len=args.min_len,
        normalize_scores=not getattr(args, "unnormalized", False),
        len_penalty=args.lenpen,
        unk_penalty=args.unkpen,
        temperature=args.temperature,
        match_source_len=args.match_source_len,
        no_repeat_ngram_size=args.no_repeat_ngram_size,
        search_strategy=search,
        static_decoding=static,
        packed_encoder=getattr(args, "packed_encoder", None),
        bos=bos,
        eos=eos,
    )


def generate_batch(
    generator: SequenceGenerator,
    sample: dict[str, Any],
    prefix_size: int = 0,
    force_bos: int | None = None,
) -> list[tuple[int, list[Hypothesis]]]:
    """Run `generator` on a collated sample ({"id", "net_input": {"src_tokens", "src_lengths", ...}, "target"}).

    Returns [(sample_id, hypotheses)] aligned with sample["id"] (row i of the batch is entry i), which is the
    order fairseq prints S-/T-/H- lines in. `prefix_size` > 0 forces the first tokens of sample["target"]
    (fairseq's --prefix-size). `force_bos` forces that token first (e.g. `<s>` for models trained with
    --prepend-bos, as fairseq's BART hub does); it comes before any target prefix.
    """
    net_input = sample["net_input"]
    src_tokens = net_input["src_tokens"]
    prefix: Tensor | None = None
    if prefix_size > 0:
        if sample.get("target") is None:
            raise SeqtrainError("--prefix-size needs target data (the prefix is read from the references)")
        prefix = sample["target"][:, :prefix_size].to(src_tokens.device)
    if force_bos is not None:
        first = torch.full((src_tokens.size(0), 1), force_bos, dtype=torch.long, device=src_tokens.device)
        prefix = first if prefix is None else torch.cat([first, prefix], dim=1)
    hypos = generator.generate(src_tokens, net_input.get("src_lengths"), prefix_tokens=prefix)
    ids: Sequence[int] = sample["id"].tolist() if torch.is_tensor(sample["id"]) else list(sample["id"])
    return list(zip(ids, hypos))
