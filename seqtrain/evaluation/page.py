"""seqtrain-eval's HTML page: one self-contained file (inline CSS and SVG plots, no script, no font, no request at
view time) drawn from the report's JSON figures, every text escaped."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from seqtrain.scoring.rouge import ROUGE_TYPES

LABELS = {"rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "rougeL": "ROUGE-L", "rougeLsum": "ROUGE-Lsum"}
COLORS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c")
CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1100px;
color:#1f2937;padding:0 16px;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #e5e7eb}
.sub{color:#6b7280;margin-bottom:16px;word-break:break-all}
table{border-collapse:collapse;margin:6px 0 10px} th,td{padding:4px 10px;border-bottom:1px solid #e5e7eb;
text-align:right;vertical-align:top} th{background:#f9fafb} td.l,th.l{text-align:left}
.ci{color:#6b7280;font-size:12px;white-space:nowrap} .plots{display:flex;flex-wrap:wrap;gap:18px}
figure{margin:0} figcaption{color:#6b7280;font-size:12px}
.ex td{text-align:left;font-size:13px;max-width:330px;word-wrap:break-word} .bad{color:#b91c1c}
.pos{color:#15803d} .neg{color:#b91c1c} .note{color:#6b7280;font-size:12px;max-width:900px}
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _f(x: float, d: int = 2) -> str:
    return f"{x:.{d}f}"


def _rouge_cells(scores: dict[str, Any], ci: bool = True) -> str:
    cells = []
    for k in ROUGE_TYPES:
        text = _f(scores[k])
        if ci and "ci" in scores:
            lo, hi = scores["ci"][k]
            text += f' <span class="ci">{_f(lo)}&ndash;{_f(hi)}</span>'
        cells.append(f"<td>{text}</td>")
    return "".join(cells)


def _head(*names: str, left: int = 1) -> str:
    return (
        "<tr>"
        + "".join(
            f'<th class="l">{_e(n)}</th>' if i < left else f"<th>{_e(n)}</th>" for i, n in enumerate(names)
        )
        + "</tr>"
    )


# ---------------------------------------------------------------------------------------------------------------
# SVG plots (fixed-size, axes with a few ticks)

W, H, PAD_L, PAD_B, PAD_T, PAD_R = 480, 260, 46, 34, 14, 12


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not hi - lo > 0 or not math.isfinite(hi - lo):  # one value (or a span no float holds: not drawn)
        return [lo]
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    start = math.ceil(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step + 1e-9) + 1)]


def _axes(x0: float, x1: float, y0: float, y1: float, xlabel: str, ylabel: str) -> tuple[Any, Any, list[str]]:
    sx = lambda x: PAD_L + (x - x0) / ((x1 - x0) or 1) * (W - PAD_L - PAD_R)  # noqa: E731
    sy = lambda y: H - PAD_B - (y - y0) / ((y1 - y0) or 1) * (H - PAD_B - PAD_T)  # noqa: E731
    parts = [
        f'<line x1="{PAD_L}" y1="{H - PAD_B}" x2="{W - PAD_R}" y2="{H - PAD_B}" stroke="#9ca3af"/>',
        f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{H - PAD_B}" stroke="#9ca3af"/>',
    ]
    for t in _ticks(y0, y1):
        y = sy(t)
        parts.append(f'<line x1="{PAD_L - 3}" y1="{y:.1f}" x2="{W - PAD_R}" y2="{y:.1f}" stroke="#f3f4f6"/>')
        parts.append(f'<text x="{PAD_L - 5}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{t:g}</text>')
    parts.append(
        f'<text x="{(W + PAD_L) / 2}" y="{H - 4}" font-size="11" text-anchor="middle">{_e(xlabel)}</text>'
    )
    parts.append(
        f'<text x="12" y="{(H - PAD_B) / 2}" font-size="11" text-anchor="middle" '
        f'transform="rotate(-90 12 {(H - PAD_B) / 2})">{_e(ylabel)}</text>'
    )
    return sx, sy, parts


def _svg(parts: list[str], legend: Sequence[str] = ()) -> str:
    for i, name in enumerate(legend):
        x = PAD_L + 10 + i * 130
        parts.append(f'<rect x="{x}" y="2" width="10" height="10" fill="{COLORS[i % len(COLORS)]}"/>')
        parts.append(f'<text x="{x + 14}" y="11" font-size="11">{_e(name)}</text>')
    body = "".join(parts)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}">{body}</svg>'
    )


def histogram(series: dict[str, Sequence[int]], xlabel: str, bins: int = 20) -> str:
    """Overlaid step histograms of integer lengths, one colour per series."""
    values = [v for s in series.values() for v in s]
    lo, hi = min(values), max(values) + 1
    width = max(1, math.ceil((hi - lo) / bins))
    edges = list(range(lo, hi + width, width))
    counts = {name: [0] * (len(edges) - 1) for name in series}
    for name, s in series.items():
        for v in s:
            counts[name][min((v - lo) // width, len(edges) - 2)] += 1
    top = max(max(c) for c in counts.values())
    sx, sy, parts = _axes(edges[0], edges[-1], 0, top * 1.1, xlabel, "examples")
    for t in _ticks(edges[0], edges[-1]):
        parts.append(
            f'<text x="{sx(t):.1f}" y="{H - PAD_B + 13}" font-size="10" text-anchor="middle">{t:g}</text>'
        )
    for i, name in enumerate(series):
        pts = []
        for j, c in enumerate(counts[name]):
            pts += [f"{sx(edges[j]):.1f},{sy(c):.1f}", f"{sx(edges[j + 1]):.1f},{sy(c):.1f}"]
        pts = [f"{sx(edges[0]):.1f},{sy(0):.1f}"] + pts + [f"{sx(edges[-1]):.1f},{sy(0):.1f}"]
        color = COLORS[i % len(COLORS)]
        parts.append(
            f'<polyline points="{" ".join(pts)}" fill="{color}" fill-opacity="0.18" stroke="{color}" '
            'stroke-width="1.5"/>'
        )
    return _svg(parts, list(series))


def bars(groups: Sequence[str], series: dict[str, Sequence[float]], xlabel: str, ylabel: str) -> str:
    """Grouped bars: one group per label, one bar per series (negative values hang below zero)."""
    values = [v for s in series.values() for v in s] + [0.0]
    y0, y1 = min(values), max(values)
    y1 += (y1 - y0) * 0.1 or 1
    sx, sy, parts = _axes(0, len(groups), y0, y1, xlabel, ylabel)
    slot = (W - PAD_L - PAD_R) / max(len(groups), 1)
    bw = slot * 0.8 / max(len(series), 1)
    for g, label in enumerate(groups):
        parts.append(
            f'<text x="{sx(g + 0.5):.1f}" y="{H - PAD_B + 13}" font-size="10" text-anchor="middle">{_e(label)}</text>'
        )
        for i, (_, s) in enumerate(series.items()):
            x = sx(g) + slot * 0.1 + i * bw
            top, bottom = sy(max(s[g], 0)), sy(min(s[g], 0))
            parts.append(
                f'<rect x="{x:.1f}" y="{top:.1f}" width="{bw:.1f}" height="{max(bottom - top, 0.5):.1f}" '
                f'fill="{COLORS[i % len(COLORS)]}"><title>{_e(label)}: {s[g]:.2f}</title></rect>'
            )
    return _svg(parts, list(series))


DRAWN = 1e15  # values beyond this magnitude (a diverged run's ppl) are marked at the edge, not scaled to


def lines(series: dict[str, Sequence[Sequence[float | None]]], xlabel: str, ylabel: str) -> str:
    """Line chart of (x, y) points, one colour per series. A y that is None (not finite in the log: a diverged
    run's nan) or beyond DRAWN breaks the line and is marked by a cross at the top edge, titled with its value."""
    xs = [p[0] for s in series.values() for p in s]
    ys = [p[1] for s in series.values() for p in s if _drawn(p[1])]
    y0, y1 = (min(ys), max(ys)) if ys else (0.0, 1.0)
    pad = (y1 - y0) * 0.08 or 1
    sx, sy, parts = _axes(min(xs), max(xs), y0 - pad, y1 + pad, xlabel, ylabel)
    for t in _ticks(min(xs), max(xs)):
        parts.append(
            f'<text x="{sx(t):.1f}" y="{H - PAD_B + 13}" font-size="10" text-anchor="middle">{t:g}</text>'
        )
    for i, (_, pts) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        runs: list[list[tuple[float, float]]] = [[]]
        for x, y in pts:
            if _drawn(y):
                runs[-1].append((x, y))
                continue
            runs.append([])
            shown = "not finite" if y is None else f"{y:g}"
            parts.append(
                f'<text x="{sx(x):.1f}" y="{PAD_T + 4}" font-size="11" fill="{color}" text-anchor="middle">'
                f"&#215;<title>{_e(f'{x:g}')}: {_e(shown)}</title></text>"
            )
        for run in runs:
            if len(run) > 1:
                path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in run)
                parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.8"/>')
            parts += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.2" fill="{color}"/>' for x, y in run]
    return _svg(parts, list(series))


