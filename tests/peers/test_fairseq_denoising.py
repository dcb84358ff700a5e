"""seqtrain's noise functions (seqtrain/data/noise.py) against fairseq 0.12's DenoisingDataset methods (the
`fairseq` marker; skipped when fairseq's venv is absent): the same inputs and the same random draws give the
same tensors.

fairseq draws from torch's global generator, seqtrain from the generator it is given: fairseq's side seeds the
global one with `torch.manual_seed(s)`, seqtrain's gets `torch.Generator().manual_seed(s)`. Rotation's offset is
numpy's draw in fairseq (`np.random.seed(s)`); seqtrain's `rotate` is given the same offset. Every case is an
example `<s> tokens </s>` of 3 to 80 random tokens from a 64-symbol vocabulary (+ `<mask>`), with a random
word-start table for the whole-word modes; 40 seeds per setting.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import subprocess

import numpy as np
import pytest
import torch

from seqtrain.data import noise as N

VENV = pathlib.Path(os.environ.get("FAIRSEQ_VENV") or pathlib.Path.home() / ".cache/seqtrain-peers/fairseq")
pytestmark = [
    pytest.mark.fairseq,
    pytest.mark.slow,
    pytest.mark.skipif(
        not (VENV / "bin" / "python").exists()
        or not list(VENV.glob("lib/python3*/site-packages/fairseq/data/denoising_dataset.py")),
        reason=f"fairseq 0.12 not installed at {VENV} (set FAIRSEQ_VENV, or run ../shared/tools/fairseq-peer.sh)",
    ),
]

VOCAB = 64  # w0..w59 after the 4 specials; <mask> is index 64, len(dictionary) 65
FULL_STOP = 7

# Runs in fairseq's venv: one DenoisingDataset per setting, each method called after torch.manual_seed(seed).
FAIRSEQ_SIDE = r"""
import json, sys
import numpy as np, torch
from fairseq.data import Dictionary
from fairseq.data.denoising_dataset import DenoisingDataset

cases = json.load(sys.stdin)
d = Dictionary()
for i in range(4, VOCAB):
    d.add_symbol(f"w{i}")
mask_idx = d.add_symbol("<mask>")
out = []
for c in cases:
    s = c["setting"]
    ws = None if s.get("word_starts") is None else torch.ByteTensor(s["word_starts"])
    ds = DenoisingDataset([], np.array([], dtype=np.int64), d, mask_idx, ws, shuffle=False, seed=1,
        mask=s.get("mask", 0.0), mask_random=s.get("mask_random", 0.0), insert=0.0, rotate=0.0,
        permute_sentences=0.0, bpe=None, replace_length=s.get("replace_length", 1),
        mask_length=s.get("mask_length", "subword"), poisson_lambda=s.get("poisson_lambda", 3.0))
    ds.full_stop_index = FULL_STOP
    tokens = torch.tensor(c["tokens"], dtype=torch.long)
    torch.manual_seed(c["seed"])
    np.random.seed(c["seed"])
    fn = s["fn"]
    if fn == "mask":
        r = ds.add_whole_word_mask(tokens.clone(), s["mask"])
    elif fn == "insert":
        r = ds.add_insertion_noise(tokens.clone(), s["p"])
    elif fn == "permute_sentences":
        r = ds.permute_sentences(tokens.clone(), s["p"])
    elif fn == "permute":
        r = ds.add_permuted_noise(tokens.clone(), s["p"])
    elif fn == "rotate":
        r = ds.add_rolling_noise(tokens.clone())
    out.append(r.tolist())
