"""fairseq's flags with fairseq's meaning (--user-dir, --amp, --dataset-impl, a bare --profile, generate's
--max-source-positions), a one-line error naming each fairseq flag seqtrain lacks, and docs/fairseq.md's table."""

import json
import pathlib
import re

import pytest

from seqtrain.errors import SeqtrainError
from seqtrain.flags.fairseq_flag_list import FAIRSEQ_FLAGS
from seqtrain.flags.parsers import UsageError
from seqtrain.flags.training import parse_train_args
from seqtrain.generation.options import parse_generation_args
from tests.utils import REPO, load_script

PLUGIN = REPO / "tests" / "plugins" / "seqtrain_toy_plugin"
TRAIN = ["data-bin", "--arch", "bart_tiny", "--max-tokens", "64"]
GENERATE = ["data-bin", "--path", "model.pt"]


def table_rows() -> list[list[str]]:
    text = (REPO / "docs" / "fairseq.md").read_text()
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| `--")]
    return [[cell.strip(" |`") for cell in row] for row in rows]


def test_amp_dataset_impl_profile_and_generate_positions():
    args = parse_train_args(TRAIN + ["--amp", "--dataset-impl", "mmap", "--profile"])
    assert (args.amp, args.fp16, args.dataset_impl, args.profile) == (True, True, "mmap", 10)
    assert parse_train_args(TRAIN + ["--profile", "3"]).profile == 3
    assert parse_train_args(TRAIN).profile == 0 and not parse_train_args(TRAIN).fp16
    for impl in ("lazy", "cached", "raw"):
        with pytest.raises(UsageError, match=rf"--dataset-impl: only mmap is supported .*got '{impl}'"):
            parse_train_args(TRAIN + ["--dataset-impl", impl])
    g = parse_generation_args(GENERATE + ["--max-source-positions", "48", "--amp"])
    assert (g.max_source_positions, g.max_target_positions, g.fp16) == (48, 1024, True)


@pytest.mark.parametrize(
    "argv, tool, flag",
    [
        (TRAIN + ["--fp16-no-flatten-grads"], "fairseq-train", "--fp16-no-flatten-grads"),
        (TRAIN + ["--skip-remainder-batch"], "fairseq-train", "--skip-remainder-batch"),
        (TRAIN + ["--encoder-layerdrop=0.1"], "fairseq-train", "--encoder-layerdrop"),
        (GENERATE + ["--print-alignment"], "fairseq-generate", "--print-alignment"),
        (GENERATE + ["--lr-scheduler", "fixed"], "fairseq-generate", "--lr-scheduler"),
    ],
)
def test_unimplemented_fairseq_flag_is_named(argv, tool, flag):
    parse = parse_generation_args if tool == "fairseq-generate" else parse_train_args
    with pytest.raises(UsageError) as e:
        parse(argv)
    assert f"{flag} is a {tool} flag that seqtrain does not implement" in str(e.value)
    assert "\n" not in str(e.value)


def test_non_fairseq_flag_keeps_argparse_message():
    with pytest.raises(UsageError) as e:
        parse_train_args(TRAIN + ["--no-such-flag"])
    assert str(e.value) == "unrecognized arguments: --no-such-flag (see --help)"
    with pytest.raises(UsageError) as e:  # seqtrain has it, under another scheduler
        parse_train_args(TRAIN + ["--total-num-update", "30"])
    assert "--total-num-update belongs to another --optimizer or --lr-scheduler" in str(e.value)


def test_flag_table_rows_name_existing_flags():
    """Every row of docs/fairseq.md's table is a flag of fairseq's parsers; 'same'/'different' rows name a flag
    seqtrain's parser for that tool has, 'absent' rows one it refuses naming it; the table is up to date."""
    script = load_script("dev/fairseq_flags")
    ours = {tool: script.seqtrain_actions(tool) for tool in ("fairseq-train", "fairseq-generate")}
    rows = table_rows()
    assert [r[0] for r in rows] == sorted(FAIRSEQ_FLAGS) and len(rows) > 250
    absent = []
    for flag, tools, seqtrain_flag, status, _how in rows:
        tools = [f"fairseq-{t}" for t in tools.split(", ")]
        assert tools == list(FAIRSEQ_FLAGS[flag][0])
        if status == "absent":
            assert seqtrain_flag == "-" and not any(flag in ours[t] for t in tools), flag
            absent.append((flag, tools[0]))
        else:
            assert status in ("same", "different") and seqtrain_flag == flag
            assert any(flag in ours[t] for t in tools), flag
    assert script.table(script.stored_flags()) in (REPO / "docs" / "fairseq.md").read_text()
    # every absent flag is refused with its name, on the parser of a tool that takes it
    for flag, tool in absent:
        value = ["1"] if FAIRSEQ_FLAGS[flag][1] else []
        base = GENERATE if tool == "fairseq-generate" else TRAIN
        parse = parse_generation_args if tool == "fairseq-generate" else parse_train_args
        with pytest.raises(UsageError, match=re.escape(f"{flag} is a {tool} flag that seqtrain does not")):
            parse(base + [flag, *value])


