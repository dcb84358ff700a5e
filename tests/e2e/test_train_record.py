"""What a seqtrain-train run leaves for a user stays what it was before training's settings were refactored
(issue 51): for each case of scripts/dev/train_record.py (a plain run; a --config preset with other components,
a layer kept, ROUGE validation and EMA; --max-tokens auto and its resume; a --user-dir arch and criterion; the
denoising task; two DDP ranks), the `args` record its checkpoint stores, key by key and in the same order, its
config.yaml and its log lines equal tests/e2e/train_record.json, which the script wrote from the code before."""

from __future__ import annotations

import json

import pytest

from tests.utils import load_script

train_record = load_script("dev/train_record")
BEFORE = json.loads(train_record.FIXTURE.read_text(encoding="utf-8"))

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    return train_record.make_data(str(tmp_path_factory.mktemp("record")))


@pytest.mark.parametrize("case", list(train_record.CASES))
def test_a_run_records_what_it_recorded_before(case, data, tmp_path):
    now, before = train_record.run_case(case, data, str(tmp_path)), BEFORE[case]
    for key, value in before["args"].items():
        assert now["args"].get(key, "(absent)") == value, f"args[{key!r}]"
    assert list(now["args"]) == list(before["args"])  # no key added, the same order
    assert now["config_yaml"] == before["config_yaml"]
    assert now["log"] == before["log"]
