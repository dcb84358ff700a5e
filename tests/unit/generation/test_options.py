"""seqtrain.generation.options: the generate and interactive parsers composed from the settings groups they use.
What a program leaves out is refused on the command line with one line, keeps its default in the parsed flags,
and is skipped (its value checked) in a --config file; --eval-rouge-args gives the search's typed settings."""

from __future__ import annotations

import pytest

from seqtrain.config import left_out
from seqtrain.errors import SeqtrainError
from seqtrain.flags.parsers import UsageError
from seqtrain.generation import options
from seqtrain.generation.search import GenerationConfig


def test_each_program_leaves_out_what_does_nothing_there():
    generate, interactive = options.get_generation_parser(), options.get_interactive_parser()
    gen_out, int_out = set(left_out(generate)), set(left_out(interactive))
    # whole training groups fairseq-generate accepts: not composed, so absent from the parser
    assert {"--distributed-world-size", "--ddp-backend", "--fp16-init-scale", "--min-loss-scale"} <= gen_out
    assert not gen_out & set(generate._option_string_actions)
    # interactive: generate's own settings marked not_in=("interactive",), on top of generate's
    assert gen_out < int_out
    assert set(options.refused_in_interactive()) == {
        "--results-path", "--scoring", "--reference", "--gen-subset", "--output", "--num-shards",
        "--shard-id", "--prefix-size", "--score-reference", "--rerank", "--rerank-lenpen",
    }  # fmt: skip
    assert "--buffer-size" in interactive._option_string_actions
    assert "--buffer-size" not in generate._option_string_actions


def test_left_out_flags_are_refused_by_name_and_keep_their_defaults(tmp_path):
    with pytest.raises(UsageError, match=r"^--rerank: does nothing in seqtrain-interactive; remove it$"):
        options.parse_generation_args(["--path", "x.pt", "--rerank=mbr"], interactive=True)
    with pytest.raises(UsageError, match=r"^--bucket-cap-mb: does nothing in seqtrain-generate; remove it$"):
        options.parse_generation_args(["--path", "x.pt", "--bucket-cap-mb", "8"])
    args = options.parse_generation_args(["--path", "x.pt"], interactive=True)
    assert (args.rerank, args.num_shards, args.shard_id, args.prefix_size, args.input) == (None, 1, 0, 0, "-")
    assert (args.distributed_world_size, args.buffer_size) == (1, 1)
    # a config serves every program: interactive skips generate's keys, checking their values
    cfg = tmp_path / "c.yaml"
    cfg.write_text("beam: 3\nrerank: length\nnum-shards: 2\nlr: 0.1\n")
    args = options.parse_generation_args(["--path", "x.pt", "--config", str(cfg)], interactive=True)
    assert (args.beam, args.rerank, args.num_shards) == (3, None, 1)
    cfg.write_text("rerank: best\n")
    with pytest.raises(SeqtrainError, match=r"c.yaml line 1 \(rerank\)"):
        options.parse_generation_args(["--path", "x.pt", "--config", str(cfg)], interactive=True)


def test_eval_rouge_args_give_the_typed_search_settings():
    config = options.generation_args('{"beam": 4, "lenpen": 2}', seed=7)
    assert config == GenerationConfig(beam=4, lenpen=2.0, seed=7)
    assert options.generation_args("--beam 4 --lenpen 2", seed=7) == config
