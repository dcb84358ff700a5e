"""seqtrain-serve's pieces without a server: how the batcher cuts its queue into batches, how a request body
becomes texts and settings (with the flags' own checks), and the Prometheus text it renders."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

from seqtrain.generation.search import GenerationConfig
from seqtrain.serve.batcher import Item, search_key, take_batch
from seqtrain.serve.metrics import Metrics
from seqtrain.serve.requests import ApiError, Limits, parse_request


def item(length: int, config: GenerationConfig, t: float) -> Item:
    return Item(None, 0, torch.zeros(length, dtype=torch.long), length, search_key(config), config, arrived=t)


def test_a_batch_forms_around_the_oldest_text_from_its_settings_within_the_budget():
    a, b = GenerationConfig(beam=4), GenerationConfig(beam=2)
    lengths = [30, 5, 28, 31, 6, 29, 200, 32]
    queue = [item(n, a if i % 4 != 1 else b, i) for i, n in enumerate(lengths)]  # texts 1 and 5 have beam 2
    batch, rest = take_batch(queue, max_tokens=4 * 32, max_size=8)
    # the oldest (30 tokens) with its nearest beam-4 neighbours in length, 4 x 32 padded tokens at most
    assert sorted(it.length for it in batch) == [28, 30, 31, 32]
    assert batch[0].length <= batch[-1].length and queue[0] in batch
    assert {it.config.beam for it in batch} == {4} and len(rest) == len(queue) - 4
    assert [it.arrived for it in rest] == sorted(it.arrived for it in rest)  # the rest keeps arrival order
    batch, rest = take_batch(
        rest, max_tokens=4 * 32, max_size=8
    )  # next: the oldest left is the 5-token beam-2
    assert [it.length for it in batch] == [5, 29] and {it.config.beam for it in batch} == {2}
    batch, rest = take_batch(rest, max_tokens=4 * 32, max_size=8)
    assert [it.length for it in batch] == [6]  # the 200-token text cannot join a 6-token one within 128
    batch, rest = take_batch(rest, max_tokens=4 * 32, max_size=8)
    assert [it.length for it in batch] == [200] and rest == []  # over the budget alone: it still goes, alone


def test_the_batch_size_caps_a_batch_and_nbest_does_not_split_one():
    queue = [item(10, GenerationConfig(beam=4, nbest=1 + i % 3), i) for i in range(10)]
    batch, rest = take_batch(queue, max_tokens=10_000, max_size=6)
    assert len(batch) == 6 and len(rest) == 4  # nbest only cuts the returned list: one batch for all


def _parse(body, **limits):
    return parse_request(json.dumps(body).encode(), GenerationConfig(beam=5, max_len_b=200), Limits(**limits))


def test_a_request_body_becomes_texts_and_the_servers_settings_with_its_own():
    texts, config = _parse({"texts": ["a", "b"], "beam": 3, "lenpen": 2, "nbest": 2})
    assert texts == ["a", "b"]
    assert (config.beam, config.lenpen, config.nbest, config.max_len_b) == (3, 2.0, 2, 200)
    assert isinstance(config.lenpen, float)  # an integer for a float setting is that float, as on the flag
    assert dataclasses.replace(config, beam=5, lenpen=1.0, nbest=1) == GenerationConfig(beam=5, max_len_b=200)


@pytest.mark.parametrize(
    "body, status, message",
    [
        ({"texts": ["a"], "beam": True}, 422, "beam must be an integer, got True"),
        ({"texts": ["a"], "beam": 4.0}, 422, "beam must be an integer, got 4.0"),
        (
            {"texts": ["a"], "no_repeat_ngram_size": -1},
            422,
            "no_repeat_ngram_size must be between 0 and 2147483647, got -1",
        ),
        (
            {"texts": ["a"], "max_len_b": 2000},
            422,
            "max_len_b 2000 is above this server's limit (--max-len-b-limit 1024)",
        ),
        ({"texts": ["a"], "beam": 17}, 422, "beam 17 is above this server's limit (--max-beam 16)"),
        (
            {"texts": ["a"], "sampling": True},
            422,
            "unknown field(s) sampling; known: texts, beam, lenpen, min_len, max_len_b, no_repeat_ngram_size, nbest",
        ),
        ({"texts": "a"}, 422, "texts must be a list of strings, got str"),
        (
            {"texts": ["a"] * 65},
            413,
            "texts: 65 texts; this server takes at most 64 per request (--max-texts)",
        ),
    ],
)
def test_bad_requests_are_named_as_the_flags_name_them(body, status, message):
    with pytest.raises(ApiError) as e:
        _parse(body)
    assert (e.value.status, e.value.message) == (status, message)


def test_metrics_render_prometheus_text():
    m = Metrics()
    m.request("/v1/summarize", 200, 0.3)
    m.request("/v1/summarize", 422, None)
    m.batch(3, 30, ok=True)
    m.batch(2, 0, ok=False)
    m.gauge("seqtrain_serve_queue_depth", "texts waiting", lambda: 7)
    text = m.render()
    lines = [x for x in text.splitlines() if not x.startswith("#")]
    values = dict(x.rsplit(" ", 1) for x in lines)
    assert values['seqtrain_serve_requests_total{route="/v1/summarize",code="200"}'] == "1"
    assert values['seqtrain_serve_request_duration_seconds_bucket{le="0.25"}'] == "0"
    assert values['seqtrain_serve_request_duration_seconds_bucket{le="0.5"}'] == "1"
    assert values['seqtrain_serve_request_duration_seconds_bucket{le="+Inf"}'] == "1"
    assert (
        values["seqtrain_serve_batch_size_count"] == "2" and values["seqtrain_serve_summaries_total"] == "3"
    )
    assert values['seqtrain_serve_batches_total{outcome="error"}'] == "1"
    assert (
        values["seqtrain_serve_queue_depth"] == "7"
        and float(values["seqtrain_serve_summaries_per_second"]) > 0
    )
    for name in {re.match(r"\w+", x).group() for x in lines}:  # every series has its TYPE line
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert f"# TYPE {base} " in text or f"# TYPE {name} " in text, name
