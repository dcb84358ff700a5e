"""fairseq 0.12's command-line flags next to seqtrain's: writes seqtrain/flags/fairseq_flag_list.py and the flag table
of docs/fairseq.md.

    python scripts/dev/fairseq_flags.py --fairseq-python ~/.cache/seqtrain-peers/fairseq/bin/python   # refresh
    python scripts/dev/fairseq_flags.py                  # rebuild the table from the stored list (no fairseq)
    python scripts/dev/fairseq_flags.py --check          # exit 1 if docs/fairseq.md's table is out of date

With --fairseq-python, this script runs itself under fairseq's interpreter (`--dump`) and reads fairseq's own
parsers: fairseq-train's with the translation task, the bart_base arch and each criterion, optimizer and lr
scheduler that seqtrain also has, with the denoising task and with translation_from_pretrained_bart (mBART);
fairseq-generate's with the translation task and translation_from_pretrained_bart. Each
flag is stored with the tools that take it, whether it takes a value and its default. Then seqtrain's parsers (the
same components) are built and each fairseq flag is classed: same (same kind and default), different (how), or
absent.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
LIST_FILE = REPO / "seqtrain" / "flags" / "fairseq_flag_list.py"
DOC = REPO / "docs" / "fairseq.md"
BEGIN, END = "<!-- flag table: scripts/dev/fairseq_flags.py -->", "<!-- end of flag table -->"
CRITERIONS = ("cross_entropy", "label_smoothed_cross_entropy")
OPTIMIZERS = ("adam", "nag", "sgd", "adafactor")
MBART_TASK = "translation_from_pretrained_bart"
SCHEDULERS = ("fixed", "inverse_sqrt", "polynomial_decay", "reduce_lr_on_plateau", "cosine")

# Where a flag seqtrain has means something else than fairseq's, beyond kind and default (written by hand).
NOTES = {
    "--amp": "implies --fp16 (seqtrain's fp16 is autocast with a dynamic grad scaler, as fairseq's --amp)",
    "--memory-efficient-fp16": "implies --fp16; fp32 master weights and optimizer state are kept",
    "--memory-efficient-bf16": "implies --bf16; fp32 master weights and optimizer state are kept (refused with "
    "--bf16-mode fairseq)",
    "--bf16": "seqtrain-train: bf16 autocast over fp32 weights by default; fairseq's behaviour (a bf16 model, fp32 "
    "master weights) is --bf16 --bf16-mode fairseq, whose checkpoints hold the fp32 masters",
    "--dataset-impl": "only mmap (others: an error naming the flag)",
    "--max-tokens": "seqtrain-train also takes auto: the largest budget that fits in CUDA memory, probed before "
    "training (docs/training.md)",
    "--user-dir": "the package registers into seqtrain.registry (archs are seqtrain presets)",
    "--profile": "records a torch.profiler trace of N updates (bare: 10) instead of fairseq's nvtx ranges",
    "--ddp-backend": "pytorch_ddp, c10d, legacy_ddp, no_c10d are one DDP; fully_sharded is FSDP2",
    "--max-source-positions": "seqtrain-train: unset means the --arch preset's (1024 in every bart_* preset); "
    "seqtrain-generate: 1024, and the model's maximum when smaller, as fairseq-generate",
    "--max-target-positions": "seqtrain-train: unset means the --arch preset's (1024 in every bart_* preset); "
    "seqtrain-generate: 1024, and the model's maximum when smaller, as fairseq-generate",
    "--distributed-backend": "unset means nccl on CUDA, gloo on the CPU",
    "--momentum": "the default depends on --optimizer in both: nag 0.99, sgd 0.0",
    "--num-workers": "DataLoader workers",
    "--permute": "--task denoising applies it (after masking, before insertion); fairseq 0.12 accepts it and never "
    "applies it",
    "--permute-sentences": "a share (fairseq's is an int, so its `1.0` is refused there); sentences end at GPT-2's '.' "
    "(id 13) as in fairseq, else at the symbol '.' (fairseq: at </s>, which its task strips, so nothing moves)",
    "--mask-length": "word starts come from the data-bin's tokenizer (fairseq: from --bpe)",
    "--bpe": "sentencepiece or gpt2 (with --sentencepiece-model, --gpt2-encoder-json, --gpt2-vocab-bpe): accepted "
    "where they name the data-bin's own tokenizer (the same file bytes; fairseq's gpt2 URLs are not fetched), one "
    "line where they differ; a fairseq data-bin (no tokenizer.json) takes the model named once its dictionary's "
    "symbols are that model's tokens",
}


def dump() -> dict:
    """Run under fairseq's interpreter: {flag: {"tools": [...], "value": bool, "default": str}}."""
    from fairseq import options  # fairseq 0.12, in its own venv: this function runs only there

    flags: dict = {}

    def collect(parser: argparse.ArgumentParser, tool: str) -> None:
        for action in parser._actions:
            for flag in action.option_strings:
                if not flag.startswith("--") or flag == "--help":
                    continue
                if flag not in flags:  # the first parser's default: adam's and fixed's, as in seqtrain's row
                    # model flags default to SUPPRESS in fairseq: the arch function fills them
                    unset = action.default is None or action.default == argparse.SUPPRESS
                    default = None if unset else str(action.default)
                    flags[flag] = {"tools": [], "value": action.nargs != 0, "default": default}
                if tool not in flags[flag]["tools"]:
                    flags[flag]["tools"].append(tool)

    for crit in CRITERIONS:
        for opt in OPTIMIZERS:
            for sched in SCHEDULERS:
                parser = options.get_training_parser()
                argv = ["data", "--arch", "bart_base", "--criterion", crit, "--optimizer", opt]
                options.parse_args_and_arch(parser, argv + ["--lr-scheduler", sched], parse_known=True)
                collect(parser, "fairseq-train")
    parser = options.get_training_parser()  # the denoising task's flags (BART pretraining)
    options.parse_args_and_arch(
        parser, ["data", "--task", "denoising", "--arch", "bart_base"], parse_known=True
    )
    collect(parser, "fairseq-train")
    parser = options.get_training_parser()  # mBART fine-tuning's task (--langs)
    options.parse_args_and_arch(
        parser, ["data", "--task", MBART_TASK, "--arch", "mbart_large"], parse_known=True
    )
    collect(parser, "fairseq-train")
    parser = options.get_generation_parser()
    options.parse_args_and_arch(parser, ["data", "--path", "x.pt"], parse_known=True)
    collect(parser, "fairseq-generate")
    parser = options.get_generation_parser()
    options.parse_args_and_arch(parser, ["data", "--path", "x.pt", "--task", MBART_TASK], parse_known=True)
    collect(parser, "fairseq-generate")
    return dict(sorted(flags.items()))


