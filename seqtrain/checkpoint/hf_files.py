"""The tokenizer files, generation_config.json and model card (README.md) of a Hugging Face export, so that
transformers' `AutoTokenizer.from_pretrained(folder)` and `AutoModelForSeq2SeqLM.generate()` work on the folder
alone.

Token ids are the model's dictionary indices, so the files map text to dictionary indices, not to the tokenizer's
own ids:
- `gpt2` (fairseq's GPT-2 BPE; dictionary symbols are GPT-2 ids as decimal strings): `vocab.json` maps each BPE
  token to its dictionary index, as the released facebook/bart-* folders do, with `merges.txt` (GPT-2's merges)
  and a `tokenizer.json` of the same byte-level BPE.
- `sentencepiece`: a `tokenizer.json` built with `tokenizers` over the dictionary (Unigram or BPE as the
  sentencepiece model is, with its normalization), and the sentencepiece model itself as `spm.model`, from which
  seqtrain reads the folder back.
Special tokens: <s>=0 <pad>=1 </s>=2 <unk>=3 (the dictionary's) and <mask> where the dictionary has it; the
post-processor adds what seqtrain adds to a source: `</s>` after it, `<s>` before it for --prepend-bos models.

A token of the tokenizer that the dictionary lacks (a dictionary counted from the training data need not hold
all of them) is left out of the files, and merges that need it too: seqtrain encodes such a token as <unk>,
transformers then segments the text into the tokens the dictionary has. `missing` counts them; exports of
dictionaries that hold every token (released BART, fine-tunes of it, sentencepiece models trained on the data)
tokenize exactly as seqtrain does.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

from seqtrain.checkpoint.fairseq import stored_conventions, stored_model_fields
from seqtrain.data.tokenizer import TokenizerJson, parse_vocab_bpe
from seqtrain.errors import SeqtrainError
from seqtrain.fileio import atomic_write, loads_bounded

SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
MASK = "<mask>"
SPM_FILE = "spm.model"


def _write(folder: str, name: str, text: str | bytes) -> None:
    mode = "wb" if isinstance(text, bytes) else "w"
    with atomic_write(
        os.path.join(folder, name), mode, **({} if mode == "wb" else {"encoding": "utf-8"})
    ) as f:
        f.write(text)


def _dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=True) + "\n"


def _check_specials(d: Any) -> None:
    got = tuple(d[i] for i in range(4))
    if got != SPECIALS:
        raise SeqtrainError(
            f"the dictionary's first symbols are {got}, not {SPECIALS}; no tokenizer exported"
        )


def _post_processor(prepend_bos: bool) -> Any:
    from tokenizers import processors  # the tokenizers library: only exports with a tokenizer need it

    single = ["<s>", "$A", "</s>"] if prepend_bos else ["$A", "</s>"]
    pair = single + (["</s>", "$B", "</s>"] if prepend_bos else ["$B", "</s>"])
    return processors.TemplateProcessing(
        single=" ".join(single), pair=" ".join(pair), special_tokens=[("<s>", 0), ("</s>", 2)]
    )


def _finish(tok: Any, d: Any) -> None:
    """The dictionary's special tokens as added (special) tokens, at their dictionary indices."""
    from tokenizers import AddedToken  # the tokenizers library: only exports with a tokenizer need it

    specials = [AddedToken(s, special=True, normalized=False) for s in SPECIALS]
    if MASK in d.indices:
        specials.append(AddedToken(MASK, special=True, normalized=False, lstrip=True))
    tok.add_special_tokens(specials)
    for s in SPECIALS + ((MASK,) if MASK in d.indices else ()):
        if tok.token_to_id(s) != d.index(s):
            raise SeqtrainError(
                f"exported tokenizer gives {s} id {tok.token_to_id(s)}, the dictionary {d.index(s)}"
            )


def _gpt2_files(spec: dict, d: Any) -> tuple[Any, dict[str, int], str, int]:
    """(tokenizers.Tokenizer, vocab.json, merges.txt text, tokens missing from the dictionary) for a gpt2 model."""
    # the tokenizers library: only exports with a tokenizer need it
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    encoder = json.loads(spec["encoder_json"])  # BPE token -> GPT-2 id
    by_id = {i: t for t, i in encoder.items()}
    vocab: dict[str, int] = {}
    for i in range(len(d)):
        sym = d[i]
        tok = by_id.get(int(sym)) if sym.isdigit() and sym.isascii() else None
        vocab[tok if tok is not None else sym] = i
    missing = sum(1 for t in encoder if t not in vocab)
    merges = [
        (a, b) for a, b in parse_vocab_bpe(spec["vocab_bpe"]) if a in vocab and b in vocab and a + b in vocab
    ]
    merges_txt = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok, vocab, merges_txt, missing