def test_user_dir_errors(tmp_path):
    with pytest.raises(SeqtrainError, match="--user-dir .*: folder not found"):
        parse_train_args(TRAIN + ["--user-dir", str(tmp_path / "missing")])
    (tmp_path / "not_a_package").mkdir()
    with pytest.raises(SeqtrainError, match="not a Python package"):
        parse_train_args(TRAIN + ["--user-dir", str(tmp_path / "not_a_package")])
    broken = tmp_path / "broken_plugin_pkg"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(SeqtrainError, match="importing it failed: RuntimeError: boom"):
        parse_train_args(TRAIN + [f"--user-dir={broken}"])


@pytest.mark.slow
def test_user_dir_plugin_arch_and_criterion_train(tmp_path, toy_databin):
    """--user-dir tests/plugins/seqtrain_toy_plugin: its arch builds the model, its criterion the loss."""
    from seqtrain.checkpoint.files import load_checkpoint_file
    from seqtrain_cli.train import train_main

    log = tmp_path / "train.log"
    argv = [toy_databin(), "--user-dir", str(PLUGIN), "--arch", "toy_micro", "--criterion"]
    argv += ["toy_double_cross_entropy", "--cpu", "--max-tokens", "256", "--max-update", "3", "--lr", "1e-3"]
    argv += [
        "--log-format",
        "json",
        "--log-interval",
        "1",
        "--log-file",
        str(log),
        "--save-dir",
        str(tmp_path),
    ]
    assert train_main(argv + ["--disable-validation", "--no-epoch-checkpoints"]) in (0, None)
    stats = [
        json.loads(line.split(" | ", 3)[3])
        for line in log.read_text().splitlines()
        if "| train_inner |" in line
    ]
    assert len(stats) == 3
    for s in stats:  # cross entropy counted twice: loss (base 2) is twice the logged nll_loss
        assert s["loss"] == pytest.approx(2 * s["nll_loss"], abs=2e-3)
    ck = load_checkpoint_file(str(pathlib.Path(tmp_path) / "checkpoint_last.pt"))
    assert (ck["args"]["arch"], ck["args"]["encoder_embed_dim"], ck["args"]["encoder_layers"]) == (
        "toy_micro",
        32,
        1,
    )
    assert tuple(ck["model"]["encoder.layers.0.fc1.weight"].shape) == (48, 32)


def test_bart_summarization_recipe_parses():
    """fairseq's examples/bart/README.summarization.md fine-tuning command line, program name swapped."""
    argv = [
        "cnn_dm-bin",
        "--restore-file",
        "bart.large/model.pt",
        "--max-tokens",
        "2048",
        "--task",
        "translation",
    ]
    argv += [
        "--source-lang",
        "source",
        "--target-lang",
        "target",
        "--truncate-source",
        "--layernorm-embedding",
    ]
    argv += ["--share-all-embeddings", "--share-decoder-input-output-embed", "--reset-optimizer"]
    argv += [
        "--reset-dataloader",
        "--reset-meters",
        "--required-batch-size-multiple",
        "1",
        "--arch",
        "bart_large",
    ]
    argv += ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--dropout", "0.1"]
    argv += ["--attention-dropout", "0.1", "--weight-decay", "0.01", "--optimizer", "adam", "--adam-betas"]
    argv += [
        "(0.9, 0.999)",
        "--adam-eps",
        "1e-08",
        "--clip-norm",
        "0.1",
        "--lr-scheduler",
        "polynomial_decay",
    ]
    argv += [
        "--lr",
        "3e-05",
        "--total-num-update",
        "20000",
        "--warmup-updates",
        "500",
        "--fp16",
        "--update-freq",
    ]
    argv += ["4", "--skip-invalid-size-inputs-valid-test", "--find-unused-parameters"]
    args = parse_train_args(argv)
    assert (args.arch, args.total_num_update, args.update_freq, args.lr) == (
        "bart_large",
        20000,
        [4],
        [3e-05],
    )
    assert (args.label_smoothing, args.clip_norm, args.adam_betas) == (0.1, 0.1, "(0.9, 0.999)")


@pytest.mark.slow
def test_user_dir_plugin_in_spawned_ranks(tmp_path, toy_databin):
    """Two spawned CPU ranks (fresh interpreters) import the plugin again and train with its criterion."""
    from seqtrain_cli.train import train_main

    log = tmp_path / "train.log"
    argv = [toy_databin(), "--user-dir", str(PLUGIN), "--arch", "toy_micro", "--criterion"]
    argv += ["toy_double_cross_entropy", "--cpu", "--max-tokens", "256", "--max-update", "2", "--lr", "1e-3"]
    argv += ["--distributed-world-size", "2", "--log-format", "json", "--log-interval", "1"]
    argv += ["--log-file", str(log), "--save-dir", str(tmp_path), "--disable-validation", "--no-save"]
    assert train_main(argv) in (0, None)
    stats = [
        json.loads(line.split(" | ", 3)[3])
        for line in log.read_text().splitlines()
        if "| train_inner |" in line
    ]
    assert len(stats) == 2 and all(s["loss"] == pytest.approx(2 * s["nll_loss"], abs=2e-3) for s in stats)
