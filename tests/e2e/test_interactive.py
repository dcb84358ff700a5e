"""seqtrain-interactive: each buffer answered as soon as it is full or the input ends, in a pipe and on
a terminal (a pty), with the summaries seqtrain-generate writes; fairseq's lines with session-wide ids."""

import io
import os
import pty
import select
import subprocess
import sys

import pytest

from seqtrain.flags.parsers import UsageError
from seqtrain_cli.generate import generate_main
from seqtrain_cli.interactive import interactive_main

N = 7


@pytest.fixture
def tiny(fairseq_tiny, tmp_path):
    texts = (fairseq_tiny / "raw" / "valid.src").read_text(encoding="utf-8").split("\n")[:N]
    flags = [
        str(fairseq_tiny / "data-bin"),
        "--path",
        str(fairseq_tiny / "checkpoint_last.pt"),
        "-s",
        "src",
        "-t",
        "tgt",
        "--cpu",
        "--beam",
        "4",
    ]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = io.StringIO()
    generate_main(flags + ["--input", str(tmp_path / "in.txt")], out=out)
    return flags, texts, out.getvalue().split("\n")[:-1]


def test_buffers_give_generate_summaries_and_fairseq_lines(tiny):
    flags, texts, want = tiny
    out = io.StringIO()
    assert interactive_main(flags + ["--buffer-size", "3"], inp=io.StringIO("\n".join(texts)), out=out) == N
    assert out.getvalue().split("\n")[:-1] == want  # the last line has no newline: answered at end of input
    out = io.StringIO()
    interactive_main(
        flags + ["--buffer-size", "2", "--output-format", "fairseq"], io.StringIO("\n".join(texts)), out
    )
    d = [line.split("\t") for line in out.getvalue().split("\n") if line.startswith("D-")]
    assert [int(x[0][2:]) for x in d] == list(range(N)) and [x[2] for x in d] == want
    for flag in (["--results-path", "r"], ["--scoring", "rouge"], ["--compile"]):
        with pytest.raises(UsageError, match=f"^{flag[0]}: does nothing in seqtrain-interactive"):
            interactive_main(flags + flag, io.StringIO(""), io.StringIO())


def _read_line(fd, skip="", timeout=120.0):
    """Read from `fd` until a full line other than `skip` arrives; returns it (without \\r\\n)."""
    buf = b""
    while True:
        ready, _, _ = select.select([fd], [], [], timeout)
        assert ready, f"no answer within {timeout} s (got {buf!r})"
        buf += os.read(fd, 4096)
        for line in buf.decode().replace("\r", "").split("\n")[:-1]:
            if line and line != skip:
                return line


@pytest.mark.slow
def test_pipe_answers_each_line_before_the_input_ends(tiny):
    flags, texts, want = tiny
    cmd = [sys.executable, "-m", "seqtrain_cli.interactive"] + flags
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        for text, summary in zip(texts[:2], want[:2]):
            proc.stdin.write((text + "\n").encode())
            proc.stdin.flush()
            assert _read_line(proc.stdout.fileno()) == summary  # answered while stdin is still open
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()


@pytest.mark.slow
def test_terminal_answers_a_typed_line_then_ends_on_ctrl_d(tiny, tmp_path):
    flags, texts, want = tiny
    master, slave = pty.openpty()
    err = open(tmp_path / "stderr.txt", "w")
    cmd = [sys.executable, "-m", "seqtrain_cli.interactive"] + flags
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=err, close_fds=True)
    os.close(slave)
    try:
        os.write(master, (texts[0] + "\n").encode())
        # the terminal echoes the typed line; the summary comes next, before any EOF
        assert _read_line(master, skip=texts[0]) == want[0]
        os.write(master, b"\x04")  # Ctrl-D at the start of a line: end of input
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        os.close(master)
        err.close()
    assert "type a text and press Enter" in (tmp_path / "stderr.txt").read_text()
