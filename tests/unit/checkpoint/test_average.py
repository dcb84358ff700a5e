"""seqtrain-average-checkpoints: the tensor mean of seqtrain and fairseq checkpoints (fairseq's summation order,
so fp32 results are bit for bit), fairseq's folder selection, and the output's use (generate, fine-tune)."""

from __future__ import annotations

import argparse
import os

import pytest
import torch

from seqtrain.checkpoint.average import average_checkpoints, last_n_checkpoints
from seqtrain.checkpoint.fairseq import model_config
from seqtrain.checkpoint.files import load_checkpoint_file, save_checkpoint_file
from seqtrain.checkpoint.load import load_model
from seqtrain.checkpoint.native import make_checkpoint_state
from seqtrain.checkpoint.train_state import TrainState
from seqtrain.data.dictionary import Dictionary
from seqtrain.errors import SeqtrainError
from seqtrain.models.bart import build_model
from seqtrain_cli.average_checkpoints import cli_main
from tests.utils import completed


def make_dict(n_words: int = 20) -> Dictionary:
    d = Dictionary()
    for i in range(n_words):
        d.add_symbol(f"w{i}", n=100 - i)
    return d


def tiny_states(
    n: int, dtype: torch.dtype = torch.float32
) -> tuple[argparse.Namespace, Dictionary, list[dict]]:
    """`n` state dicts of one tiny BART with different random weights."""
    d = make_dict()
    args = argparse.Namespace(arch="bart_tiny", encoder_layers=1, decoder_layers=1, dropout=0.0)
    states = []
    for seed in range(n):
        torch.manual_seed(seed)
        model = build_model(model_config(completed(args)), d, d).to(dtype)
        states.append({k: v.clone() for k, v in model.state_dict().items()})
    return args, d, states


def save_seqtrain(path, args, d, state, **extra) -> str:
    opt = {"state": {0: {"exp_avg": torch.ones(3)}}, "param_groups": []}
    save_checkpoint_file(
        make_checkpoint_state(
            args, state, d, d, training=TrainState.from_dict({"optimizer": opt, "extra_state": extra})
        ),
        str(path),
    )
    return str(path)


def run(*argv: str) -> int:
    with pytest.raises(SystemExit) as e:
        cli_main(list(argv))
    return e.value.code


def test_seqtrain_checkpoints_average_to_the_tensor_mean(tmp_path):
    args, d, states = tiny_states(3)
    paths = [save_seqtrain(tmp_path / f"c{i}.pt", args, d, s) for i, s in enumerate(states)]
    assert run("--inputs", *paths, "--output", str(tmp_path / "avg.pt")) == 0
    out = load_checkpoint_file(str(tmp_path / "avg.pt"))
    assert list(out["model"]) == list(states[0])
    for k, first in states[0].items():
        want = (
            first.clone() + states[1][k] + states[2][k]
        ) / 3  # fairseq's order: sum in input order, divide once
        assert torch.equal(out["model"][k], want), k
    k = "encoder.layers.0.fc1.weight"  # random weights: the mean is none of the inputs
    assert all(not torch.equal(out["model"][k], s[k]) for s in states)
    # settings and dictionaries of the first input; no optimizer state
    assert out["format"] == "seqtrain" and out["args"]["arch"] == "bart_tiny"
    assert out["src_dict"] == d.to_list() and out["optimizer"] is None and out["lr_scheduler"] is None
    # it loads as a model whose weights are the mean
    lm = load_model(str(tmp_path / "avg.pt"))
    got = lm.model.state_dict()
    assert all(torch.equal(got[k], out["model"][k]) for k in got)


def test_half_precision_is_averaged_in_fp32_and_integers_floor_divided(tmp_path):
    args, d, states = tiny_states(2, torch.float16)
    for i, s in enumerate(states):
        s["counter"] = torch.tensor([3 + 2 * i])  # 3 and 5: floor((3 + 5) / 2) = 4; an int entry stays int
    paths = [save_seqtrain(tmp_path / f"c{i}.pt", args, d, s) for i, s in enumerate(states)]
    out = average_checkpoints(paths)["model"]
    k = "encoder.layers.0.fc1.weight"
    assert out[k].dtype == torch.float32
    assert torch.equal(out[k], (states[0][k].float() + states[1][k].float()) / 2)
    assert out["counter"].dtype == torch.int64 and out["counter"].tolist() == [4]


def test_fairseq_checkpoints_average_and_keep_their_format(tmp_path):
    args, d, states = tiny_states(2)
    paths = []
    for i, s in enumerate(states):
        state = dict(s)
        state["encoder.version"] = torch.tensor([3.0])
        p = str(tmp_path / f"checkpoint{i + 1}.pt")
        save_checkpoint_file(
            {
                "args": None,
                "cfg": {"model": args},
                "model": state,
                "extra_state": {},
                "last_optimizer_state": {},
            },
            p,
        )
        paths.append(p)
    d.save(str(tmp_path / "dict.txt"))
    assert (
        run("--inputs", str(tmp_path), "--num-epoch-checkpoints", "2", "--output", str(tmp_path / "avg.pt"))
        == 0
    )
    out = load_checkpoint_file(str(tmp_path / "avg.pt"), unsafe=True)
    assert "cfg" in out and "last_optimizer_state" not in out
    k = "decoder.layers.0.fc2.weight"
    # newest first: checkpoint2 + checkpoint1, then divided
    assert torch.equal(out["model"][k], (states[1][k].clone() + states[0][k]) / 2)
    lm = load_model(str(tmp_path / "avg.pt"), dict_path=str(tmp_path / "dict.txt"), unsafe=True)
    assert torch.equal(lm.model.state_dict()[k], out["model"][k])


