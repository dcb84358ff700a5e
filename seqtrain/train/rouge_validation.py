"""Validation with ROUGE (--eval-rouge): generate summaries for the validation batches and score them.

fairseq's translation task does this for BLEU (--eval-bleu, --eval-bleu-args, --eval-bleu-print-samples); this is
the summarization counterpart. Generation settings come from --eval-rouge-args, either JSON with generation flag
names as keys ('{"beam": 4, "max_len_b": 30, "lenpen": 1.0, "no_repeat_ngram_size": 3}') or the flags themselves
('--beam 4 --max-len-b 30'); unset ones keep seqtrain-generate's defaults. Hypotheses and references are
detokenized with the data-bin's tokenizer and scored with seqtrain.scoring.rouge; the scores (F1 x 100) are
logged as rouge1, rouge2, rouge_l, rouge_lsum, so `--best-checkpoint-metric rouge_l
--maximize-best-checkpoint-metric` keeps the checkpoint that summarizes best. With --eval-rouge-bootstrap N each
figure also gets its 95% percentile-bootstrap interval (rouge_l_lo, rouge_l_hi, ...), computed by seqtrain-score's
own code with --seed, so `seqtrain-score --bootstrap N --seed S` on the same hypotheses gives the same interval.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch

from seqtrain.data.tokenizer import build_tokenizer
from seqtrain.generation.options import generation_args
from seqtrain.generation.runner import check_beam_width
from seqtrain.generation.sequence_generator import build_generator, generate_batch
from seqtrain.scoring.rouge import bootstrap_intervals, example_scores, format_intervals, mean_scores
from seqtrain.scoring.settings import EvalRougeConfig

logger = logging.getLogger("seqtrain.eval_rouge")  # the name log lines have always shown

# seqtrain.scoring.rouge's keys -> the names logged (fairseq-style lower case with underscores)
ROUGE_LOG_NAMES = {"rouge1": "rouge1", "rouge2": "rouge2", "rougeL": "rouge_l", "rougeLsum": "rouge_lsum"}


class RougeValidator:
    """Collects (hypothesis, reference) pairs batch by batch during one validation, then scores them."""

    def __init__(self, cfg: EvalRougeConfig, task: Any, seed: int = 1, prepend_bos: bool = False):
        """`cfg`: the --eval-rouge settings; `seed`: the run's --seed (generation and the bootstrap draw from
        it); `prepend_bos`: the data's --prepend-bos (the decoder then starts after <s>)."""
        self.gen_args = generation_args(cfg.eval_rouge_args, seed)
        self.print_samples = cfg.eval_rouge_print_samples
        self.bootstrap = int(cfg.eval_rouge_bootstrap or 0)
        self.seed = int(seed)
        self.tgt_dict = task.target_dictionary
        # held against the model's vocabulary now, not at the first validation (seqtrain-generate's check)
        check_beam_width(self.gen_args, len(self.tgt_dict), lambda dest: f"--eval-rouge-args {dest}")
        spec = getattr(task, "tokenizer_spec", None)
        self.tokenizer = build_tokenizer(spec if spec else {"kind": "none"})
        self.force_bos = self.tgt_dict.bos() if prepend_bos else None
        # the task's decoder start and end tokens (mBART's translation task: the target's [lang] for both)
        self.gen_tokens = task.generator_tokens() if hasattr(task, "generator_tokens") else {}
        self.hypotheses: list[str] = []
        self.references: list[str] = []
        self._generator: Any = None
        self._model: torch.nn.Module | None = None

    def reset(self) -> None:
        self.hypotheses, self.references = [], []

    def _decode(self, tokens: torch.Tensor) -> str:
        strip = set(self.gen_tokens.values())  # as generation strips them (runner.GenerationModel.strip)
        return self.tokenizer.decode(self.tgt_dict.string(tokens.cpu(), extra_symbols_to_ignore=strip))

    def add_batch(self, model: torch.nn.Module, sample: dict[str, Any], autocast: Any = None) -> None:
        """Generate for one (device-resident) validation batch and keep its detokenized pairs."""
        if not sample or sample.get("target") is None:
            return
        if self._generator is None or self._model is not model:
            self._generator, self._model = (
                build_generator(model, self.tgt_dict, self.gen_args, **self.gen_tokens),
                model,
            )
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), autocast() if autocast is not None else contextlib.nullcontext():
                results = generate_batch(
                    self._generator, sample, prefix_size=self.gen_args.prefix_size, force_bos=self.force_bos
                )
        finally:
            model.train(was_training)
        targets = sample["target"]
        for row, (_, hypos) in enumerate(results):
            hyp = self._decode(hypos[0]["tokens"]) if hypos else ""
            ref = self._decode(targets[row])
            if self.print_samples and row == 0:
                logger.info(f"example hypothesis: {hyp}")
                logger.info(f"example reference: {ref}")
            self.hypotheses.append(hyp)
            self.references.append(ref)

    def scores(self) -> dict[str, float]:
        """{rouge1, rouge2, rouge_l, rouge_lsum} (F1 x 100) over the pairs collected since reset(); with
        --eval-rouge-bootstrap also each one's interval as {name}_lo and {name}_hi, the interval also logged as
        the line seqtrain-score prints."""
        names = ROUGE_LOG_NAMES.values()
        if not self.hypotheses:
            empty = [f"{n}{end}" for n in names for end in ("", "_lo", "_hi")] if self.bootstrap else names
            return dict.fromkeys(empty, 0.0)
        per = example_scores(self.hypotheses, self.references)
        raw = mean_scores(per)
        out = {ROUGE_LOG_NAMES[k]: raw[k] for k in ROUGE_LOG_NAMES}
        if self.bootstrap:
            intervals = bootstrap_intervals(per, self.bootstrap, self.seed)
            logger.info(f"validation ROUGE {format_intervals(intervals, self.bootstrap, self.seed)}")
            for k, (lo, hi) in intervals.items():
                out[f"{ROUGE_LOG_NAMES[k]}_lo"], out[f"{ROUGE_LOG_NAMES[k]}_hi"] = lo, hi
        return out
