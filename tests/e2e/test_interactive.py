"""seqtrain-interactive: each buffer answered as soon as it is full or the input ends, in a pipe and on
a terminal (a pty), with the summaries seqtrain-generate writes; fairseq's lines with session-wide ids."""

import io
import os
import pty
import re
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


def _start(module: str, flags: list, close: int | None = None, locale: str = "C.UTF-8") -> subprocess.Popen:
    """Start `python -m seqtrain_cli.MODULE FLAGS` with a stdin pipe, or with descriptor `close` (0 or 1)
    closed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LC_ALL": locale, "PYTHONIOENCODING": ""}
    env.pop("PYTHONUTF8", None)
    return subprocess.Popen(
        [sys.executable, "-m", f"seqtrain_cli.{module}"] + flags,
        stdin=subprocess.PIPE if close is None else None,
        stdout=subprocess.PIPE if close is None else None,
        stderr=subprocess.PIPE,
        preexec_fn=(lambda: os.close(close)) if close is not None else None,
        env=env,
    )


def _finish(proc: subprocess.Popen, stdin: bytes | None = None):
    """(exit code, stdout, stderr lines other than INFO records) of a process from _start."""
    try:
        out, err = proc.communicate(stdin, timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [ln for ln in err.decode().splitlines() if ln.strip() and " | INFO | " not in ln]
    return proc.returncode, out, lines


def _cli(module: str, flags: list, stdin: bytes | None, close: int | None = None, locale: str = "C.UTF-8"):
    """Run `python -m seqtrain_cli.MODULE FLAGS` with `stdin`, or with descriptor `close` (0 or 1) closed."""
    return _finish(_start(module, flags, close, locale), stdin)


@pytest.mark.slow
@pytest.mark.parametrize("locale", ["C", "C.UTF-8"])
def test_invalid_utf8_on_stdin_is_one_line_naming_stdin_and_line(tiny, locale):
    """Under the C locale Python reads stdin with 'surrogateescape': invalid bytes reached sentencepiece as
    surrogates (a traceback there); in a UTF-8 locale the line was named '-'."""
    flags, texts, want = tiny
    data = (texts[0] + "\n").encode() + b"caf\xe9 " + texts[1].encode() + b"\n"
    # both programs start side by side
    gen = _start("generate", flags + ["--input", "-"], locale=locale)
    code, out, err = _cli("interactive", flags + ["--buffer-size", "1"], data, locale=locale)
    assert code == 1 and err == [
        "seqtrain-interactive: error: stdin:2: invalid UTF-8 (byte 0xe9 at byte 4 of the line)"
    ], err
    assert out.decode().split("\n")[:-1] == want[:1]  # the line before it was answered
    code, out, err = _finish(gen, data)
    assert code == 1 and err == [
        "seqtrain-generate: error: stdin:2: invalid UTF-8 (byte 0xe9 at byte 4 of the line)"
    ]
    assert out == b""


@pytest.mark.slow
def test_closed_stdin_or_stdout_is_one_line(tiny, tmp_path):
    """Started with 0<&- or 1>&-, Python has no sys.stdin / sys.stdout: 'NoneType' object has no attribute
    'isatty' (or 'writelines', after all the work)."""
    flags, _, _ = tiny
    closed_stdout = "stdout is closed: the summaries have nowhere to go"
    cases = [
        ("interactive", [], 0, "stdin is closed: give the text on stdin, or with --input FILE"),
        ("interactive", [], 1, f"{closed_stdout}; run with stdout open"),
        (
            "generate",
            ["--input", "-"],
            0,
            "--input -: stdin is closed; give the text on stdin, or --input FILE",
        ),
        ("generate", ["--input", str(tmp_path / "in.txt")], 1, f"{closed_stdout}; give --output FILE"),
    ]
    # the four processes run side by side (each is refused on its own; they share nothing)
    procs = [_start(module, flags + extra, close=fd) for module, extra, fd, _ in cases]
    for (module, _extra, fd, line), proc in zip(cases, procs):
        code, _, err = _finish(proc)
        assert (code, err) == (1, [f"seqtrain-{module}: error: {line}"]), (module, fd, err)


def test_truncated_sources_get_generates_warning(tiny, tmp_path, caplog):
    """A source longer than the model takes is cut to fit in both programs: interactive says so as generate does
    (same line, ids counted over the session), and answers what generate answers."""
    flags, texts, _ = tiny
    flags = flags + ["--max-source-positions", "8"]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = io.StringIO()
    caplog.set_level("WARNING")
    generate_main(flags + ["--input", str(tmp_path / "in.txt")], out=out)
    gen_warnings = [r.getMessage() for r in caplog.records if "truncated" in r.getMessage()]
    caplog.clear()
    answers = io.StringIO()
    interactive_main(flags + ["--buffer-size", str(N)], inp=io.StringIO("\n".join(texts) + "\n"), out=answers)
    warnings = [r.getMessage() for r in caplog.records if "truncated" in r.getMessage()]
    assert len(gen_warnings) == 1 and re.fullmatch(
        rf"truncated (\d+) of {N} sources longer than 8 tokens to fit; first ids: \[[\d, ]+\]",
        gen_warnings[0],
    )
    assert warnings == gen_warnings
    assert answers.getvalue() == out.getvalue()
    # issue 48, class 11: a line at a time, the warning came for every line cut; now once a session, the last
    # line counting them all
    n_cut = int(gen_warnings[0].split()[1])
    caplog.clear()
    caplog.set_level("INFO")
    interactive_main(
        flags + ["--buffer-size", "1"], inp=io.StringIO("\n".join(texts) + "\n"), out=io.StringIO()
    )
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and warned[0].startswith("truncated 1 of 1 sources longer than 8 tokens to fit")
    last = caplog.records[-1].getMessage()
    assert last.startswith(f"Generated {N} sentences") and last.endswith(
        f"; {n_cut} sources truncated to 8 tokens"
    )
