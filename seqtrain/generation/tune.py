"""`seqtrain-tune`: generation settings (beam, lenpen, min/max length, n-gram blocking) chosen on a validation
subset by a ROUGE figure, written as a --config preset and a generation_config.json, and the gain over the given
settings measured on the whole split.

Flow: seqtrain-generate's flags plus the search's (tune_flags.add_tune_args) -> load the model and the split as
seqtrain-generate does (runner, generate.open_dataset) -> a seeded sample of --tune-subset examples, batched as
seqtrain-generate batches -> the encoder runs once per batch of the sample and its outputs stay cached; every
setting tried runs only the beam search from them (SequenceGenerator.generate(encoder_out=...)) -> each setting's
hypotheses scored (seqtrain.scoring.rouge: the chosen ROUGE's mean and its bootstrap interval) -> the search:
coordinate descent by default (each setting in turn over its candidates, the others held at the best so far,
passes until one changes nothing), or the full grid (--tune-search grid) -> the best of all settings tried
(ties keep the given settings, then the first tried) -> the given and the best settings on the whole split, one
encoder pass per batch for both, with intervals and the paired bootstrap test -> --tune-output: generation.yaml
(read by seqtrain-generate / -interactive --config), generation_config.json (as seqtrain-convert --to hf writes
it) and tune.json; the table on stdout.

Why coordinate descent by default: the five settings' default candidates make a grid of 4 x 4 x 4 x 3 x 3 =
576 beam searches of the sample, coordinate descent about 18 per pass; length penalty and the length limits
interact, which the passes (until one changes nothing) follow. --tune-search grid tries every combination, the
right search for two or three settings.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np
import torch

from seqtrain.checkpoint.generation_settings import not_seqtrain, store_settings
from seqtrain.checkpoint.hf_files import GENERATION_DEFAULTS, hf_generation_config
from seqtrain.config import from_args
from seqtrain.errors import SeqtrainError, stop_on_sigterm
from seqtrain.fileio import write_files
from seqtrain.generation import generate as gen_mod
from seqtrain.generation import runner
from seqtrain.generation.output import check_file_writable, fairseq_lines
from seqtrain.generation.program import GenerateConfig
from seqtrain.generation.rerank import check_rerank, rerank
from seqtrain.generation.search import GenerationConfig, check_generation_args
from seqtrain.generation.sequence_generator import encode, generate_batch
from seqtrain.generation.tune_flags import METRICS, TUNABLE, TuneConfig
from seqtrain.logging import setup_logging
from seqtrain.scoring.rouge import bootstrap_intervals, example_scores, mean_scores, paired_bootstrap

logger = logging.getLogger("seqtrain.tune")

LABELS = {"rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "rougeL": "ROUGE-L", "rougeLsum": "ROUGE-Lsum"}
MAX_PASSES = 3  # coordinate descent: passes over the settings at most (a pass that changes nothing ends it)


@dataclass
class TuneRunConfig:
    """What seqtrain-tune reads of its flags: seqtrain-generate's settings and its own (made once, from_args)."""

    gen: GenerateConfig = field(default_factory=GenerateConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)


def space(tune: TuneConfig, search: GenerationConfig) -> dict[str, list[int | float]]:
    """Each searched setting's flag dest -> its candidates (sorted, the given value in `search` among them)."""
    grid = tune.tune_grid or {}
    extra = [n for n in grid if n not in tune.tune]
    if extra:
        raise SeqtrainError(
            f"--tune-grid names {', '.join(extra)}, which --tune does not search (--tune {','.join(tune.tune)})"
        )
    out = {}
    for name in tune.tune:
        dest, default = TUNABLE[name]
        values = list(grid.get(name, default))
        given = getattr(search, dest)
        if given not in values:
            values.append(given)
        out[dest] = sorted(values)
    return out


# ---------------------------------------------------------------------- decoding with cached encoder outputs


