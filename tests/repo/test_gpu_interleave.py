"""scripts/gpu/interleave.py, the sampler of the fair GPU comparisons (issue 49): engines alternate in rotated
rounds on the same items, medians and spreads come from the samples, the fastest engine is the least median,
an engine that fails leaves the later rounds; and scripts/gpu/gpu_speed.py's --plan: the prepared device calls
written in docs/benchmarks.md fit their TIMEOUTs."""

import re
import statistics
import sys

import pytest

from tests.utils import REPO

sys.path.insert(0, str(REPO / "scripts" / "gpu"))
import interleave as il  # noqa: E402


class FakeClock:
    """A timer whose 'seconds' are what each engine's call returns: the sampler's bookkeeping, not a clock."""

    def __call__(self, fn):
        return fn()


def _engines(calls, seconds):
    def make(name):
        def run(item):
            calls.append((name, item))
            return seconds[name][item]

        return run

    return [il.Engine(n, "seqtrain" if n.startswith("s") else "transformers", make(n)) for n in seconds]


def test_rounds_rotate_the_order_and_run_the_same_item_for_every_engine():
    calls = []
    seconds = {n: {i: 1.0 for i in range(6)} for n in ("s_a", "h_b", "h_c")}
    res = il.alternate(_engines(calls, seconds), items=list(range(6)), rounds=6, timer=FakeClock())
    assert res.order == [
        ["s_a", "h_b", "h_c"],
        ["h_b", "h_c", "s_a"],
        ["h_c", "s_a", "h_b"],
        ["s_a", "h_b", "h_c"],
        ["h_b", "h_c", "s_a"],
        ["h_c", "s_a", "h_b"],
    ]
    # round r runs item r for all engines, in the round's order
    assert calls == [(n, r) for r, names in enumerate(res.order) for n in names]
    assert {n: len(v) for n, v in res.samples.items()} == {"s_a": 6, "h_b": 6, "h_c": 6}
    # every engine leads a round and ends one
    assert {o[0] for o in res.order} == {o[-1] for o in res.order} == {"s_a", "h_b", "h_c"}


def test_items_cycle_when_rounds_outnumber_them_and_enter_leave_wrap_each_call():
    log = []
    e = il.Engine(
        "x",
        "seqtrain",
        lambda item: log.append(("run", item)) or 0.5,
        lambda: log.append("in"),
        lambda: log.append("out"),
    )
    res = il.alternate([e], items=["a", "b"], rounds=3, timer=FakeClock())
    assert log == ["in", ("run", "a"), "out", "in", ("run", "b"), "out", "in", ("run", "a"), "out"]
    assert res.samples["x"] == [0.5, 0.5, 0.5]


def test_summary_median_quartiles_and_range_come_from_the_samples():
    xs = [5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 6.0, 7.0, 9.0, 8.0]
    s = il.summary(xs)
    assert s["median"] == statistics.median(xs) == 5.5
    assert (s["q1"], s["q3"]) == (3.25, 7.75)  # inclusive quartiles of 1..10
    assert (s["min"], s["max"], s["n"]) == (1.0, 10.0, 10)
    assert il.summary([2.0]) == {"median": 2.0, "q1": 2.0, "q3": 2.0, "min": 2.0, "max": 2.0, "n": 1}
    rec = il.record("bart_large_hf_eager", s, "ms", 1000.0)
    assert rec["bart_large_hf_eager_ms_median"] == 5500.0 and rec["bart_large_hf_eager_samples"] == 10
    with pytest.raises(ValueError):
        il.summary([])


def test_the_fastest_is_the_least_median_and_the_ratio_pairs_rounds():
    assert il.fastest({"a": 3.0, "b": 1.0, "c": 2.0}) == "b"
    assert il.fastest({"a": 1.0, "b": 1.0}) == "a"  # a tie: the first named
    r = il.ratio([2.0, 4.0, 6.0], [1.0, 1.0, 2.0])
    assert r["ratio"] == 4.0 / 1.0
    assert (r["rounds_median"], r["rounds_min"], r["rounds_max"]) == (3.0, 2.0, 4.0)


def test_an_engine_that_fails_leaves_the_later_rounds_and_the_others_go_on():
    freed = []

    def flaky(item):
        if item == 1:
            raise RuntimeError("out of memory")
        return 1.0

    engines = [il.Engine("ok", "seqtrain", lambda item: 2.0), il.Engine("bad", "transformers", flaky)]
    res = il.alternate(
        engines, items=[0, 1, 2, 3], rounds=4, timer=FakeClock(), after_failure=lambda: freed.append(1)
    )
    assert res.samples == {"ok": [2.0, 2.0, 2.0, 2.0], "bad": [1.0]}
    assert (
        res.failed == {"bad": "round 1: RuntimeError: out of memory"}
        and "out of memory" in res.tracebacks["bad"]
    )
    assert res.order[2:] == [["ok"], ["ok"]] and freed == [1]


def test_rounds_that_fit_the_time_left():
    assert il.rounds_that_fit(100.0, 2.0, target=10) == 10
    assert il.rounds_that_fit(13.0, 2.0, target=10, minimum=3) == 6
    assert il.rounds_that_fit(1.0, 2.0, target=10, minimum=3) == 3
    assert il.rounds_that_fit(float("inf"), 2.0, target=10) == 10


def _prepared_calls():
    """The device calls docs/benchmarks.md's "prepared fair run" section gives: (TIMEOUT, stages)."""
    text = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    section = text[text.index("### The prepared fair run (issue 49)") :]
    section = section[: section.index("\n### ", 5)] if "\n### " in section[5:] else section
    return [
        (int(t), s.split(","))
        for t, s in re.findall(r"TIMEOUT=(\d+) scripts/gpu/gpu_speed\.sh --stages (\S+)", section)
    ]


def test_the_prepared_calls_fit_their_timeouts_and_the_device_time():
    import gpu_speed

    calls = _prepared_calls()
    assert len(calls) == 2, calls
    for timeout, stages in calls:
        # gpu_speed.sh hands the script TIMEOUT less the device probe's seconds and 10 s of margin
        text, fits = gpu_speed.plan(stages, timeout - 15)
        assert fits, text
    # the most important figures first: training bart_large in the first call, generation in the second
    assert "train_fair_large" in calls[0][1] and "generate_fair" in calls[1][1]
    # both calls (each TIMEOUT + 15 s for the call) within 15 minutes of device time, even with a machine start
    # (1-2 minutes) before each: an idle machine goes back after 30 s
    assert sum(t + 15 for t, _ in calls) + 2 * 120 <= 900
    # and the GPU shapes give >= 10 updates and >= 3 generation passes an engine
    shapes = gpu_speed.Shapes(dry=False)
    assert shapes.fair_rounds >= 10 and shapes.gen_rounds >= 3


def test_a_plan_over_budget_says_so():
    import gpu_speed

    text, fits = gpu_speed.plan(["env", "train_fair_large", "generate_fair", "train_fair_base"], 300)
    assert not fits and "DOES NOT FIT" in text and "| train_fair_large | 220 |" in text