def _drawn(y: float | None) -> bool:
    return y is not None and abs(y) <= DRAWN


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{_e(caption)}</figcaption></figure>"


# ---------------------------------------------------------------------------------------------------------------
# the page


def _summary_section(r: dict[str, Any]) -> str:
    rows = [_head("system", *[LABELS[k] for k in ROUGE_TYPES], "n")]
    rows.append(
        f'<tr><td class="l"><b>{_e(r["hypotheses"])}</b></td>{_rouge_cells(r["rouge"])}<td>{r["n"]}</td></tr>'
    )
    if "compare" in r:
        c = r["compare"]
        rows.append(
            f'<tr><td class="l">{_e(c["hypotheses"])}</td>{_rouge_cells(c["rouge"])}<td>{r["n"]}</td></tr>'
        )
    for name, scores in r["baselines"].items():
        extra = (
            f' <span class="ci">({scores["mean_sentences"]:.2f} sentences)</span>' if name == "oracle" else ""
        )
        rows.append(
            f'<tr><td class="l">{_e(name)}{extra}</td>{_rouge_cells(scores, False)}<td>{r["n"]}</td></tr>'
        )
    note = (
        f"F1 &times; 100 (rouge-score, Porter stemming), averaged over examples; grey: 95% percentile-bootstrap "
        f"interval ({r['bootstrap']} resamples, seed {r['seed']}). lead-k: the source's first k sentences; "
        "oracle: the greedy extractive oracle (source sentences chosen to maximise ROUGE-1 + ROUGE-2 against the "
        "reference), an upper bound for extraction."
    )
    return f"<h2>ROUGE</h2><table>{''.join(rows)}</table><p class='note'>{note}</p>"