@dataclass
class Split:
    """Examples to decode: their ids (input order), the batches (seqtrain-generate's order and sizes), and the
    ids left out as too long (their hypothesis is empty, as seqtrain-generate leaves it)."""

    ids: list[int]
    batches: list[np.ndarray]
    skipped: set[int] = field(default_factory=set)


class Decoder:
    """Runs generation settings on the examples of a dataset, one encoder pass per batch: `cache` keeps every
    batch's collated sample and encoder output across calls (the tuning sample), otherwise each batch is
    encoded once per call of `run` for all its settings (the whole split). `encoder_calls` counts the passes."""

    def __init__(self, loaded: Any, cfg: GenerateConfig, ds: Any, refs: list[str] | None):
        self.loaded, self.cfg, self.ds, self.refs = loaded, cfg, ds, refs
        self.encoder_calls = 0
        self._cache: dict[int, tuple[dict[str, Any], Any]] = {}

    def settings_config(self, settings: dict[str, Any]) -> GenerationConfig:
        """The search settings of one trial: the given ones with `settings` changed."""
        config = dataclasses.replace(self.cfg.search, **settings)
        if (
            self.cfg.rerank.rerank
        ):  # --rerank chooses among all --beam finished hypotheses, as seqtrain-generate
            config.nbest = config.beam
        return config

    def _batch(self, i: int, batch: np.ndarray, cache: bool) -> tuple[dict[str, Any], Any]:
        if cache and i in self._cache:
            return self._cache[i]
        sample = self.ds.collater([self.ds[int(j)] for j in batch])
        sample["net_input"] = runner._to_device(sample["net_input"], self.loaded.device)
        net = sample["net_input"]
        with torch.no_grad():
            encoder_out = encode(
                self.loaded.model,
                net["src_tokens"],
                net["src_lengths"],
                self.cfg.search.packed_encoder,
            )
        self.encoder_calls += 1
        if cache:
            self._cache[i] = (sample, encoder_out)
        return sample, encoder_out

    def run(
        self, split: Split, all_settings: list[dict[str, Any]], cache: bool = False
    ) -> list[tuple[list[str], list[str]]]:
        """(hypotheses, references) in split.ids' order, for each of `all_settings`."""
        loaded, cfg, rr = self.loaded, self.cfg, self.cfg.rerank
        generators = [runner.make_generator(loaded, self.settings_config(s)) for s in all_settings]
        lenpen = 1.0 if rr.rerank_lenpen is None else rr.rerank_lenpen
        hyps: list[dict[int, str]] = [{} for _ in all_settings]
        refs: dict[int, str] = {}
        for i, batch in enumerate(split.batches):
            sample, encoder_out = self._batch(i, batch, cache)
            for k, gen in enumerate(generators):
                with torch.no_grad():
                    results = generate_batch(
                        gen, sample, cfg.search.prefix_size, loaded.force_bos, encoder_out=encoder_out
                    )
                for row, (sid, hypos) in enumerate(results):
                    if rr.rerank:
                        hypos = rerank(hypos, rr.rerank, lambda t: runner.decode(loaded, t), lenpen)
                    post = cfg.inputs.post_process
                    _, texts, target, _ = fairseq_lines(loaded, sid, sample, row, hypos, 1, post)
                    hyps[k][sid] = texts[0] if texts else ""
                    if target is not None:
                        refs[sid] = target
        if self.refs is not None:
            ref_list = [self.refs[i] for i in split.ids]
        elif len(refs) == len(split.ids) - len(split.skipped):
            ref_list = [refs.get(i, "") for i in split.ids]
        else:
            raise SeqtrainError(
                "no references to score against: the split has no target side (with --input give --reference FILE)"
            )
        return [([h.get(i, "") for i in split.ids], ref_list) for h in hyps]


# ---------------------------------------------------------------------- scoring and the search


@dataclass
class Scored:
    settings: dict[str, Any]
    rouge: dict[str, float]  # mean F1 x 100 per ROUGE type, and n
    interval: dict[str, tuple[float, float]]
    per: dict[str, list[float]]  # per-example scores (for the paired test)

    def value(self, metric: str) -> float:
        return self.rouge[metric]