json.dump(out, sys.stdout)
""".replace("VOCAB", str(VOCAB)).replace("FULL_STOP", str(FULL_STOP))

SETTINGS = {
    "subword, replace 1, random 0.1": {"fn": "mask", "mask": 0.3, "mask_random": 0.1, "replace_length": 1},
    "subword, replace 0": {"fn": "mask", "mask": 0.3, "replace_length": 0},
    "word, replace 1, random 0.2": {"fn": "mask", "mask": 0.35, "mask_random": 0.2, "mask_length": "word"},
    "word, replace -1": {"fn": "mask", "mask": 0.3, "mask_length": "word", "replace_length": -1},
    "span-poisson 3, replace 1": {
        "fn": "mask",
        "mask": 0.3,
        "mask_random": 0.1,
        "mask_length": "span-poisson",
    },
    "span-poisson 3.5, replace 0": {
        "fn": "mask",
        "mask": 0.4,
        "mask_length": "span-poisson",
        "replace_length": 0,
        "poisson_lambda": 3.5,
    },
    "span-poisson 0.5, replace -1, random 0.5": {
        "fn": "mask",
        "mask": 0.3,
        "mask_random": 0.5,
        "mask_length": "span-poisson",
        "replace_length": -1,
        "poisson_lambda": 0.5,
    },
    "insert 0.2, random 0.3": {"fn": "insert", "p": 0.2, "mask_random": 0.3},
    "permute sentences 1.0": {"fn": "permute_sentences", "p": 1.0},
    "permute sentences 0.5": {"fn": "permute_sentences", "p": 0.5},
    "permute tokens 0.3": {"fn": "permute", "p": 0.3},
    "rotate": {"fn": "rotate"},
}


def make_cases() -> list[dict]:
    r = random.Random(0)
    cases = []
    for name, setting in SETTINGS.items():
        setting = dict(setting)
        if setting.get("mask_length") in ("word", "span-poisson"):
            setting["word_starts"] = [1] * 4 + [int(r.random() < 0.6) for _ in range(4, VOCAB)] + [0]
        for seed in range(40):
            n = r.randint(3, 80)
            body = [r.randrange(4, VOCAB) for _ in range(n)]
            if setting["fn"] == "permute_sentences":  # sentences end in FULL_STOP, some back to back
                body = [FULL_STOP if r.random() < 0.15 else t for t in body]
            cases.append({"name": name, "setting": setting, "seed": seed, "tokens": [0, *body, 2]})
    return cases


def ours(case: dict) -> list[int]:
    s = case["setting"]
    noise = N.Noise(
        mask_idx=VOCAB,
        vocab_size=VOCAB + 1,
        mask=s.get("mask", 0.0),
        mask_random=s.get("mask_random", 0.0),
        replace_length=s.get("replace_length", 1),
        mask_length=s.get("mask_length", "subword"),
        poisson_lambda=s.get("poisson_lambda", 3.0),
        full_stop=FULL_STOP,
        word_starts=None if s.get("word_starts") is None else torch.tensor(s["word_starts"]),
    )
    tokens = torch.tensor(case["tokens"], dtype=torch.long)
    g = torch.Generator().manual_seed(case["seed"])
    fn = s["fn"]
    if fn == "mask":
        out = N.mask_words(tokens.clone(), s["mask"], noise, g)
    elif fn == "insert":
        out = N.insert_tokens(tokens, s["p"], noise.mask_idx, noise.vocab_size, noise.mask_random, g)
    elif fn == "permute_sentences":
        out = N.permute_sentences(tokens, s["p"], FULL_STOP, g)
    elif fn == "permute":
        out = N.permute_tokens(tokens, s["p"], g)
    else:  # fairseq's numpy draw of the offset, handed to seqtrain's rotate
        np.random.seed(case["seed"])
        out = N.rotate(tokens, int(np.random.randint(1, max(1, len(tokens) - 1) + 1)))
    return out.tolist()


@pytest.fixture(scope="module")
def fairseq_results() -> tuple[list[dict], list[list[int]]]:
    cases = make_cases()
    env = {
        k: v for k, v in os.environ.items() if k != "PYTHONPATH"
    }  # fairseq's venv must not import seqtrain
    proc = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", FAIRSEQ_SIDE],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        env=dict(env, OMP_NUM_THREADS="1"),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cases, json.loads(proc.stdout)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_noise_function_equals_fairseqs(name, fairseq_results):
    cases, theirs = fairseq_results
    mine = [(c, t) for c, t in zip(cases, theirs) if c["name"] == name]
    assert len(mine) == 40
    changed = 0
    for case, expected in mine:
        got = ours(case)
        assert got == expected, f"{name}, seed {case['seed']}: {got} != fairseq's {expected}"
        changed += got != case["tokens"]
    assert changed >= 20  # the noise did something in most cases, so equality says something


# fairseq 0.12's denoising task's blocks: StripTokenDataset(</s>) under TokenBlockDataset(sizes with </s>)
BLOCKS_SIDE = r"""
import json, sys
import numpy as np, torch
from fairseq.data import StripTokenDataset, TokenBlockDataset

