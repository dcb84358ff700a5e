"""seqtrain-eval: one report of a summarization system on a split (docs/evaluation.md).

report.py    `evaluate(args)`: read and check the inputs, compute the figures (the JSON), write JSON and HTML
analyses.py  baselines (lead-k, extractive oracle), lengths and buckets, faithfulness proxy, truncation,
             train/split near-duplicates, validation curves: small functions of the texts
page.py      the self-contained HTML page (inline CSS, SVG plots) drawn from the JSON
"""