def score(hyps: list[str], refs: list[str], n_resamples: int, seed: int, settings: dict[str, Any]) -> Scored:
    per = example_scores(hyps, refs)
    return Scored(dict(settings), mean_scores(per), bootstrap_intervals(per, n_resamples, seed), per)


def _key(settings: dict[str, Any]) -> tuple:
    return tuple(sorted(settings.items()))


def valid_combination(cfg: GenerateConfig, settings: dict[str, Any], max_tgt: int, vocab: int) -> str | None:
    """Why a combination (cfg's search settings with `settings` changed) cannot run (seqtrain-generate would
    refuse it, also for a beam wider than the model's `vocab` allows), or None."""
    a = dataclasses.replace(cfg.search, **settings)
    try:
        check_generation_args(a, rerank=bool(cfg.rerank.rerank))
        runner.check_beam_width(a, vocab)
        check_rerank(cfg.rerank.rerank, a.beam)
    except SeqtrainError as e:
        return str(e)
    if a.min_len > max_tgt - 1:
        return f"--min-len {a.min_len} is above the model's maximum target length {max_tgt - 1}"
    return None


def search(
    candidates: dict[str, list[int | float]],
    given: dict[str, Any],
    evaluate: Callable[[dict[str, Any]], float | None],
    strategy: str,
) -> dict[str, Any]:
    """The best settings found: `evaluate` scores a combination (None: it cannot run) and keeps every result;
    the given settings are tried first. grid: every combination; coordinate: one setting at a time over its
    candidates, the others at the best so far, until a pass changes nothing (MAX_PASSES at most). A setting
    replaces the best only when it scores strictly higher, so ties keep the given settings, then the first
    tried: the result is the argmax of everything evaluated."""
    best, best_score = dict(given), evaluate(given)
    if best_score is None:
        raise SeqtrainError("the given generation settings cannot run; see the line above")

    def consider(s: dict[str, Any]) -> None:
        nonlocal best, best_score
        v = evaluate(s)
        if v is not None and v > best_score:
            best, best_score = dict(s), v

    if strategy == "grid":
        dests = list(candidates)
        for values in itertools.product(*(candidates[d] for d in dests)):
            consider({**given, **dict(zip(dests, values))})
        return best
    for _ in range(MAX_PASSES):
        start = dict(best)
        for dest, values in candidates.items():
            current = dict(best)
            for v in values:
                consider({**current, dest: v})
        if best == start:
            break
    return best


# ---------------------------------------------------------------------- the program


def _sample(ids: list[int], n: int, seed: int) -> list[int]:
    """A seeded sample of n ids (all when there are no more), in input order."""
    if n >= len(ids):
        return list(ids)
    pick = np.random.default_rng(seed).choice(len(ids), size=n, replace=False)
    return [ids[i] for i in sorted(pick.tolist())]


def _fmt(s: Scored, metric: str) -> str:
    lo, hi = s.interval[metric]
    return f"{s.rouge[metric]:.2f} [{lo:.2f}, {hi:.2f}]"


def _describe(settings: dict[str, Any]) -> str:
    return ", ".join(f"{d.replace('_', '-')} {v}" for d, v in settings.items())


