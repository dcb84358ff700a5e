"""Reliability, round two (issue 17): runs that could not end, writes before checks, unchecked data read from
checkpoints / Hugging Face folders / data-bins, OS errors as tracebacks, temporaries left by killed runs."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from seqtrain.errors import SeqtrainError
from seqtrain_cli.train import train_main
from tests.utils import REPO, base_args


@pytest.fixture(scope="module")
def databin(toy_databin):
    return toy_databin(n_train=40, n_valid=8)


def run_cli(cli: str, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"seqtrain_cli.{cli}", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )


def one_error_line(err: str, prog: str) -> str:
    lines = [
        ln for ln in err.strip().splitlines() if ln and " | WARNING | " not in ln and " | INFO | " not in ln
    ]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    return lines[0]


# ---------------------------------------------------------------------------------------------- item 1
@pytest.mark.slow
def test_an_epoch_without_a_batch_is_refused_at_once(databin, tmp_path):
    """Every training example longer than --max-tokens: the run used to loop over empty epochs forever."""
    argv = base_args(databin, str(tmp_path / "save"), "--max-tokens", "3", "--disable-validation")
    proc = run_cli("train", *argv, timeout=90)
    line = one_error_line(proc.stderr, "seqtrain-train")
    assert proc.returncode == 1 and "has no batch" in line and "--max-tokens 3" in line, line
    assert not os.path.exists(tmp_path / "save" / "checkpoint_last.pt")


def test_an_epoch_without_a_batch_in_process(databin, tmp_path):
    argv = base_args(databin, str(tmp_path / "save"), "--max-target-positions", "2", "--disable-validation")
    with pytest.raises(SeqtrainError, match="has no batch.*--max-target-positions 2"):
        train_main(argv)


# ---------------------------------------------------------------------------------------------- item 8
def test_log_file_in_a_missing_folder_is_one_line(databin, tmp_path, capsys):
    from seqtrain_cli.train import cli_main

    log = tmp_path / "missing" / "train.log"
    with pytest.raises(SystemExit) as e:
        cli_main(base_args(databin, str(tmp_path / "save"), "--log-file", str(log)))
    line = one_error_line(capsys.readouterr().err, "seqtrain-train")
    assert e.value.code == 1 and str(log) in line and "No such file or directory" in line, line


def test_debug_shows_the_os_error(databin, tmp_path):
    from seqtrain_cli.train import cli_main

    with pytest.raises(FileNotFoundError):
        cli_main(base_args(databin, str(tmp_path / "s"), "--log-file", str(tmp_path / "x" / "l"), "--debug"))


@pytest.fixture(scope="module")
def checkpoint(databin, tmp_path_factory):
    save = str(tmp_path_factory.mktemp("ck"))
    tiny = ("--encoder-layers", "1", "--decoder-layers", "1", "--max-update", "2", "--no-epoch-checkpoints")
    assert train_main(base_args(databin, save, *tiny)) == 0
    return os.path.join(save, "checkpoint_last.pt")


# ---------------------------------------------------------------------------------------------- item 3
def test_convert_checks_dict_txt_before_replacing_model_pt(checkpoint, tmp_path, capsys):
    from seqtrain_cli.convert import cli_main

    out = tmp_path / "export"
    out.mkdir()
    (out / "dict.txt").write_text("other 1\n")
    (out / "model.pt").write_bytes(b"the old model")
    with pytest.raises(SystemExit) as e:
        cli_main([checkpoint, str(out / "model.pt"), "--to", "fairseq"])
    line = one_error_line(capsys.readouterr().err, "seqtrain-convert")
    assert e.value.code == 1 and "dict.txt exists and differs" in line, line
    assert (out / "model.pt").read_bytes() == b"the old model"
    assert (out / "dict.txt").read_text() == "other 1\n"
    assert sorted(os.listdir(out)) == ["dict.txt", "model.pt"]  # no temporary left either


# ---------------------------------------------------------------------------------------------- item 11
@pytest.mark.parametrize("blank", ["\u200b\u200b", " \u200b\u2060 ", "\ufeff", "\u200d\t"])
def test_a_line_of_zero_width_characters_is_an_empty_line(tmp_path, capsys, blank):
    from seqtrain_cli.preprocess import cli_main

    (tmp_path / "train.src").write_text(f"a b\nc d\n{blank}\ne f\n", encoding="utf-8")
    (tmp_path / "train.tgt").write_text("a\nb\nc\nd\n", encoding="utf-8")
    argv = [
        "-s",
        "src",
        "-t",
        "tgt",
        "--trainpref",
        str(tmp_path / "train"),
        "--destdir",
        str(tmp_path / "bin"),
    ]
    with pytest.raises(SystemExit) as e:
        cli_main(argv + ["--tokenizer", "none", "--joined-dictionary"])
    line = one_error_line(capsys.readouterr().err, "seqtrain-preprocess")
    assert e.value.code == 1 and f"{tmp_path / 'train.src'}:3: empty line" in line, line
    assert not (tmp_path / "bin").exists()


# ---------------------------------------------------------------------------------------------- item 9
def _preprocess_argv(raw, dest) -> list:
    return ["-s", "src", "-t", "tgt", "--trainpref", f"{raw}/train", "--destdir", str(dest)]


def _write_pair(raw, n: int) -> None:
    raw.mkdir(exist_ok=True)
    words = [f"w{i}" for i in range(50)]
    line = " ".join(words[:20]) + "\n"
    (raw / "train.src").write_text(line * n)
    (raw / "train.tgt").write_text((" ".join(words[20:30]) + "\n") * n)


@pytest.mark.slow
def test_sigterm_removes_the_preprocess_work_folder(tmp_path):
    import signal
    import time

    raw, dest = tmp_path / "raw", tmp_path / "bin"
    _write_pair(raw, 400_000)
    dest.mkdir()
    cmd = [sys.executable, "-m", "seqtrain_cli.preprocess", *_preprocess_argv(raw, dest)]
    proc = subprocess.Popen(
        cmd + ["--tokenizer", "none", "--joined-dictionary", "--no-progress-bar"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    deadline = time.monotonic() + 60
    while not [n for n in os.listdir(dest) if n.startswith(".preprocess-")] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read()
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "Traceback" not in err and os.listdir(dest) == [], (err, os.listdir(dest))


def test_work_folders_of_dead_runs_are_removed_by_the_next_run(tmp_path, capsys):
    import socket

    from seqtrain_cli.preprocess import preprocess_main

    raw, dest = tmp_path / "raw", tmp_path / "bin"
    _write_pair(raw, 20)
    dest.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    stale = dest / f".preprocess-{dead.pid}@{host}.abcd_123"
    alive = dest / f".preprocess-{os.getpid()}@{host}.live_123"  # a run still going: kept
    other_host = dest / f".preprocess-{dead.pid}@not-{host}.abcd_123"  # cannot tell: kept
    unrelated = dest / ".preprocess-notmine"
    for folder in (stale, alive, other_host, unrelated):
        folder.mkdir()
        (folder / "train.src-tgt.src.bin").write_bytes(b"x" * 100)
    preprocess_main(_preprocess_argv(raw, dest) + ["--tokenizer", "none", "--joined-dictionary"])
    left = sorted(n for n in os.listdir(dest) if n.startswith("."))
    assert left == sorted([alive.name, other_host.name, unrelated.name])
    assert os.path.exists(dest / "preprocess.json")


# ---------------------------------------------------------------------------------------------- items 5, 7, 8 (HF)
@pytest.fixture(scope="module")
def hf_folder(checkpoint, tmp_path_factory):
    from seqtrain_cli.convert import main as convert_main

    out = str(tmp_path_factory.mktemp("hf") / "model")
    convert_main([checkpoint, out, "--to", "hf"])
    return out


def sharded_copy(hf_folder: str, dest, shard_name: str) -> str:
    """A copy of `hf_folder` whose model.safetensors.index.json names `shard_name` for every tensor."""
    import json
    import shutil

    from safetensors.torch import load_file

    folder = dest / "sharded"
    folder.mkdir()
    shutil.copy(os.path.join(hf_folder, "config.json"), folder)
    keys = sorted(load_file(os.path.join(hf_folder, "model.safetensors")))
    index = {"metadata": {}, "weight_map": {k: shard_name for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return str(folder)


def convert_error(capsys, *argv: str) -> str:
    from seqtrain_cli.convert import cli_main

    with pytest.raises(SystemExit) as e:
        cli_main(list(argv))
    line = one_error_line(capsys.readouterr().err, "seqtrain-convert")
    assert e.value.code == 1, line
    return line


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink"])
def test_hf_shard_index_cannot_point_outside_its_folder(hf_folder, tmp_path, capsys, where):
    import shutil

    outside = tmp_path / "elsewhere.safetensors"
    shutil.copy(os.path.join(hf_folder, "model.safetensors"), outside)  # loadable: old code took it silently
    name = {"parent": "../elsewhere.safetensors", "absolute": str(outside), "symlink": "link.safetensors"}[
        where
    ]
    folder = sharded_copy(hf_folder, tmp_path, name)
    if where == "symlink":
        os.symlink(outside, os.path.join(folder, "link.safetensors"))
    line = convert_error(capsys, folder, str(tmp_path / "out.pt"), "--to", "seqtrain")
    assert "is outside the model folder" in line and name in line, line
    assert not (tmp_path / "out.pt").exists()


def hub_cache(hf_folder: str, dest, escape: str | None = None) -> str:
    """The Hugging Face hub cache's layout for the model in `hf_folder`, sharded in two:
    models--org--bart/blobs/<sha256> and snapshots/<rev>/<name> -> ../../blobs/<sha256>. With `escape`, the
    second shard's link leads there instead. Returns the snapshot folder."""
    import hashlib
    import json

    from safetensors.torch import load_file, save_file

    repo = dest / "hub" / "models--org--bart"
    blobs, snap = repo / "blobs", repo / "snapshots" / ("a" * 40)
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    state = load_file(os.path.join(hf_folder, "model.safetensors"))
    keys = sorted(state)
    halves = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    files = {"config.json": open(os.path.join(hf_folder, "config.json"), "rb").read()}
    for name, part in halves.items():
        tmp = dest / name
        save_file({k: state[k] for k in part}, str(tmp))
        files[name] = tmp.read_bytes()
    index = {"metadata": {}, "weight_map": {k: n for n, part in halves.items() for k in part}}
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    for name, data in files.items():
        blob = hashlib.sha256(data).hexdigest()
        (blobs / blob).write_bytes(data)
        os.symlink(f"../../blobs/{blob}", snap / name)
    if escape is not None:
        os.remove(snap / "model-00002-of-00002.safetensors")
        os.symlink(escape, snap / "model-00002-of-00002.safetensors")
    return str(snap)