def _spm_proto(model_proto: bytes) -> Any:
    # sentencepiece's own protobuf description (needs the protobuf package): the pieces' scores, the model
    # type and the normalization tables, which the sentencepiece processor does not expose
    try:
        # an optional dependency (protobuf), only for exports of sentencepiece models
        from sentencepiece import sentencepiece_model_pb2
    except ImportError as e:
        raise SeqtrainError(f"exporting a sentencepiece tokenizer needs the protobuf package ({e})") from None
    m = sentencepiece_model_pb2.ModelProto()
    m.ParseFromString(model_proto)
    return m


def _spm_files(spec: dict, d: Any) -> tuple[Any, int]:
    """(tokenizers.Tokenizer, pieces missing from the dictionary) for a sentencepiece model, as transformers'
    SpmConverter builds it, with the dictionary's indices as ids."""
    # the tokenizers library: only exports with a tokenizer need it
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    m = _spm_proto(base64.b64decode(spec["model_base64"]))
    normal = 1  # ModelProto.SentencePiece.Type.NORMAL (USER_DEFINED = 4 are plain pieces too)
    scores = {p.piece: p.score for p in m.pieces if p.type in (normal, 4)}
    missing = sum(1 for p in scores if p not in d.indices)
    kind = m.trainer_spec.model_type  # 1 unigram, 2 bpe
    if kind == 1:
        # symbols that are no piece (the specials, <mask>, madeupwords) never win a segmentation
        floor = min(scores.values(), default=0.0) - 10.0
        vocab = [(d[i], scores.get(d[i], floor)) for i in range(len(d))]
        model = models.Unigram(vocab, unk_id=d.unk(), byte_fallback=False)
    elif kind == 2:
        vocab_ids = {d[i]: i for i in range(len(d))}
        pieces = [p for p in sorted(scores, key=lambda p: -scores[p]) if p in vocab_ids]
        merges = []  # each piece from its two parts, ranked by the piece's score (sentencepiece's BPE order)
        for piece in pieces:
            local = [
                (piece[:k], piece[k:])
                for k in range(1, len(piece))
                if piece[:k] in vocab_ids and piece[k:] in vocab_ids
            ]
            merges.extend(sorted(local, key=lambda ab: (vocab_ids[ab[0]], vocab_ids[ab[1]])))
        model = models.BPE(vocab=vocab_ids, merges=merges, unk_token="<unk>", fuse_unk=True)
    else:
        raise SeqtrainError(f"sentencepiece model type {kind} has no tokenizers export (unigram or bpe)")
    tok = Tokenizer(model)
    steps = []
    charsmap = m.normalizer_spec.precompiled_charsmap
    if charsmap:
        steps.append(normalizers.Precompiled(charsmap))
    # seqtrain's encode first joins the whitespace-split words, as sentencepiece's remove_extra_whitespaces
    steps += [normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()]
    tok.normalizer = normalizers.Sequence(steps)
    prepend = "always" if m.normalizer_spec.add_dummy_prefix else "never"
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=prepend)
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=prepend)
    return tok, missing


def export_tokenizer(folder: str, spec: dict | None, d: Any, prepend_bos: bool, max_positions: int) -> dict:
    """Write the tokenizer files of tokenizer `spec` over dictionary `d` into `folder`; returns what was done
    ({"kind", "files", "missing"}), {} for a model without a gpt2 or sentencepiece tokenizer."""
    kind = (spec or {}).get("kind")
    if kind not in ("gpt2", "sentencepiece") or d is None:
        return {}
    _check_specials(d)
    files = []
    if kind == "gpt2":
        tok, vocab, merges_txt, missing = _gpt2_files(spec, d)
        _write(folder, "vocab.json", json.dumps(vocab, ensure_ascii=False) + "\n")
        _write(folder, "merges.txt", merges_txt)
        files += ["vocab.json", "merges.txt"]
    else:
        tok, missing = _spm_files(spec, d)
        _write(folder, SPM_FILE, base64.b64decode(spec["model_base64"]))
        files.append(SPM_FILE)
    tok.post_processor = _post_processor(prepend_bos)
    _finish(tok, d)
    _write(folder, "tokenizer.json", tok.to_str(pretty=True) + "\n")
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    if MASK in d.indices:
        special["mask_token"] = MASK
    config = {
        **special,
        # the class that loads tokenizer.json as it is (BartTokenizer would rebuild the post-processor)
        "tokenizer_class": "PreTrainedTokenizerFast",
        # what BART's forward takes: transformers 4.x's PreTrainedTokenizerFast also returns token_type_ids by
        # default, which model.generate(**tokenizer(texts, return_tensors="pt")) then refuses
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": int(max_positions),
        "clean_up_tokenization_spaces": False,
        "add_prefix_space": False,
    }
    _write(folder, "tokenizer_config.json", _dump(config))
    _write(folder, "special_tokens_map.json", _dump(special))
    files += ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
    return {"kind": kind, "files": files, "missing": missing}