def seqtrain_actions(tool: str) -> dict:
    """seqtrain's flags for the tool (every component seqtrain shares with fairseq): {flag: action}."""
    from seqtrain.config import left_out
    from seqtrain.flags import parsing, training
    from seqtrain.generation import options

    actions: dict = {}
    if tool == "fairseq-train":
        for opt in OPTIMIZERS:
            for sched in SCHEDULERS:
                parser = training.get_training_parser()
                parsing.add_choice_args(parser, "task", "translation")
                parsing.add_choice_args(parser, "optimizer", opt)
                parsing.add_choice_args(parser, "lr_scheduler", sched)
                for flag, action in parser._option_string_actions.items():
                    actions.setdefault(flag, action)  # the defaults of the default components (adam, fixed)
        for task in ("denoising", MBART_TASK):
            parser = training.get_training_parser()
            parsing.add_choice_args(parser, "task", task)
            for flag, action in parser._option_string_actions.items():
                actions.setdefault(flag, action)
    else:
        for task in ("translation", MBART_TASK):
            parser = options.get_generation_parser()
            parsing.add_choice_args(parser, "task", task)
            for flag, action in parser._option_string_actions.items():
                actions.setdefault(flag, action)
            train = training.get_training_parser()  # the flags seqtrain-generate takes and leaves out ...
            parsing.add_choice_args(train, "task", task)
            for flag in left_out(parser):  # ... are refused as doing nothing there: seqtrain-train's
                actions.setdefault(flag, train._option_string_actions[flag])
    return actions


