"""seqtrain-eval: one report of a system on a split, as JSON (report()) and as an HTML page (seqtrain.evaluation.page).

Everything is computed on the same examples: the system's ROUGE with bootstrap intervals, the lead-k baselines
and the extractive oracle (seqtrain.evaluation.analyses), length statistics and ROUGE by source-length bucket,
the faithfulness proxy for the system and, as its base rate, for the references, the share of each reference past
the source truncation limit, train/split near-duplicates, the worst and best examples, the validation curves of a
training log, and with --compare the paired bootstrap test and per-bucket differences. All inputs are read and
checked before anything is scored; the outputs are written whole or not at all.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from seqtrain.checkpoint.fairseq import stored_conventions
from seqtrain.config import add_settings, flag_names, from_args, int_list, setting, settings
from seqtrain.errors import SeqtrainError, stop_on_sigterm
from seqtrain.evaluation import analyses, page
from seqtrain.fileio import check_outputs_apart, write_files
from seqtrain.flag_bounds import POSITIVE_INT, Bounds
from seqtrain.flags.parsers import ArgumentParser, add_negations
from seqtrain.generation import runner
from seqtrain.scoring.rouge import (
    ROUGE_TYPES,
    _read_lines,
    bootstrap_intervals,
    check_lengths,
    check_some_text,
    example_scores,
    format_comparison,
    format_intervals,
    format_summary,
    mean_scores,
    paired_bootstrap,
)

SORT_KEY = "rougeLsum"  # worst / best examples: by ROUGE-Lsum, ties by the lower example id


@settings
class EvalInputs:
    """inputs"""

    hyps: str = setting(
        None,
        "the hypotheses: a file of lines, or a seqtrain-generate --results-path folder (its "
        "hypotheses-SPLIT.txt)",
        required=True,
        metavar="PATH",
    )
    source: str = setting(None, "the split's sources, one per line", required=True, metavar="FILE")
    reference: str = setting(None, "the split's references, one per line", required=True, metavar="FILE")
    split: str | None = setting(
        None,
        "with a --results-path folder: which hypotheses-NAME.txt (default: the only one there)",
        metavar="NAME",
    )
    train_source: str | None = setting(
        None,
        "train's sources, one per line: count sources of the split that train holds (exact and high-overlap)",
        metavar="FILE",
    )
    train_log: str | None = setting(
        None,
        "a training log (--log-format json, or a --jsonl-log file): plot its validation curves",
        metavar="FILE",
    )
    compare: str | None = setting(
        None,
        "a second system's hypotheses (file or folder): the paired bootstrap test and per-bucket differences",
        metavar="OTHER",
    )
    path: str | None = setting(
        None,
        "the model that made the hypotheses (any checkpoint seqtrain-generate --path reads): the truncation "
        "section then counts each source in its tokenizer's pieces against its max_source_positions, instead "
        "of --source-limit words",
        metavar="CHECKPOINT",
    )


@settings
class EvalReport:
    """report"""

    json: str | None = setting(None, "write the report as JSON to OUT", metavar="OUT")
    html: str | None = setting(None, "write the report as one self-contained HTML page to OUT", metavar="OUT")
    title: str | None = setting(None, "the page's title (default: the hypotheses' path)", metavar="TEXT")
    bootstrap: int = setting(
        1000,
        "resamples of the bootstrap intervals and test",
        type=int,
        metavar="N",
        bounds=Bounds(0, 1_000_000),
    )
    seed: int = setting(1, "seed of the resampling (default: 1)", type=int, metavar="N")
    lead: list[int] = setting(
        [1, 2, 3], "lead-k baselines: first k sentences", type=int_list, metavar="K,...", bounds=POSITIVE_INT
    )
    buckets: int = setting(4, "source-length buckets (quantiles)", type=int, metavar="N", bounds=POSITIVE_INT)
    source_limit: int = setting(
        1024,
        "the source truncation limit in words (ROUGE's tokens): how much of each reference lies past it "
        "(a model's --max-source-positions counts subword pieces; 1024 pieces are roughly 750 words)",
        type=int,
        metavar="WORDS",
        bounds=POSITIVE_INT,
    )
    dup_threshold: float = setting(
        0.8,
        "a source is a high-overlap duplicate when this share of its word 5-grams is in one train source",
        type=float,
        metavar="F",
        bounds=Bounds(0, 1, lo_open=True),
    )
    examples: int = setting(5, "the N worst and best examples shown", type=int, metavar="N")
    debug: bool = setting(False, "show tracebacks on errors", action="store_true")


@dataclass
class EvalConfig:
    """What seqtrain-eval reads of its flags: made once from the parsed flags at its front end (evaluate), each
    group as declared above; the ranges are the fields' own (bounds=), checked as the flags are parsed."""

    inputs: EvalInputs = field(default_factory=EvalInputs)
    report: EvalReport = field(default_factory=EvalReport)