def read_model_max_length(folder: str) -> int | None:
    """tokenizer_config.json's model_max_length (the source limit of the folder's tokenizer), None when absent or
    not a plain integer (transformers' 'no limit' is a huge float)."""
    path = os.path.join(folder, "tokenizer_config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            value = loads_bounded(f.read()).get("model_max_length")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def tokenizer_prepends_bos(folder: str) -> bool | None:
    """Whether a folder's tokenizer.json puts <s> first (True / False), None when it does not say."""
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            post = json.load(f).get("post_processor") or {}
    except (OSError, ValueError, AttributeError):
        return None
    if post.get("type") != "TemplateProcessing" or not post.get("single"):
        return None
    first = post["single"][0]
    return isinstance(first, dict) and (first.get("SpecialToken") or {}).get("id") == "<s>"


def read_spm_tokenizer(folder: str) -> tuple[list[str] | None, dict | None]:
    """(symbol of each id, seqtrain sentencepiece spec) of a folder seqtrain exported with its sentencepiece
    model (spm.model beside a Unigram / BPE tokenizer.json), else (None, None)."""
    spm_path, tok_path = os.path.join(folder, SPM_FILE), os.path.join(folder, "tokenizer.json")
    if not (os.path.isfile(spm_path) and os.path.isfile(tok_path)):
        return None, None
    try:
        with open(tok_path, encoding="utf-8") as f:
            model = json.load(f).get("model") or {}
        with open(spm_path, "rb") as f:
            proto = f.read()
    except (OSError, ValueError, AttributeError) as e:
        raise SeqtrainError(f"{folder}: unreadable tokenizer files ({e})") from None
    if model.get("type") == "Unigram" and isinstance(model.get("vocab"), list):
        names = [
            p[0] if isinstance(p, list) and p and isinstance(p[0], str) else None for p in model["vocab"]
        ]
    elif model.get("type") == "BPE" and isinstance(model.get("vocab"), dict):
        vocab = model["vocab"]
        names = [None] * (max([i for i in vocab.values() if isinstance(i, int)], default=-1) + 1)
        for t, i in vocab.items():
            if isinstance(i, int) and i >= 0:
                names[i] = t
    else:
        return None, None
    return names, {"kind": "sentencepiece", "version": 1, "model_base64": base64.b64encode(proto).decode()}


def _metaspace(pre: Any) -> bool:
    """Whether a tokenizer.json pre_tokenizer is (or holds) sentencepiece's Metaspace one."""
    if not isinstance(pre, dict):
        return False
    return pre.get("type") == "Metaspace" or any(_metaspace(p) for p in pre.get("pretokenizers") or [])


def read_tokenizer_json(folder: str) -> tuple[list[str | None] | None, dict | None]:
    """(symbol of each id, `tokenizer_json` spec) of a folder with a tokenizer.json but no spm.model: what
    transformers' save_pretrained (or peft's merge and save) keeps of a seqtrain sentencepiece export. Its tokens
    are the sentencepiece pieces, and the dictionary lists them by id, as the export's did. A GPT-2 BPE
    tokenizer.json (any BPE without sentencepiece's Metaspace) is left to the gpt2 reader (its dictionary symbols
    are ids, fairseq's convention): (None, None) for it and for a folder without tokenizer.json. One that the
    tokenizers library cannot read is an error naming it, never a model run without its tokenizer."""
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        return None, None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        obj = json.loads(text)
        if (obj.get("model") or {}).get("type") == "BPE" and not _metaspace(obj.get("pre_tokenizer")):
            return None, None  # GPT-2's byte-level BPE (or a bare BPE, read as GPT-2's as before)
    except (OSError, ValueError, AttributeError) as e:
        raise SeqtrainError(f"{path}: unreadable tokenizer file ({e})") from None
    tok = TokenizerJson(text, path)
    vocab = tok.tok.get_vocab(with_added_tokens=True)
    names: list[str | None] = [None] * (max(vocab.values(), default=-1) + 1)
    for t, i in vocab.items():
        names[i] = t
    return names, tok.spec()


# The generation settings an export records, at seqtrain-generate's defaults (fairseq's).
GENERATION_DEFAULTS: dict[str, Any] = dict(
    beam=5, lenpen=1.0, max_len_a=0.0, max_len_b=200, min_len=1, no_repeat_ngram_size=0
)


def decoder_start(args: Any, d: Any) -> int:
    """The token decoding begins with, for a model's stored args: the target language's `[lang]` for an mBART
    model with --langs (fairseq's translation_from_pretrained_bart, transformers' mBART decoder_start_token_id),
    else </s>."""
    eos = d.eos() if d is not None else 2
    stored = stored_conventions(args)
    tgt = stored.target_lang
    if stored.langs and tgt and d is not None and f"[{tgt}]" in d:
        return d.index(f"[{tgt}]")
    return eos


def read_decoder_start(folder: str) -> int | None:
    """The decoder start token a Hugging Face folder names (decoder_start_token_id of generation_config.json,
    else of config.json; transformers' mBART: the target language's code), or None when neither says."""
    for name in ("generation_config.json", "config.json"):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                value = loads_bounded(f.read()).get("decoder_start_token_id")
        except (OSError, ValueError, AttributeError) as e:
            raise SeqtrainError(f"{path}: cannot read decoder_start_token_id ({e})") from None
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SeqtrainError(
                f"{path}: decoder_start_token_id={value!r} is not a token id (an integer >= 0)"
            )
        return value
    return None


def hf_generation_config(args: Any, d: Any, settings: dict[str, Any]) -> dict:
    """generation_config.json for seqtrain generation `settings` (GENERATION_DEFAULTS' keys): the search
    seqtrain-generate runs, in transformers' terms (docs/generate.md, "Coming from Hugging Face transformers"):
    lengths counting the decoder start token, the max length capped as seqtrain caps it, early stopping,
    <pad> never generated, </s> as the decoder start token and forced last, <s> forced first for --prepend-bos
    models. `args`: the model's stored args."""
    pad, bos, eos = (d.pad(), d.bos(), d.eos()) if d is not None else (1, 0, 2)
    stored = stored_conventions(args)
    max_len = min(int(settings["max_len_b"]), int(stored.max_target_positions) - 1)
    return {
        "bos_token_id": bos,
        "pad_token_id": pad,
        "eos_token_id": eos,
        "decoder_start_token_id": decoder_start(args, d),
        "forced_eos_token_id": eos,
        "forced_bos_token_id": bos if stored.prepend_bos else None,
        "num_beams": int(settings["beam"]),
        "length_penalty": float(settings["lenpen"]),
        "max_length": max_len + 2,
        "min_length": int(settings["min_len"]) + 1,
        "no_repeat_ngram_size": int(settings["no_repeat_ngram_size"]),
        "early_stopping": True,
        "suppress_tokens": [pad],
    }


def model_card(
    lm: Any, config: dict, gen: dict, tok: dict, sources: dict[str, str], folder: str = "."
) -> str:
    name = f"{config['encoder_layers']}+{config['decoder_layers']} layers, d_model {config['d_model']}"
    source = ("<s> " if stored_conventions(lm.args).prepend_bos else "") + "text </s>"
    arch = stored_model_fields(lm.args).get("arch", "?")
    n = sum(p.numel() for p in lm.model.parameters())
    tok_line = (
        f"`{tok['kind']}` ({', '.join(tok['files'])})"
        + (f"; {tok['missing']} of its tokens are not in the dictionary" if tok.get("missing") else "")
        if tok
        else "none exported (the checkpoint carries no gpt2 or sentencepiece tokenizer)"
    )
    settings = ", ".join(f"{k} {gen[k]}" for k in ("num_beams", "length_penalty", "max_length", "min_length"))
    settings += f", no_repeat_ngram_size {gen['no_repeat_ngram_size']}"
    where = sorted(set(sources.values()))
    forced_bos = ", `<s>` first" if gen["forced_bos_token_id"] is not None else ""
    here = os.path.basename(os.path.normpath(folder)) or "."
    return f"""---
library_name: transformers
pipeline_tag: summarization
tags:
- bart
- seqtrain
---
# BART summarizer (exported by seqtrain)

A BART model ({name}, {n:,} parameters, vocabulary {config["vocab_size"]}, arch `{arch}`)
trained or converted with seqtrain and written by `seqtrain-convert --to hf`.

- Tokenizer: {tok_line}. Ids are the model's dictionary indices; a source is `{source}`.
- Generation defaults (`generation_config.json`, from {", ".join(where)}): {settings}; the decoder starts with
  `</s>`, `</s>` is forced last{forced_bos}, `<pad>` is never generated.

```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{here}")
model = AutoModelForSeq2SeqLM.from_pretrained("{here}")
batch = tokenizer(["A text to summarize."], return_tensors="pt", padding=True, truncation=True)
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))
```

With seqtrain: `seqtrain-generate --path {here} --input texts.txt` (the same defaults), or
`seqtrain-convert {here} model.pt --to seqtrain`.
"""
