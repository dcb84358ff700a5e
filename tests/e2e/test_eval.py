"""seqtrain-eval end to end: the command writes the JSON and the HTML page, and the page renders in a real headless
browser (Debian's chromium) without a console message and without reaching for anything outside the file."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import zlib

import pytest

from seqtrain_cli.eval import main
from tests.unit.evaluation.test_report import HYPOTHESES, OTHER, REFERENCES, SOURCES, TRAIN, _write

CHROMIUM = next(
    (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None
)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (apt-get install chromium) to render the page in"
)


def _pixels(png: bytes) -> tuple[int, int, list[tuple[int, ...]]]:
    """(width, height, RGB pixels) of an 8-bit, non-interlaced RGB or RGBA PNG (what chromium writes)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, head = 8, b"", None
    while pos < len(png):
        (length,), kind = struct.unpack(">I", png[pos : pos + 4]), png[pos + 4 : pos + 8]
        data = png[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", data)
        elif kind == b"IDAT":
            idat += data
        pos += 12 + length
    width, height, depth, color, _, _, interlace = head
    assert depth == 8 and color in (2, 6) and interlace == 0, head
    bpp = 3 if color == 2 else 4
    raw, stride, out, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out += [tuple(line[i : i + 3]) for i in range(0, stride, bpp)]
        prev = line
    return width, height, out


def render(page, png, tmp_path) -> str:
    """Screenshot `page` with headless chromium; returns its log (console messages are `:CONSOLE` lines)."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
           "--host-resolver-rules=MAP * ~NOTFOUND",  # nothing outside the file can be reached
           f"--screenshot={png}", "--window-size=1000,1400", f"file://{page}"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert png.is_file(), done.stderr[-2000:]
    return done.stderr


def _report(tmp_path, *extra):
    d = {
        "hyps": _write(tmp_path / "hyp.txt", HYPOTHESES),
        "other": _write(tmp_path / "other.txt", OTHER),
        "source": _write(tmp_path / "valid.source", SOURCES),
        "reference": _write(tmp_path / "valid.target", REFERENCES),
        "train": _write(tmp_path / "train.source", TRAIN),
    }
    log = tmp_path / "train.log"
    log.write_text(
        "".join(
            f'x | INFO | valid | {{"valid_loss": {9 - u / 100}, "valid_num_updates": {u}}}\n'
            for u in (100, 200, 300)
        )
    )
    main(["--hyps", d["hyps"], "--source", d["source"], "--reference", d["reference"], "--train-source",
          d["train"], "--compare", d["other"], "--train-log", str(log), "--bootstrap", "100", "--buckets", "2",
          "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html"), *extra])  # fmt: skip
    return json.loads((tmp_path / "r.json").read_text()), (tmp_path / "r.html").read_text()


def test_command_writes_json_and_a_self_contained_page(tmp_path, capsys):
    r, page = _report(tmp_path)
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(f"{tmp_path / 'hyp.txt'}: ROUGE-1 50.00 | ROUGE-2 50.00")
    assert "train duplicates: 1 exact, 2 with >= 80% 5-gram overlap, of 4 sources" in out
    assert r["rouge"]["rouge1"] == pytest.approx(50.0) and r["validation_curves"]["subsets"]["valid"][
        "loss"
    ] == [
        [100.0, 8.0],
        [200.0, 7.0],
        [300.0, 6.0],
    ]
    # self-contained: no script, no external reference (the SVG namespace is a name, not a request)
    assert "<script" not in page and not re.search(r"\b(src|href)\s*=", page)
    assert set(re.findall(r"https?://[^\"' ]+", page)) == {"http://www.w3.org/2000/svg"}
    # the length histograms (summaries, sources), ROUGE by bucket, its difference, the valid loss curve
    assert page.count("<svg") == 5
    assert "Dave saw 7 cats in Berlin" in page and "absent from source: 7, Berlin" in page


@pytest.mark.slow
@needs_chromium
def test_page_renders_in_headless_chromium_without_console_messages(tmp_path):
    _, page = _report(tmp_path)
    log = render(tmp_path / "r.html", tmp_path / "r.png", tmp_path)
    assert not [line for line in log.splitlines() if ":CONSOLE" in line], log
    width, height, pixels = _pixels((tmp_path / "r.png").read_bytes())
    assert (width, height) == (1000, 1400)
    not_white = sum(1 for p in pixels if p != (255, 255, 255))
    assert not_white > 0.01 * len(pixels)  # text, tables and plots drawn
    blue = sum(1 for p in pixels if abs(p[0] - 0x25) < 30 and abs(p[1] - 0x63) < 30 and abs(p[2] - 0xEB) < 30)
    assert blue > 500  # the SVG plots' first colour (#2563eb) is on screen: the plots rendered
    # the check would see a console message: the same browser run on a page that logs one
    control = tmp_path / "control.html"
    control.write_text('<!DOCTYPE html><p>x</p><script>console.error("seqtrain-eval control")</script>')
    log = render(control, tmp_path / "control.png", tmp_path)
    assert [line for line in log.splitlines() if ":CONSOLE" in line and "seqtrain-eval control" in line]
