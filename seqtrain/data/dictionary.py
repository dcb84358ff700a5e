"""fairseq's Dictionary: symbol <-> index mapping stored as `dict.txt` (`<symbol> <count>` per line).

Indices must match fairseq exactly, because released checkpoints (BART's dict.txt of GPT-2 ids as strings) and
fairseq data-bins are read with them: `<s>`=0 `<pad>`=1 `</s>`=2 `<unk>`=3 are implied, file lines follow in order,
and `finalize` sorts by count (descending), ties by symbol, then pads with `madeupword0000`.. to a multiple of
`padding_factor`.

Counting for preprocess works on byte ranges of a file (`find_offsets` / `count_chunk`), so N workers each count a
chunk and the merged counts are identical to a single pass.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO

import torch

from seqtrain.errors import SeqtrainError
from seqtrain.fileio import (
    MAX_LINE_BYTES,
    atomic_write,
    bounded_lines,
    decode_line,
    line_too_long,
    text_lines,
)
from seqtrain.workers import child_pool

OVERWRITE_FLAG = "#fairseq:overwrite"


class Dictionary:
    """A symbol table with counts, in fairseq's format and index order."""

    def __init__(
        self,
        bos: str = "<s>",
        pad: str = "<pad>",
        eos: str = "</s>",
        unk: str = "<unk>",
        extra_special_symbols: Sequence[str] | None = None,
    ):
        self.bos_word, self.pad_word, self.eos_word, self.unk_word = bos, pad, eos, unk
        self.symbols: list[str] = []
        self.count: list[int] = []
        self.indices: dict = {}
        self.bos_index = self.add_symbol(bos)
        self.pad_index = self.add_symbol(pad)
        self.eos_index = self.add_symbol(eos)
        self.unk_index = self.add_symbol(unk)
        for s in extra_special_symbols or ():
            self.add_symbol(s)
        self.nspecial = len(self.symbols)

    # --- lookup -------------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.symbols)

    def __getitem__(self, idx: int) -> str:
        if 0 <= idx < len(self.symbols):
            return self.symbols[idx]
        return self.unk_word

    def __contains__(self, sym: str) -> bool:
        return sym in self.indices

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Dictionary) and self.symbols == other.symbols and self.indices == other.indices
        )

    def __repr__(self) -> str:
        return f"Dictionary({len(self)} symbols)"

    def difference(self, other: Dictionary) -> str:
        """Where `other` first differs from this dictionary, for error messages ('' when equal)."""
        for i, (a, b) in enumerate(zip(self.symbols, other.symbols)):
            if a != b:
                return f"{len(self)} vs {len(other)} symbols, first difference at index {i}: {a!r} vs {b!r}"
        return "" if len(self) == len(other) else f"{len(self)} vs {len(other)} symbols"

    def index(self, sym: str) -> int:
        return self.indices.get(sym, self.unk_index)

    def bos(self) -> int:
        return self.bos_index

    def pad(self) -> int:
        return self.pad_index

    def eos(self) -> int:
        return self.eos_index

    def unk(self) -> int:
        return self.unk_index

    # --- building -----------------------------------------------------------------------------------------------
    def add_symbol(self, word: str, n: int = 1, overwrite: bool = False) -> int:
        """Add `n` to the count of `word` (appending it if new); `overwrite` appends a new entry even if present,
        and the name then points at the new entry (fairseq's rule, used by `#fairseq:overwrite` lines)."""
        if word in self.indices and not overwrite:
            idx = self.indices[word]
            self.count[idx] += n
            return idx
        idx = len(self.symbols)
        self.indices[word] = idx
        self.symbols.append(word)
        self.count.append(n)
        return idx

    def update(self, other: Dictionary) -> None:
        """Add all symbols and counts of `other` (in its order)."""
        for word in other.symbols:
            self.add_symbol(word, other.count[other.indices[word]])

    def add_counts(self, counter: Counter[str]) -> None:
        """Merge counts from `count_chunk`; sorted so the insertion order never depends on the chunking."""
        for word, n in sorted(counter.items()):
            self.add_symbol(word, n)

    def finalize(self, threshold: int = -1, nwords: int = -1, padding_factor: int = 8) -> None:
        """Keep specials, then the rest sorted by count desc / symbol asc; stop at `nwords` symbols in total or
        at the first count below `threshold`; pad to a multiple of `padding_factor`."""
        if nwords <= 0:
            nwords = len(self)
        ns = self.nspecial
        new_symbols = self.symbols[:ns]
        new_count = self.count[:ns]
        new_indices = {s: i for i, s in enumerate(new_symbols)}
        # A later duplicate (overwrite) wins, as in fairseq, where a dict() collapses them.
        rest = dict(sorted(zip(self.symbols[ns:], self.count[ns:])))
        ranked = sorted(
            rest.items(), key=lambda kv: kv[1], reverse=True
        )  # stable: ties stay sorted by symbol
        for symbol, n in ranked[: max(0, nwords - ns)]:
            if n < threshold:
                break
            new_indices[symbol] = len(new_symbols)
            new_symbols.append(symbol)
            new_count.append(n)
        self.symbols, self.count, self.indices = new_symbols, new_count, new_indices
        self.pad_to_multiple_(padding_factor)

    def pad_to_multiple_(self, padding_factor: int) -> None:
        if padding_factor > 1:
            i = 0
            while len(self) % padding_factor != 0:
                self.add_symbol(f"madeupword{i:04d}", n=0)
                i += 1

    # --- text <-> tensors ---------------------------------------------------------------------------------------
    def encode_line(
        self,
        line: str | Sequence[str],
        add_if_not_exist: bool = False,
        append_eos: bool = True,
        consumer: Callable[[str, int], None] | None = None,
    ) -> torch.IntTensor:
        """Symbols (a whitespace-separated str or a list) -> int32 tensor of indices, `</s>` appended."""
        words = line.split() if isinstance(line, str) else list(line)
        if add_if_not_exist:
            ids = [self.add_symbol(w) for w in words]
        else:
            get, unk = self.indices.get, self.unk_index
            ids = [get(w, unk) for w in words]
        if consumer is not None:
            for w, idx in zip(words, ids):
                consumer(w, idx)
        if append_eos:
            ids.append(self.eos_index)
        return torch.tensor(ids, dtype=torch.int32)

    def string(
        self,
        tensor: torch.Tensor | Iterable[int],
        bpe_symbol: str | None = None,
        extra_symbols_to_ignore: Iterable[int] | None = None,
        include_eos: bool = False,
        unk_string: str | None = None,
        separator: str = " ",
    ) -> str:
        """Indices -> symbols joined by `separator`, dropping pad, bos and (unless `include_eos`) eos.
        A 2-D tensor gives one line per row. `bpe_symbol` undoes subword joining as fairseq's post_process
        ("sentencepiece", "@@ ", "subword_nmt", or any continuation marker)."""
        if torch.is_tensor(tensor) and tensor.dim() == 2:
            return "\n".join(
                self.string(t, bpe_symbol, extra_symbols_to_ignore, include_eos, unk_string, separator)
                for t in tensor
            )
        ignore = set(int(i) for i in (extra_symbols_to_ignore or ()))
        ignore.update((self.pad_index, self.bos_index))
        if not include_eos:
            ignore.add(self.eos_index)
        ids = tensor.tolist() if torch.is_tensor(tensor) else [int(i) for i in tensor]
        unk = self.unk_word if unk_string is None else unk_string
        sent = separator.join(unk if i == self.unk_index else self[i] for i in ids if i not in ignore)
        return post_process(sent, bpe_symbol)

    # --- files and plain data -----------------------------------------------------------------------------------
    @classmethod
    def load(cls, f: str | os.PathLike | IO[str]) -> Dictionary:
        d = cls()
        d.add_from_file(f)
        return d

    def add_from_file(self, f: str | os.PathLike | IO[str]) -> None:
        """Add the symbols of a dict.txt (a path, or a text file object as fairseq takes), read with
        seqtrain.fileio's bound on a line's length and, from a path, strict UTF-8 naming file and line."""
        if isinstance(f, (str, os.PathLike)):
            try:
                fd = open(f, "rb")
            except FileNotFoundError:
                raise SeqtrainError(f"{f}: dictionary file not found") from None
            with fd:
                self._add_lines(text_lines(fd, os.fspath(f)), os.fspath(f))
            return
        name = getattr(f, "name", "<dictionary>")

        def stream_lines() -> Iterator[str]:
            for lineno in itertools.count(1):
                line = f.readline(MAX_LINE_BYTES + 1)
                if len(line) > MAX_LINE_BYTES and not line.endswith("\n"):
                    raise line_too_long(name, lineno)
                if not line:
                    return
                yield line

        self._add_lines(stream_lines(), name)

    def _add_lines(self, lines: Iterable[str], name: str) -> None:
        for lineno, raw in enumerate(lines, start=1):
            line = raw.rstrip()
            word, sep, field = line.rpartition(" ")
            overwrite = field == OVERWRITE_FLAG
            if overwrite:
                word, sep, field = word.rpartition(" ")
            try:
                n = int(field)
            except ValueError:
                n = None
            if not sep or n is None:
                raise SeqtrainError(
                    f"{name}:{lineno}: malformed dictionary line {line!r}; expected "
                    f"'<symbol> <count>' (optionally followed by ' {OVERWRITE_FLAG}')"
                )
            if word in self.indices and not overwrite:
                raise SeqtrainError(
                    f"{name}:{lineno}: duplicate symbol {word!r}; add ' {OVERWRITE_FLAG}' to the "
                    f"line if it is meant to replace the earlier entry"
                )
            self.add_symbol(word, n=n, overwrite=overwrite)

    def save(self, path: str | os.PathLike) -> None:
        """Write dict.txt atomically (specials are implied, so not written)."""
        with atomic_write(os.fspath(path), "w", encoding="utf-8") as f:
            f.write(self._dump())

    def _dump(self) -> str:
        seen = set(self.symbols[: self.nspecial])
        out = []
        for word, n in zip(self.symbols[self.nspecial :], self.count[self.nspecial :]):
            # A repeated symbol can only come from an overwrite; mark it so the file loads back the same.
            out.append(f"{word} {n} {OVERWRITE_FLAG}\n" if word in seen else f"{word} {n}\n")
            seen.add(word)
        return "".join(out)

    def to_list(self) -> list[list]:
        """All entries (specials included) as plain data for checkpoints."""
        return [[s, int(c)] for s, c in zip(self.symbols, self.count)]

    @classmethod
    def from_list(cls, entries: Sequence[Sequence]) -> Dictionary:
        """Inverse of `to_list`; the first four entries are the specials, in fairseq's order."""
        if len(entries) < 4:
            raise SeqtrainError(
                f"stored dictionary has {len(entries)} entries; needs at least the 4 specials"
            )
        d = cls(bos=entries[0][0], pad=entries[1][0], eos=entries[2][0], unk=entries[3][0])
        d.count[:4] = [int(e[1]) for e in entries[:4]]
        for word, n in entries[4:]:
            d.add_symbol(word, int(n), overwrite=word in d.indices)
        return d


