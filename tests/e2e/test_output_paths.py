"""What the tools do with what is already at an output path (seqtrain.fileio.output_target): a regular file is
replaced atomically, a symbolic link is followed and its target written, a FIFO, a device or a descriptor of the
process is written in place and never replaced, a folder is a one-line error. Device nodes are made in the
test's own temporary folder (root only), never the machine's /dev entries."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import threading

import pytest

from seqtrain.errors import SeqtrainError
from seqtrain.fileio import atomic_write, link_or_copy, output_target, publish
from tests.utils import REPO, base_args

NULL_LIKE, FULL_LIKE = (1, 3), (1, 7)  # the numbers of the kernel's null and full devices


class FifoReader:
    """Reads a FIFO to its end in a thread (a writer's open waits until a reader has it open)."""

    def __init__(self, path):
        self.data: list[bytes] = []
        self.thread = threading.Thread(target=lambda: self.data.append(open(path, "rb").read()), daemon=True)
        self.thread.start()

    def result(self, timeout: float = 60) -> bytes:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the FIFO's reader never saw the end of its input"
        return self.data[0]


def device(path, numbers: tuple[int, int]) -> str:
    """A character device node at `path` (in the test's folder), or skip where nodes cannot be made."""
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(*numbers))
        with open(path, "wb"):
            pass
    except PermissionError as e:
        pytest.skip(f"device nodes cannot be made or opened here ({e.strerror})")
    return str(path)


def is_char_device(path, numbers: tuple[int, int]) -> bool:
    st = os.lstat(path)
    return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == numbers


# ------------------------------------------------------------------------------------------------ the primitive
def test_regular_file_is_replaced_atomically_and_a_failed_write_keeps_it(tmp_path):
    p = tmp_path / "out.txt"
    p.write_text("old")
    inode = os.stat(p).st_ino
    with pytest.raises(RuntimeError), atomic_write(p, "w") as f:
        f.write("half")
        raise RuntimeError("boom")
    assert p.read_text() == "old" and os.listdir(tmp_path) == ["out.txt"]
    with atomic_write(p, "w") as f:
        f.write("new")
    assert p.read_text() == "new" and os.stat(p).st_ino != inode  # a new file renamed over the old one


def test_a_link_is_followed_and_its_target_replaced_in_the_target_folder(tmp_path):
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    (there / "real.txt").write_text("old")
    link = here / "out.txt"
    link.symlink_to(there / "real.txt")
    with pytest.raises(RuntimeError), atomic_write(link, "w") as f:
        f.write("half")
        assert os.listdir(here) == ["out.txt"] and len(os.listdir(there)) == 2  # the temporary is there
        raise RuntimeError("boom")
    assert (there / "real.txt").read_text() == "old" and os.listdir(there) == ["real.txt"]
    with atomic_write(link, "w") as f:
        f.write("new")
    assert link.is_symlink() and os.readlink(link) == str(there / "real.txt")
    assert (there / "real.txt").read_text() == "new" and os.listdir(there) == ["real.txt"]
    assert output_target(link).where == str(there / "real.txt")


def test_a_dangling_link_gets_its_target_created(tmp_path):
    link = tmp_path / "out.json"
    link.symlink_to("sub/result.json")  # relative to the link's folder, which has no sub/ yet
    with atomic_write(link, "w") as f:
        f.write("{}")
    assert link.is_symlink() and os.readlink(link) == "sub/result.json"
    assert (tmp_path / "sub" / "result.json").read_text() == "{}"


@pytest.mark.parametrize("via_link", [False, True], ids=["fifo", "link-to-fifo"])
def test_a_fifo_is_written_in_place_and_stays_a_fifo(tmp_path, via_link):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    path = fifo
    if via_link:
        path = tmp_path / "out.txt"
        path.symlink_to(fifo)
    reader = FifoReader(fifo)
    with atomic_write(path, "w") as f:  # flushed, closed, never fsynced (a pipe cannot be: EINVAL)
        f.write("line 1\nline 2\n")
    assert reader.result() == b"line 1\nline 2\n"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and path.is_symlink() == via_link
    assert sorted(os.listdir(tmp_path)) == sorted({"pipe", path.name})  # no temporary file anywhere


def test_a_device_is_written_in_place_and_stays_a_device(tmp_path):
    null = device(tmp_path / "null", NULL_LIKE)
    link = tmp_path / "to-null"
    link.symlink_to(null)
    for path in (null, link):
        with atomic_write(path, "wb") as f:
            f.write(b"x" * 100_000)
    assert is_char_device(null, NULL_LIKE) and link.is_symlink()
    full = device(tmp_path / "full", FULL_LIKE)
    with pytest.raises(OSError) as e, atomic_write(full, "w") as f:
        f.write("{}")
    assert e.value.errno == errno.ENOSPC and e.value.filename == full  # the one line names the output
    assert is_char_device(full, FULL_LIKE) and sorted(os.listdir(tmp_path)) == ["full", "null", "to-null"]