def tune(args: argparse.Namespace, out: TextIO | None = None) -> dict[str, Any]:
    """Search the settings, write --tune-output's files and print the table; returns tune.json's content."""
    run = from_args(TuneRunConfig, args)  # the program's one read of its flags
    cfg, tcfg = run.gen, run.tune
    out = out or sys.stdout
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise SeqtrainError("seqtrain-tune runs in one process; start it without torchrun")
    if cfg.inputs.input is not None and not cfg.inputs.reference:
        raise SeqtrainError(
            "--input: give --reference FILE too, the summaries each setting is scored against"
        )
    # --tune-grid against --tune, before the model loads (again after: a model's defaults)
    space(tcfg, cfg.search)
    cfg.inputs.scoring, cfg.outputs.output, cfg.load.results_path = "none", None, None
    cfg.outputs.output_format = "text"
    files = output_files(tcfg.tune_output)
    # every output checked now, not after the search: not one of the inputs (seqtrain.fileio's rule), not a
    # folder, writable; the folder itself is made only when the files are written
    gen_mod.check_settings(cfg, [("--tune-output", path) for path in files.values()])
    for path in files.values():
        check_file_writable(path, "--tune-output", missing_ok=True)
    if tcfg.tune_checkpoint:  # (it may be --path itself: replaced atomically)
        check_file_writable(tcfg.tune_checkpoint, "--tune-checkpoint", missing_ok=True)
    handler = setup_logging(sys.stderr, log_file=cfg.log.log_file)
    try:
        with stop_on_sigterm(f"nothing was written to --tune-output {tcfg.tune_output}"):
            return _tune(cfg, tcfg, out)
    finally:
        if handler is not None:
            logging.getLogger().removeHandler(handler)
            handler.close()


def _tune(cfg: GenerateConfig, tcfg: TuneConfig, out: TextIO) -> dict[str, Any]:
    # takes the defaults a Hugging Face folder ships, or a seqtrain checkpoint stores, for settings not given
    loaded = gen_mod.load_generation_model(cfg)
    one = loaded.lm.format == "seqtrain" and len(runner.split_paths(cfg.load.path)) == 1  # not an ensemble
    if tcfg.tune_checkpoint and not one:
        raise SeqtrainError(f"--tune-checkpoint: --path {not_seqtrain(cfg.load.path)}")
    search_cfg, seed = cfg.search, cfg.device.seed
    check_generation_args(search_cfg, rerank=bool(cfg.rerank.rerank))
    candidates = space(tcfg, search_cfg)
    max_src, max_tgt = loaded.model.max_positions()
    max_src = min(max_src, cfg.inputs.max_source_positions)
    max_tgt = min(max_tgt, cfg.inputs.max_target_positions)
    vocab = len(loaded.lm.tgt_dict)
    given = {d: getattr(search_cfg, d) for d in (TUNABLE[n][0] for n in TUNABLE)}
    why = valid_combination(cfg, given, max_tgt, vocab)
    if why:
        raise SeqtrainError(why)
    ds, raw_sizes, refs, _ = gen_mod.open_dataset(cfg, loaded)
    every = list(range(len(ds)))
    skipped: set[int] = set()
    too_long = [i for i in every if raw_sizes[i] > max_src]
    if too_long and cfg.dataset.skip_invalid_size_inputs_valid_test and not cfg.dataset.truncate_source:
        skipped = set(too_long)  # as seqtrain-generate: left out, their hypotheses empty
        logger.warning(f"skipped {len(too_long)} of {len(ds)} sources longer than {max_src} tokens")

    def make_split(ids: list[int]) -> Split:
        keep = np.array([i for i in ids if i not in skipped], dtype=np.int64)
        order = runner.order_examples(ds, keep, seed)
        batches = runner.plan_batches(ds, order, cfg.dataset.max_tokens, cfg.dataset.batch_size)
        return Split(ids, batches, skipped & set(ids))

    subset = make_split(_sample(every, tcfg.tune_subset, seed))
    full = make_split(every)
    decoder = Decoder(loaded, cfg, ds, refs)
    metric = METRICS[tcfg.tune_metric]
    split_name = "input" if cfg.inputs.input is not None else cfg.dataset.gen_subset
    n_sub = len(subset.ids)
    logger.info(
        f"searching {', '.join(f'{d.replace(chr(95), chr(45))} {v}' for d, v in candidates.items())} "
        f"({tcfg.tune_search}) on {n_sub} of {len(every)} examples of {split_name} by {LABELS[metric]}"
    )
    trials: list[Scored] = []
    skipped_combos: list[dict[str, Any]] = []
    seen: dict[tuple, float | None] = {}
    n_boot = tcfg.tune_bootstrap

    def evaluate(settings: dict[str, Any]) -> float | None:
        k = _key(settings)
        if k in seen:
            return seen[k]
        reason = valid_combination(cfg, settings, max_tgt, vocab)
        if reason:
            skipped_combos.append({"settings": settings, "reason": reason})
            logger.info(f"not tried: {_describe(settings)} ({reason})")
            seen[k] = None
            return None
        ((hyps, ref_list),) = decoder.run(subset, [settings], cache=True)
        s = score(hyps, ref_list, n_boot, seed, settings)
        trials.append(s)
        seen[k] = s.value(metric)
        logger.info(f"trial {len(trials)}: {_describe(settings)}: {LABELS[metric]} {_fmt(s, metric)}")
        return seen[k]

    best = search(candidates, given, evaluate, tcfg.tune_search)
    sub_calls = decoder.encoder_calls
    # the given and the best settings on the whole split: one encoder pass per batch for both (none when the
    # sample is the whole split: the same batches, already cached)
    runs = [given] if best == given else [given, best]
    decoded = decoder.run(full, runs, cache=subset.ids == full.ids)
    full_scores = [score(h, r, n_boot, seed, s) for (h, r), s in zip(decoded, runs)]
    base_full, best_full = full_scores[0], full_scores[-1]

    test = paired_bootstrap(best_full.per, base_full.per, n_boot, seed)
    result = {
        "metric": metric,
        "search": tcfg.tune_search,
        "split": split_name,
        "candidates": {d.replace("_", "-"): v for d, v in candidates.items()},
        "subset": {"n": n_sub, "seed": seed, "ids": subset.ids},
        "trials": [
            {
                "settings": t.settings,
                "rouge": t.rouge,
                "interval": {k: list(v) for k, v in t.interval.items()},
            }
            for t in trials
        ],
        "not_tried": skipped_combos,
        "given": given,
        "best": best,
        "full": {
            "n": len(full.ids),
            "given": {
                "rouge": base_full.rouge,
                "interval": {k: list(v) for k, v in base_full.interval.items()},
            },
            "best": {
                "rouge": best_full.rouge,
                "interval": {k: list(v) for k, v in best_full.interval.items()},
            },
            "gain": {k: best_full.rouge[k] - base_full.rouge[k] for k in LABELS},
            "paired_test": test,
        },
        "bootstrap": n_boot,
        "encoder_passes": {"subset": sub_calls, "full": decoder.encoder_calls - sub_calls},
        "files": {},
    }
    if tcfg.tune_checkpoint:  # first: tune.json names it
        result["files"]["checkpoint"] = store_choice(cfg, tcfg, best, result)
    result["files"] = write_outputs(cfg, tcfg.tune_output, loaded, best, result)
    out.write(table(result, n_sub))
    out.flush()
    return result