def parse_langs(langs: str | None, flag: str = "--langs") -> list[str]:
    """The language codes of mBART's --langs ("en_XX,ro_RO"), in order; [] when not given."""
    if not langs:
        return []
    codes = [c.strip() for c in str(langs).split(",")]
    bad = [c for c in codes if not c or any(ch.isspace() for ch in c)]
    if bad or len(set(codes)) != len(codes):
        raise SeqtrainError(
            f"{flag} {langs!r}: expected distinct comma-separated language codes, e.g. en_XX,ro_RO"
        )
    return codes


def add_language_symbols(d: Dictionary, langs: str | None) -> Dictionary:
    """fairseq's translation_from_pretrained_bart: `[lang]` for each --langs code, then `<mask>`, appended to the
    dictionary in that order (mBART's pretraining put them there, so the embedding rows line up). Symbols already
    present (a dictionary stored with them) are not added again. Returns `d`, changed in place."""
    codes = parse_langs(langs)
    for sym in [f"[{c}]" for c in codes] + (["<mask>"] if codes else []):
        if sym not in d:
            d.add_symbol(sym)
    return d


def language_id(d: Dictionary, lang: str | None, flag: str, langs: str | None = None) -> int:
    """The index of `[lang]` in `d` (mBART's language token). fairseq's index() would give <unk> for a code
    missing from --langs and train on it silently; here that is an error naming `flag`."""
    sym = f"[{lang}]"
    if lang is None or sym not in d:
        known = f" (--langs {langs})" if langs else ""
        raise SeqtrainError(f"{flag} {lang!r}: the dictionary has no language token {sym}{known}")
    return d.index(sym)