def test_hf_hub_cache_sharded_model_loads(hf_folder, tmp_path):
    """The hub cache's snapshot files are links into ../../blobs/: the shard check refused every sharded model
    there ("is outside the model folder"); the model loads, with the same weights as the single-file folder."""
    import torch

    from seqtrain.checkpoint.formats import read_checkpoint
    from seqtrain_cli.convert import main as convert_main

    snapshot = hub_cache(hf_folder, tmp_path)
    out = str(tmp_path / "out.pt")
    convert_main([snapshot, out, "--to", "seqtrain"])
    got, want = read_checkpoint(out).model, read_checkpoint(hf_folder).model
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_hf_hub_cache_link_leading_out_of_the_repository_is_refused(hf_folder, tmp_path, capsys):
    import shutil

    outside = tmp_path / "elsewhere.safetensors"
    shutil.copy(os.path.join(hf_folder, "model.safetensors"), outside)
    snapshot = hub_cache(hf_folder, tmp_path, escape=str(outside))
    line = convert_error(capsys, snapshot, str(tmp_path / "out.pt"), "--to", "seqtrain")
    repo = os.path.realpath(tmp_path / "hub" / "models--org--bart")
    assert line.endswith(
        f"shard 'model-00002-of-00002.safetensors' is outside the model folder {repo} (it leads to "
        f"{os.path.realpath(outside)}); refusing it"
    ), line
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.slow
def test_hf_shard_that_is_a_fifo_is_refused_not_read(hf_folder, tmp_path):
    folder = sharded_copy(hf_folder, tmp_path, "fifo.safetensors")
    os.mkfifo(os.path.join(folder, "fifo.safetensors"))
    proc = run_cli("convert", folder, str(tmp_path / "out.pt"), "--to", "seqtrain", timeout=60)
    line = one_error_line(proc.stderr, "seqtrain-convert")
    assert proc.returncode == 1 and "is not a regular file" in line, line