def test_folder_selection_follows_fairseq(tmp_path):
    for name in ("checkpoint_1_100.pt", "checkpoint_1_200.pt", "checkpoint_2_300.pt", "checkpoint_2_400.pt"):
        (tmp_path / name).write_bytes(b"x")
    for name in (
        "checkpoint1.pt",
        "checkpoint2.pt",
        "checkpoint10.pt",
        "checkpoint_last.pt",
        "checkpoint_best.pt",
    ):
        (tmp_path / name).write_bytes(b"x")
    folder = str(tmp_path)
    assert last_n_checkpoints(folder, 2, update_based=True) == [
        os.path.join(folder, "checkpoint_2_400.pt"),
        os.path.join(folder, "checkpoint_2_300.pt"),
    ]
    assert last_n_checkpoints(folder, 2, update_based=True, upper_bound=300) == [
        os.path.join(folder, "checkpoint_2_300.pt"),
        os.path.join(folder, "checkpoint_1_200.pt"),
    ]
    # epochs sort as numbers (10 after 2), and _last / _best never count
    assert last_n_checkpoints(folder, 3, update_based=False) == [
        os.path.join(folder, f"checkpoint{e}.pt") for e in (10, 2, 1)
    ]
    with pytest.raises(SeqtrainError, match=r"found 2 checkpoint_E_U.pt files at or below 200, need 3"):
        last_n_checkpoints(folder, 3, update_based=True, upper_bound=200)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--checkpoint-upper-bound", "5"], "--checkpoint-upper-bound needs --num-epoch-checkpoints"),
        (["--num-epoch-checkpoints", "0"], "--num-epoch-checkpoints must be >= 1, got 0"),
        (["--num-update-checkpoints", "1", "--num-epoch-checkpoints", "1"], "not allowed with argument"),
    ],
)
def test_bad_flags_are_one_line(tmp_path, capsys, argv, message):
    args, d, states = tiny_states(1)
    p = save_seqtrain(tmp_path / "c.pt", args, d, states[0])
    code = run(
        "--inputs", p if "--num-epoch-checkpoints" not in argv else str(tmp_path), *argv, "--output", "x.pt"
    )
    err = capsys.readouterr().err.strip()
    assert code in (1, 2) and message in err and len(err.splitlines()) == 1, err


def test_mismatched_inputs_are_refused_and_nothing_is_written(tmp_path, capsys):
    args, d, states = tiny_states(2)
    a = save_seqtrain(tmp_path / "a.pt", args, d, states[0])
    other = dict(states[1])
    other.pop("decoder.layers.0.fc1.bias")
    b = save_seqtrain(tmp_path / "b.pt", args, d, other)
    assert run("--inputs", a, b, "--output", str(tmp_path / "avg.pt")) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        f"seqtrain-average-checkpoints: error: {b}: parameters differ from {a}'s "
        "(missing ['decoder.layers.0.fc1.bias']); average one model's checkpoints"
    )
    assert not (tmp_path / "avg.pt").exists()
    assert run("--inputs", a, b, "--output", a) == 1  # never over an input
    assert "(the same file): writing it would replace that input" in capsys.readouterr().err


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda args, d: (argparse.Namespace(**{**vars(args), "activation_fn": "relu"}), d),
            "architecture argument activation_fn='relu', {a} has activation_fn='gelu'",
        ),
        (
            lambda args, d: (
                args,
                Dictionary.from_list([[s if s != "w3" else "x3", c] for s, c in d.to_list()]),
            ),
            "its source dictionary differs from {a}'s (symbol 7 is 'x3', not 'w3')",
        ),
    ],
    ids=["another-activation", "another-dictionary"],
)
def test_another_model_of_equal_shapes_is_refused(tmp_path, capsys, change, message):
    """Equal names and shapes do not make one model (issue 40): another activation, or another dictionary (a row
    would be averaged with another word's), is refused naming the first difference; nothing is written."""
    args, d, states = tiny_states(2)
    args = argparse.Namespace(**{**vars(args), "activation_fn": "gelu"})
    a = save_seqtrain(tmp_path / "a.pt", args, d, states[0])
    b = save_seqtrain(tmp_path / "b.pt", *change(args, d), states[1])
    assert run("--inputs", a, b, "--output", str(tmp_path / "avg.pt")) == 1
    err = capsys.readouterr().err.strip()
    assert (
        err
        == f"seqtrain-average-checkpoints: error: {b}: {message.format(a=a)}; average one model's checkpoints"
    )
    assert not (tmp_path / "avg.pt").exists()
