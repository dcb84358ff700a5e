"""fairseq's validation dry run: before the first update every validation split is batched and loaded once, so a
split that cannot be batched stops training at the start, with the error validation itself would give."""

import os

import pytest

from seqtrain.errors import SeqtrainError
from seqtrain_cli.train import train_main
from tests.utils import base_args

pytestmark = pytest.mark.slow  # in-process training runs


def run(databin, save_dir, log, *extra):
    argv = base_args(databin, str(save_dir), "--max-update", "3", "--log-file", str(log), *extra)
    return train_main(argv + ["--save-interval-updates", "1"])


@pytest.mark.parametrize(
    "flags, error",
    [
        # an example longer than the valid batch, which --skip-invalid-size-inputs-valid-test does not skip
        (["--max-tokens-valid", "4"], "valid: Sentences lengths should not exceed max_tokens=4"),
        # an example longer than the model's positions, without --skip-invalid-size-inputs-valid-test
        (["--max-source-positions", "6", "--max-tokens-valid", "512"], "valid: Size of sample #"),
    ],
    ids=["max-tokens-valid", "max-positions"],
)
def test_unbatchable_valid_set_fails_before_the_first_update(tmp_path, databin, flags, error):
    log = tmp_path / "train.log"
    with pytest.raises(SeqtrainError, match=error) as e:
        # training itself skips the too-long training examples (as fairseq's train iterator does)
        run(databin, tmp_path / "ck", log, *flags)
    assert "\n" not in str(e.value)
    text = log.read_text()
    assert 'begin dry-run validation on "valid" subset' in text
    assert "train_inner" not in text and "num_updates" not in text  # not one update ran
    assert not os.path.exists(tmp_path / "ck" / "checkpoint_last.pt")


def test_dry_run_passes_then_trains(tmp_path, databin):
    log = tmp_path / "train.log"
    run(databin, tmp_path / "ck", log)
    text = log.read_text()
    assert text.index('begin dry-run validation on "valid" subset') < text.index(
        "Start iterating over samples"
    )
    assert os.path.exists(tmp_path / "ck" / "checkpoint_last.pt")


def test_no_dry_run_with_disable_validation(tmp_path, databin):
    log = tmp_path / "train.log"
    run(databin, tmp_path / "ck", log, "--max-tokens-valid", "4", "--disable-validation")
    assert "dry-run" not in log.read_text()
