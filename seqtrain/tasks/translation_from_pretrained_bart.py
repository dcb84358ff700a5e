"""fairseq's `translation_from_pretrained_bart` task: fine-tune a multilingual BART (mBART) on source -> target pairs.

fairseq 0.12's conventions (fairseq/tasks/translation_from_pretrained_bart.py), which mBART's pretraining fixed:
- both dictionaries get `[lang]` for each --langs code, in order, then `<mask>` (the embedding rows line up with
  the pretrained model's);
- a source is `tokens </s> [src_lang]`, a target `tokens </s> [tgt_lang]` (load_langpair_dataset's
  `append_source_id`), and the decoder input is the target with its last token moved to the front:
  `[tgt_lang] tokens </s>`;
- generation starts from `[tgt_lang]` and ends at it (fairseq's SequenceGenerator with `eos=[tgt_lang]`), so a
  hypothesis reads `tokens </s> [tgt_lang]`; both language tokens and </s> are dropped from the text.
--source-lang / --target-lang name the languages and the data-bin's file suffixes alike (train.en_XX-ro_RO.en_XX),
as in fairseq.
"""

from __future__ import annotations

import argparse

from seqtrain.config import add_settings, setting, settings
from seqtrain.data.dictionary import add_language_symbols, language_id, parse_langs
from seqtrain.errors import SeqtrainError
from seqtrain.registry import TASKS
from seqtrain.tasks.translation import TranslationConfig, TranslationTask


@settings
class LangsConfig:
    """Task (translation_from_pretrained_bart)

    fairseq's --langs (seqtrain-train, -generate and -interactive take it)."""

    langs: str | None = setting(
        None,
        "comma-separated language codes of the pretrained mBART, in its order (e.g. ar_AR,cs_CZ,...); "
        "[code] symbols and <mask> are appended to the dictionaries, as fairseq does",
        metavar="LANGS",
    )


def add_langs_flag(parser: argparse.ArgumentParser) -> None:
    """--langs, fairseq's flag (seqtrain-train, -generate and -interactive take it)."""
    add_settings(parser, LangsConfig)


@TASKS.register("translation_from_pretrained_bart", config=TranslationConfig)
class TranslationFromPretrainedBARTTask(TranslationTask):
    """Translation with a model initialized from mBART: language tokens around every pair (module docstring)."""

    add_task_flags = staticmethod(add_langs_flag)

    @classmethod
    def setup_task(cls, cfg: TranslationConfig) -> TranslationFromPretrainedBARTTask:
        if not parse_langs(cfg.langs):
            raise SeqtrainError(
                "--task translation_from_pretrained_bart needs --langs (the pretrained mBART's language codes, "
                "e.g. en_XX,ro_RO)"
            )
        task = super().setup_task(cfg)
        for d in {id(task.src_dict): task.src_dict, id(task.tgt_dict): task.tgt_dict}.values():
            add_language_symbols(d, cfg.langs)
        langs, data = set(parse_langs(cfg.langs)), cfg.dataset
        for flag, lang in (("--source-lang", data.source_lang), ("--target-lang", data.target_lang)):
            if lang not in langs:
                raise SeqtrainError(f"{flag} {lang!r} is not one of --langs {cfg.langs}")
        return task

    def sequence_tokens(self) -> dict[str, int]:
        """`[src]` after every source, `[tgt]` after every target and first in the decoder input."""
        a, langs = self.cfg.dataset, self.cfg.langs
        tgt = language_id(self.tgt_dict, a.target_lang, "--target-lang", langs)
        return dict(
            append_source=language_id(self.src_dict, a.source_lang, "--source-lang", langs),
            append_target=tgt,
            eos=tgt,
        )

    def generator_tokens(self) -> dict[str, int]:
        """fairseq's build_generator: `eos=[tgt]`, which is also where decoding starts."""
        tgt = language_id(self.tgt_dict, self.cfg.dataset.target_lang, "--target-lang", self.cfg.langs)
        return dict(bos=tgt, eos=tgt)