def _compare_section(r: dict[str, Any]) -> str:
    if "compare" not in r:
        return ""
    c = r["compare"]
    rows = [_head("", *[LABELS[k] for k in ROUGE_TYPES])]
    for label, key, fmt in (
        ("A − B", "delta", lambda v: f"{v:+.2f}"),
        ("A better in (share of resamples)", "a_wins", lambda v: f"{v:.3f}"),
        ("p (two-sided)", "p_value", lambda v: f"{v:.4f}"),
    ):
        cells = "".join(f"<td>{fmt(c['test'][k][key])}</td>" for k in ROUGE_TYPES)
        rows.append(f'<tr><td class="l">{label}</td>{cells}</tr>')
    brows = [_head("source words", "n", *[f"{LABELS[k]} A−B" for k in ROUGE_TYPES])]
    for b in c["buckets"]:
        signs = {k: "pos" if b["delta"][k] > 0 else "neg" if b["delta"][k] < 0 else "" for k in ROUGE_TYPES}
        cells = "".join(f'<td class="{signs[k]}">{b["delta"][k]:+.2f}</td>' for k in ROUGE_TYPES)
        brows.append(f'<tr><td class="l">{_e(b["source_words"])}</td><td>{b["n"]}</td>{cells}</tr>')
    plot = bars(
        [b["source_words"] for b in c["buckets"]],
        {"ROUGE-Lsum A-B": [b["delta"]["rougeLsum"] for b in c["buckets"]]},
        "source length (words)",
        "difference",
    )
    return (
        f"<h2>Compared with {_e(c['hypotheses'])}</h2><p class='note'>A = {_e(r['hypotheses'])}, "
        f"B = {_e(c['hypotheses'])}; paired bootstrap test (Koehn 2004) on the same examples.</p>"
        f"<table>{''.join(rows)}</table><table>{''.join(brows)}</table>"
        f"{_figure(plot, 'ROUGE-Lsum difference by source length')}"
    )


def _lengths_section(r: dict[str, Any]) -> str:
    L = r["lengths"]
    rows = [_head("words", "mean", "median", "p90", "min", "max")]
    for name in ("hypothesis", "reference", "source"):
        s = L[name]
        rows.append(
            f'<tr><td class="l">{name}</td><td>{_f(s["mean"], 1)}</td><td>{_f(s["median"], 1)}</td>'
            f"<td>{_f(s['p90'], 1)}</td><td>{s['min']}</td><td>{s['max']}</td></tr>"
        )
    ex = r["examples"]
    hist = histogram(
        {"hypothesis": [e["hypothesis_words"] for e in ex], "reference": [e["reference_words"] for e in ex]},
        "summary length (words)",
    )
    src = histogram({"source": [e["source_words"] for e in ex]}, "source length (words)")
    labels = [b["source_words"] for b in r["buckets"]]
    series = {"system": [b["rouge"]["rougeLsum"] for b in r["buckets"]]}
    if "compare" in r:
        series["compared"] = [b["rouge"]["rougeLsum"] for b in r["compare"]["buckets"]]
    by_bucket = bars(labels, series, "source length (words)", "ROUGE-Lsum")
    brows = [_head("source words", "n", *[LABELS[k] for k in ROUGE_TYPES])]
    for b in r["buckets"]:
        brows.append(
            f'<tr><td class="l">{_e(b["source_words"])}</td><td>{b["n"]}</td>{_rouge_cells(b["rouge"], False)}</tr>'
        )
    return (
        f"<h2>Lengths</h2><table>{''.join(rows)}</table><p class='note'>hypothesis / reference mean length: "
        f"{L['hypothesis_over_reference']:.2f}</p><div class='plots'>{_figure(hist, 'summary lengths')}"
        f"{_figure(src, 'source lengths')}</div><h2>ROUGE by source length</h2><table>{''.join(brows)}</table>"
        f"{_figure(by_bucket, 'ROUGE-Lsum by source-length bucket (quantiles of the split)')}"
    )


