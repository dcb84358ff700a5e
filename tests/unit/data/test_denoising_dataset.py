"""The denoising dataset (seqtrain/data/denoising_dataset.py): word starts and full stops from the tokenizer,
examples `<s> block </s>` whose noise depends on (seed, epoch, index) only, the epoch seen by forked readers,
and right-padded batches."""

from __future__ import annotations

import torch

from seqtrain.data.denoising_dataset import DenoisingDataset, full_stop_index, word_start_table
from seqtrain.data.dictionary import Dictionary
from seqtrain.data.iterators import EpochBatchIterator
from seqtrain.data.noise import Noise
from seqtrain.data.token_blocks import TokenBlockDataset


class Tok:
    """A stand-in tokenizer: its kind, and GPT-2's decoding of a few ids."""

    def __init__(self, kind: str, texts: dict[str, str] | None = None):
        self.kind, self.texts = kind, texts or {}

    def decode(self, symbols: str) -> str:
        return self.texts[symbols]


def dictionary(symbols: list[str]) -> Dictionary:
    d = Dictionary()
    for s in symbols:
        d.add_symbol(s)
    d.add_symbol("<mask>")
    return d


def test_word_starts_per_tokenizer():
    spm = dictionary(["\u2581the", "re", "\u2581cat", ".", "madeupword0000"])
    assert word_start_table(spm, Tok("sentencepiece")).tolist() == [1, 1, 1, 1, 1, 0, 1, 0, 1, 0]
    gpt2 = dictionary(["464", "3797", "13", "<unk2>"])
    texts = {"464": "The", "3797": " cat", "13": "."}
    assert word_start_table(gpt2, Tok("gpt2", texts)).tolist() == [1, 1, 1, 1, 0, 1, 0, 1, 0]
    assert word_start_table(gpt2, Tok("none")) is None  # every symbol begins a word
    assert full_stop_index(gpt2, Tok("gpt2")) == gpt2.index("13")
    assert full_stop_index(spm, Tok("sentencepiece")) == spm.index(".")
    assert full_stop_index(dictionary(["a"]), Tok("none")) == 2  # no '.': </s>, as fairseq


def make_dataset(fixed_epoch=None) -> DenoisingDataset:
    d = dictionary([f"w{i}" for i in range(20)])
    g = torch.Generator().manual_seed(0)
    lines = [
        torch.cat([torch.randint(4, 24, (int(n),), generator=g), torch.tensor([2])]) for n in range(3, 30)
    ]
    blocks = TokenBlockDataset(lines, [len(x) for x in lines], 30, "complete", strip=2)
    noise = Noise(mask_idx=d.index("<mask>"), vocab_size=len(d), mask=0.3, insert=0.1, rotate=0.5)
    return DenoisingDataset(blocks, d, noise, seed=3, fixed_epoch=fixed_epoch)


def test_examples_depend_on_seed_epoch_and_index_only():
    ds = make_dataset()
    first = [ds[i] for i in range(len(ds))]
    for i in reversed(range(len(ds))):  # another reading order gives the same examples
        assert torch.equal(ds[i]["source"], first[i]["source"])
    for i, ex in enumerate(first):
        assert ex["target"].tolist() == [0, *ds.blocks[i].tolist(), 2]
        assert ex["source"][0] == 0 and ex["source"][-1] == 2
    assert ds.sizes.tolist() == [int(s) + 2 for s in ds.blocks.sizes]
    ds.set_epoch(2)
    second = [ds[i]["source"] for i in range(len(ds))]
    assert sum(not torch.equal(a["source"], b) for a, b in zip(first, second)) >= len(ds) // 2
    fixed = make_dataset(fixed_epoch=1)
    fixed.set_epoch(5)  # validation: epoch 1's noise at every validation
    assert all(torch.equal(fixed[i]["source"], first[i]["source"]) for i in range(len(ds)))


def test_batches_are_right_padded():
    ds = make_dataset()
    batch = ds.collater([ds[0], ds[5]])
    src, lengths = batch["net_input"]["src_tokens"], batch["net_input"]["src_lengths"]
    assert lengths[0] >= lengths[1]
    assert src[1, int(lengths[1]) :].eq(1).all() and src[1, 0] == 0  # pads after </s>, <s> first
    assert batch["net_input"]["prev_output_tokens"][:, 0].eq(2).all()
    assert batch["target"][:, 0].eq(0).all()


def test_iterator_sets_the_epoch_for_forked_workers_too():
    ds = make_dataset()
    batches = [list(range(i, min(i + 4, len(ds)))) for i in range(0, len(ds), 4)]

    def epoch_sources(num_workers: int, epoch: int) -> list[list[int]]:
        itr = EpochBatchIterator(ds, ds.collater, batches, seed=1, epoch=1, num_workers=num_workers)
        try:
            for _ in range(epoch):
                out = [b["net_input"]["src_tokens"].tolist() for b in itr.next_epoch_itr(shuffle=True)]
            return out
        finally:
            itr.close()

    inline = epoch_sources(0, 2)
    assert epoch_sources(1, 2) == inline  # the worker forked in epoch 1 draws epoch 2's noise in epoch 2
    assert epoch_sources(0, 1) != inline


def test_gpt2_word_starts_from_the_real_tokenizer(tmp_path):
    """GPT-2 BPE: an id begins a word when its text begins with a space (fairseq's GPT2BPE.is_beginning_of_word);
    a symbol that is not an id begins one, <mask> does not."""
    import json

    from seqtrain.data.tokenizer import GPT2BPETokenizer

    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    alphabet, extra = {}, 0
    for b in range(256):  # GPT-2's printable stand-in for every byte
        if b in keep:
            alphabet[b] = chr(b)
        else:
            alphabet[b], extra = chr(256 + extra), extra + 1
    vocab = {alphabet[b]: b for b in range(256)}
    vocab.update({"he": 256, "\u0120he": 257})
    (tmp_path / "encoder.json").write_text(json.dumps(vocab))
    (tmp_path / "vocab.bpe").write_text("#version: 0.2\nh e\n\u0120 he\n")
    tok = GPT2BPETokenizer.from_files(str(tmp_path / "encoder.json"), str(tmp_path / "vocab.bpe"))
    assert tok.encode("he he!") == "256 257 33"
    d = dictionary(["256", "257", "33", "104", "32", "<weird>"])
    assert word_start_table(d, tok).tolist() == [1, 1, 1, 1, 0, 1, 0, 0, 1, 1, 0]