def get_eval_parser() -> argparse.ArgumentParser:
    """seqtrain-eval's parser, composed from EvalInputs and EvalReport."""
    p = ArgumentParser(
        prog="seqtrain-eval",
        description="One report of a summarization system on a split, as JSON and a self-contained HTML page: "
        "ROUGE with bootstrap intervals beside lead-k and an extractive oracle, lengths, ROUGE by source length, "
        "a faithfulness proxy, truncation, train/split near-duplicates, the worst and best examples, plots.",
    )
    add_settings(p, EvalInputs)
    add_settings(p, EvalReport)
    return add_negations(p)


def hypotheses_file(path: str, split: str | None, flag: str) -> str:
    """The hypotheses file `path` names: itself, or in a seqtrain-generate --results-path folder its
    hypotheses-SPLIT.txt (SPLIT from --split, else the only one there)."""
    if os.path.isdir(path):
        if split:
            file = os.path.join(path, f"hypotheses-{split}.txt")
            if not os.path.isfile(file):
                raise SeqtrainError(f"{flag} {path}: no hypotheses-{split}.txt in the folder")
        else:
            found = sorted(glob.glob(os.path.join(path, "hypotheses-*.txt")))
            if len(found) != 1:
                names = ", ".join(os.path.basename(f) for f in found) or "no hypotheses-SPLIT.txt"
                raise SeqtrainError(f"{flag} {path}: {names}; choose the split with --split")
            file = found[0]
    elif os.path.exists(path):
        file = path
    else:
        raise SeqtrainError(f"{flag} {path}: no such file or folder")
    return file


def read_hypotheses(path: str, split: str | None, flag: str) -> tuple[str, list[str]]:
    """(the file read, its lines); `path` as hypotheses_file takes it."""
    file = hypotheses_file(path, split, flag)
    return file, _read_lines(file)