def placeholder_dictionary(rows: int, tokens: list[str | None] | None = None) -> Dictionary:
    """A Dictionary of `rows` symbols: the four specials, then `tokens[i]` where given, else madeupwordNNNN (the
    names fairseq pads dictionaries with). Used where a checkpoint carries no dictionary and none is needed."""
    d = Dictionary()
    tokens = tokens or [None] * rows
    for i in range(len(d), rows):
        tok = tokens[i] if i < len(tokens) else None
        if tok is None or tok in d or not tok or any(c.isspace() for c in tok):
            tok = f"madeupword{i:04d}"
        d.add_symbol(tok)
    return d


def post_process(sentence: str, symbol: str | None) -> str:
    """Undo subword segmentation as fairseq's data_utils.post_process does for the common schemes."""
    if symbol is None or symbol == "none":
        return sentence
    if symbol == "sentencepiece":
        return sentence.replace(" ", "").replace("\u2581", " ").strip()
    if symbol == "subword_nmt":
        symbol = "@@ "
    return (sentence + " ").replace(symbol, "").rstrip()


# --- counting in chunks (parallel-friendly) -------------------------------------------------------------------
def find_offsets(path: str, num_chunks: int) -> list[int]:
    """Byte offsets splitting `path` into `num_chunks` ranges that each start at a line start.
    Returns num_chunks + 1 offsets (first 0, last the file size); ranges may be empty for few, long lines."""
    size = os.path.getsize(path)
    offsets = [0] * (num_chunks + 1)
    with open(path, "rb") as f:
        for i in range(1, num_chunks):
            pos = size * i // num_chunks
            if pos <= offsets[i - 1]:
                offsets[i] = offsets[i - 1]
                continue
            f.seek(pos - 1)
            f.readline(MAX_LINE_BYTES + 1)  # finish the line `pos - 1` is in (bounded: iter_lines refuses it)
            offsets[i] = min(f.tell(), size)
    offsets[num_chunks] = size
    return offsets


