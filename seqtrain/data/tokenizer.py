"""Tokenizers: raw text <-> a line of dictionary symbols separated by single spaces.

Kinds (registered in `seqtrain.registry.TOKENIZERS`):
- `sentencepiece`: pieces as symbols; trained here (deterministic, one thread) or loaded from a .model file.
- `gpt2`: GPT-2 byte-level BPE (the `tokenizers` library) written as decimal ids, fairseq BART's convention
  ("31414 232"); released BART dict.txt files list exactly these strings. Lossless.
- `none`: the text is already symbols; whitespace split / join.
- `tokenizer_json`: a Hugging Face `tokenizer.json` (the `tokenizers` library) written as its tokens, for a
  folder whose sentencepiece model is gone: transformers' `save_pretrained` (and peft's merge and save) keep
  tokenizer.json but not the spm.model of a seqtrain export. The export's tokenizer.json is the sentencepiece
  model in transformers' terms, so its tokens are the sentencepiece pieces.

`spec()` is plain JSON-able data holding everything needed to rebuild a tokenizer (model files embedded), so a
checkpoint or `data-bin/tokenizer.json` carries it; `build_tokenizer(spec)` is the inverse. Tokenizers pickle as
their spec, so multiprocessing workers rebuild them cheaply.
"""

from __future__ import annotations

import base64
import io
import json
import os
from collections.abc import Iterable, Sequence

from seqtrain.config import setting, settings
from seqtrain.data.dictionary import iter_lines
from seqtrain.errors import SeqtrainError
from seqtrain.fileio import atomic_write
from seqtrain.flag_bounds import INT_MAX, Bounds
from seqtrain.registry import TOKENIZERS

TOKENIZER_JSON = "tokenizer.json"
SPEC_VERSION = 1


class Tokenizer:
    kind = "?"

    def encode(self, text: str) -> str:
        raise NotImplementedError

    def decode(self, symbols: str) -> str:
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[str]:
        return [self.encode(t) for t in texts]

    def spec(self) -> dict:
        raise NotImplementedError

    @classmethod
    def from_spec(cls, spec: dict) -> Tokenizer:
        raise NotImplementedError

    def files(self) -> dict[str, bytes]:
        """Model files worth copying next to tokenizer.json for people and other tools (name -> bytes)."""
        return {}

    # Pickle as the spec: native handles (SentencePieceProcessor, tokenizers.Tokenizer) are rebuilt in workers.
    def __getstate__(self) -> dict:
        return self.spec()

    def __setstate__(self, spec: dict) -> None:
        self.__dict__.update(self.from_spec(spec).__dict__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokenizer) and self.spec() == other.spec()

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


@TOKENIZERS.register("none")
class WhitespaceTokenizer(Tokenizer):
    kind = "none"

    def encode(self, text: str) -> str:
        return " ".join(text.split())

    def decode(self, symbols: str) -> str:
        return " ".join(symbols.split())

    def spec(self) -> dict:
        return {"kind": self.kind, "version": SPEC_VERSION}

    @classmethod
    def from_spec(cls, spec: dict) -> WhitespaceTokenizer:
        return cls()