def shown(text: str) -> str:
    """`text` as valid UTF-8 for the report: a file name or --title whose bytes are not UTF-8 reaches Python as
    surrogate escapes, which no UTF-8 file can hold (a UnicodeEncodeError at the write); they are shown as
    U+FFFD."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a surrogate no byte escapes to
        return text.encode("utf-8", "replace").decode("utf-8")


def _check_count(name: str, lines: list[str], ref_name: str, refs: list[str], what: str) -> None:
    if len(lines) != len(refs):
        raise SeqtrainError(
            f"{name}: {len(lines)} {what} but {ref_name} has {len(refs)} references (one line each, same order)"
        )


def _means_ci(per: dict[str, list[float]], n_boot: int, seed: int) -> dict[str, Any]:
    out: dict[str, Any] = mean_scores(per)
    if n_boot:
        out["ci"] = {k: list(v) for k, v in bootstrap_intervals(per, n_boot, seed).items()}
    return out


def _subset(per: dict[str, list[float]], ids: list[int]) -> dict[str, float]:
    return {k: float(np.mean([per[k][i] for i in ids])) for k in ROUGE_TYPES}


def report(cfg: EvalConfig) -> dict[str, Any]:
    """The report's figures (what --json holds) from seqtrain-eval's settings."""
    inputs, opts = cfg.inputs, cfg.report
    hyp_file, hyps = read_hypotheses(inputs.hyps, inputs.split, "--hyps")
    sources, refs = _read_lines(inputs.source), _read_lines(inputs.reference)
    if not refs:
        raise SeqtrainError(f"{inputs.reference}: no references (the file is empty)")
    check_some_text(refs, inputs.reference, "references")
    check_some_text(sources, inputs.source, "sources")
    _check_count(inputs.source, sources, inputs.reference, refs, "sources")
    _check_count(hyp_file, hyps, inputs.reference, refs, "hypotheses")
    check_lengths(hyps, hyp_file)
    check_lengths(refs, inputs.reference)
    other = None
    if inputs.compare:
        other_file, other_hyps = read_hypotheses(inputs.compare, inputs.split, "--compare")
        _check_count(other_file, other_hyps, inputs.reference, refs, "hypotheses")
        check_lengths(other_hyps, other_file)
        other = (other_file, other_hyps)
    train = _read_lines(inputs.train_source) if inputs.train_source else None
    curves = analyses.validation_curves(inputs.train_log) if inputs.train_log else None

    n, n_boot, seed = len(refs), opts.bootstrap, opts.seed
    per = example_scores(hyps, refs)
    out: dict[str, Any] = {
        "format": "seqtrain-eval",
        "version": 1,
        "hypotheses": shown(hyp_file),
        "source": shown(inputs.source),
        "reference": shown(inputs.reference),
        "n": n,
        "bootstrap": n_boot,
        "seed": seed,
        "rouge": _means_ci(per, n_boot, seed),
    }

    baselines: dict[str, Any] = {}
    for k in opts.lead:
        lead_per = example_scores([analyses.lead(s, k) for s in sources], refs)
        baselines[f"lead-{k}"] = mean_scores(lead_per)
    picks = [analyses.oracle(s, r) for s, r in zip(sources, refs)]
    oracle_per = example_scores([text for text, _ in picks], refs)
    baselines["oracle"] = {
        **mean_scores(oracle_per),
        "mean_sentences": float(np.mean([len(ids) for _, ids in picks])),
    }
    out["baselines"] = baselines

    src_len = [len(analyses.words(s)) for s in sources]
    hyp_len = [len(analyses.words(h)) for h in hyps]
    ref_len = [len(analyses.words(r)) for r in refs]
    out["lengths"] = {
        "unit": "words (ROUGE's tokens)",
        "hypothesis": analyses.length_stats(hyp_len),
        "reference": analyses.length_stats(ref_len),
        "source": analyses.length_stats(src_len),
        "hypothesis_over_reference": float(np.mean(hyp_len) / max(np.mean(ref_len), 1e-9)),
    }

    edges = analyses.bucket_edges(src_len, opts.buckets)
    labels = analyses.bucket_labels(edges, src_len)
    members: list[list[int]] = [[] for _ in labels]
    for i, length in enumerate(src_len):
        members[analyses.bucket_of(length, edges)].append(i)
    buckets = []
    for label, ids in zip(labels, members):
        if ids:
            buckets.append({"source_words": label, "n": len(ids), "ids": ids, "rouge": _subset(per, ids)})
    out["buckets"] = buckets

    hyp_faith = [analyses.unsupported(h, s) for h, s in zip(hyps, sources)]
    ref_faith = [analyses.unsupported(r, s) for r, s in zip(refs, sources)]
    out["faithfulness"] = {
        "hypothesis": analyses.faithfulness_summary(hyp_faith),
        "reference": analyses.faithfulness_summary(ref_faith),
    }

    out["truncation"], past = truncation(cfg, sources, refs, src_len)

    if train is not None:
        out["duplicates"] = {
            "train_source": shown(inputs.train_source),
            **analyses.duplicates(train, sources, opts.dup_threshold),
        }
    if curves is not None:
        out["validation_curves"] = {"train_log": shown(inputs.train_log), **curves}

    examples = [
        {
            "id": i,
            "source": sources[i],
            "reference": refs[i],
            "hypothesis": hyps[i],
            "rouge": {k: per[k][i] for k in ROUGE_TYPES},
            "hypothesis_words": hyp_len[i],
            "reference_words": ref_len[i],
            "source_words": src_len[i],
            "absent": hyp_faith[i]["absent"],
            "reference_past_limit": past[i],
            "oracle_sentences": picks[i][1],
        }
        for i in range(n)
    ]
    k = min(opts.examples, n)
    out["worst"] = sorted(range(n), key=lambda i: (per[SORT_KEY][i], i))[:k]
    out["best"] = sorted(range(n), key=lambda i: (-per[SORT_KEY][i], i))[:k]
    out["sorted_by"] = SORT_KEY

    if other is not None:
        other_per = example_scores(other[1], refs)
        out["compare"] = {
            "hypotheses": shown(other[0]),
            "rouge": _means_ci(other_per, n_boot, seed),
            "test": paired_bootstrap(per, other_per, n_boot or 1000, seed),
            "buckets": [
                {
                    "source_words": b["source_words"],
                    "n": b["n"],
                    "rouge": _subset(other_per, b["ids"]),
                    "delta": {
                        key: b["rouge"][key] - _subset(other_per, b["ids"])[key] for key in ROUGE_TYPES
                    },
                }
                for b in buckets
            ],
        }
        for e, o in zip(examples, other[1]):
            e["compare_hypothesis"] = o
        for e in examples:
            e["compare_rouge"] = {key: other_per[key][e["id"]] for key in ROUGE_TYPES}
    out["examples"] = examples
    return out


def limit_text(t: dict[str, Any]) -> str:
    """The truncation limit in words: "1024 words", or "48 pieces of CHECKPOINT's tokenizer"."""
    if t["unit"] == "words":
        return f"{t['limit']} words"
    return f"{t['limit']} pieces of {t['model']}'s tokenizer (its max_source_positions)"


def truncation(
    cfg: EvalConfig, sources: list[str], refs: list[str], src_len: list[int]
) -> tuple[dict[str, Any], list[float]]:
    """The truncation section and each reference's share of words past the limit: --source-limit words, or with
    --path the model's own limit (its max_source_positions, in its tokenizer's pieces), each source cut where
    the model cuts it (analyses.kept_words)."""
    path, limit_words = cfg.inputs.path, cfg.report.source_limit
    if not path:
        kept = [limit_words] * len(sources)
        over = sum(1 for x in src_len if x > limit_words)
        section: dict[str, Any] = {"limit": limit_words, "unit": "words", "limit_words": limit_words}
    else:
        loaded = runner.load_for_generation(path)
        limit = loaded.model.max_positions()[0]
        extra = 1 if stored_conventions(loaded.lm.args).prepend_bos else 0  # <s>, which encode leaves out

        def fits(text: str) -> bool:
            return len(runner.encode(loaded, [text])[0]) + extra <= limit

        kept = [analyses.kept_words(s, fits) for s in sources]
        over = sum(1 for s, k, n in zip(sources, kept, src_len) if k < n or not fits(s))
        section = {"limit": limit, "unit": "pieces", "model": shown(path)}
    past = [analyses.past_limit(s, r, k) for s, r, k in zip(sources, refs, kept)]
    section.update(
        sources_over_limit=over,
        reference_past_limit_mean=float(np.mean(past)),
        references_with_words_past_limit=sum(1 for x in past if x > 0),
    )
    return section, past


def _lines(r: dict[str, Any]) -> list[str]:
    """The console summary."""
    lines = [f"{r['hypotheses']}: {format_summary(r['rouge'])}"]
    if "ci" in r["rouge"]:
        lines.append(
            format_intervals({k: tuple(v) for k, v in r["rouge"]["ci"].items()}, r["bootstrap"], r["seed"])
        )
    for name, scores in r["baselines"].items():
        lines.append(f"{name}: {format_summary({k: scores[k] for k in ROUGE_TYPES})}")
    f = r["faithfulness"]
    lines.append(
        f"faithfulness proxy: {f['hypothesis']['absent']} of {f['hypothesis']['items']} numbers/names in the "
        f"hypotheses are absent from their source ({100 * f['hypothesis']['absent_share']:.1f}%; references "
        f"{100 * f['reference']['absent_share']:.1f}%)"
    )
    t = r["truncation"]
    lines.append(
        f"truncation at {limit_text(t)}: {t['sources_over_limit']} sources longer; "
        f"{100 * t['reference_past_limit_mean']:.2f}% of reference words lie only past it"
    )
    if "duplicates" in r:
        d = r["duplicates"]
        lines.append(
            f"train duplicates: {d['exact']} exact, {d['high_overlap']} with >= {100 * d['threshold']:.0f}% "
            f"5-gram overlap, of {r['n']} sources"
        )
    skipped = r.get("validation_curves", {}).get("skipped")
    if skipped:
        lines.append(
            f"--train-log {r['validation_curves']['train_log']}: {skipped} malformed records skipped"
        )
    if "compare" in r:
        c = r["compare"]
        lines.append(f"{c['hypotheses']}: {format_summary(c['rouge'])}")
        lines.append(format_comparison(c["test"], c["hypotheses"], r["bootstrap"] or 1000, r["seed"]))
    return lines


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """seqtrain-eval: read the parsed flags once (EvalConfig), compute the report, print its summary, write
    --json and --html (both or neither, each whole). The outputs are checked first: none is one of the inputs
    (seqtrain.fileio's rule), nor a folder."""
    cfg = from_args(EvalConfig, args)  # the program's one read of its flags
    out = cfg.report
    check_outputs_apart([("--json", out.json), ("--html", out.html)], _inputs(cfg.inputs))
    for flag, path in (("--json", out.json), ("--html", out.html)):
        if path and os.path.isdir(path):
            raise SeqtrainError(f"{flag} {path}: is a folder; give a file name")
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise SeqtrainError(
                f"{flag} {path}: folder {os.path.dirname(path)} does not exist; create it first"
            )
    with stop_on_sigterm():  # the outputs are written at the end: until then, nothing was
        r = report(cfg)
        texts = {}
        if out.json:
            texts[out.json] = json.dumps(r, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
        if out.html:
            texts[out.html] = page.render(r, shown(out.title or r["hypotheses"]))
        write_files(texts)
    for line in _lines(r):
        print(line)
    for path in texts:
        print(f"wrote {shown(path)}")
    return r


def _inputs(inputs: EvalInputs) -> list[tuple[str, str | None]]:
    """The files seqtrain-eval reads, as (flag, path): every EvalInputs path (--split names no file), a --hyps or
    --compare folder standing for the file in it."""
    found = [(flag_names(f)[0], getattr(inputs, f.name)) for f in fields(inputs) if f.name != "split"]
    for flag, path in (("--hyps", inputs.hyps), ("--compare", inputs.compare)):
        if path and os.path.isdir(path):
            with contextlib.suppress(SeqtrainError):  # an ambiguous folder is refused when it is read
                found.append((flag, hypotheses_file(path, inputs.split, flag)))
    return found