def test_a_descriptor_of_this_process_is_written_through_it(tmp_path):
    """/proc/self/fd/N (also /dev/stdout, /dev/fd/N): written at the descriptor's offset, with its flags; the
    regular file behind it is not replaced (which would cut it off from the descriptor, and lose what `>>`
    had kept)."""
    log = tmp_path / "log.txt"
    log.write_text("kept\n")
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    r, w = os.pipe()
    try:
        inode = os.stat(log).st_ino
        link = tmp_path / "out.txt"
        link.symlink_to(f"/proc/self/fd/{fd}")
        with atomic_write(link, "w") as f:
            f.write("appended\n")
        os.write(fd, b"the descriptor's own write\n")
        assert log.read_text() == "kept\nappended\nthe descriptor's own write\n"
        assert os.stat(log).st_ino == inode and link.is_symlink()
        with atomic_write(f"/dev/fd/{w}", "w") as f:
            f.write("to the pipe\n")
        os.write(w, b"the descriptor stays open\n")  # atomic_write closed only its duplicate
        assert os.read(r, 100) == b"to the pipe\nthe descriptor stays open\n"
    finally:
        for d in (fd, r, w):
            os.close(d)


def test_a_folder_at_the_path_is_one_line_naming_it(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    link = tmp_path / "link"
    link.symlink_to(folder)
    for path in (folder, link):
        with pytest.raises(SeqtrainError, match=f"^{path}: is a folder; give a file name$"):
            with atomic_write(path, "w") as f:
                f.write("x")
    assert os.listdir(folder) == [] and sorted(os.listdir(tmp_path)) == ["link", "results"]


def test_publish_and_link_or_copy_follow_the_same_rule(tmp_path):
    src = tmp_path / "checkpoint_1_2.pt"
    src.write_bytes(b"checkpoint bytes")
    there = tmp_path / "there"
    there.mkdir()
    (there / "last.pt").write_bytes(b"older")
    last = tmp_path / "checkpoint_last.pt"
    last.symlink_to(there / "last.pt")
    link_or_copy(str(src), last)  # a hard link made in the target's folder, renamed over the target
    assert last.is_symlink() and os.path.samefile(there / "last.pt", src)
    assert os.listdir(there) == ["last.pt"]
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    link_or_copy(str(src), fifo)  # a FIFO cannot be linked: the bytes are copied into it
    assert reader.result() == b"checkpoint bytes" and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    tmp = tmp_path / ".work" / "dict.txt"
    tmp.parent.mkdir()
    tmp.write_text("a 1\n")
    reader = FifoReader(fifo)
    publish(str(tmp), fifo)
    assert reader.result() == b"a 1\n" and not tmp.exists() and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_preprocess_refuses_a_folder_in_the_way_before_moving_anything(tmp_path):
    from seqtrain.preprocess.databin import publish as publish_databin

    work, dest = tmp_path / ".work", tmp_path / "bin"
    work.mkdir(), dest.mkdir()
    for name in ("dict.src.txt", "dict.tgt.txt", "preprocess.json"):
        (work / name).write_text(name)
    (dest / "dict.tgt.txt").mkdir()
    with pytest.raises(SeqtrainError, match="dict.tgt.txt: is a folder"):
        publish_databin(str(work), str(dest))
    assert os.listdir(dest) == ["dict.tgt.txt"] and len(os.listdir(work)) == 3


# ------------------------------------------------------------------------------------------------ the programs
def run_cli(cli: str, *argv: str, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", f"seqtrain_cli.{cli}", *argv],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
        env=env,
        **kwargs,
    )


@pytest.fixture
def texts(tmp_path):
    (tmp_path / "sys.txt").write_text("the cat sat on the mat\na dog\n")
    (tmp_path / "ref.txt").write_text("the cat sat on a mat\na dog barked\n")
    return str(tmp_path / "sys.txt"), str(tmp_path / "ref.txt")


@pytest.mark.slow
def test_score_json_into_a_fifo_and_a_full_device(tmp_path, texts):
    hyp, ref = texts
    fifo = tmp_path / "scores.fifo"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    proc = run_cli("score", "--sys", hyp, "--ref", ref, "--json", str(fifo))
    assert proc.returncode == 0, proc.stderr
    scores = json.loads(reader.result())
    assert scores["n"] == 2 and scores["sys"] == hyp and 0 < scores["rouge1"] < 100
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    full = device(tmp_path / "full", FULL_LIKE)
    proc = run_cli("score", "--sys", hyp, "--ref", ref, "--json", full)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"seqtrain-score: error: {full}: No space left on device"), proc.stderr
    assert is_char_device(full, FULL_LIKE)


