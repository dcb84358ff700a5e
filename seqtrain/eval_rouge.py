"""Validation with ROUGE (--eval-rouge): generate summaries for the validation batches and score them.

fairseq's translation task does this for BLEU (--eval-bleu, --eval-bleu-args, --eval-bleu-print-samples); this is
the summarization counterpart. Generation settings come from --eval-rouge-args, either JSON with generation flag
names as keys ('{"beam": 4, "max_len_b": 30, "lenpen": 1.0, "no_repeat_ngram_size": 3}') or the flags themselves
('--beam 4 --max-len-b 30'); unset ones keep seqtrain-generate's defaults. Hypotheses and references are
detokenized with the data-bin's tokenizer and scored with seqtrain.scoring.rouge; the scores (F1 x 100) are
logged as rouge1, rouge2, rouge_l, rouge_lsum, so `--best-checkpoint-metric rouge_l
--maximize-best-checkpoint-metric` keeps the checkpoint that summarizes best.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shlex
from typing import Any

import torch

from seqtrain.errors import SeqtrainError

logger = logging.getLogger(__name__)

# seqtrain.scoring.rouge's keys -> the names logged (fairseq-style lower case with underscores)
ROUGE_LOG_NAMES = {"rouge1": "rouge1", "rouge2": "rouge2", "rougeL": "rouge_l", "rougeLsum": "rouge_lsum"}


def add_args(parser: argparse.ArgumentParser, group: Any = None) -> Any:
    """The --eval-rouge flags, into `group` (seqtrain-train: the validation flags' group) or a new group."""
    group = group if group is not None else parser.add_argument_group("Validation with generation (ROUGE)")
    group.add_argument(
        "--eval-rouge",
        action="store_true",
        help="generate for the validation subsets and log ROUGE (rouge1, rouge2, rouge_l, rouge_lsum, "
        "F1 x 100); pick checkpoints with --best-checkpoint-metric rouge_l "
        "--maximize-best-checkpoint-metric",
    )
    group.add_argument(
        "--eval-rouge-args",
        default="{}",
        metavar="JSON_OR_FLAGS",
        help='generation settings for --eval-rouge: JSON (\'{"beam": 4, "max_len_b": 30}\') or '
        "seqtrain-generate flags ('--beam 4 --max-len-b 30') (default: generate's defaults)",
    )
    group.add_argument(
        "--eval-rouge-print-samples",
        action="store_true",
        help="log the first hypothesis and reference of every validation batch",
    )
    return group


def _generation_parser() -> argparse.ArgumentParser:
    from seqtrain.generation.options import add_generation_args

    parser = argparse.ArgumentParser(prog="--eval-rouge-args", add_help=False, allow_abbrev=False)
    add_generation_args(parser)
    return parser


def generation_args(text: str, seed: int = 1) -> argparse.Namespace:
    """The generation settings --eval-rouge-args describes (JSON object or flags), on top of the defaults."""
    parser = _generation_parser()
    text = (text or "").strip()
    if text.startswith("{") or not text:
        try:
            values = json.loads(text or "{}")
        except ValueError as e:
            raise SeqtrainError(f"--eval-rouge-args: not valid JSON ({e})") from None
        if not isinstance(values, dict):
            raise SeqtrainError("--eval-rouge-args: expected a JSON object")
        args = parser.parse_args([])
        known = vars(args)
        for key, value in values.items():
            dest = str(key).lstrip("-").replace("-", "_")
            if dest not in known:
                raise SeqtrainError(
                    f"--eval-rouge-args: unknown generation setting {key!r}; choose from: "
                    f"{', '.join(sorted(known))}"
                )
            default = known[dest]
            if isinstance(default, bool) and not isinstance(value, bool):
                raise SeqtrainError(f"--eval-rouge-args: {key} must be true or false, got {value!r}")
            if isinstance(default, (int, float)) and not isinstance(default, bool):
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise SeqtrainError(f"--eval-rouge-args: {key} must be a number, got {value!r}")
                value = type(default)(value)
            setattr(args, dest, value)
    else:
        try:
            args, rest = parser.parse_known_args(shlex.split(text))
        except SystemExit:  # argparse already printed why
            raise SeqtrainError(f"--eval-rouge-args: cannot parse {text!r}") from None
        if rest:
            raise SeqtrainError(f"--eval-rouge-args: unknown generation flags {' '.join(rest)}")
    args.seed = seed
    from seqtrain.generation.options import check_generation_args

    try:
        check_generation_args(args)
    except SeqtrainError as e:
        raise SeqtrainError(f"--eval-rouge-args: {e}") from None
    return args


class RougeValidator:
    """Collects (hypothesis, reference) pairs batch by batch during one validation, then scores them."""

    def __init__(self, args: argparse.Namespace, task: Any):
        from seqtrain.data.tokenizer import build_tokenizer

        self.gen_args = generation_args(getattr(args, "eval_rouge_args", "{}"), getattr(args, "seed", 1))
        self.print_samples = bool(getattr(args, "eval_rouge_print_samples", False))
        self.tgt_dict = task.target_dictionary
        spec = getattr(task, "tokenizer_spec", None)
        self.tokenizer = build_tokenizer(spec if spec else {"kind": "none"})
        self.force_bos = self.tgt_dict.bos() if getattr(args, "prepend_bos", False) else None
        self.hypotheses: list[str] = []
        self.references: list[str] = []
        self._generator: Any = None
        self._model: torch.nn.Module | None = None

    def reset(self) -> None:
        self.hypotheses, self.references = [], []

    def _decode(self, tokens: torch.Tensor) -> str:
        return self.tokenizer.decode(self.tgt_dict.string(tokens.cpu()))

    def add_batch(self, model: torch.nn.Module, sample: dict[str, Any], autocast: Any = None) -> None:
        """Generate for one (device-resident) validation batch and keep its detokenized pairs."""
        from seqtrain.generation.sequence_generator import build_generator, generate_batch

        if not sample or sample.get("target") is None:
            return
        if self._generator is None or self._model is not model:
            self._generator, self._model = build_generator(model, self.tgt_dict, self.gen_args), model
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
        """{rouge1, rouge2, rouge_l, rouge_lsum} (F1 x 100) over the pairs collected since reset()."""
        from seqtrain.scoring.rouge import score_pairs

        if not self.hypotheses:
            return {name: 0.0 for name in ROUGE_LOG_NAMES.values()}
        raw = score_pairs(self.hypotheses, self.references)
        return {ROUGE_LOG_NAMES[k]: raw[k] for k in ROUGE_LOG_NAMES}
