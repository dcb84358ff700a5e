"""A mistyped flag: argparse's one-line error names the nearest real flag (abbreviations stay refused)."""

from __future__ import annotations

import pytest

from seqtrain.flags.parsers import UsageError
from seqtrain.flags.training import parse_train_args
from seqtrain.generation.options import parse_generation_args


def test_a_mistyped_train_flag_gets_the_nearest_one(tmp_path):
    with pytest.raises(UsageError) as e:
        parse_train_args([str(tmp_path), "--arch", "bart_tiny", "--max-tokns", "100"])
    assert str(e.value) == "unrecognized arguments: --max-tokns 100; did you mean --max-tokens? (see --help)"
    with pytest.raises(UsageError) as e:  # a prefix is still no flag (allow_abbrev off), only a hint
        parse_train_args([str(tmp_path), "--arch", "bart_tiny", "--max-tok", "100"])
    assert str(e.value) == "unrecognized arguments: --max-tok 100; did you mean --max-tokens? (see --help)"
    with pytest.raises(UsageError) as e:  # nothing close: no guess
        parse_train_args([str(tmp_path), "--arch", "bart_tiny", "--xyz", "3"])
    assert str(e.value) == "unrecognized arguments: --xyz 3 (see --help)"


def test_several_mistyped_generate_flags():
    with pytest.raises(UsageError) as e:
        parse_generation_args(["--path", "x.pt", "--beem", "4", "--lenpn", "1"])  # (argparse took 4 as DATA)
    assert str(e.value) == (
        "unrecognized arguments: --beem --lenpn 1; did you mean --beam (for --beem), --lenpen (for --lenpn)? "
        "(see --help)"
    )
