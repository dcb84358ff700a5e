"""fairseq's --bpe flags (`--bpe sentencepiece --sentencepiece-model FILE`, `--bpe gpt2 --gpt2-encoder-json
... --gpt2-vocab-bpe ...`) checked against the data-bin's own tokenizer: a fairseq command runs unchanged where
they name it, and is refused with one line where they name another. Read by the tasks (train) and generate."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from seqtrain.data.dictionary import Dictionary
from seqtrain.data.tokenizer import GPT2BPETokenizer, SentencePieceTokenizer, load_databin_tokenizer
from seqtrain.errors import SeqtrainError


@dataclass
class BpeConfig:
    """fairseq's --bpe flags (declared in seqtrain.flags.fairseq_compat, read here)."""

    bpe: str | None = None
    sentencepiece_model: str | None = None
    gpt2_encoder_json: str | None = None
    gpt2_vocab_bpe: str | None = None


def _read_bytes(path: str, flag: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise SeqtrainError(f"{flag} {path}: cannot read it ({e.strerror or e})") from None


def _named_tokenizer(cfg: BpeConfig) -> tuple[Any, list[tuple[str, str, bytes]]] | None:
    """(the tokenizer fairseq's --bpe flags name, [(flag, path, bytes) of each file given]); None without --bpe.
    fairseq's default gpt2 files are URLs, which seqtrain does not fetch: those name no file to compare."""
    bpe, spm = cfg.bpe, cfg.sentencepiece_model
    if bpe is None:
        given = [f for f, v in (("--sentencepiece-model", spm),) if v]
        if given:
            raise SeqtrainError(f"{given[0]} needs --bpe sentencepiece (as in fairseq)")
        return None
    if bpe == "sentencepiece":
        if not spm:
            raise SeqtrainError("--bpe sentencepiece needs --sentencepiece-model FILE (as in fairseq)")
        data = _read_bytes(spm, "--sentencepiece-model")
        try:
            tok = SentencePieceTokenizer(data)
        except Exception:  # sentencepiece's own parse error (a RuntimeError naming its C++ source line)
            raise SeqtrainError(f"--sentencepiece-model {spm}: not a sentencepiece model file") from None
        return tok, [("--sentencepiece-model", spm, data)]
    files = [
        (flag, path, _read_bytes(path, flag))
        for flag, path in (
            ("--gpt2-encoder-json", cfg.gpt2_encoder_json),
            ("--gpt2-vocab-bpe", cfg.gpt2_vocab_bpe),
        )
        if path and not path.startswith(("http://", "https://"))
    ]
    if len(files) == 2:
        return GPT2BPETokenizer(files[0][2].decode("utf-8"), files[1][2].decode("utf-8")), files
    return None, files  # the data-bin's gpt2 tokenizer is the one (its files compared below, if given)


def databin_tokenizer(cfg: BpeConfig, data_dir: str) -> Any:
    """The data-bin's tokenizer (seqtrain.data.tokenizer.load_databin_tokenizer), checked against fairseq's
    --bpe flags when given: the same kind and the same model file bytes; a fairseq data-bin (no tokenizer.json)
    takes the model they name once every dictionary symbol is one of its tokens."""
    have = load_databin_tokenizer(data_dir)
    named = _named_tokenizer(cfg)
    if named is None:
        return have
    tok, files = named
    bpe = cfg.bpe
    if have.kind == "none" and not os.path.exists(os.path.join(data_dir, "tokenizer.json")):
        if tok is None:
            raise SeqtrainError(
                f"--bpe gpt2: {data_dir} has no tokenizer.json; give the local --gpt2-encoder-json and "
                "--gpt2-vocab-bpe files (seqtrain does not fetch fairseq's URLs)"
            )
        known = _token_symbols(tok)
        for name in sorted(n for n in os.listdir(data_dir) if n.startswith("dict.") and n.endswith(".txt")):
            d = Dictionary.load(os.path.join(data_dir, name))
            odd = [s for s in d.symbols[d.nspecial :] if s not in known and not s.startswith("madeupword")]
            if odd:
                raise SeqtrainError(
                    f"--bpe {bpe} {files[0][1]}: {data_dir}/{name} holds {odd[0]!r}, which it never writes: the "
                    "data-bin was not made with it"
                )
        return tok
    if have.kind != bpe:
        raise SeqtrainError(
            f"--bpe {bpe}: {data_dir} was made with the {have.kind} tokenizer (its tokenizer.json)"
        )
    own = have.files()
    for flag, path, data in files:
        name = {"--sentencepiece-model": "spm.model", "--gpt2-encoder-json": "encoder.json"}.get(
            flag, "vocab.bpe"
        )
        if own.get(name) != data:
            raise SeqtrainError(
                f"{flag} {path}: differs from the tokenizer of the data-bin {data_dir} (its {name}, in "
                "tokenizer.json): give the model the data-bin was made with, or drop the flag"
            )
    return have


def _token_symbols(tok: Any) -> set[str]:
    """The dictionary symbols a tokenizer writes: sentencepiece's pieces, GPT-2's ids as decimal strings."""
    if tok.kind == "sentencepiece":
        return {tok.sp.IdToPiece(i) for i in range(tok.vocab_size)}
    return {str(i) for i in range(tok.vocab_size)}
