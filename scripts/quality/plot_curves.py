#!/usr/bin/env python
"""Plot training and validation curves from a seqtrain-train (or fairseq-train) log written with
`--log-format json`, or from seqtrain-train's `--jsonl-log FILE` (what scripts/quickstart.sh writes):
`train_inner` lines give the training loss every --log-interval updates, the validation lines (`valid`,
`valid1`, ...: one series per --valid-subset) the validation loss.
Left panel: loss against updates; right panel: the same against training wall-clock minutes.

    python scripts/quality/plot_curves.py logs/train.log -o docs/img/curves.png --title "debdesc, bart_small"

Needs matplotlib (`pip install -e .[plot]`). Losses are fairseq's: base 2, per target token; with label
smoothing `loss` includes the smoothing term and `nll_loss` is the plain negative log-likelihood.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from seqtrain.errors import SeqtrainError  # noqa: E402

Series = dict[str, list[tuple[float, float, float]]]  # "loss"/"nll_loss" -> [(updates, wall seconds, value)]


def read_json_log(path: str) -> dict[str, Series]:
    """{"train": {"loss": [...], "nll_loss": [...]}, "<valid subset>": {...}, ...} from a training log's json lines.

    Lines are `... | INFO | train_inner | {...}` (seqtrain/fairseq) or bare JSON objects; other lines are skipped.
    Validation records carry their subset as key prefix (`valid_loss`, `valid1_loss`), so each validated subset
    is its own series. A resumed run appends to the same log, so points are keyed by update and later lines win.
    """
    out: dict[str, dict[str, dict[float, tuple[float, float]]]] = {"train": {}}
    last_wall = 0.0
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise SeqtrainError(f"{path}: cannot read ({e.strerror})") from None
    with f:
        for n, line in enumerate(f, 1):
            brace = line.find("{")
            if brace < 0:
                continue
            head = line[:brace]
            try:
                stats = json.loads(line[brace:])
            except ValueError:
                continue  # a Namespace dump or other text with braces
            if not isinstance(stats, dict):
                continue
            if "tag" in stats and "step" in stats:  # --jsonl-log: {"tag": ..., "step": updates, stats...}
                tag = stats.pop("tag")
                if tag == "train":
                    continue  # end-of-epoch summaries repeat the inner lines
                kind = "train" if tag == "train_inner" else str(tag)
                stats = {"num_updates": stats.pop("step"), **stats}
                if kind != "train":  # as the json log format spells a validation record
                    stats = {f"{kind}_{k}": v for k, v in stats.items()}
                head = "| train_inner |" if kind == "train" else ""
            subsets = [k[: -len("_num_updates")] for k in stats if k.endswith("_num_updates")]
            if "| train_inner |" in head or ("num_updates" in stats and "loss" in stats):
                kind, prefix = "train", ""
                last_wall = float(stats.get("wall", last_wall))
            elif subsets and subsets[0] != "train" and subsets[0] + "_loss" in stats:
                kind, prefix = subsets[0], subsets[0] + "_"
            else:
                continue  # end-of-epoch `train` summaries (train_loss, ...) repeat the inner lines
            updates = stats.get(prefix + "num_updates")
            if updates is None:
                raise SeqtrainError(f"{path} line {n}: a {kind} record without num_updates")
            wall = float(stats.get("wall", last_wall)) if kind == "train" else last_wall
            for key in ("loss", "nll_loss"):
                if prefix + key in stats:
                    out.setdefault(kind, {}).setdefault(key, {})[float(updates)] = (
                        wall,
                        float(stats[prefix + key]),
                    )
    result: dict[str, Series] = {}
    for kind, series in out.items():
        result[kind] = {k: sorted((u, w, v) for u, (w, v) in points.items()) for k, points in series.items()}
    if not result["train"].get("loss"):
        raise SeqtrainError(
            f"{path}: no train_inner JSON lines (train with --jsonl-log FILE, or with --log-format json "
            "and --log-file or a redirect to keep them)"
        )
    return result


def plot(curves: dict[str, Series], out: str, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    colors = ["tab:red", "tab:green", "tab:purple", "tab:orange"]
    styles = {}
    for i, kind in enumerate(curves):
        color = "tab:blue" if kind == "train" else colors[(i - 1) % len(colors)]
        smoothed = "train loss (label-smoothed)" if kind == "train" else f"{kind} loss (label-smoothed)"
        styles[(kind, "loss")] = (color, "-", smoothed)
        styles[(kind, "nll_loss")] = (color, ":", f"{kind} nll_loss")
    for ax, x_index, xlabel in ((axes[0], 0, "updates"), (axes[1], 1, "training wall-clock (minutes)")):
        for (kind, key), (color, ls, label) in styles.items():
            points = curves.get(kind, {}).get(key, [])
            if not points:
                continue
            xs = [p[x_index] / (60.0 if x_index == 1 else 1.0) for p in points]
            ys = [p[2] for p in points]
            marker = None if kind == "train" else "o"
            ax.plot(xs, ys, color=color, linestyle=ls, marker=marker, markersize=4, label=label)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("loss (base 2, per target token)")
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    from seqtrain.fileio import atomic_write

    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with atomic_write(out, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)


def main(argv: list[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log", help="training log with --log-format json lines")
    p.add_argument("-o", "--output", default="curves.png", help="PNG to write (default: curves.png)")
    p.add_argument("--title", default="")
    args = p.parse_args(argv)
    try:
        curves = read_json_log(args.log)
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise SeqtrainError(
                "needs matplotlib to draw (pip install -e '.[plot]' or pip install matplotlib)"
            ) from None
        plot(curves, args.output, args.title)
    except SeqtrainError as e:
        print(f"plot_curves.py: error: {e}", file=sys.stderr)
        return 1
    t = curves["train"]["loss"]
    line = f"wrote {args.output}: {len(t)} train points (last loss {t[-1][2]:.3f} at {t[-1][0]:.0f} updates)"
    for kind, series in curves.items():
        v = series.get("loss", [])
        if kind != "train" and v:
            line += f", {len(v)} {kind} points (last loss {v[-1][2]:.3f})"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