def preset_text(cfg: GenerateConfig, best: dict[str, Any], result: dict[str, Any]) -> str:
    """generation.yaml: the best settings as `--config` keys, with a header saying how they were chosen."""
    metric = LABELS[result["metric"]]
    full = result["full"]
    lines = [
        "# Generation settings chosen by seqtrain-tune on "
        f"{result['subset']['n']} examples of {result['split']} (seed {result['subset']['seed']}) by {metric}",
        f"# ({result['search']} search, {len(result['trials'])} settings tried). On all {full['n']} examples: "
        f"{metric} {full['best']['rouge'][result['metric']]:.2f}, given settings "
        f"{full['given']['rouge'][result['metric']]:.2f}.",
        f"#   seqtrain-generate DATA --path {cfg.load.path} --config THIS_FILE",
        "# Other generation flags of the tuning command (e.g. --rerank) are not in this file: give them again.",
    ]
    for dest, value in best.items():
        lines.append(
            f"{dest.replace('_', '-')}: {float(value)!r}"
            if isinstance(value, float)
            else f"{dest.replace('_', '-')}: {value}"
        )
    if cfg.search.max_len_a:
        lines.append(f"max-len-a: {float(cfg.search.max_len_a)!r}")
    return "\n".join(lines) + "\n"


def output_files(folder: str) -> dict[str, str]:
    """--tune-output's three files: the preset, the Hugging Face generation_config.json and tune.json."""
    names = (("preset", "generation.yaml"), ("hf", "generation_config.json"), ("json", "tune.json"))
    return {k: os.path.join(folder, n) for k, n in names}