class Lines:
    def __init__(self, lines):
        self.lines = [torch.tensor(x, dtype=torch.long) for x in lines]
        self.sizes = np.array([len(x) for x in lines], dtype=np.int64)
    def __len__(self):
        return len(self.lines)
    def __getitem__(self, i):
        return self.lines[i]

out = []
for c in json.load(sys.stdin):
    lines = Lines(c["lines"])
    blocks = TokenBlockDataset(StripTokenDataset(lines, 2), lines.sizes, c["block"], pad=1, eos=2,
        break_mode=c["mode"], document_sep_len=0)
    out.append({"sizes": [int(s) for s in blocks.sizes], "items": [blocks[i].tolist() for i in range(len(blocks))]})
json.dump(out, sys.stdout)
"""


def test_token_blocks_equal_fairseqs():
    from seqtrain.data.token_blocks import TokenBlockDataset

    r = random.Random(1)
    cases = []
    for mode in ("none", "complete", "complete_doc", "eos"):
        for block in (1, 5, 30, 126):
            lines = [
                [r.randrange(4, 60) for _ in range(r.choice([0, 0, 1, 3, 10, 40]))] + [2] for _ in range(60)
            ]
            cases.append({"mode": mode, "block": block, "lines": lines})
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", BLOCKS_SIDE],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        env=dict(env, OMP_NUM_THREADS="1"),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for case, theirs in zip(cases, json.loads(proc.stdout)):
        lines = [torch.tensor(x) for x in case["lines"]]
        ours = TokenBlockDataset(lines, [len(x) for x in lines], case["block"], case["mode"], strip=2)
        where = f"{case['mode']}, block {case['block']}"
        assert ours.sizes.tolist() == theirs["sizes"], where
        assert [ours[i].tolist() for i in range(len(ours))] == theirs["items"], where
        assert len(theirs["sizes"]) > 1


WORD_STARTS_SIDE = r"""
import json, sys
from argparse import Namespace
from fairseq.data import Dictionary
from fairseq.data.encoders.utils import get_whole_word_mask

folder, spm = sys.argv[1], sys.argv[2]
d = Dictionary.load(folder + "/dict.txt")
d.add_symbol("<mask>")  # as the denoising task, before it builds the mask
mask = get_whole_word_mask(Namespace(bpe="sentencepiece", sentencepiece_model=spm), d)
json.dump(mask.tolist(), sys.stdout)
"""


def test_sentencepiece_word_starts_equal_fairseqs(tmp_path):
    """fairseq's get_whole_word_mask with its sentencepiece BPE, on a data-bin of seqtrain-preprocess
    --only-source (what fairseq-train-spm.py gives fairseq's denoising task), against word_start_table."""
    from seqtrain.data.denoising_dataset import word_start_table
    from seqtrain.data.dictionary import Dictionary
    from seqtrain.data.tokenizer import load_databin_tokenizer
    from seqtrain_cli.preprocess import preprocess_main
    from tests.utils import SAMPLE

    lines = (SAMPLE / "train.source").read_text(encoding="utf-8").splitlines(keepends=True)[:300]
    (tmp_path / "text").write_text("".join(lines), encoding="utf-8")
    dest = tmp_path / "bin"
    preprocess_main(["--only-source", "--trainpref", str(tmp_path / "text"), "--destdir", str(dest)]
                    + ["--spm-vocab-size", "500", "--no-progress-bar"])  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", WORD_STARTS_SIDE, str(dest), str(dest / "spm.model")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = json.loads(proc.stdout)
    d = Dictionary.load(str(dest / "dict.txt"))
    d.add_symbol("<mask>")
    ours = word_start_table(d, load_databin_tokenizer(str(dest))).tolist()
    assert ours == theirs
    assert 100 < sum(theirs) < len(theirs) - 100  # both kinds of pieces are there