@TOKENIZERS.register("sentencepiece", "spm")
class SentencePieceTokenizer(Tokenizer):
    kind = "sentencepiece"

    def __init__(self, model_proto: bytes):
        import sentencepiece as spm  # only the tokenizer kind in use is loaded

        self.model_proto = bytes(model_proto)
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(self.model_proto)
        except (RuntimeError, OSError) as e:
            raise SeqtrainError(f"not a valid sentencepiece model ({e})") from None

    @classmethod
    def from_file(cls, path: str) -> SentencePieceTokenizer:
        try:
            with open(path, "rb") as f:
                proto = f.read()
        except OSError as e:
            raise SeqtrainError(f"{path}: cannot read sentencepiece model ({e.strerror})") from None
        try:
            return cls(proto)
        except SeqtrainError as e:
            raise SeqtrainError(f"{path}: {e}") from None

    @classmethod
    def train_iter(
        cls,
        sentences: Iterable[str],
        vocab_size: int = 8000,
        model_type: str = "unigram",
        character_coverage: float = 1.0,
        num_threads: int = 1,
        max_sentence_length: int = 1 << 16,
        verbose: bool = False,
        what: str = "sentencepiece training",
    ) -> SentencePieceTokenizer:
        """Train on `sentences` as given: no sampling or shuffling of ours or sentencepiece's, so the same lines and
        the same `num_threads` give a byte-identical model. Errors name `what` (a file or a flag)."""
        import sentencepiece as spm  # only the tokenizer kind in use is loaded

        if model_type not in ("unigram", "bpe"):
            raise SeqtrainError(f"--spm-model-type: {model_type!r} is not one of unigram, bpe")
        out = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences),
                model_writer=out,
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=character_coverage,
                num_threads=num_threads,
                input_sentence_size=0,
                shuffle_input_sentence=False,
                max_sentence_length=max_sentence_length,
                minloglevel=0 if verbose else 2,
            )
        except RuntimeError as e:
            # e.g. "Vocabulary size too high (8000). Please set it to a value <= 5105."
            msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise SeqtrainError(f"{what} failed: {msg}") from None
        return cls(out.getvalue())

    @classmethod
    def train(
        cls,
        files: Sequence[str],
        vocab_size: int = 8000,
        model_type: str = "unigram",
        character_coverage: float = 0.9995,
        max_sentence_length: int = 1 << 16,
    ) -> SentencePieceTokenizer:
        """Train on the non-empty lines of `files` (in order), with one thread: reproducible."""
        for path in files:
            if not os.path.isfile(path):
                raise SeqtrainError(f"{path}: no such file (sentencepiece training input)")
        lines = (line for path in files for line in iter_lines(path) if line.strip())
        return cls.train_iter(
            lines,
            vocab_size,
            model_type,
            character_coverage,
            num_threads=1,
            max_sentence_length=max_sentence_length,
            what=f"sentencepiece training on {', '.join(files)}",
        )

    def encode(self, text: str) -> str:
        # Unicode whitespace other than ' ' could survive spm's normalization inside a piece and then split it;
        # splitting first is what spm's default remove_extra_whitespaces does anyway.
        return " ".join(self.sp.EncodeAsPieces(" ".join(text.split())))

    def encode_batch(self, texts: Sequence[str]) -> list[str]:
        pieces = self.sp.Encode([" ".join(t.split()) for t in texts], out_type=str)
        return [" ".join(p) for p in pieces]

    def decode(self, symbols: str) -> str:
        return self.sp.DecodePieces(symbols.split())

    @property
    def vocab_size(self) -> int:
        return self.sp.GetPieceSize()

    def spec(self) -> dict:
        return {
            "kind": self.kind,
            "version": SPEC_VERSION,
            "model_base64": base64.b64encode(self.model_proto).decode("ascii"),
        }

    @classmethod
    def from_spec(cls, spec: dict) -> SentencePieceTokenizer:
        return cls(base64.b64decode(_field(spec, "model_base64")))

    def files(self) -> dict[str, bytes]:
        return {"spm.model": self.model_proto}


