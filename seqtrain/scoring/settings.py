"""The settings of ROUGE scoring: seqtrain-train's --eval-rouge flags (validation with generation, run by
seqtrain.train.rouge_validation; the generation settings --eval-rouge-args describes are read by
seqtrain.generation.options.generation_args) and seqtrain-score's flags (seqtrain.scoring.rouge.score_files)."""

from __future__ import annotations

from seqtrain.config import setting, settings
from seqtrain.flag_bounds import Bounds


@settings
class EvalRougeConfig:
    """Validation with generation (ROUGE)"""

    eval_rouge: bool = setting(
        False,
        "generate for the validation subsets and log ROUGE (rouge1, rouge2, rouge_l, rouge_lsum, "
        "F1 x 100); pick checkpoints with --best-checkpoint-metric rouge_l "
        "--maximize-best-checkpoint-metric",
        action="store_true",
    )
    eval_rouge_args: str = setting(
        "{}",
        'generation settings for --eval-rouge: JSON (\'{"beam": 4, "max_len_b": 30}\') or '
        "seqtrain-generate flags ('--beam 4 --max-len-b 30') (default: generate's defaults)",
        metavar="JSON_OR_FLAGS",
    )
    eval_rouge_bootstrap: int = setting(
        0,
        "also log 95%% percentile-bootstrap confidence intervals of each ROUGE figure from N resamples of "
        "the validation examples, seeded with --seed (rouge_l_lo, rouge_l_hi, ...; the figures seqtrain-score "
        "--bootstrap N --seed S gives on the same hypotheses; 0: off)",
        type=int,
        metavar="N",
        bounds=Bounds(0, 1_000_000),
    )
    eval_rouge_print_samples: bool = setting(
        False, "log the first hypothesis and reference of every validation batch", action="store_true"
    )


@settings
class ScoreConfig:
    """seqtrain-score"""

    sys: str = setting(None, "hypotheses, one per line", required=True, metavar="HYP")
    ref: str = setting(None, "references, one per line, aligned with --sys", required=True, metavar="REF")
    json: str | None = setting(None, "also write the scores as JSON to OUT", metavar="OUT")
    bootstrap: int = setting(
        0,
        "also print 95%% percentile-bootstrap confidence intervals of each ROUGE figure from N resamples "
        "of the examples (0: off; 1000 is usual)",
        type=int,
        metavar="N",
        bounds=Bounds(0, 1_000_000),
    )
    compare: str | None = setting(
        None,
        "paired bootstrap test of --sys against the hypotheses OTHER on the same --ref: the fraction of "
        "resamples where --sys scores higher and a two-sided p-value (N from --bootstrap, else 1000)",
        metavar="OTHER",
    )
    seed: int = setting(1, "seed of the resampling (default: 1)", type=int, metavar="N")
    debug: bool = setting(False, "show tracebacks on errors", action="store_true")