def _value(text: str | None) -> object:
    """A default as a comparable value: "1" == "1.0" == "[1]"."""
    try:
        v = ast.literal_eval(text) if text is not None else None
    except (ValueError, SyntaxError):
        return text
    if isinstance(v, (list, tuple)) and len(v) == 1:
        v = v[0]
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def differences(flag: str, info: dict, action: argparse.Action) -> list[str]:
    """How seqtrain's flag differs from fairseq's in kind and default."""
    diffs = []
    # nargs "?" takes both spellings (fairseq 0.10's `--left-pad-source False` and 0.12's bare switch)
    if action.nargs != "?" and (action.nargs != 0) != info["value"]:
        diffs.append("takes a value" if action.nargs != 0 else "a switch (no value)")
    ours = None if action.default is None else str(action.default)
    if info["value"] and action.nargs != 0 and _value(ours) != _value(info["default"]):
        diffs.append(f"default {ours} (fairseq: {info['default']})")
    return diffs


def row(flag: str, info: dict, ours: dict) -> tuple[str, str]:
    """(status, how) of one fairseq flag: same, different (how) or absent, over the tools that take it."""
    have = [tool for tool in info["tools"] if flag in ours[tool]]
    if not have:
        return "absent", "refused with one line naming it as a fairseq flag seqtrain does not implement"
    how = []
    for tool in have:
        for d in differences(flag, info, ours[tool][flag]):
            if d not in how:
                how.append(d)
    if flag in NOTES:
        how.append(NOTES[flag])
    missing = [t.replace("fairseq-", "seqtrain-") for t in info["tools"] if t not in have]
    if missing:
        how.append(f"{', '.join(missing)} refuses it (fairseq's parser takes it and does not use it)")
    return ("different" if how else "same"), "; ".join(how)


def table(flags: dict) -> str:
    rows = ["| fairseq flag | fairseq tools | seqtrain flag | status | how |", "|---|---|---|---|---|"]
    ours = {tool: seqtrain_actions(tool) for tool in ("fairseq-train", "fairseq-generate")}
    for flag, info in flags.items():
        status, how = row(flag, info, ours)
        tools = ", ".join(t.replace("fairseq-", "") for t in info["tools"])
        ours_flag = f"`{flag}`" if status != "absent" else "-"
        rows.append(f"| `{flag}` | {tools} | {ours_flag} | {status} | {how} |")
    return "\n".join(rows) + "\n"


def write_list(flags: dict) -> None:
    lines = [
        '"""fairseq 0.12\'s flags (written by scripts/dev/fairseq_flags.py from fairseq\'s own parsers; do not edit).',
        "",
        "FAIRSEQ_FLAGS: {flag: (tools, takes a value, default as str or None)}.",
        '"""',
        "",
        "FAIRSEQ_FLAGS = {",
    ]
    for flag, info in flags.items():
        tools = ", ".join(json.dumps(t) for t in info["tools"]) + ("," if len(info["tools"]) == 1 else "")
        default = "None" if info["default"] is None else json.dumps(info["default"])
        lines.append(f"    {json.dumps(flag)}: (({tools}), {info['value']}, {default}),")
    lines += ["}", ""]
    LIST_FILE.write_text("\n".join(lines))


def stored_flags() -> dict:
    from seqtrain.flags.fairseq_flag_list import FAIRSEQ_FLAGS

    return {f: {"tools": list(t), "value": v, "default": d} for f, (t, v, d) in FAIRSEQ_FLAGS.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--fairseq-python", help="python of a venv with fairseq 0.12: refresh the stored flag list"
    )
    p.add_argument("--dump", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--check", action="store_true", help="exit 1 if docs/fairseq.md's table is out of date")
    a = p.parse_args()
    if a.dump:
        json.dump(dump(), sys.stdout)
        return 0
    sys.path.insert(0, str(REPO))
    if a.fairseq_python:
        env = dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1", PYTHONPATH="")
        out = subprocess.run(
            [a.fairseq_python, __file__, "--dump"], capture_output=True, text=True, env=env, check=True
        )
        write_list(json.loads(out.stdout))
        sys.modules.pop("seqtrain.flags.fairseq_flag_list", None)
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    new = f"{head}{BEGIN}\n{table(stored_flags())}{END}{tail}"
    if a.check:
        if new != text:
            print(f"{DOC}: the flag table is out of date; run scripts/dev/fairseq_flags.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