@pytest.mark.slow
def test_generate_output_through_links_to_stdout_and_to_a_file(toy_databin, tmp_path):
    from seqtrain_cli.train import train_main

    data = toy_databin(n_train=40, n_valid=8)
    save = str(tmp_path / "ck")
    assert (
        train_main(
            base_args(data, save, "--encoder-layers", "1", "--decoder-layers", "1", "--max-update", "2")
        )
        == 0
    )
    argv = [data, "--path", f"{save}/checkpoint_last.pt", "-s", "src", "-t", "tgt", "--cpu", "--beam", "2"]
    argv += ["--gen-subset", "valid", "--output-format", "text", "--no-progress-bar"]
    # what plain stdout gets (in this process: the same generate a console script runs, one process start less)
    import io

    from seqtrain_cli.generate import generate_main

    plain = io.StringIO()
    generate_main(list(argv), out=plain)
    expected = plain.getvalue()
    assert expected.count("\n") == 8
    to_stdout = tmp_path / "out.txt"
    to_stdout.symlink_to("/proc/self/fd/1")  # the program's own stdout: the pipe the test reads
    proc = run_cli("generate", *argv, "--output", str(to_stdout))
    assert proc.returncode == 0 and proc.stdout == expected, proc.stderr
    assert os.readlink(to_stdout) == "/proc/self/fd/1"
    there = tmp_path / "there"
    there.mkdir()
    (there / "hyp.txt").write_text("old")
    to_file = tmp_path / "hyp.txt"
    to_file.symlink_to(there / "hyp.txt")
    proc = run_cli("generate", *argv, "--output", str(to_file), "--results-path", str(tmp_path / "res"))
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    assert to_file.is_symlink() and (there / "hyp.txt").read_text() == expected
    assert os.listdir(there) == ["hyp.txt"]


# ------------------------------------------------------------------------------------------------ a full disk
def test_a_checkpoint_written_to_a_full_device_names_it(tmp_path):
    """torch.save turns the ENOSPC of its writer into RuntimeError('... unexpected pos ...'): seqtrain-convert
    and a training save on a full disk ended with that traceback."""
    import torch

    from seqtrain.checkpoint.files import save_checkpoint_file

    full = device(tmp_path / "full", FULL_LIKE)
    with pytest.raises(OSError) as e:
        save_checkpoint_file({"w": torch.zeros(100_000)}, full)
    assert (e.value.errno, e.value.filename) == (errno.ENOSPC, full)
    assert is_char_device(full, FULL_LIKE) and os.listdir(tmp_path) == ["full"]


@pytest.mark.slow
def test_generate_stdout_and_log_file_on_a_full_device(fairseq_tiny, tmp_path):
    """Standard output on a full disk said only 'No space left on device'; a --log-file there printed logging's
    '--- Logging error ---' traceback for every record, then that same bare line."""
    full = device(tmp_path / "full", FULL_LIKE)
    argv = [str(fairseq_tiny / "data-bin"), "--path", str(fairseq_tiny / "checkpoint_last.pt"), "-s", "src",
            "-t", "tgt", "--cpu", "--gen-subset", "valid"]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    with open(full, "w") as stdout:
        proc = subprocess.run(
            [sys.executable, "-m", "seqtrain_cli.generate", *argv],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=180,
            cwd=REPO,
            env=env,
        )
    lines = [ln for ln in proc.stderr.splitlines() if " | INFO | " not in ln]
    assert proc.returncode == 1 and lines == [
        "seqtrain-generate: error: stdout: No space left on device; the disk is full; free space and rerun"
    ], proc.stderr
    out = tmp_path / "out.txt"
    proc = run_cli("generate", *argv, "--log-file", full, "--output", str(out))
    lines = [ln for ln in proc.stderr.splitlines() if " | INFO | " not in ln]
    assert proc.returncode == 0 and len(lines) == 1, proc.stderr
    assert lines[0].endswith(
        f" | WARNING | seqtrain.logging | --log-file {full}: cannot write (No space left on device); it gets no "
        "more log lines (they still go to the console)"
    ), lines
    assert sum(ln.startswith("H-") for ln in out.read_text().splitlines()) == 200  # the run went on
