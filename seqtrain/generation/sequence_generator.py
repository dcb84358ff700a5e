"""Batched beam search (and sampling) for encoder-decoder models, with fairseq's SequenceGenerator behaviour.

The encoder runs once. The decoder starts every hypothesis from the start token (EOS, fairseq's convention; mBART:
a language token) and is called once per step on all live hypotheses with an incremental key/value cache; the
decoder batch is `beam` x the encoder batch and the encoder's keys/values stay once per sentence. Each step
(the step body, decode_step.DecodeStep, which the static loop, static_search.py, runs too):

1. log_softmax of the last position (float32, logits divided by the temperature), then masks: pad never, unk
   penalty, EOS forced at a sentence's max length, prefix tokens forced, EOS forbidden below min length,
   repeated n-grams blocked (on the device, no host sync). A model with a `next_token_log_probs(logits,
   temperature)` method supplies the log-probabilities itself (an ensemble of checkpoints, ensemble.py).
2. The search strategy (search.py) proposes candidates (beam search: top 2*beam over beam x vocab, cumulative
   scores; diverse beam search: the same per group of hypotheses, with a penalty between groups; sampling).
3. EOS candidates among the top `beam` are finalized: score = cumulative log-prob / len**lenpen, where len counts
   the EOS (fairseq's rule). A sentence is done when it has `beam` finalized hypotheses (fairseq's early stop) or
   reaches its max length; done sentences leave the batch (encoder output and cache follow). This loop counts
   them on the host, the static loop on the device (device_finalize.py).
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

import gc
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from seqtrain.distributed import to_device
from seqtrain.errors import SeqtrainError
from seqtrain.generation import cpu_step
from seqtrain.generation.decode_step import Beams, Candidates, DecodeStep, positional_scores
from seqtrain.generation.search import GenerationConfig, keyword_config, make_search
from seqtrain.generation.static_search import StaticSteps, static_generate

Hypothesis = dict[str, Any]


class SequenceGenerator:
    def __init__(
        self,
        model: torch.nn.Module,
        tgt_dict: Any,
        config: GenerationConfig | None = None,
        *,
        nbest: int | None = None,
        max_len: int = 0,
        search_strategy: Any = None,
        bos: int | None = None,
        eos: int | None = None,
        static_decoding: bool = False,
        packed_encoder: bool | None = None,
        cpu_step: bool | None = None,
        **keywords: Any,
    ):
        """`config`: the search settings (search.GenerationConfig, as build_generator passes them, checked by the
        front end that read them); or fairseq's SequenceGenerator keywords for them (beam_size=5,
        max_len_a=0.0, max_len_b=200, min_len=1, normalize_scores=True, len_penalty=1.0, unk_penalty=0.0,
        temperature=1.0, match_source_len=False, no_repeat_ngram_size=0: search.keyword_config, checked as the
        flags are). Either way they build the step body both loops run (decode_step.DecodeStep), in one place.
        `tgt_dict` gives pad()/eos()/unk(). `max_len` caps the output length (0: the model's
        max_positions()[1] - 1, as fairseq). `search_strategy`: the strategy (default: the one the settings
        name, search.make_search). `eos` is the token that ends a hypothesis (default: the dictionary's </s>;
        mBART's translation task: the target's `[lang]`, as fairseq's `eos=`), `bos` the decoder start token
        (default: `eos`, fairseq's convention). `nbest` hypotheses are returned per sentence (default: all
        `beam` finalized ones, as fairseq's generate() does). `static_decoding`: decode with
        seqtrain.generation.static_search (fixed-shape steps, CUDA graphs on CUDA, finished on the device); the
        same hypotheses. `packed_encoder`: the encoder pass on the sources' real tokens only (True), padded
        (False), or the encoder's choice (None: on CUDA in fp16/bf16, on the CPU from 20% pads; see `encode`);
        the same encoder output, so the same hypotheses. `cpu_step`: on the CPU, decode with the compiled step
        (cpu_step.py: the same hypotheses, scores to rounding) where it applies (None: unless
        SEQTRAIN_CPU_STEP=eager), or never (False)."""
        if config is None:
            config = keyword_config(**keywords)
        elif keywords:
            raise TypeError(
                f"SequenceGenerator: give the search settings as config or keywords, not both: {keywords}"
            )
        self.model = model
        target_positions = model.max_positions()[1] if hasattr(model, "max_positions") else 1024
        eos = tgt_dict.eos() if eos is None else eos
        if search_strategy is None:
            search_strategy = make_search(config, next(model.parameters()).device)
        self.decode_step = DecodeStep(
            config,
            tgt_dict.pad(),
            tgt_dict.unk(),
            eos,
            max_len=max_len or target_positions,
            search=search_strategy,
            # a model may bring its own next-token distribution: an ensemble (ensemble.py) averages its members'
            log_probs=getattr(model, "next_token_log_probs", None),
        )
        self.bos = eos if bos is None else bos
        self.nbest = config.beam if nbest is None else nbest
        self.static_decoding = static_decoding
        self.packed_encoder = packed_encoder
        self.cpu_step = cpu_step
        self._static_steps: StaticSteps | None = None  # kept across batches: its buffers and CUDA graphs

    @property
    def beam_size(self) -> int:
        return self.decode_step.beam

    @property
    def eos(self) -> int:
        return self.decode_step.eos

    @property
    def search(self) -> Any:
        return self.decode_step.search

    # ------------------------------------------------------------------ public API

    @torch.no_grad()
    def generate(
        self,
        src_tokens: Tensor,
        src_lengths: Tensor | None = None,
        prefix_tokens: Tensor | None = None,
        bos_token: int | None = None,
        encoder_out: Any = None,
    ) -> list[list[Hypothesis]]:
        """src_tokens: B x S (left or right padded). prefix_tokens: B x P tokens to force first (pad = not forced).
        `encoder_out`: this batch's encoder output (`encode`), when the caller already has it: seqtrain-tune
        searches many settings from one encoder pass per batch (the search never changes it). Returns, per
        sentence in src_tokens' order, its hypotheses best first."""
        was_training = self.model.training
        self.model.eval()
        # Python's cycle collector off for the search: the loop allocates a few tensors a step, which trigger
        # collections that walk every object of torch and the model (~180k: 11% of a CPU search's time on
        # bart_small, docs/benchmarks.md); the search makes no cycles, and a later collection finds any
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._generate(
                src_tokens,
                src_lengths,
                prefix_tokens,
                self.bos if bos_token is None else bos_token,
                encoder_out,
            )
        finally:
            self.model.train(was_training)
            if collecting:
                gc.enable()

    # ------------------------------------------------------------------ the loop

    def _generate(
        self,
        src_tokens: Tensor,
        src_lengths: Tensor | None,
        prefix_tokens: Tensor | None,
        bos: int,
        encoder_out: Any = None,
    ) -> list[list[Hypothesis]]:
        if src_tokens.size(0) == 0:
            return []
        if src_lengths is None:
            src_lengths = src_tokens.ne(self.decode_step.pad).sum(dim=1)
        # the compiled CPU step's prepared weights (looked up once a batch: the lookup reads every weight)
        cpu = None
        if self.cpu_step is not False and src_tokens.device.type == "cpu":
            cpu = cpu_step.for_model(self.model)
        if encoder_out is None:  # both loops' one pass
            encoder_out = encode(self.model, src_tokens, src_lengths, self.packed_encoder, cpu or False)
        if self.static_decoding:
            if self._static_steps is None:
                self._static_steps = StaticSteps(self.model, self.beam_size)
            return static_generate(
                self.decode_step, self._static_steps, encoder_out, src_tokens, prefix_tokens, bos, self.nbest
            )
        return self._eager(encoder_out, src_tokens, prefix_tokens, bos, cpu)

    def _decoder(self, encoder_out: Any, bsz: int, cpu: cpu_step.PackedModel | None) -> Any:
        """This batch's decoder (`logits`, `reorder`): the compiled CPU step where it applies (`cpu`, the model's
        prepared weights), else the model's incremental decoder."""
        native = cpu.native_decoder() if cpu is not None else None
        if native is None:
            return ModelSteps(self.model, encoder_out)
        return cpu_step.CompiledSteps(cpu, native, encoder_out, bsz, bsz * self.beam_size)

    def _eager(
        self,
        encoder_out: Any,
        src_tokens: Tensor,
        prefix_tokens: Tensor | None,
        bos: int,
        cpu: cpu_step.PackedModel | None = None,
    ) -> list[list[Hypothesis]]:
        """The eager loop: the model's incremental decoder (or the compiled CPU step), finished hypotheses
        counted on the host (one sync a step), finished sentences leaving the batch at once."""
        body, beam, device = self.decode_step, self.beam_size, src_tokens.device
        bsz = src_tokens.size(0)
        beams = body.begin(src_tokens, prefix_tokens, bos)
        decoder = self._decoder(encoder_out, bsz, cpu)
        fused = isinstance(decoder, cpu_step.CompiledSteps) and body.fusable(beams)
        if fused:  # plain beam search on the compiled step: the whole loop in C++ (this loop's rules)
            found = decoder.search(body, beams, bos)
            if found is not None:
                return self._sorted(found)
            decoder = self._decoder(encoder_out, bsz, cpu)  # a logit was not finite: this loop's masks decide

        # Finished hypotheses stay on the device until the search ends (_collect); the host keeps their counts.
        pending: list[tuple[list[int], Tensor, Tensor, Tensor]] = []
        counts = [0] * bsz
        active: list[int] = list(range(bsz))  # original index of each sentence still in the batch
        reorder: tuple[Tensor, Tensor | None] | None = None

        for step in range(beams.steps + 1):
            if reorder is not None:
                new_order, encoder_order = reorder
                if step == 1 and beam > 1:
                    new_order = torch.div(new_order, beam, rounding_mode="floor")
                decoder.reorder(new_order, encoder_order)

            # The beams of a sentence are identical until the first choice: step 0 decodes one row per sentence.
            # Its cache rows are per sentence, so the first reorder maps beam rows to sentences.
            unexpanded = step == 0 and beam > 1
            logits = decoder.logits(beams.tokens[::beam, :1] if unexpanded else beams.tokens[:, : step + 1])
            cands = body.fused_candidates(step, logits[:, -1], beams, unexpanded) if fused else None
            if cands is None:
                if unexpanded:
                    logits = logits.repeat_interleave(beam, dim=0)
                cands = body.candidates(step, body.log_probs(step, logits, beams), beams)

            # The step's one host-device sync: which of the top candidates end here. The first `beam` finished
            # per sentence are kept, as in fairseq.
            picks = []
            for j, row in enumerate(cands.eos[:, :beam].tolist()):
                for b, ends in enumerate(row):
                    if ends and counts[active[j]] < beam:
                        counts[active[j]] += 1
                        picks.append((j, b))
            if picks:
                pending.append(self._finalize(step, picks, cands, beams, active))

            keep = [j for j, s in enumerate(active) if counts[s] < beam and step < beams.max_lens_host[j]]
            if not keep:
                break
            encoder_order = None
            if len(keep) < len(active):
                keep_idx = torch.tensor(keep, dtype=torch.long, device=device)
                cands = cands.select(keep_idx)
                beams.select(keep, keep_idx)
                active = [active[j] for j in keep]
                encoder_order = keep_idx

            # Rows index the pre-removal batch, so one index_select both drops finished sentences and reorders beams.
            reorder = (body.advance(step, cands, beams), encoder_order)

        return self._collect(pending, bsz)

    def _finalize(
        self, step: int, picks: list[tuple[int, int]], cands: Candidates, beams: Beams, active: list[int]
    ) -> tuple[list[int], Tensor, Tensor, Tensor]:
        """The hypotheses that end with EOS at this step, `picks` = (sentence slot, candidate) in candidate
        order: (their sentences, tokens, positional scores, final scores), the tensors left on the device."""
        beam = self.beam_size
        flat = to_device(torch.tensor([j * beam + b for j, b in picks]), beams.tokens.device)
        rows = cands.rows[:, :beam].reshape(-1).index_select(0, flat)
        eos_scores = cands.scores[:, :beam].reshape(-1).index_select(0, flat)
        hyp_tokens = beams.tokens.index_select(0, rows)[:, 1 : step + 2].clone()
        hyp_tokens[:, step] = self.eos
        cum = beams.scores.index_select(0, rows)[:, : step + 1].clone()
        cum[:, step] = eos_scores
        final = self.decode_step.final_scores(step, eos_scores)
        return [active[j] for j, _ in picks], hyp_tokens, positional_scores(cum), final

    def _sorted(self, found: list[list[tuple[float, list[int], list[float]]]]) -> list[list[Hypothesis]]:
        """The compiled loop's finished hypotheses (per sentence, (final score, tokens, positional scores) in
        the order they finished) as _collect returns its own: best first (a stable sort), nbest kept."""
        out = []
        for hyps in found:
            hyps = sorted(hyps, key=lambda h: h[0], reverse=True)[: self.nbest]
            out.append(
                [
                    {
                        "tokens": torch.tensor(tokens, dtype=torch.long),
                        "score": torch.tensor(score, dtype=torch.float32),
                        "attention": None,
                        "alignment": None,
                        "positional_scores": torch.tensor(positional, dtype=torch.float32),
                    }
                    for score, tokens, positional in hyps
                ]
            )
        return out

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


class ModelSteps:
    """The model's incremental decoder for one batch, as the eager loop drives it (`logits`, `reorder`)."""

    def __init__(self, model: torch.nn.Module, encoder_out: Any):
        self.model, self.encoder_out = model, encoder_out
        self.state: dict[str, Any] = {}

    def logits(self, prev_output_tokens: Tensor) -> Tensor:
        return self.model.decoder(prev_output_tokens, self.encoder_out, incremental_state=self.state)[0]

    def reorder(self, new_order: Tensor, encoder_order: Tensor | None) -> None:
        self.model.decoder.reorder_incremental_state(self.state, new_order, encoder_order)
        if encoder_order is not None:
            self.encoder_out = self.model.encoder.reorder_encoder_out(self.encoder_out, encoder_order)


def encode(
    model: torch.nn.Module,
    src_tokens: Tensor,
    src_lengths: Tensor | None,
    packed: bool | None,
    compiled: bool | cpu_step.PackedModel = True,
) -> Any:
    """The encoder pass of generation (and of --score-reference) on a padded batch: packed (the real tokens only,
    models/varlen.py's attention; BartEncoder.forward_padded_as_packed) when `packed`, padded when False, the
    encoder's own choice when None (BartEncoder.packs_by_default). The output is laid out as the padded pass's
    (B x S x C and the B x S pad mask), so everything above the encoder is the same either way. On the CPU, where
    the compiled step applies (`compiled`: True, or the model's prepared weights when the caller has them;
    cpu_step.for_model), the packed pass with its prepared products. An encoder without `supports_packed` (a
    caller's own model) runs as it always did."""
    cpu = compiled if isinstance(compiled, cpu_step.PackedModel) else None
    if compiled is True and src_tokens.device.type == "cpu":
        cpu = cpu_step.for_model(model)
    if cpu is not None:
        return cpu.encode(src_tokens, src_lengths)
    if getattr(model.encoder, "supports_packed", False):
        return model.encoder(src_tokens, src_lengths, packed=packed)
    return model.encoder(src_tokens, src_lengths)


# ---------------------------------------------------------------------- builders and the batch helper


def build_generator(
    model: torch.nn.Module,
    tgt_dict: Any,
    config: GenerationConfig,
    bos: int | None = None,
    eos: int | None = None,
) -> SequenceGenerator:
    """A generator configured from the search settings `config` (search.GenerationConfig: fairseq's names and
    defaults), already checked by check_generation_args (each front end checks where it names the source: a
    flag, a config file's key, a Summarizer argument, and converts its flags once, search.generation_config);
    `bos` and `eos` as SequenceGenerator's (a task's or a model's start and end tokens). The library's beam
    search takes no Namespace and no flag layer: the settings are read here, nothing below keeps them."""
    if not isinstance(config, GenerationConfig):
        raise TypeError(
            f"build_generator takes a GenerationConfig (search.generation_config(args) converts parsed flags), "
            f"got {type(config).__name__}"
        )
    static = config.static_decoding
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
        config,
        nbest=config.nbest,
        static_decoding=static,
        packed_encoder=config.packed_encoder,
        bos=bos,
        eos=eos,
    )


def generate_batch(
    generator: SequenceGenerator,
    sample: dict[str, Any],
    prefix_size: int = 0,
    force_bos: int | None = None,
    encoder_out: Any = None,
) -> list[tuple[int, list[Hypothesis]]]:
    """Run `generator` on a collated sample ({"id", "net_input": {"src_tokens", "src_lengths", ...}, "target"}).

    Returns [(sample_id, hypotheses)] aligned with sample["id"] (row i of the batch is entry i), which is the
    order fairseq prints S-/T-/H- lines in. `prefix_size` > 0 forces the first tokens of sample["target"]
    (fairseq's --prefix-size). `force_bos` forces that token first (e.g. `<s>` for models trained with
    --prepend-bos, as fairseq's BART hub does); it comes before any target prefix. `encoder_out`: the
    sample's encoder output when already computed (SequenceGenerator.generate).
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
    hypos = generator.generate(
        src_tokens, net_input.get("src_lengths"), prefix_tokens=prefix, encoder_out=encoder_out
    )
    ids: Sequence[int] = sample["id"].tolist() if torch.is_tensor(sample["id"]) else list(sample["id"])
    return list(zip(ids, hypos))