@pytest.mark.parametrize(
    "config, message",
    [("[1, 2]", "expected a JSON object"), ('{"model_type": "bart", "d_model": "wide"}', "malformed value")],
)
def test_malformed_hf_config_is_one_line(hf_folder, tmp_path, capsys, config, message):
    import shutil

    folder = tmp_path / "hf"
    shutil.copytree(hf_folder, folder)
    (folder / "config.json").write_text(config)
    line = convert_error(capsys, str(folder), str(tmp_path / "out.pt"), "--to", "seqtrain")
    assert "config.json" in line and message in line, line


def crafted(checkpoint: str, dest, change) -> str:
    import torch

    obj = torch.load(checkpoint, weights_only=True)
    change(obj)
    path = str(dest / "crafted.pt")
    torch.save(obj, path)
    return path


def _set_arg(name, value):
    return lambda obj: obj["args"].__setitem__(name, value)


@pytest.mark.parametrize(
    "change, message",
    [
        (_set_arg("encoder_embed_dim", 10**6), "encoder_embed_dim=1000000 is out of bounds"),
        (_set_arg("decoder_ffn_embed_dim", 60000), "does not match the stored decoder.layers.0.fc1.weight"),
        (_set_arg("encoder_layers", 40), "encoder_layers=40 but the weights hold 1 encoder layers"),
        (_set_arg("encoder_embed_dim", "16"), "encoder_embed_dim='16' is not an integer"),
        (lambda o: o["model"].__setitem__("encoder.layers.0.fc1.bias", [1.0]), "is a list, not a tensor"),
        (lambda o: o.__setitem__("tokenizer", "gpt2"), "tokenizer entry is a str"),
        (lambda o: o.__setitem__("src_dict", 5), "malformed dictionary data"),
    ],
    ids=["huge-dim", "ffn-vs-weights", "layers-vs-weights", "string-dim", "list-weight", "tokenizer", "dict"],
)
def test_crafted_checkpoint_is_refused_before_allocating(checkpoint, tmp_path, capsys, change, message):
    import resource

    path = crafted(checkpoint, tmp_path, change)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    line = convert_error(capsys, path, str(tmp_path / "out"), "--to", "hf")
    assert message in line, line
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: nothing big allocated
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------- item 6
def _poke_token(folder: str, split: str, value: int) -> None:
    """Write token id `value` into the middle of `split`'s target .bin."""
    from seqtrain.data.indexed_dataset import MMapIndexedDataset

    path = os.path.join(folder, f"{split}.src-tgt.tgt")
    ds = MMapIndexedDataset(path)
    data = np.memmap(path + ".bin", dtype=ds.dtype, mode="r+")
    data[len(data) // 2] = value
    data.flush()


@pytest.mark.parametrize("keep_max_id", [True, False], ids=["preprocess-json", "no-max-id-field"])
def test_token_ids_beyond_the_dictionary_are_refused_when_the_split_opens(databin, tmp_path, keep_max_id):
    import json
    import shutil

    from seqtrain.data.dictionary import Dictionary

    folder = str(tmp_path / "bin")
    shutil.copytree(databin, folder)
    size = len(Dictionary.load(os.path.join(folder, "dict.tgt.txt")))
    _poke_token(folder, "train", size + 3)
    meta = os.path.join(folder, "preprocess.json")
    if os.path.exists(meta):
        summary = json.load(open(meta))
        if keep_max_id:  # what preprocess would have recorded for such a .bin
            summary["splits"]["train"]["tgt"]["max_id"] = size + 3
        else:  # a data-bin from before the field existed: the .bin itself is checked
            for sides in summary["splits"].values():
                for side in sides.values():
                    side.pop("max_id", None)
        json.dump(summary, open(meta, "w"))
    with pytest.raises(
        SeqtrainError, match=rf"train.src-tgt.tgt.bin: .*token id {size + 3}.*seqtrain-preprocess"
    ):
        train_main(base_args(folder, str(tmp_path / "save"), "--max-update", "1"))
    assert not os.path.exists(tmp_path / "save" / "checkpoint_last.pt")


def test_check_data_finds_an_id_that_sampling_misses(tmp_path):
    from seqtrain.data import indexed_dataset as idx

    prefix = str(tmp_path / "train.src-tgt.tgt")
    with idx.MMapIndexedDatasetBuilder(prefix + ".bin", np.int32) as b:
        for i in range(2000):
            b.add_item(np.full(4000, 5 if i != 777 else 999, dtype=np.int32))
        b.finalize(prefix + ".idx")
    ds = idx.MMapIndexedDataset(prefix)
    old = idx.FULL_CHECK_BYTES
    idx.FULL_CHECK_BYTES = 0  # treat the 32 MB file as large: sampled
    try:
        idx.check_token_ids(ds, 100, "dict.tgt.txt")  # the one bad block lies between the samples
        with pytest.raises(SeqtrainError, match="token id 999 is out of range"):
            idx.check_token_ids(ds, 100, "dict.tgt.txt", full=True)
    finally:
        idx.FULL_CHECK_BYTES = old


def test_preprocess_records_the_largest_token_id(databin):
    import json

    summary = json.load(open(os.path.join(databin, "preprocess.json")))
    from seqtrain.data.dictionary import Dictionary

    size = len(Dictionary.load(os.path.join(databin, "dict.tgt.txt")))
    for sides in summary["splits"].values():
        for side in sides.values():
            assert 4 <= side["max_id"] < size


# ---------------------------------------------------------------------------------------------- item 4
def test_non_finite_weights_are_never_saved(databin, tmp_path):
    """--lr inf is refused at parse time; a library caller that sets it anyway still cannot poison
    checkpoint_last.pt: the save is refused and names the last good checkpoint."""
    import hashlib

    from seqtrain.flags.training import parse_train_args
    from seqtrain.train.loop import train
    from seqtrain.train.program import train_config

    save = str(tmp_path / "save")
    argv = base_args(
        databin, save, "--encoder-layers", "1", "--decoder-layers", "1", "--no-epoch-checkpoints"
    )
    argv += ["--save-interval-updates", "1", "--optimizer", "sgd"]
    assert train(train_config(parse_train_args(argv + ["--max-update", "2"]))) == 0
    last = os.path.join(save, "checkpoint_last.pt")
    before = hashlib.sha256(open(last, "rb").read()).hexdigest()
    args = parse_train_args(argv + ["--max-update", "4"])
    args.lr = [float("inf")]
    with pytest.raises(
        SeqtrainError,
        match=r"not finite .* at update 3: not saving .*; the last good update is 2 .*checkpoint_last.pt \(update 2\)",
    ):
        train(train_config(args))
    assert hashlib.sha256(open(last, "rb").read()).hexdigest() == before
    assert sorted(n for n in os.listdir(save) if n.startswith(".")) == []


# ---------------------------------------------------------------------------------------------- item 10
class _CtrlCInsideWrite:
    """A file whose 5th write gets a real SIGINT (the second Ctrl-C landing inside torch.save)."""

    def __init__(self, path: str):
        self.f, self.writes = open(path, "wb"), 0

    def write(self, b) -> int:
        import signal

        self.writes += 1
        if self.writes == 5:
            signal.raise_signal(signal.SIGINT)
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()


def test_second_ctrl_c_inside_a_checkpoint_write_exits_130(tmp_path, capsys, python_sigint):
    import signal

    import torch

    from seqtrain.train.stop_signals import GracefulStop
    from seqtrain_cli._main import run_cli

    def main(argv):
        with GracefulStop() as stop:
            signal.raise_signal(signal.SIGINT)  # the first Ctrl-C: recorded, training would save and stop
            assert stop.requested
            torch.save(
                {"w": torch.zeros(4096), "v": torch.ones(4096)}, _CtrlCInsideWrite(str(tmp_path / "c.pt"))
            )
        return 0

    with pytest.raises(SystemExit) as e:
        run_cli("seqtrain-train", main, [])
    err = capsys.readouterr().err
    assert e.value.code == 130 and err.strip() == "seqtrain-train: interrupted", err


def test_ctrl_c_inside_save_checkpoint_file_stays_a_keyboard_interrupt(tmp_path, monkeypatch):
    import torch

    from seqtrain.checkpoint import files as checkpoint

    real_save = torch.save

    def save(obj, f):  # the interrupt arrives inside the zip writer, as a real Ctrl-C can
        calls, real_write = [], f.write

        def write(b):
            calls.append(len(b))
            if len(calls) == 5:
                raise KeyboardInterrupt
            return real_write(b)

        f.write = write
        real_save(obj, f)

    monkeypatch.setattr(checkpoint.torch, "save", save)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint_file(
            {"w": torch.zeros(4096), "v": torch.ones(4096)}, str(tmp_path / "c.pt")
        )
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------------------------- stop checks
def test_sigterm_between_epochs_stops_before_another_update(databin, tmp_path):
    """A SIGTERM that arrives after an epoch's last update ends the run at the epoch boundary (it used to be
    read only after the next update)."""
    import logging
    import signal

    import torch

    from seqtrain.train.loop import logger as train_logger

    class SignalAtEpochEnd(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.getMessage().startswith("end of epoch 1 "):
                signal.raise_signal(signal.SIGTERM)
            return True

    hook = SignalAtEpochEnd()
    train_logger.addFilter(hook)
    save = tmp_path / "save"
    try:
        code = train_main(base_args(databin, str(save), "--max-epoch", "3", "--no-epoch-checkpoints"))
    finally:
        train_logger.removeFilter(hook)
    assert code == 143
    state = torch.load(save / "checkpoint_last.pt", weights_only=False)["extra_state"]["train_iterator"]
    assert (state["epoch"], state["iterations_in_epoch"]) == (2, 0)


@pytest.mark.parametrize(
    "err, expected",
    [
        ((28, "No space left on device", "/d/x.bin"), "/d/x.bin: No space left on device; the disk is full"),
        ((13, "Permission denied", "/ro/bin"), "/ro/bin: Permission denied; fix its permissions"),
        (
            (30, "Read-only file system", "/ro/bin"),
            "/ro/bin: Read-only file system; the filesystem is read-only",
        ),
    ],
)
def test_os_errors_become_one_line_with_a_remedy(capsys, err, expected):
    from seqtrain_cli._main import run_cli

    def main(argv):
        raise OSError(*err)

    with pytest.raises(SystemExit) as e:
        run_cli("seqtrain-preprocess", main, [])
    line = one_error_line(capsys.readouterr().err, "seqtrain-preprocess")
    assert e.value.code == 1 and expected in line, line


def test_a_run_ending_mid_epoch_leaves_no_data_loading_worker(databin, tmp_path, monkeypatch):
    """Issue 17 item 13: nothing may still read data while the process group is torn down and the interpreter
    exits; a run that stops mid-epoch stops its DataLoader workers (and data threads) itself, even while
    something (here the test; in a process, a reference cycle) still holds its task."""
    import multiprocessing
    import threading

    import seqtrain.train.loop

    tasks = []

    def keep(cfg):
        tasks.append(setup_task(cfg))
        return tasks[-1]

    setup_task = seqtrain.train.loop.setup_task
    monkeypatch.setattr(seqtrain.train.loop, "setup_task", keep)
    threads, children = set(threading.enumerate()), set(multiprocessing.active_children())
    argv = base_args(databin, str(tmp_path / "save"), "--max-update", "2", "--num-workers", "1")
    assert train_main([*argv, "--max-tokens", "64", "--disable-validation"]) == 0
    itr = next(iter(tasks[0]._iterators.values()))
    assert 0 < itr.iterations_in_epoch < len(itr)  # stopped mid-epoch
    assert set(multiprocessing.active_children()) <= children  # (other tests' workers may still be alive)
    assert set(threading.enumerate()) <= threads
