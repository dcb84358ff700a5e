"""Bad input catalogue: each case gives one line naming the problem and the file or flag, a non-zero exit, no
traceback, and leaves every file as it was (hashes before and after). Most cases run the console scripts' main
in-process; a few go through the installed console scripts as subprocesses. The table is docs/reliability.md's bad-input
catalogue."""

from __future__ import annotations

import hashlib
import importlib
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.utils import REPO


def write_raw(folder: str, prefix: str, n: int, seed: int, word: str = "w", n_tgt: int = None) -> str:
    r = random.Random(seed)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, prefix)
    with open(path + ".src", "w") as fs, open(path + ".tgt", "w") as ft:
        for i in range(n):
            toks = [f"{word}{r.randrange(30)}" for _ in range(r.randint(4, 9))]
            fs.write(" ".join(toks) + "\n")
            if n_tgt is None or i < n_tgt:
                ft.write(" ".join(reversed(toks[:4])) + "\n")
    return path


def preprocess(raw: str, dest: str, valid: str = None) -> str:
    from seqtrain_cli.preprocess import preprocess_main as main

    argv = [
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--trainpref",
        f"{raw}/train",
        "--destdir",
        dest,
        "--joined-dictionary",
        "--tokenizer",
        "none",
        "--no-progress-bar",
    ]
    main(argv + ["--validpref", valid or f"{raw}/valid"])
    return dest


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A data-bin, a checkpoint trained on it, and damaged or mismatched variants of both."""
    root = str(tmp_path_factory.mktemp("bad"))
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        raw = os.path.join(root, "raw")
        write_raw(raw, "train", 60, 0)
        write_raw(raw, "valid", 12, 1)
        write_raw(raw, "valid10", 10, 1)
        write_raw(raw, "uneven", 10, 2, n_tgt=9)
        with open(os.path.join(raw, "bad_dict.txt"), "w") as f:
            f.write("hello 3\nworld\n")
        w = {"root": root, "raw": raw}
        w["bin"] = preprocess(raw, os.path.join(root, "bin"))
        # another vocabulary (different words): its dictionary differs from the checkpoint's
        raw_other = os.path.join(root, "raw_other")
        write_raw(raw_other, "train", 30, 3, word="x")
        write_raw(raw_other, "valid", 6, 4, word="x")
        w["bin_other_dict"] = preprocess(raw_other, os.path.join(root, "bin_other_dict"))

        def variant(name: str) -> str:
            dest = os.path.join(root, name)
            shutil.copytree(w["bin"], dest)
            return dest

        w["bin_corrupt_idx"] = variant("bin_corrupt_idx")
        with open(os.path.join(w["bin_corrupt_idx"], "valid.src-tgt.src.idx"), "r+b") as f:
            f.write(b"GARBAGE!")
        w["bin_truncated_bin"] = variant("bin_truncated_bin")
        path = os.path.join(w["bin_truncated_bin"], "train.src-tgt.tgt.bin")
        os.truncate(path, os.path.getsize(path) // 2)
        # valid target side from a 10-example preprocessing next to the 12-example source side
        w["bin_counts_differ"] = variant("bin_counts_differ")
        ten = preprocess(raw, os.path.join(root, "bin_valid10"), valid=f"{raw}/valid10")
        for ext in ("bin", "idx"):
            shutil.copy(
                os.path.join(ten, f"valid.src-tgt.tgt.{ext}"),
                os.path.join(w["bin_counts_differ"], f"valid.src-tgt.tgt.{ext}"),
            )
        w["bin_empty_valid"] = variant("bin_empty_valid")
        from seqtrain.data.indexed_dataset import MMapIndexedDatasetBuilder

        for side in ("src", "tgt"):
            prefix = os.path.join(w["bin_empty_valid"], f"valid.src-tgt.{side}")
            builder = MMapIndexedDatasetBuilder(prefix + ".bin", np.uint16)
            builder.finalize(prefix + ".idx")
        w["bin_no_dict"] = variant("bin_no_dict")
        os.remove(os.path.join(w["bin_no_dict"], "dict.tgt.txt"))

        from seqtrain_cli.train import train_main

        w["ck_dir"] = os.path.join(root, "ck")
        train_main(
            [
                w["bin"],
                "--arch",
                "bart_tiny",
                "--encoder-layers",
                "1",
                "--decoder-layers",
                "1",
                "--cpu",
                "--max-tokens",
                "256",
                "--max-update",
                "2",
                "--save-dir",
                w["ck_dir"],
                "--log-format",
                "none",
                "--no-epoch-checkpoints",
            ]
        )
        w["ck"] = os.path.join(w["ck_dir"], "checkpoint_last.pt")
        w["text_file"] = os.path.join(raw, "train.src")
        w["config_bad"] = os.path.join(root, "bad.yaml")
        with open(w["config_bad"], "w") as f:
            f.write("arch: bart_tiny\nmax-tokenz: 100\n")
        w["out"] = os.path.join(root, "out")  # outputs that must not appear
        # a monolingual data-bin (--only-source) of the train sources, for --task denoising
        from seqtrain_cli.preprocess import preprocess_main

        w["bin_mono"] = os.path.join(root, "bin_mono")
        preprocess_main(["--only-source", "--trainpref", f"{raw}/train.src", "--validpref", f"{raw}/valid.src"]
                        + ["--destdir", w["bin_mono"], "--tokenizer", "none", "--no-progress-bar"])  # fmt: skip
        add_round_two_inputs(w, variant)
    finally:
        torch.set_num_threads(n)
    return w


def add_round_two_inputs(w: dict, variant) -> None:
    """Inputs of the second round of bad-input cases (issue 17): damaged data-bins, crafted checkpoints and
    Hugging Face folders, unreadable text and config files."""
    import json

    from seqtrain.data.indexed_dataset import MMapIndexedDataset
    from seqtrain_cli.convert import main as convert_main

    root, raw = w["root"], w["raw"]
    w["bin_bad_token"] = variant("bin_bad_token")
    prefix = os.path.join(w["bin_bad_token"], "train.src-tgt.tgt")
    data = np.memmap(prefix + ".bin", dtype=MMapIndexedDataset(prefix).dtype, mode="r+")
    data[len(data) // 2] = 300  # the dictionary has 40 symbols
    data.flush()
    del data
    for name, text in [
        ("zero_width", "w1 w2\n\u200b\u200b\nw3\n"),
        ("blank", "w1 w2\n  \nw3\n"),
        ("three", "a\nb\nc\n"),
    ]:
        with open(os.path.join(raw, name + ".src"), "w", encoding="utf-8") as f:
            f.write(text)
    for name in ("zero_width", "blank"):
        shutil.copy(os.path.join(raw, "three.src"), os.path.join(raw, name + ".tgt"))
    with open(os.path.join(raw, "latin1.src"), "wb") as f:
        f.write(b"w1 w2\ncaf\xe9\nw3\n")
    shutil.copy(os.path.join(raw, "three.src"), os.path.join(raw, "latin1.tgt"))
    w["config_latin1"] = os.path.join(root, "latin1.yaml")
    with open(w["config_latin1"], "wb") as f:
        f.write(b"arch: bart_tiny\n# caf\xe9\n")
    w["config_dropout3"] = os.path.join(root, "dropout3.yaml")
    with open(w["config_dropout3"], "w") as f:
        f.write("arch: bart_tiny\ndropout: 3\n")
    # crafted seqtrain checkpoints: plain data, loadable, but claiming what they do not hold
    obj = torch.load(w["ck"], weights_only=True)
    for name, change in [
        ("ck_huge_dim", lambda o: o["args"].__setitem__("encoder_embed_dim", 10**6)),
        ("ck_string_dim", lambda o: o["args"].__setitem__("decoder_layers", "1")),
        ("ck_list_weight", lambda o: o["model"].__setitem__("encoder.layers.0.fc1.bias", [0.0])),
        ("ck_bad_tokenizer", lambda o: o.__setitem__("tokenizer", ["gpt2"])),
    ]:
        crafted = {**obj, "args": dict(obj["args"]), "model": dict(obj["model"])}
        change(crafted)
        w[name] = os.path.join(root, name + ".pt")
        torch.save(crafted, w[name])
    # Hugging Face folders
    w["hf"] = os.path.join(root, "hf")
    convert_main([w["ck"], w["hf"], "--to", "hf"])
    from safetensors.torch import load_file

    keys = sorted(load_file(os.path.join(w["hf"], "model.safetensors")))
    for name, shard in [
        ("hf_shard_outside", "../hf/model.safetensors"),
        ("hf_shard_absolute", "/etc/passwd"),
    ]:
        w[name] = os.path.join(root, name)
        os.makedirs(w[name])
        shutil.copy(os.path.join(w["hf"], "config.json"), w[name])
        with open(os.path.join(w[name], "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": {k: shard for k in keys}}, f)
    w["hf_config_list"] = os.path.join(root, "hf_config_list")
    shutil.copytree(w["hf"], w["hf_config_list"])
    with open(os.path.join(w["hf_config_list"], "config.json"), "w") as f:
        f.write("[1, 2, 3]\n")
    # an export folder whose dict.txt belongs to another model
    w["export"] = os.path.join(root, "export")
    os.makedirs(w["export"])
    with open(os.path.join(w["export"], "dict.txt"), "w") as f:
        f.write("other 1\n")
    with open(os.path.join(w["export"], "model.pt"), "wb") as f:
        f.write(b"an older model")


def train(*extra: str, data: str = "bin", save: str = "save") -> list:
    """A seqtrain-train command line over world[data], with world-relative placeholders {key}."""
    return [
        "{" + data + "}",
        "--arch",
        "bart_tiny",
        "--encoder-layers",
        "1",
        "--decoder-layers",
        "1",
        "--cpu",
        "--max-tokens",
        "256",
        "--max-update",
        "1",
        "--save-dir",
        "{root}/" + save,
        "--log-format",
        "none",
        *extra,
    ]


def gen(*extra: str, data: str = "bin") -> list:
    return [
        "{" + data + "}",
        "--path",
        "{ck}",
        "--cpu",
        "--gen-subset",
        "valid",
        "--beam",
        "2",
        "--max-len-b",
        "6",
        *extra,
    ]


# (id, CLI, argv with {placeholders}, text the one error line must contain)
CASES = [
    # ---- seqtrain-train: flags
    ("train-unknown-arch", "train", ["{bin}", "--arch", "bart_huge"], "--arch: unknown arch 'bart_huge'"),
    ("train-unknown-criterion", "train", train("--criterion", "bleu_loss"), "bleu_loss"),
    ("train-unknown-optimizer", "train", train("--optimizer", "lion"), "lion"),
    ("train-unknown-scheduler", "train", train("--lr-scheduler", "cosine_foo"), "cosine_foo"),
    ("train-lr-not-a-number", "train", train("--lr", "abc"), "argument --lr"),
    ("train-max-tokens-zero", "train", train("--max-tokens", "0"), "--max-tokens"),
    ("train-update-freq-zero", "train", train("--update-freq", "0"), "--update-freq"),
    ("train-unknown-flag", "train", train("--max-updatez", "3"), "--max-updatez"),
    ("train-fp16-on-cpu", "train", train("--fp16"), "--fp16 needs a CUDA device"),
    ("train-config-unknown-key", "train", ["{bin}", "--config", "{config_bad}", "--cpu"], "max-tokenz"),
    (
        "train-optimizer-overrides-not-json",
        "train",
        train("--optimizer-overrides", "lr=1"),
        "--optimizer-overrides",
    ),
    (
        "train-best-metric-unreported",
        "train",
        train("--best-checkpoint-metric", "bleu"),
        "--best-checkpoint-metric bleu",
    ),
    # an example longer than --max-tokens in the validation set, without --skip-invalid-size-inputs-valid-test
    ("train-max-tokens-below-an-example", "train", train("--max-tokens", "6"), "--skip-invalid-size-inputs"),
    # ---- seqtrain-train: data
    ("train-missing-data-bin", "train", ["{root}/nope"] + train()[1:], "{root}/nope"),
    ("train-missing-split", "train", train("--valid-subset", "test"), "test"),
    ("train-missing-dict", "train", train(data="bin_no_dict"), "dict.tgt.txt"),
    ("train-corrupt-idx", "train", train(data="bin_corrupt_idx"), "valid.src-tgt.src.idx"),
    ("train-truncated-bin", "train", train(data="bin_truncated_bin"), "train.src-tgt.tgt.bin"),
    (
        "train-source-target-counts-differ",
        "train",
        train(data="bin_counts_differ"),
        "{bin_counts_differ}/valid.src-tgt.src.idx has 12 examples but",
    ),
    (
        "train-empty-split",
        "train",
        train(data="bin_empty_valid"),
        "{bin_empty_valid}/valid.src-tgt.src.idx: split 'valid' has no examples",
    ),
    # ---- seqtrain-train: checkpoints
    ("train-restore-missing", "train", train("--restore-file", "{root}/nope.pt"), "{root}/nope.pt"),
    (
        "train-restore-not-a-checkpoint",
        "train",
        train("--restore-file", "{text_file}"),
        "{text_file} is not a PyTorch checkpoint",
    ),
    (
        "train-restore-other-arch",
        "train",
        train("--restore-file", "{ck}", "--encoder-layers", "2"),
        "do not fit the model architecture",
    ),
    (
        "train-restore-other-dictionary",
        "train",
        train("--restore-file", "{ck}", data="bin_other_dict"),
        "was trained with another source dictionary than {bin_other_dict}/dict.src.txt (40 vs 40 symbols, first "
        "difference at index 4:",
    ),
    (
        "train-finetune-missing",
        "train",
        train("--finetune-from-model", "{root}/nope.pt"),
        "--finetune-from-model",
    ),
    # ---- seqtrain-generate
    ("generate-path-missing", "generate", ["{bin}", "--path", "{root}/nope.pt", "--cpu"], "{root}/nope.pt"),
    (
        "generate-path-not-a-checkpoint",
        "generate",
        ["{bin}", "--path", "{text_file}", "--cpu"],
        "{text_file}",
    ),
    ("generate-min-len-above-max-len", "generate", gen("--min-len", "50"), "--min-len"),
    ("generate-beam-zero", "generate", gen("--beam", "0"), "--beam"),
    ("generate-nbest-above-beam", "generate", gen("--nbest", "3"), "--nbest"),
    ("generate-missing-split", "generate", gen("--gen-subset", "test"), "test"),
    (
        "generate-other-dictionary",
        "generate",
        gen(data="bin_other_dict"),
        "{bin_other_dict}/dict.src.txt: the source dictionary differs",
    ),
    (
        "generate-source-target-counts-differ",
        "generate",
        gen(data="bin_counts_differ"),
        "{bin_counts_differ}/valid.src-tgt.src.idx has 12 examples but",
    ),
    (
        "generate-corrupt-idx",
        "generate",
        gen("--gen-subset", "valid", data="bin_corrupt_idx"),
        "valid.src-tgt.src.idx",
    ),
    # ---- seqtrain-preprocess
    (
        "preprocess-missing-trainpref",
        "preprocess",
        ["-s", "src", "-t", "tgt", "--trainpref", "{raw}/nope", "--destdir", "{out}", "--tokenizer", "none"],
        "{raw}/nope",
    ),
    (
        "preprocess-line-counts-differ",
        "preprocess",
        [
            "-s",
            "src",
            "-t",
            "tgt",
            "--trainpref",
            "{raw}/uneven",
            "--destdir",
            "{out}",
            "--tokenizer",
            "none",
        ],
        "{raw}/uneven",
    ),
    (
        "preprocess-malformed-srcdict",
        "preprocess",
        [
            "-s",
            "src",
            "-t",
            "tgt",
            "--trainpref",
            "{raw}/train",
            "--destdir",
            "{out}",
            "--tokenizer",
            "none",
            "--srcdict",
            "{raw}/bad_dict.txt",
        ],
        "bad_dict.txt",
    ),
    (
        "preprocess-workers-zero",
        "preprocess",
        [
            "-s",
            "src",
            "-t",
            "tgt",
            "--trainpref",
            "{raw}/train",
            "--destdir",
            "{out}",
            "--tokenizer",
            "none",
            "--workers",
            "0",
        ],
        "--workers",
    ),
    (
        "preprocess-unknown-tokenizer",
        "preprocess",
        ["-s", "src", "-t", "tgt", "--trainpref", "{raw}/train", "--destdir", "{out}", "--tokenizer", "bert"],
        "--tokenizer",
    ),
    # ---- seqtrain-convert
    ("convert-input-missing", "convert", ["{root}/nope.pt", "{out}.pt", "--to", "hf"], "{root}/nope.pt"),
    ("convert-not-a-checkpoint", "convert", ["{text_file}", "{out}.pt", "--to", "hf"], "{text_file}"),
    ("convert-unknown-format", "convert", ["{ck}", "{out}.pt", "--to", "onnx"], "--to"),
    ("convert-output-is-input", "convert", ["{ck}", "{ck}", "--to", "seqtrain"], "output must differ"),
    (
        "convert-wrong-from",
        "convert",
        ["{ck}", "{out}.pt", "--to", "hf", "--from", "fairseq"],
        "--from fairseq",
    ),
    # ---- seqtrain-score
    (
        "score-sys-missing",
        "score",
        ["--sys", "{root}/nope.txt", "--ref", "{raw}/valid.tgt"],
        "{root}/nope.txt",
    ),
    (
        "score-line-counts-differ",
        "score",
        ["--sys", "{raw}/valid10.tgt", "--ref", "{raw}/valid.tgt"],
        "valid10.tgt",
    ),
]


def pre(*extra: str, prefix: str = "{raw}/train") -> list:
    return [
        "-s",
        "src",
        "-t",
        "tgt",
        "--trainpref",
        prefix,
        "--destdir",
        "{out}",
        "--tokenizer",
        "none",
        *extra,
    ]


# Round two (issue 17): numeric flags out of range, OS errors, data and checkpoints that claim what they do not
# hold. Every numeric flag of every CLI is also tried with NaN, inf, a negative, zero and a huge value by
# tests/unit/flags/test_numeric_flag_bounds.py.
CASES += [
    # ---- seqtrain-train: numbers
    ("train-lr-inf", "train", train("--lr", "inf"), "argument --lr: must be a finite number, got inf"),
    ("train-lr-nan", "train", train("--lr", "nan", "--optimizer", "sgd"), "argument --lr: must be a finite"),
    ("train-lr-list-with-nan", "train", train("--lr", "0.1,nan"), "argument --lr: must be a finite"),
    ("train-seed-negative", "train", train("--seed=-1"), "argument --seed: must be between 0 and 4294967295"),
    (
        "train-dropout-above-one",
        "train",
        train("--dropout", "2"),
        "argument --dropout: must be between 0 and 1",
    ),
    ("train-max-update-negative", "train", train("--max-update=-3"), "argument --max-update"),
    ("train-clip-norm-nan", "train", train("--clip-norm", "nan"), "argument --clip-norm: must be a finite"),
    (
        "train-warmup-updates-huge",
        "train",
        train("--warmup-updates", str(10**20)),
        "argument --warmup-updates",
    ),
    (
        "train-label-smoothing-above-one",
        "train",
        train("--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "1.5"),
        "argument --label-smoothing",
    ),
    (
        "train-attention-heads-zero",
        "train",
        train("--encoder-attention-heads", "0"),
        "--encoder-attention-heads",
    ),
    ("train-adam-eps-zero", "train", train("--adam-eps", "0"), "argument --adam-eps: must be above 0"),
    ("train-patience-negative", "train", train("--patience=-5"), "argument --patience: must be -1 (off) or"),
    ("train-update-freq-list-zero", "train", train("--update-freq", "2,0"), "argument --update-freq"),
    (
        "train-max-tokens-inf",
        "train",
        train("--max-tokens", "inf"),
        "argument --max-tokens: invalid int value",
    ),
    # ---- seqtrain-train: files
    (
        "train-log-file-missing-folder",
        "train",
        train("--log-file", "{root}/nope/train.log"),
        "{root}/nope/train.log",
    ),
    ("train-config-not-utf8", "train", ["{bin}", "--config", "{config_latin1}", "--cpu"], "not UTF-8 text"),
    ("train-config-value-out-of-range", "train", ["{bin}", "--config", "{config_dropout3}"], "dropout"),
    (
        "train-epoch-without-a-batch",
        "train",
        train("--max-tokens", "3", "--disable-validation"),
        "the training split 'train' has no batch",
    ),
    (
        "train-token-id-beyond-dictionary",
        "train",
        train(data="bin_bad_token"),
        "{bin_bad_token}/train.src-tgt.tgt.bin: token id 300 is out of range",
    ),
    (
        "train-denoising-pair-data-bin",
        "train",
        train("--task", "denoising"),
        "{bin}/dict.txt: dictionary not found (--task denoising reads a monolingual data-bin: run "
        "seqtrain-preprocess --only-source)",
    ),
    (
        "train-denoising-mask-above-one",
        "train",
        train("--task", "denoising", "--mask", "1.5", data="bin_mono"),
        "argument --mask: must be between 0 and 1, got 1.5",
    ),
    (
        "train-denoising-subword-replace-every-token",
        "train",
        train("--task", "denoising", "--mask", "0.3", "--replace-length", "-1", data="bin_mono"),
        "--mask-length subword needs --replace-length 0 or 1 (as in fairseq)",
    ),
    (
        "train-denoising-missing-split",
        "train",
        train("--task", "denoising", "--valid-subset", "test", data="bin_mono"),
        "{bin_mono}: split 'test' not found (expected test.bin and test.idx, as seqtrain-preprocess --only-source "
        "writes them)",
    ),
    # ---- seqtrain-generate
    ("generate-lenpen-nan", "generate", gen("--lenpen", "nan"), "argument --lenpen: must be a finite number"),
    (
        "generate-beam-huge",
        "generate",
        gen("--beam", "100000"),
        "argument --beam: must be between 1 and 10000",
    ),
    ("generate-temperature-zero", "generate", gen("--temperature", "0"), "argument --temperature"),
    ("generate-topp-above-one", "generate", gen("--sampling-topp", "2"), "argument --sampling-topp"),
    ("generate-max-len-b-negative", "generate", gen("--max-len-b=-1"), "argument --max-len-b"),
    ("generate-unkpen-inf", "generate", gen("--unkpen=-inf"), "argument --unkpen: must be a finite"),
    (
        "generate-token-id-beyond-dictionary",
        "generate",
        gen("--gen-subset", "train", data="bin_bad_token"),
        "train.src-tgt.tgt.bin: token id 300 is out of range",
    ),
    (
        "generate-crafted-huge-dimension",
        "generate",
        ["{bin}", "--path", "{ck_huge_dim}", "--cpu"],
        "encoder_embed_dim=1000000 is out of bounds",
    ),
    (
        "generate-crafted-bad-tokenizer",
        "generate",
        ["{bin}", "--path", "{ck_bad_tokenizer}", "--cpu"],
        "the tokenizer entry is a list",
    ),
    ("generate-input-is-a-folder", "generate", gen("--input", "{raw}"), "{raw}"),
    # ---- seqtrain-preprocess
    (
        "preprocess-zero-width-line",
        "preprocess",
        pre(prefix="{raw}/zero_width"),
        "zero_width.src:2: empty line",
    ),
    ("preprocess-blank-line", "preprocess", pre(prefix="{raw}/blank"), "blank.src:2: empty line"),
    ("preprocess-not-utf8", "preprocess", pre(prefix="{raw}/latin1"), "latin1.src:2: invalid UTF-8"),
    ("preprocess-destdir-is-a-file", "preprocess", pre("--destdir", "{text_file}"), "{text_file}"),
    ("preprocess-nwords-zero", "preprocess", pre("--nwordssrc", "0"), "argument --nwordssrc"),
    ("preprocess-threshold-negative", "preprocess", pre("--thresholdsrc=-2"), "argument --thresholdsrc"),
    (
        "preprocess-padding-factor-zero",
        "preprocess",
        pre("--padding-factor", "0"),
        "argument --padding-factor",
    ),
    ("preprocess-workers-huge", "preprocess", pre("--workers", "100000"), "argument --workers"),
    # ---- seqtrain-convert
    (
        "convert-hf-shard-outside-folder",
        "convert",
        ["{hf_shard_outside}", "{out}.pt", "--to", "seqtrain"],
        "'../hf/model.safetensors' is outside the model folder",
    ),
    (
        "convert-hf-shard-absolute-path",
        "convert",
        ["{hf_shard_absolute}", "{out}.pt", "--to", "seqtrain"],
        "'/etc/passwd' is outside the model folder",
    ),
    (
        "convert-hf-config-not-an-object",
        "convert",
        ["{hf_config_list}", "{out}.pt", "--to", "seqtrain"],
        "config.json: expected a JSON object",
    ),
    (
        "convert-crafted-string-dimension",
        "convert",
        ["{ck_string_dim}", "{out}", "--to", "hf"],
        "decoder_layers='1' is not an integer",
    ),
    (
        "convert-crafted-non-tensor-weight",
        "convert",
        ["{ck_list_weight}", "{out}", "--to", "hf"],
        "weight 'encoder.layers.0.fc1.bias' is a list, not a tensor",
    ),
    (
        "convert-dict-conflict-keeps-old-model",
        "convert",
        ["{ck}", "{export}/model.pt", "--to", "fairseq"],
        "{export}/dict.txt exists and differs",
    ),
    # ---- seqtrain-score
    (
        "score-ref-missing",
        "score",
        ["--sys", "{raw}/valid.tgt", "--ref", "{root}/nope.txt"],
        "{root}/nope.txt",
    ),
    ("score-sys-is-a-folder", "score", ["--sys", "{raw}", "--ref", "{raw}/valid.tgt"], "{raw}"),
    # ---- outputs (seqtrain.fileio.output_target): a folder at the path is refused, never replaced
    (
        "score-json-is-a-folder",
        "score",
        ["--sys", "{raw}/valid.tgt", "--ref", "{raw}/valid.tgt", "--json", "{raw}"],
        "{raw}: is a folder; give a file name",
    ),
    ("convert-output-is-a-folder", "convert", ["{ck}", "{raw}", "--to", "seqtrain"], "{raw}: is a folder"),
]

# Run through the installed console scripts (a fresh process each), not in-process.
SUBPROCESS = {
    "train-unknown-arch",
    "train-corrupt-idx",
    "generate-min-len-above-max-len",
    "convert-not-a-checkpoint",
    "score-line-counts-differ",
}


def fill(items: list, w: dict) -> list:
    return [s.format(**w) for s in items]


def tree_hashes(root: str) -> dict:
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            out[os.path.relpath(path, root)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


def run_in_process(cli: str, argv: list, capsys) -> tuple:
    main = importlib.import_module(f"seqtrain_cli.{cli}").cli_main
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.raises(SystemExit) as e:
            main(argv)
    finally:
        torch.set_num_threads(n)
    return e.value.code, capsys.readouterr().err


def run_subprocess(cli: str, argv: list) -> tuple:
    script = os.path.join(os.path.dirname(sys.executable), f"seqtrain-{cli}")
    cmd = [script] if os.path.exists(script) else [sys.executable, "-m", f"seqtrain_cli.{cli}"]
    proc = subprocess.run(
        cmd + argv,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    return proc.returncode, proc.stderr


def error_lines(err: str) -> list:
    # log records are not errors: training and generation log to stdout, a few warnings reach stderr
    return [
        ln for ln in err.strip().splitlines() if ln and " | WARNING | " not in ln and " | INFO | " not in ln
    ]


def test_catalogue_is_large_and_covers_every_cli():
    assert len(CASES) >= 80 and len({c[0] for c in CASES}) == len(CASES)
    assert {c[1] for c in CASES} == {"train", "generate", "preprocess", "convert", "score"}


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c[0], marks=[pytest.mark.slow] if c[0] in SUBPROCESS else []) for c in CASES]
)
def test_bad_input_gives_one_clear_line(world, capsys, case):
    name, cli, argv, expected = case
    argv, expected = fill(argv, world), expected.format(**world)
    before = tree_hashes(world["root"])
    if name in SUBPROCESS:
        code, err = run_subprocess(cli, argv)
    else:
        code, err = run_in_process(cli, argv, capsys)
    lines = error_lines(err)
    assert code not in (0, None) and "Traceback" not in err, err
    assert len(lines) == 1, err
    assert lines[0].startswith(f"seqtrain-{cli}: error: ") and expected in lines[0], lines[0]
    after = tree_hashes(world["root"])
    created = sorted(set(after) - set(before))
    # a refused training run may have created its (empty) --save-dir folder; no file appears or changes
    assert created == [] and {k: after[k] for k in before} == before, created


def test_debug_shows_the_traceback(world, capsys):
    from seqtrain.errors import SeqtrainError

    with pytest.raises(SeqtrainError, match="unknown arch"):
        importlib.import_module("seqtrain_cli.train").cli_main(
            fill(["{bin}", "--arch", "nope", "--debug"], world)
        )


def test_docs_catalogue_lists_exactly_the_tested_cases():
    """docs/reliability.md's bad-input table and CASES name the same cases, in the same order."""
    import re

    with open(os.path.join(REPO, "docs", "reliability.md"), encoding="utf-8") as f:
        documented = re.findall(r"^\| `([a-z0-9-]+)` \| \d \| `", f.read(), flags=re.MULTILINE)
    assert documented == [c[0] for c in CASES]