def _checks_section(r: dict[str, Any]) -> str:
    f, t = r["faithfulness"], r["truncation"]
    rows = [_head("", "numbers/names checked", "absent from source", "share", "examples with one absent")]
    for name, label in (("hypothesis", "hypotheses"), ("reference", "references")):
        s = f[name]
        rows.append(
            f'<tr><td class="l">{label}</td><td>{s["items"]}</td><td>{s["absent"]}</td>'
            f"<td>{100 * s['absent_share']:.1f}%</td><td>{s['examples_with_absent']} "
            f"({100 * s['examples_with_absent_share']:.1f}%)</td></tr>"
        )
    out = (
        f"<h2>Faithfulness proxy</h2><table>{''.join(rows)}</table><p class='note'>Numbers and capitalised "
        "words (not sentence-initial) of each summary that its source does not contain; the references' share is "
        "the base rate of such content in the data. A proxy to read examples by, not a verdict.</p>"
        f"<h2>Source truncation</h2><p>At {_e(_limit(t))}: {t['sources_over_limit']} of {r['n']} "
        f"sources are longer; on average {100 * t['reference_past_limit_mean']:.2f}% of a reference's words occur "
        f"in its source only past the limit ({t['references_with_words_past_limit']} references have some).</p>"
    )
    if "duplicates" in r:
        d = r["duplicates"]
        out += (
            f"<h2>Train / split overlap</h2><p>Of {r['n']} sources, <b>{d['exact']}</b> are in train word for word "
            f"and <b>{d['high_overlap']}</b> share at least {100 * d['threshold']:.0f}% of their word 5-grams "
            f"with one train source ({d['train_examples']} train sources, {_e(d['train_source'])}).</p>"
        )
    if "validation_curves" in r:
        figs = []
        subsets = r["validation_curves"]["subsets"]
        metrics = sorted({m for s in subsets.values() for m in s}, key=lambda m: (not m.endswith("loss"), m))
        for m in metrics[:4]:
            series = {s: pts[m] for s, pts in subsets.items() if m in pts}
            figs.append(_figure(lines(series, "updates", m), f"validation {m}"))
        skipped = r["validation_curves"].get("skipped", 0)
        note = (
            f"<p class='note'>{skipped} malformed records of the log skipped (not UTF-8, not JSON, or a step that "
            "is no update number).</p>"
            if skipped
            else ""
        )
        out += f"<h2>Validation curves</h2><div class='plots'>{''.join(figs)}</div>{note}"
    return out


def _limit(t: dict[str, Any]) -> str:
    if t.get("unit", "words") == "words":
        return f"{t['limit_words']} words"
    return f"{t['limit']} pieces of {t['model']}'s tokenizer (its max_source_positions)"


def _examples_section(r: dict[str, Any], which: str) -> str:
    ex = r["examples"]
    compare = "compare" in r
    head = (
        ["id", "source", "reference", "hypothesis"]
        + (["compared"] if compare else [])
        + [LABELS[r["sorted_by"]]]
    )
    rows = ["<tr>" + "".join(f'<th class="l">{h}</th>' for h in head) + "</tr>"]
    for i in r[which]:
        e = ex[i]
        src = e["source"] if len(e["source"]) <= 600 else e["source"][:600] + " …"
        absent = (
            f'<div class="bad">absent from source: {_e(", ".join(e["absent"]))}</div>' if e["absent"] else ""
        )
        cells = [str(e["id"]), _e(src), _e(e["reference"]), _e(e["hypothesis"]) + absent]
        if compare:
            cells.append(_e(e["compare_hypothesis"]))
        cells.append(_f(e["rouge"][r["sorted_by"]]))
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return f"<h2>The {len(r[which])} {which} examples</h2><table class='ex'>{''.join(rows)}</table>"


def render(r: dict[str, Any], title: str) -> str:
    body = "".join(
        [
            f"<h1>{_e(title)}</h1><div class='sub'>{r['n']} examples · sources {_e(r['source'])} · references "
            f"{_e(r['reference'])}</div>",
            _summary_section(r),
            _compare_section(r),
            _lengths_section(r),
            _checks_section(r),
            _examples_section(r, "worst"),
            _examples_section(r, "best"),
        ]
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>{body}</body></html>\n"
    )
