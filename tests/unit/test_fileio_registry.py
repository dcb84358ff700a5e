"""seqtrain.registry (names, aliases, errors), seqtrain.fileio.atomic_write, and the bundled data sample."""

import os

import pytest

from seqtrain.fileio import atomic_write
from seqtrain.registry import Registry


def test_registry_aliases_and_unknown_name():
    r = Registry("arch")
    r.register("a", "alias")(1)
    assert r.get("a") == 1 and r.get("alias") == 1
    with pytest.raises(KeyError, match="unknown arch 'b'; choose from: a, alias"):
        r.get("b")
    with pytest.raises(ValueError):
        r.register("a")(2)


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    p = tmp_path / "f.txt"
    p.write_text("good")
    with pytest.raises(RuntimeError):
        with atomic_write(str(p), "w") as f:
            f.write("half")
            raise RuntimeError("boom")
    assert p.read_text() == "good"
    assert os.listdir(tmp_path) == ["f.txt"]
    with atomic_write(str(p), "w") as f:
        f.write("new")
    assert p.read_text() == "new"


def test_bundled_sample_is_aligned(sample_dir):
    for split, n in (("train", 5000), ("valid", 300), ("test", 300)):
        src = (sample_dir / f"{split}.source").read_text(encoding="utf-8").split("\n")[:-1]
        tgt = (sample_dir / f"{split}.target").read_text(encoding="utf-8").split("\n")[:-1]
        assert len(src) == len(tgt) == n
        assert all(s.strip() and t.strip() for s, t in zip(src, tgt))


def test_atomic_write_publishes_with_normal_permissions(tmp_path):
    from seqtrain.fileio import DEFAULT_FILE_MODE

    p = tmp_path / "g.txt"
    with atomic_write(str(p), "w") as f:
        f.write("x")
    assert os.stat(p).st_mode & 0o777 == DEFAULT_FILE_MODE