def parse_vocab_bpe(text: str, name: str = "vocab.bpe") -> list[tuple[str, str]]:
    """GPT-2's merges file: an optional '#version' line, then one 'left right' pair per line, best first."""
    merges = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line or (lineno == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise SeqtrainError(f"{name}:{lineno}: malformed merge line {line!r}; expected 'left right'")
        merges.append((parts[0], parts[1]))
    return merges


@TOKENIZERS.register("gpt2")
class GPT2BPETokenizer(Tokenizer):
    kind = "gpt2"

    def __init__(self, encoder_json: str, vocab_bpe: str):
        from tokenizers import Tokenizer as HFTokenizer  # only the tokenizer kind in use is loaded
        from tokenizers import decoders, models, pre_tokenizers  # only the tokenizer kind in use is loaded

        self.encoder_json, self.vocab_bpe = encoder_json, vocab_bpe
        try:
            vocab = json.loads(encoder_json)
        except json.JSONDecodeError as e:
            raise SeqtrainError(f"encoder.json: invalid JSON at line {e.lineno}: {e.msg}") from None
        if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
            raise SeqtrainError("encoder.json: expected an object mapping BPE tokens to integer ids")
        merges = parse_vocab_bpe(vocab_bpe)
        try:
            bpe = models.BPE(vocab=vocab, merges=merges)
        except Exception as e:  # the Rust side reports e.g. a merge whose parts are not in the vocabulary
            raise SeqtrainError(f"encoder.json/vocab.bpe do not fit together: {e}") from None
        # No special tokens: as in fairseq, "<|endoftext|>" in raw text is plain text.
        self.tok = HFTokenizer(bpe)
        self.tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        self.tok.decoder = decoders.ByteLevel()
        self._bytes_view = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        self._size = len(vocab)

    @classmethod
    def from_files(cls, encoder_json_path: str, vocab_bpe_path: str) -> GPT2BPETokenizer:
        texts = []
        for path in (encoder_json_path, vocab_bpe_path):
            try:
                with open(path, encoding="utf-8", newline="") as f:
                    texts.append(f.read())
            except (OSError, UnicodeDecodeError) as e:
                raise SeqtrainError(f"{path}: cannot read GPT-2 BPE file ({e})") from None
        try:
            return cls(*texts)
        except SeqtrainError as e:
            raise SeqtrainError(f"{encoder_json_path} / {vocab_bpe_path}: {e}") from None

    def encode(self, text: str) -> str:
        return " ".join(map(str, self.tok.encode(text, add_special_tokens=False).ids))

    def encode_batch(self, texts: Sequence[str]) -> list[str]:
        return [
            " ".join(map(str, e.ids)) for e in self.tok.encode_batch(list(texts), add_special_tokens=False)
        ]

    def decode(self, symbols: str) -> str:
        # Ids become byte-level tokens; anything else ("<unk>", "<mask>", madeupwords) stands for its own text.
        pieces = []
        for s in symbols.split():
            tok = (
                self.tok.id_to_token(int(s)) if s.isdigit() and s.isascii() and int(s) < self._size else None
            )
            if tok is None:
                tok = "".join(p for p, _ in self._bytes_view.pre_tokenize_str(s))
            pieces.append(tok)
        return self.tok.decoder.decode(pieces)

    @property
    def vocab_size(self) -> int:
        return self._size

    def spec(self) -> dict:
        return {
            "kind": self.kind,
            "version": SPEC_VERSION,
            "encoder_json": self.encoder_json,
            "vocab_bpe": self.vocab_bpe,
        }

    @classmethod
    def from_spec(cls, spec: dict) -> GPT2BPETokenizer:
        return cls(_field(spec, "encoder_json"), _field(spec, "vocab_bpe"))

    def files(self) -> dict[str, bytes]:
        return {
            "encoder.json": self.encoder_json.encode("utf-8"),
            "vocab.bpe": self.vocab_bpe.encode("utf-8"),
        }


@TOKENIZERS.register("tokenizer_json")
class TokenizerJson(Tokenizer):
    kind = "tokenizer_json"

    def __init__(self, text: str, where: str = "tokenizer.json"):
        from tokenizers import Tokenizer as HFTokenizer  # only the tokenizer kind in use is loaded

        self.text = text
        try:
            self.tok = HFTokenizer.from_str(text)
        except Exception as e:  # the Rust side's parse errors are plain Exceptions
            raise SeqtrainError(f"{where}: not a tokenizer the tokenizers library reads ({e})") from None

    def encode(self, text: str) -> str:
        # the tokens, not the ids: the dictionary maps them (the folder's dictionary lists them by id)
        return " ".join(self.tok.encode(text, add_special_tokens=False).tokens)

    def encode_batch(self, texts: Sequence[str]) -> list[str]:
        return [" ".join(e.tokens) for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, symbols: str) -> str:
        tokens = symbols.split()
        return self.tok.decoder.decode(tokens) if self.tok.decoder is not None else " ".join(tokens)

    def spec(self) -> dict:
        return {"kind": self.kind, "version": SPEC_VERSION, "tokenizer_json": self.text}

    @classmethod
    def from_spec(cls, spec: dict) -> TokenizerJson:
        return cls(_field(spec, "tokenizer_json"))

    def files(self) -> dict[str, bytes]:
        return {}  # the spec's tokenizer.json is the file itself (the data-bin's tokenizer.json holds it)


def _field(spec: dict, key: str) -> str:
    value = spec.get(key)
    if not isinstance(value, str):
        raise SeqtrainError(f"{spec.get('kind')} tokenizer spec lacks the text field {key!r}")
    return value


def build_tokenizer(spec: dict | None) -> Tokenizer:
    """Rebuild a tokenizer from `Tokenizer.spec()` data; None means the `none` tokenizer."""
    if spec is None:
        return WhitespaceTokenizer()
    if not isinstance(spec, dict) or not isinstance(spec.get("kind"), str):
        raise SeqtrainError(f"tokenizer spec must be an object with a 'kind'; got {type(spec).__name__}")
    if spec.get("version", SPEC_VERSION) > SPEC_VERSION:
        raise SeqtrainError(f"tokenizer spec version {spec['version']} is newer than this seqtrain reads")
    try:
        cls = TOKENIZERS.get(spec["kind"])
    except KeyError as e:
        raise SeqtrainError(str(e.args[0])) from None
    return cls.from_spec(spec)


def save_databin_tokenizer(data_dir: str, tokenizer: Tokenizer) -> None:
    """Write `tokenizer.json` (the full spec) and plain copies of the model files, each atomically."""
    for name, data in tokenizer.files().items():
        with atomic_write(os.path.join(data_dir, name), "wb") as f:
            f.write(data)
    with atomic_write(os.path.join(data_dir, TOKENIZER_JSON), "w", encoding="utf-8") as f:
        json.dump(tokenizer.spec(), f, ensure_ascii=False)
        f.write("\n")


def load_databin_tokenizer(data_dir: str) -> Tokenizer:
    """The tokenizer a data-bin was made with; `none` for fairseq data-bins, which have no tokenizer.json."""
    path = os.path.join(data_dir, TOKENIZER_JSON)
    if not os.path.exists(path):
        return WhitespaceTokenizer()
    try:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SeqtrainError(f"{path}: not valid JSON ({e})") from None
    try:
        return build_tokenizer(spec)
    except SeqtrainError as e:
        raise SeqtrainError(f"{path}: {e}") from None


# --- flags (for seqtrain-preprocess) --------------------------------------------------------------------------
@settings
class TokenizerConfig:
    """Tokenizer"""

    tokenizer: str = setting(
        "sentencepiece",
        "how raw text becomes dictionary symbols (default: sentencepiece; 'none' = the input is "
        "already tokenized, split on whitespace, as fairseq-preprocess does)",
        choices=["sentencepiece", "gpt2", "none"],
    )
    spm_model: str | None = setting(
        None, "use this sentencepiece model instead of training one", metavar="FP"
    )
    spm_vocab_size: int = setting(
        8000,
        "sentencepiece vocabulary size to train (default: 8000)",
        type=int,
        metavar="N",
        bounds=Bounds(1, INT_MAX),
    )
    spm_model_type: str = setting(
        "unigram", "sentencepiece model type to train (default: unigram)", choices=["unigram", "bpe"]
    )
    spm_character_coverage: float = setting(
        1.0,
        "share of characters the sentencepiece model covers (default: 1.0)",
        type=float,
        metavar="F",
        bounds=Bounds(0, 1, lo_open=True),
    )
    spm_input_sentence_size: int = setting(
        1_000_000,
        "train sentencepiece on at most N train lines (source and target together), evenly spread "
        "over the files; bounds its memory on big corpora (default: 1000000; 0 = all lines)",
        type=int,
        metavar="N",
    )
    spm_num_threads: int = setting(
        4,
        "sentencepiece training threads (default: 4). The trained model depends on this number, "
        "so it is a flag of its own and not --workers",
        type=int,
        metavar="N",
        bounds=Bounds(1, 1024),
    )
    gpt2_encoder_json: str | None = setting(
        None, "GPT-2 BPE encoder.json (for --tokenizer gpt2)", metavar="FP"
    )
    gpt2_vocab_bpe: str | None = setting(None, "GPT-2 BPE vocab.bpe (for --tokenizer gpt2)", metavar="FP")


def load_tokenizer(cfg: TokenizerConfig, train_files: Sequence[str] = ()) -> Tokenizer:
    """Load the tokenizer `cfg` names, training a sentencepiece model on `train_files` if none is given."""
    kind = cfg.tokenizer or "none"
    if kind == "none":
        return WhitespaceTokenizer()
    if kind == "gpt2":
        if not (cfg.gpt2_encoder_json and cfg.gpt2_vocab_bpe):
            raise SeqtrainError("--tokenizer gpt2 needs --gpt2-encoder-json and --gpt2-vocab-bpe")
        return GPT2BPETokenizer.from_files(cfg.gpt2_encoder_json, cfg.gpt2_vocab_bpe)
    if kind == "sentencepiece":
        if cfg.spm_model:
            return SentencePieceTokenizer.from_file(cfg.spm_model)
        if not train_files:
            raise SeqtrainError("--tokenizer sentencepiece needs --spm-model or training text to learn from")
        return SentencePieceTokenizer.train(
            train_files,
            vocab_size=cfg.spm_vocab_size,
            model_type=cfg.spm_model_type,
            character_coverage=cfg.spm_character_coverage,
        )
    raise SeqtrainError(f"--tokenizer: unknown kind {kind!r}; choose from sentencepiece, gpt2, none")
