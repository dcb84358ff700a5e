"""`seqtrain.Summarizer`: text in, summaries out, from Python.

    >>> from seqtrain import Summarizer
    >>> s = Summarizer.from_pretrained("checkpoints/checkpoint_best.pt")   # or fairseq model.pt, or an HF folder
    >>> s.summarize(["first document ...", "second document ..."], beam=4, max_len_b=60)
    ['first summary', 'second summary']

The same pipeline as seqtrain-generate (seqtrain.generation.runner): texts are tokenized with the model's own
tokenizer, sorted by length into batches under a token budget, generated on the model's device and returned in
input order; a text gets the summary `seqtrain-generate --input` writes for it with the same flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import torch

from seqtrain.checkpoint.fairseq import stored_model_fields
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import check_value
from seqtrain.generation import runner
from seqtrain.generation.search import GenerationConfig, check_generation_args

logger = logging.getLogger("seqtrain.generate")


class Summarizer:
    """A model plus its tokenizer and generation defaults; build it with `from_pretrained`."""

    def __init__(self, loaded: runner.GenerationModel):
        self._loaded = loaded

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        dict_path: str | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        unsafe: bool = False,
        model_overrides: dict[str, Any] | None = None,
        lora_base: str | None = None,
        compute_type: str = "default",
    ) -> Summarizer:
        """Load a seqtrain checkpoint (it carries its dictionary and tokenizer), a fairseq checkpoint (dict.txt,
        and GPT-2 BPE files encoder.json + vocab.bpe, from `dict_path` or next to it) or a Hugging Face BART
        folder (its generation_config.json gives the generation defaults), or a hub name `org/name[@revision]`
        read from the Hugging Face cache (seqtrain.checkpoint.hub), on `device`, in `dtype`
        (torch.float16 / torch.bfloat16; default: as stored, fp32). `unsafe=True` allows arbitrary unpickling
        (only for files you trust). `lora_base`: the base model of an adapters-only LoRA checkpoint
        (--save-adapters-only), when it is no longer where the checkpoint says. `compute_type`: seqtrain-generate's
        --compute-type, CTranslate2's names ("int8": int8 linear layers on the CPU; "auto": int8 where the CPU
        supports it)."""
        loaded = runner.load_for_generation(
            str(path), overrides=model_overrides, unsafe=unsafe, dict_path=dict_path, lora_base=lora_base
        )
        runner.cast(loaded, device, dtype)
        runner.set_compute_type(loaded, compute_type, "Summarizer.from_pretrained(compute_type=...)")
        if loaded.defaults:  # where each default came from, as seqtrain-generate logs it
            where = {d: loaded.default_sources.get(d, loaded.defaults_from) for d in loaded.defaults}
            logger.info(
                f"{loaded.defaults_from}: generation defaults for summarize(): "
                + ", ".join(f"{d}={v} ({where[d]})" for d, v in loaded.defaults.items())
            )
        return cls(loaded)

    # ------------------------------------------------------------------------------------- device and dtype
    @property
    def device(self) -> torch.device:
        return self._loaded.device

    @property
    def dtype(self) -> torch.dtype:
        return next(self._loaded.model.parameters()).dtype

    @property
    def model(self) -> torch.nn.Module:
        return self._loaded.model

    @property
    def generation_defaults(self) -> dict[str, Any]:
        """The generation flags the model ships, by flag dest: the settings a seqtrain checkpoint remembers (its
        training preset's, seqtrain-tune's), a Hugging Face folder's generation_config.json; {} for none."""
        return dict(self._loaded.defaults)

    def to(self, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> Summarizer:
        """Move the model to `device` and/or `dtype`. An int8 Summarizer (compute_type="int8") stays an fp32
        CPU model: another device or dtype is refused at the call, in its words."""
        given = ", ".join(f"{k}={v!r}" for k, v in (("device", device), ("dtype", dtype)) if v is not None)
        return self._cast(device, dtype, f"Summarizer.to({given})")

    def half(self) -> Summarizer:
        return self._cast(None, torch.float16, "Summarizer.half()")

    def bfloat16(self) -> Summarizer:
        return self._cast(None, torch.bfloat16, "Summarizer.bfloat16()")

    def float(self) -> Summarizer:
        return self._cast(None, torch.float32, "Summarizer.float()")

    def _cast(self, device: str | torch.device | None, dtype: torch.dtype | None, name: str) -> Summarizer:
        runner.cast(self._loaded, device if device is not None else self.device, dtype, name=name)
        return self

    # ------------------------------------------------------------------------------------------ summarize
    def summarize(
        self,
        texts: str | Sequence[str],
        max_tokens: int | None = 4096,
        batch_size: int | None = None,
        seed: int = 1,
        **generation_flags: Any,
    ) -> list[str]:
        """One summary per text, in input order. `generation_flags` are seqtrain-generate's generation flags
        with `_` for `-` (beam=4, lenpen=2.0, min_len=10, max_len_b=60, no_repeat_ngram_size=3, sampling=True,
        ...); flags not given take the model's defaults (`generation_defaults`: what a seqtrain checkpoint
        remembers, a Hugging Face generation_config.json), then seqtrain-generate's. Batches hold at most
        `max_tokens` padded source tokens (and `batch_size` texts). Every value is checked as the command line
        checks its flag, before anything is generated: a wrong kind or a value out of range is a SeqtrainError
        naming it (`Summarizer.summarize(beam=...) must be between 1 and 10000, got 1000000`)."""
        if isinstance(texts, str):
            texts = [texts]
        texts = list(texts)
        if not all(isinstance(t, str) for t in texts):
            raise SeqtrainError("summarize: texts must be strings")
        for name, v in (("max_tokens", max_tokens), ("batch_size", batch_size), ("seed", seed)):
            if v is None and name != "seed":
                continue
            if isinstance(v, bool) or not isinstance(v, int):
                raise SeqtrainError(f"Summarizer.summarize({name}=...) must be an integer, got {v!r}")
            try:
                check_value(name, v)
            except argparse.ArgumentTypeError as e:
                raise SeqtrainError(f"Summarizer.summarize({name}=...) {e}") from None
        known = {f.name for f in dataclasses.fields(GenerationConfig)}
        unknown = sorted(set(generation_flags) - known)
        if unknown:
            raise SeqtrainError(
                f"summarize: unknown generation flag(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        # the values as given (a GenerationConfig holds them unconverted), so the check below sees them
        config = dataclasses.replace(
            GenerationConfig(), **{**self._loaded.defaults, **generation_flags, "seed": seed}
        )
        # the command line's check, naming the argument: before, lenpen=nan and beam="4" went into the search
        name = lambda dest: f"Summarizer.summarize({dest}=...)"  # noqa: E731
        check_generation_args(config, name)
        generator = runner.make_generator(self._loaded, config, name)  # held against the model's vocabulary
        if not texts:
            return []
        ds = runner.text_dataset(self._loaded, runner.encode(self._loaded, texts))
        order = runner.order_examples(ds, None, seed)
        batches = runner.plan_batches(ds, order, max_tokens, batch_size)
        out = [""] * len(texts)
        for sid, _, _, hypos in runner.run_batches(self._loaded, generator, ds, batches):
            out[sid] = runner.decode(self._loaded, hypos[0]["tokens"])
        return out

    def __repr__(self) -> str:
        lm = self._loaded.lm
        arch = stored_model_fields(lm.args)["arch"]
        return f"Summarizer({arch}, {lm.format}, {self.device}, {self.dtype})"