def write_outputs(
    cfg: GenerateConfig, folder: str, loaded: Any, best: dict[str, Any], result: dict[str, Any]
) -> dict[str, str]:
    """--tune-output's three files (in `folder`); returns their paths."""
    paths = output_files(folder)
    settings = {**GENERATION_DEFAULTS, "max_len_a": cfg.search.max_len_a, **best}
    if settings["max_len_a"]:
        logger.warning(
            f"max_len_a {settings['max_len_a']} has no transformers equivalent: generation_config.json's "
            "max_length comes from max_len_b alone"
        )
    gen = hf_generation_config(loaded.lm.args, loaded.lm.src_dict, settings)
    paths = {**paths, **result["files"]}  # and the --tune-checkpoint written before
    result["files"] = paths
    write_files(  # all or none, as seqtrain-generate's result files
        {
            paths["preset"]: preset_text(cfg, best, result),
            paths["hf"]: json.dumps(gen, indent=2, sort_keys=True) + "\n",
            paths["json"]: json.dumps(result, indent=2, sort_keys=True, default=_json_default) + "\n",
        }
    )
    return paths


def store_choice(cfg: GenerateConfig, tcfg: TuneConfig, best: dict[str, Any], result: dict[str, Any]) -> str:
    """--tune-checkpoint: the --path checkpoint with the settings of the choice stored in it; returns the path."""
    json_path = os.path.join(tcfg.tune_output, "tune.json")
    chosen = f"seqtrain-tune ({LABELS[result['metric']]} on {result['subset']['n']} of {result['split']}; {json_path})"
    searched, out = {TUNABLE[n][0] for n in tcfg.tune}, tcfg.tune_checkpoint
    stored = store_settings(
        cfg.load.path, out, best, searched, chosen, "the seqtrain-tune command", cfg.load.unsafe_load
    )
    logger.info(f"{out}: the chosen settings stored in it: {stored.describe()}")
    return out


def _json_default(x: Any) -> Any:
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    raise TypeError(type(x))


def table(result: dict[str, Any], n_sub: int) -> str:
    """The report on stdout: the settings (given, best) and each ROUGE on the whole split with its 95%
    interval, the gain and the paired test's p-value."""
    given, best, full = result["given"], result["best"], result["full"]
    rows = [("setting", "given", "best")]
    for dest in given:
        rows.append((dest.replace("_", "-"), str(given[dest]), str(best[dest])))
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:>{w[2]}}" for r in rows]
    lines.append("")
    head = (
        f"{result['split']}, all {full['n']} examples (searched on {n_sub}, by {LABELS[result['metric']]}; "
        f"95% bootstrap intervals, {result['bootstrap']} resamples)"
    )
    lines.append(head)
    rows2 = [("ROUGE", "given", "best", "gain", "p")]
    for k, label in LABELS.items():
        g, b = full["given"], full["best"]
        rows2.append(
            (
                label,
                f"{g['rouge'][k]:.2f} [{g['interval'][k][0]:.2f}, {g['interval'][k][1]:.2f}]",
                f"{b['rouge'][k]:.2f} [{b['interval'][k][0]:.2f}, {b['interval'][k][1]:.2f}]",
                f"{full['gain'][k]:+.2f}",
                f"{full['paired_test'][k]['p_value']:.3f}",
            )
        )
    w = [max(len(r[i]) for r in rows2) for i in range(5)]
    lines += ["  ".join(f"{c:<{w[i]}}" if i == 0 else f"{c:>{w[i]}}" for i, c in enumerate(r)) for r in rows2]
    lines.append(f"wrote {', '.join(result['files'].values())}")
    return "\n".join(lines) + "\n"