def iter_lines(path: str, start: int = 0, end: int = -1, first_lineno: int = 1) -> Iterator[str]:
    """Decoded lines (trailing newline removed) of the byte range [start, end) (`end` < 0: to the end), read
    with seqtrain.fileio's bound on a line's length and strict UTF-8 (errors name the file and line; in a range
    that starts past byte 0, the line counted from the range's start). Lines are split on '\\n' only, so a
    stray '\\r' or U+2028 inside a line never shifts source/target pairs."""
    name = path if start == 0 else f"{path} (the range from byte {start})"
    with open(path, "rb") as f:
        f.seek(start)
        pos = start
        for lineno, raw in enumerate(bounded_lines(f, name, first_lineno), first_lineno):
            if 0 <= end <= pos:
                break
            pos += len(raw)
            line = decode_line(raw, name, lineno)
            yield line[:-1] if line.endswith("\n") else line


def count_chunk(
    path: str,
    start: int = 0,
    end: int = -1,
    tokenize: Callable[[str], list[str]] | None = None,
    eos_word: str = "</s>",
) -> Counter[str]:
    """Symbol counts of one byte range, one `eos_word` per line (as fairseq counts). `tokenize` maps a line to
    symbols, a list or a space-separated str such as `Tokenizer.encode` returns (default: the line itself, split
    on whitespace); it must be picklable (a top-level function or a tokenizer's bound method) for a Pool."""
    counter: Counter = Counter()
    for line in iter_lines(path, start, end):
        symbols = tokenize(line) if tokenize is not None else line
        counter.update(symbols.split() if isinstance(symbols, str) else symbols)
        counter[eos_word] += 1
    return counter


def _count_chunk_star(args: tuple) -> Counter[str]:
    return count_chunk(*args)


def add_file_to_dictionary(
    path: str, d: Dictionary, tokenize: Callable[[str], list[str]] | None = None, num_workers: int = 1
) -> None:
    """Count the symbols of a text file into `d` using `num_workers` processes; same result for any count."""
    if not os.path.isfile(path):
        raise SeqtrainError(f"{path}: no such file")
    offsets = find_offsets(path, max(1, num_workers))
    jobs = [(path, a, b, tokenize, d.eos_word) for a, b in zip(offsets, offsets[1:]) if b > a]
    if num_workers > 1 and len(jobs) > 1:
        # the workers leave SIGTERM / SIGINT to this process
        with child_pool(min(num_workers, len(jobs))) as pool:
            counters = pool.map(_count_chunk_star, jobs)
    else:
        counters = [_count_chunk_star(j) for j in jobs]
    total: Counter = Counter()
    for c in counters:
        total.update(c)
    d.add_counts(total)


# fairseq spells it as a static method of Dictionary.
Dictionary.add_file_to_dictionary = staticmethod(add_file_to_dictionary)  # type: ignore[attr-defined]
