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
        add_round_three_inputs(w)
        add_round_four_inputs(w)
        add_round_five_inputs(w, str(tmp_path_factory.mktemp("endless")))
        w["home"] = str(
            tmp_path_factory.mktemp("home")
        )  # a HOME without W&B credentials, outside the hashed tree
    finally:
        torch.set_num_threads(n)
    w["plugin"] = str(REPO / "tests" / "plugins" / "seqtrain_toy_plugin")  # --user-dir for toy criteria
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
    add_round_three_damaged_inputs(w, obj)
    add_round_four_checkpoints(w, obj)
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


def add_round_three_inputs(w: dict) -> None:
    """Inputs of the third round (issue 31, items 3, 4, 8 and 9): small files that expand without bound, values
    only the command line used to check, overrides of the wrong kind."""
    import json

    root, raw = w["root"], w["raw"]
    bomb = (
        "a: &a ["
        + ", ".join(['"lol"'] * 9)
        + "]\n"
        + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    )
    configs = {
        "config_alias_bomb": (
            "bomb.yaml",
            "arch: bart_tiny\n" + bomb.replace("a: &a", "eval-rouge-args: &a", 1),
        ),
        "config_deep": ("deep.yaml", "arch: " + "[" * 100_000 + "]" * 100_000 + "\n"),
        "config_deep_json": ("deep.json", '{"arch": ' + "[" * 100_000 + "]" * 100_000 + "}\n"),
        "config_duplicate": ("duplicate.yaml", "arch: bart_tiny\nlr: 0.1\nlr: 0.2\n"),
        "config_huge_int": ("huge_int.yaml", "arch: bart_tiny\nseed: " + "9" * 5000 + "\n"),
        "config_seed_float": ("seed_float.yaml", "arch: bart_tiny\nseed: 3.7\n"),
        "config_too_large": ("too_large.yaml", "arch: bart_tiny\n# " + "x" * (1 << 20) + "\n"),
    }
    for key, (name, text) in configs.items():
        w[key] = os.path.join(root, name)
        with open(w[key], "w") as f:
            f.write(text)
    with open(os.path.join(raw, "train.src")) as fs, open(os.path.join(raw, "train.tgt")) as ft:
        rows = [{"src": a.strip(), "tgt": b.strip()} for a, b in zip(fs, ft)]
    with open(os.path.join(raw, "deep.jsonl"), "w") as f:
        f.write(json.dumps(rows[0]) + "\n" + '{"src": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    rows[3]["src"] = "\x01"  # sentencepiece keeps nothing of a control character
    with open(os.path.join(raw, "nothing.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(raw, "long_line.txt"), "w") as f:
        f.write("w1 w2\n" + "w3 " * 5000 + "\n")
    for name, config in [
        ("hf_num_beams", {"num_beams": 1000000}),
        ("hf_forced_bos", {"forced_bos_token_id": 10**9}),
    ]:
        w[name] = os.path.join(root, name)
        shutil.copytree(w["hf"], w[name])
        with open(os.path.join(w[name], "generation_config.json"), "w") as f:
            json.dump(config, f)


def add_round_three_damaged_inputs(w: dict, obj: dict) -> None:
    """Inputs of the third round (issue 31): damaged checkpoints that loaded silently, hostile state files."""
    import struct
    import zipfile
    import zlib

    root = w["root"]
    # a flipped byte in the middle of a weight's zip record (torch.load checks no CRC)
    w["ck_flipped"] = os.path.join(root, "ck_flipped.pt")
    shutil.copy(w["ck"], w["ck_flipped"])
    storage = obj["model"]["encoder.layers.0.fc1.weight"].untyped_storage()
    crc = zlib.crc32(torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),)).numpy())
    with zipfile.ZipFile(w["ck_flipped"]) as z:
        info = next(i for i in z.infolist() if "/data/" in i.filename and i.CRC == crc)
    with open(w["ck_flipped"], "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
        at = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))
    # NaN weights (a diverged run's file from elsewhere)
    nan = {**obj, "model": dict(obj["model"])}
    bias = nan["model"]["decoder.layers.0.fc2.bias"].clone()
    bias[2] = float("nan")
    nan["model"]["decoder.layers.0.fc2.bias"] = bias
    w["ck_nan"] = os.path.join(root, "ck_nan.pt")
    torch.save(nan, w["ck_nan"])
    # a FIFO where the --save-dir lock belongs: start-up used to wait on it for ever
    w["save_fifo_lock"] = os.path.join(root, "save_fifo_lock")
    os.makedirs(w["save_fifo_lock"])
    os.mkfifo(os.path.join(w["save_fifo_lock"], ".seqtrain.lock"))
    # a FIFO given as the checkpoint: opening it waited for a writer for ever
    w["fifo_pt"] = os.path.join(root, "fifo.pt")
    os.mkfifo(w["fifo_pt"])
    # a dictionary of another model: 300 symbols for the checkpoint's 40 rows
    w["dict_other_model"] = os.path.join(root, "dict_other_model.txt")
    with open(w["dict_other_model"], "w") as f:
        f.writelines(f"x{i} 1\n" for i in range(296))


def add_round_four_inputs(w: dict) -> None:
    """Inputs of the fourth round (issue 40) besides checkpoints."""
    raw = w["raw"]
    with open(os.path.join(raw, "train.src")) as fs, open(os.path.join(raw, "train.tgt")) as ft:
        rows = [f'{{"src": "{a.strip()}", "tgt": "{b.strip()}"}}' for a, b in zip(fs, ft)]
    rows[2] = '{"src": "w1 \\ud800 w2", "tgt": "w3"}'  # a lone surrogate: valid JSON, no text
    with open(os.path.join(raw, "surrogate.jsonl"), "w") as f:
        f.writelines(r + "\n" for r in rows)
    # a Hugging Face folder whose only tokenizer file is a tokenizer.json the tokenizers library cannot read
    w["hf_bad_tokenizer_json"] = os.path.join(w["root"], "hf_bad_tokenizer_json")
    shutil.copytree(w["hf"], w["hf_bad_tokenizer_json"])
    with open(os.path.join(w["hf_bad_tokenizer_json"], "tokenizer.json"), "w") as f:
        f.write('{"model": {"type": "Nope"}}\n')


def add_round_five_inputs(w: dict, endless: str) -> None:
    """Inputs of the fifth round (issue 48): other names for the inputs (links), files without a line end (in
    `endless`, outside the hashed tree: sparse files of zero bytes), configs and output folders."""
    root, raw = w["root"], w["raw"]
    os.symlink(os.path.join(raw, "valid.tgt"), os.path.join(root, "ref_link.txt"))
    os.link(os.path.join(raw, "valid10.tgt"), os.path.join(root, "hyp_hard.txt"))
    os.link(w["ck"], os.path.join(root, "ck_hard.pt"))
    os.makedirs(os.path.join(root, "results"))
    shutil.copy(os.path.join(raw, "valid.tgt"), os.path.join(root, "results", "references-input.txt"))
    os.makedirs(os.path.join(root, "tuned"))
    os.symlink(os.path.join(raw, "valid.tgt"), os.path.join(root, "tuned", "tune.json"))
    os.makedirs(os.path.join(root, "tuned_folder", "generation.yaml"))
    for name, text in [
        ("beam_wide.yaml", "beam: 40\n"),
        ("beam_section.yaml", "beam: {a: 1}\n"),
        ("arch_nope.yaml", "lr: 0.1\narch: no_such_arch\n"),
        ("blank12.txt", "\n" * 6 + " \n" * 6),
    ]:
        with open(os.path.join(root, name), "w") as f:
            f.write(text)
    from seqtrain.fileio import MAX_LINE_BYTES

    w["endless"] = endless
    for name in ("endless.txt", "endless.src", "endless.tgt", "endless.jsonl"):
        with open(os.path.join(endless, name), "wb") as f:
            f.truncate(MAX_LINE_BYTES + 10)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:  # the parquet case is skipped (NEEDS)
        return
    docs = pa.array([b"w1 w2", b"w3 \xed\xa0\x80 w4"], type=pa.binary())  # U+D800's bytes: no UTF-8
    table = pa.table(
        {"src": pa.Array.from_buffers(pa.string(), 2, docs.buffers()), "tgt": pa.array(["w5", "w6"])}
    )
    pq.write_table(table, os.path.join(raw, "bad_utf8.parquet"))


def add_round_four_checkpoints(w: dict, obj: dict) -> None:
    """Checkpoints of the fourth round (issue 40): fields the content checks did not cover (LoRA's, the EMA,
    --max-tokens auto's choice, mBART's langs, the positions), crafted as plain data."""
    q_proj = obj["model"]["encoder.layers.0.self_attn.q_proj.weight"]
    for name, args, model, extra in [
        ("ck_lora_rank_string", {"lora_rank": "2"}, {}, {}),
        ("ck_lora_rank_huge", {"lora_rank": 10**8}, {}, {}),
        ("ck_lora_alpha_nan", {"lora_rank": 2, "lora_alpha": float("nan")}, {}, {}),
        (
            "ck_lora_adapter_no_module",
            {"lora_rank": 2},
            {"encoder.layers.0.self_attn.nope.lora_A": torch.zeros(2, q_proj.shape[1])},
            {},
        ),
        ("ck_ema_not_tensors", {}, {}, {"ema": "weights"}),
        ("ck_auto_max_tokens_huge", {}, {}, {"auto_max_tokens": 10**12}),
        ("ck_langs_not_text", {"langs": 5}, {}, {}),
        ("ck_positions_differ", {"max_target_positions": 3}, {}, {}),
        ("ck_other_activation", {"activation_fn": "relu"}, {}, {}),  # the same shapes: another model
    ]:
        crafted = {
            **obj,
            "args": {**obj["args"], **args},
            "model": {**obj["model"], **model},
            "extra_state": {**(obj.get("extra_state") or {}), **extra},
        }
        w[name] = os.path.join(w["root"], name + ".pt")
        torch.save(crafted, w[name])


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
    (
        "train-bf16-mode-without-bf16",
        "train",
        train("--bf16-mode", "fairseq"),
        "--bf16-mode fairseq needs --bf16",
    ),
    (
        "train-bf16-mode-memory-efficient",
        "train",
        train("--memory-efficient-bf16", "--bf16-mode", "fairseq"),
        "--memory-efficient-bf16",
    ),
    (
        "train-bf16-mode-fsdp",
        "train",
        train("--bf16", "--bf16-mode", "fairseq", "--ddp-backend", "fully_sharded"),
        "--ddp-backend fully_sharded",
    ),
    ("train-config-unknown-key", "train", ["{bin}", "--config", "{config_bad}", "--cpu"], "max-tokenz"),
    (
        "train-eval-rouge-args-switch-not-bool",
        "train",
        train("--eval-rouge", "--eval-rouge-args", '{{"packed_encoder": "yes"}}'),  # (braces doubled: format)
        "--eval-rouge-args: packed_encoder must be true, false or null, got 'yes'",
    ),
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
    (
        "convert-output-is-input",
        "convert",
        ["{ck}", "{ck}", "--to", "seqtrain"],
        "OUTPUT {ck} is INPUT {ck} (the same file): writing it would replace that input; give OUTPUT another file",
    ),
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


KD = "label_smoothed_cross_entropy_with_distillation"


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
        "train-distill-alpha-above-one",
        "train",
        train("--criterion", KD, "--teacher-path", "{ck}", "--distill-alpha", "1.5"),
        "argument --distill-alpha: must be between 0 and 1, got 1.5",
    ),
    (
        "train-distill-temperature-zero",
        "train",
        train("--criterion", KD, "--teacher-path", "{ck}", "--distill-temperature", "0"),
        "argument --distill-temperature: must be between 0.01 and 1000, got 0",
    ),
    (
        "train-distill-no-teacher",
        "train",
        train("--criterion", KD),
        f"--criterion {KD} needs --teacher-path CKPT",
    ),
    (
        "train-teacher-dictionary-differs",
        "train",
        train("--criterion", KD, "--teacher-path", "{ck}", data="bin_other_dict"),
        "--teacher-path {ck}: its dictionary differs from {bin_other_dict}/dict.src.txt",
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
        "argument --max-tokens: expected a number of tokens or auto, got 'inf'",
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
    # ---- round three (issue 31): hostile state files and environments, corruption that passed
    (
        "train-save-dir-lock-is-a-fifo",
        "train",
        train(save="save_fifo_lock"),
        "the lock {save_fifo_lock}/.seqtrain.lock is a FIFO, not a regular file",
    ),
    (
        "train-slurm-procid-beyond-ntasks",
        "train",
        train(),
        "SLURM_PROCID='5' is out of range: must be between 0 and 1 (SLURM_NTASKS=2)",
    ),
    ("train-slurm-nodelist-unclosed", "train", train(), "SLURM_NODELIST='node[01-': '[' without its ']'"),
    (
        "generate-flipped-weight-byte",
        "generate",
        gen("--path", "{ck_flipped}"),
        "{ck_flipped} is corrupted: the bytes of weight 'encoder.layers.0.fc1.weight' fail",
    ),
    (
        "convert-flipped-weight-byte",
        "convert",
        ["{ck_flipped}", "{out}.pt", "--to", "seqtrain"],
        "{ck_flipped} is corrupted: the bytes of weight 'encoder.layers.0.fc1.weight' fail",
    ),
    (
        "generate-path-is-a-fifo",
        "generate",
        gen("--path", "{fifo_pt}"),
        "{fifo_pt} is a FIFO, not a checkpoint",
    ),
    (
        "convert-input-is-a-fifo",
        "convert",
        ["{fifo_pt}", "{out}.pt", "--to", "seqtrain"],
        "{fifo_pt} is a FIFO, not a checkpoint",
    ),
    (
        "train-restore-file-is-a-fifo",
        "train",
        train("--restore-file", "{fifo_pt}"),
        "{fifo_pt} is a FIFO, not a checkpoint",
    ),
    (
        "convert-dict-of-another-model",
        "convert",
        ["{ck}", "{out}.pt", "--to", "seqtrain", "--dict", "{dict_other_model}"],
        "encoder.embed_tokens.weight has 40 rows but the dictionary has 300 symbols",
    ),
    (
        "generate-nan-weight",
        "generate",
        gen("--path", "{ck_nan}"),
        "{ck_nan}: weight 'decoder.layers.0.fc2.bias' holds 1 non-finite value(s) (the first: nan)",
    ),
]

# Round three (issue 31): small inputs that expanded without bound, bounds only the command line applied,
# overrides of the wrong kind, config values read otherwise than on the command line.
CASES += [
    # ---- --config files: bounded before anything is built
    (
        "train-config-yaml-alias-bomb",
        "train",
        ["{bin}", "--config", "{config_alias_bomb}"],
        "--config {config_alias_bomb} line 3: YAML aliases (*a) are not supported",
    ),
    (
        "train-config-nested-too-deep",
        "train",
        ["{bin}", "--config", "{config_deep}"],
        "--config {config_deep} line 1: nested more than 100 levels deep",
    ),
    (
        "train-config-json-nested-too-deep",
        "train",
        ["{bin}", "--config", "{config_deep_json}"],
        "--config {config_deep_json}: nested more than 100 levels deep",
    ),
    (
        "train-config-too-large",
        "train",
        ["{bin}", "--config", "{config_too_large}"],
        "--config {config_too_large}: larger than 1 MiB",
    ),
    (
        "train-config-duplicate-key",
        "train",
        ["{bin}", "--config", "{config_duplicate}"],
        "--config {config_duplicate} line 3: 'lr' is given twice (also line 2)",
    ),
    (
        "train-config-huge-integer",
        "train",
        ["{bin}", "--config", "{config_huge_int}"],
        "--config {config_huge_int} line 2: an integer of 5000 digits (at most 100)",
    ),
    (
        "train-config-seed-not-an-integer",
        "train",
        ["{bin}", "--config", "{config_seed_float}"],
        "line 2 (seed): invalid value 3.7 (expected an integer)",
    ),
    # ---- overrides checked against what they replace
    (
        "train-optimizer-overrides-not-an-object",
        "train",
        train("--optimizer-overrides", "[1]"),
        "--optimizer-overrides: not a JSON object: '[1]'",
    ),
    (
        "train-optimizer-overrides-wrong-kind",
        "train",
        train(
            "--restore-file", "{ck}", "--optimizer-overrides", '{{"betas": 5}}'
        ),  # {{ }}: fill's str.format
        "--optimizer-overrides: betas=5 does not fit the optimizer's betas=(0.9, 0.999)",
    ),
    (
        "generate-model-overrides-wrong-kind",
        "generate",
        gen("--model-overrides", '{{"encoder_embed_dim": "x"}}'),
        "--model-overrides: encoder_embed_dim='x' does not fit the checkpoint's encoder_embed_dim=",
    ),
    # ---- a Hugging Face folder's generation_config.json: the command line's checks, naming the file
    (
        "generate-hf-num-beams-huge",
        "generate",
        ["{bin}", "--path", "{hf_num_beams}", "--cpu", "--gen-subset", "valid"],
        "{hf_num_beams}/generation_config.json: num_beams=1000000 is out of range for --beam (must be between 1",
    ),
    (
        "generate-hf-forced-bos-not-a-token",
        "generate",
        ["{bin}", "--path", "{hf_forced_bos}", "--cpu", "--gen-subset", "valid"],
        "{hf_forced_bos}/generation_config.json: forced_bos_token_id=1000000000 is not a token of the model",
    ),
    # ---- JSON lines
    (
        "preprocess-jsonl-nested-too-deep",
        "preprocess",
        pre("--jsonl", "--source-key", "src", "--target-key", "tgt", prefix="{raw}/deep"),
        "{raw}/deep.jsonl:2: nested more than 100 levels deep",
    ),
    (
        "preprocess-jsonl-value-tokenizes-to-nothing",
        "preprocess",
        pre("--jsonl", "--tokenizer", "sentencepiece", "--spm-vocab-size", "30", prefix="{raw}/nothing"),
        "{raw}/nothing.jsonl:4: its 'src' value tokenizes to nothing",
    ),
    # ---- trackers: W&B without an API key, no terminal, no server in reach (CASE_ENV)
    (
        "train-wandb-without-api-key",
        "train",
        train("--wandb-project", "seqtrain-test"),
        "--wandb-project seqtrain-test: W&B did not start (No API key configured. Use `wandb login` to log in.); "
        "log in with `wandb login` (or set WANDB_API_KEY), or log offline with WANDB_MODE=offline",
    ),
    # ---- seqtrain-score: lines bounded before scoring
    (
        "score-line-too-long",
        "score",
        ["--sys", "{raw}/long_line.txt", "--ref", "{raw}/long_line.txt"],
        "{raw}/long_line.txt:2: 5000 words, more than the 4096 ROUGE scores per line",
    ),
]

# Issue 26: --deterministic refuses what would make a run non-deterministic, in one line naming the flag
CASES += [
    (
        "train-deterministic-cudnn-attention",
        "train",
        train("--deterministic", "--cudnn-attention"),
        "--cudnn-attention and --deterministic exclude each other",
    ),
    (
        "train-deterministic-cublas-config",
        "train",
        train("--deterministic"),
        "--deterministic: CUBLAS_WORKSPACE_CONFIG=':0:0' is not a deterministic cuBLAS setting",
    ),
    (  # an operator torch has no deterministic kernel for (Tensor.put_, in a --user-dir criterion), met in the
        # training step (without validation; tests/e2e/test_distributed.py meets it in validation's dry run)
        "train-deterministic-operator-without-kernel",
        "train",
        train(
            "--deterministic",
            "--disable-validation",
            "--user-dir",
            "{plugin}",
            "--criterion",
            "toy_put_cross_entropy",
        ),
        "--deterministic: put_ has no deterministic implementation in torch",
    ),
]

# Round four (issue 40): every checkpoint field a reader uses checked before anything is allocated (generate,
# convert and resume alike); flags added since round three bounded where ranges live (seqtrain.flag_bounds)
CASES += [
    (
        "generate-ck-lora-rank-not-an-integer",
        "generate",
        gen("--path", "{ck_lora_rank_string}"),
        "{ck_lora_rank_string}: model arg lora_rank='2' is not an integer",
    ),
    (
        "generate-ck-lora-rank-above-the-width",
        "generate",
        gen("--path", "{ck_lora_rank_huge}"),
        "{ck_lora_rank_huge}: model arg lora_rank=100000000 is out of bounds",
    ),
    (
        "convert-ck-lora-alpha-nan",
        "convert",
        ["{ck_lora_alpha_nan}", "{out}", "--to", "hf"],
        "{ck_lora_alpha_nan}: model arg lora_alpha=nan is not a finite number",
    ),
    (
        "generate-ck-lora-adapter-without-its-module",
        "generate",
        gen("--path", "{ck_lora_adapter_no_module}"),
        "{ck_lora_adapter_no_module}: weight 'encoder.layers.0.self_attn.nope.lora_A' adapts "
        "encoder.layers.0.self_attn.nope, which is no projection",
    ),
    (
        "train-resume-ck-ema-not-tensors",
        "train",
        train("--restore-file", "{ck_ema_not_tensors}", "--store-ema"),
        "{ck_ema_not_tensors}: extra_state['ema'] is a str, not a dict of tensors",
    ),
    (
        "train-resume-ck-auto-max-tokens-huge",
        "train",
        train("--restore-file", "{ck_auto_max_tokens_huge}"),
        "{ck_auto_max_tokens_huge}: extra_state['auto_max_tokens']=1000000000000 is not an integer >= 1",
    ),
    (
        "generate-ck-langs-not-text",
        "generate",
        gen("--path", "{ck_langs_not_text}"),
        "{ck_langs_not_text}: model arg langs=5 is not a string",
    ),
    (
        "generate-ck-positions-differ-from-the-weights",
        "generate",
        gen("--path", "{ck_positions_differ}"),
        "{ck_positions_differ}: model arg max_target_positions=3 does not match the stored "
        "decoder.embed_positions.weight of shape",
    ),
    (
        "train-lora-rank-huge",
        "train",
        train("--lora-rank", "2147483647"),
        "argument --lora-rank: must be between 0 and 65536, got 2147483647",
    ),
    (
        "train-lora-rank-above-the-model",
        "train",
        train("--lora-rank", "10000"),
        "--lora-rank 10000: above the narrowest projection it adapts (64); give at most 64",
    ),
    (
        "train-poisson-lambda-huge",
        "train",
        train(
            "--task",
            "denoising",
            "--mask-length",
            "span-poisson",
            "--poisson-lambda",
            "1000",
            data="bin_mono",
        ),
        "argument --poisson-lambda: must be above 0 and at most 16, got 1000",
    ),
    (
        "average-another-architecture",
        "average_checkpoints",
        ["--inputs", "{ck}", "{ck_other_activation}", "--output", "{out}"],
        "{ck_other_activation}: architecture argument activation_fn='relu', {ck} has activation_fn='gelu'",
    ),
    (
        "generate-bpe-not-the-data-bins-tokenizer",
        "generate",
        gen("--bpe", "sentencepiece", "--sentencepiece-model", "{raw}/train.src"),
        "--sentencepiece-model {raw}/train.src: not a sentencepiece model",
    ),
    (
        "train-bpe-another-kind-than-the-data-bins",
        "train",
        train("--bpe", "gpt2"),
        "--bpe gpt2: {bin} was made with the none tokenizer (its tokenizer.json)",
    ),
    (
        "generate-hf-tokenizer-json-unreadable",
        "generate",
        ["{bin}", "--path", "{hf_bad_tokenizer_json}", "--cpu", "--gen-subset", "valid"],
        "{hf_bad_tokenizer_json}/tokenizer.json: not a tokenizer the tokenizers library reads",
    ),
    (
        "preprocess-jsonl-lone-surrogate",
        "preprocess",
        pre("--jsonl", "--source-key", "src", "--target-key", "tgt", prefix="{raw}/surrogate"),
        "{raw}/surrogate.jsonl:3: 'src' holds a lone surrogate (\\ud800 at character 4)",
    ),
]

# Issue 38: seqtrain-eval's inputs and outputs; the table inputs of seqtrain-preprocess
CASES += [
    (
        "eval-hypothesis-count-differs",
        "eval",
        ["--hyps", "{raw}/valid10.tgt", "--source", "{raw}/valid.src", "--reference", "{raw}/valid.tgt"],
        "{raw}/valid10.tgt: 10 hypotheses but {raw}/valid.tgt has 12 references (one line each, same order)",
    ),
    (
        "eval-html-folder-missing",
        "eval",
        [
            "--hyps",
            "{raw}/valid.tgt",
            "--source",
            "{raw}/valid.src",
            "--reference",
            "{raw}/valid.tgt",
            "--html",
            "{root}/nofolder/r.html",
        ],  # fmt: skip
        "--html {root}/nofolder/r.html: folder {root}/nofolder does not exist; create it first",
    ),
    (
        "preprocess-parquet-missing",
        "preprocess",
        pre("--parquet", prefix="{raw}/nope"),
        "--trainpref {raw}/nope: input file not found: {raw}/nope.parquet",
    ),
]


def tune(*extra: str, out: str = "{out}", inp: str = "{raw}/valid.src") -> list:
    return ["{bin}", "--path", "{ck}", "--cpu", "--input", inp, "--reference", "{raw}/valid.tgt",
            "--tune-output", out, "--tune-subset", "4", *extra]  # fmt: skip


def interactive(*extra: str) -> list:
    return ["{bin}", "--path", "{ck}", "--cpu", "--input", "{raw}/valid.src", *extra]


def evaluate(*extra: str, hyps: str = "{raw}/valid.tgt") -> list:
    return ["--hyps", hyps, "--source", "{raw}/valid.src", "--reference", "{raw}/valid.tgt", *extra]


ENDLESS = "no line end within 16 MiB (16,777,216 bytes); a text input holds one example per line (is this a text file?)"
WIDE = (
    "--beam 40 is wider than the model's vocabulary allows: beam search keeps at most 39 hypotheses (its 40 target "
    "symbols less <pad>, which no search picks); give --beam 39 or less"
)


def replaces(out: str, path: str, flag: str, inp: str) -> str:
    return f"{out} {path} is {flag} {inp} (the same file): writing it would replace that input; give {out} another file"


# Issue 48 (round five): an output never replaces an input, whatever the path's spelling; an endless line is
# refused at the bound; a beam the vocabulary cannot fill; config keys; the smaller ones
CASES += [
    ("eval-html-onto-source", "eval", evaluate("--html", "{raw}/valid.src"),
     replaces("--html", "{raw}/valid.src", "--source", "{raw}/valid.src")),
    ("eval-json-onto-reference-through-a-link", "eval",
     evaluate("--json", "{root}/ref_link.txt", hyps="{raw}/uneven.tgt"),
     replaces("--json", "{root}/ref_link.txt", "--reference", "{raw}/valid.tgt")),
    ("eval-html-onto-hyps-hard-link", "eval",
     evaluate("--html", "{root}/hyp_hard.txt", hyps="{raw}/valid10.tgt"),
     replaces("--html", "{root}/hyp_hard.txt", "--hyps", "{raw}/valid10.tgt")),
    ("eval-html-and-json-the-same-file", "eval", evaluate("--json", "{out}.html", "--html", "{out}.html"),
     "--json {out}.html and --html {out}.html are the same file: one output would replace the other; give each "
     "its own file"),
    ("score-json-onto-sys-through-dotdot", "score",
     ["--sys", "{raw}/valid10.tgt", "--ref", "{raw}/valid.tgt", "--json", "{raw}/../raw/valid10.tgt"],
     replaces("--json", "{raw}/../raw/valid10.tgt", "--sys", "{raw}/valid10.tgt")),
    ("generate-output-onto-input", "generate", gen("--input", "{raw}/valid.src", "--output", "{raw}/valid.src"),
     replaces("--output", "{raw}/valid.src", "--input", "{raw}/valid.src")),
    ("generate-results-path-onto-the-reference", "generate",
     gen("--input", "{raw}/valid.src", "--reference", "{root}/results/references-input.txt", "--results-path",
         "{root}/results"),
     replaces("--results-path", "{root}/results/references-input.txt", "--reference",
              "{root}/results/references-input.txt")),
    ("generate-log-file-onto-a-data-bin-file", "generate", gen("--log-file", "{bin}/dict.src.txt"),
     replaces("--log-file", "{bin}/dict.src.txt", "DATA", "{bin}/dict.src.txt")),
    ("tune-json-a-link-to-the-reference", "tune", tune(out="{root}/tuned"),
     replaces("--tune-output", "{root}/tuned/tune.json", "--reference", "{raw}/valid.tgt")),
    ("tune-preset-is-a-folder", "tune", tune(out="{root}/tuned_folder"),
     "--tune-output {root}/tuned_folder/generation.yaml: is a folder; give a file name"),
    ("interactive-log-file-onto-input", "interactive", interactive("--log-file", "{raw}/valid.src"),
     replaces("--log-file", "{raw}/valid.src", "--input", "{raw}/valid.src")),
    ("train-log-file-onto-a-data-bin-file", "train", train("--log-file", "{bin}/train.src-tgt.src.idx"),
     replaces("--log-file", "{bin}/train.src-tgt.src.idx", "DATA", "{bin}/train.src-tgt.src.idx")),
    ("average-output-a-hard-link-of-an-input", "average_checkpoints",
     ["--inputs", "{ck}", "--output", "{root}/ck_hard.pt"],
     replaces("--output", "{root}/ck_hard.pt", "--inputs", "{ck}")),
    ("eval-hyps-endless-device", "eval", evaluate(hyps="/dev/zero"), f"/dev/zero:1: {ENDLESS}"),
    ("score-sys-endless-line", "score", ["--sys", "{endless}/endless.txt", "--ref", "{raw}/valid.tgt"],
     f"{{endless}}/endless.txt:1: {ENDLESS}"),
    ("generate-input-endless-line", "generate", gen("--input", "{endless}/endless.txt"),
     f"{{endless}}/endless.txt:1: {ENDLESS}"),
    ("tune-input-endless-line", "tune", tune(inp="{endless}/endless.txt"),
     f"{{endless}}/endless.txt:1: {ENDLESS}"),
    ("interactive-input-endless-line", "interactive", interactive()[:4] + ["--input", "{endless}/endless.txt"],
     f"{{endless}}/endless.txt:1: {ENDLESS}"),
    ("preprocess-endless-line", "preprocess", pre(prefix="{endless}/endless"), f"{{endless}}/endless.src:1: {ENDLESS}"),
    ("preprocess-srcdict-endless-line", "preprocess", pre("--srcdict", "{endless}/endless.txt"),
     f"{{endless}}/endless.txt:1: {ENDLESS}"),
    ("preprocess-jsonl-endless-line", "preprocess", pre("--jsonl", prefix="{endless}/endless"),
     f"{{endless}}/endless.jsonl:1: {ENDLESS}"),
    ("generate-beam-wider-than-the-vocabulary", "generate", gen("--beam", "40"), WIDE),
    ("generate-config-beam-wider-than-the-vocabulary", "generate",
     ["{bin}", "--path", "{ck}", "--cpu", "--gen-subset", "valid", "--config", "{root}/beam_wide.yaml"], WIDE),
    ("generate-diverse-beam-wider-than-the-vocabulary", "generate", gen("--beam", "80", "--diverse-beam-groups", "2"),
     "--beam 80 is wider than the model's vocabulary allows: beam search keeps at most 39 hypotheses per group of "
     "--diverse-beam-groups 2 (its 40 target symbols less <pad>, which no search picks); give --beam 78 or less"),
    ("tune-beam-wider-than-the-vocabulary", "tune", tune("--beam", "40"), WIDE),
    ("interactive-beam-wider-than-the-vocabulary", "interactive", interactive("--beam", "40"), WIDE),
    ("train-eval-rouge-beam-wider-than-the-vocabulary", "train",
     train("--eval-rouge", "--eval-rouge-args", '{{"beam": 40}}'),
     WIDE.replace("--beam", "--eval-rouge-args beam")),
    ("generate-config-flag-read-as-a-section", "generate", gen("--config", "{root}/beam_section.yaml"),
     "--config {root}/beam_section.yaml line 1 (beam): 'beam' is a flag, and its value is a mapping; give the flag a "
     "value (a mapping is a section only under a name that is no flag)"),
    ("generate-config-unknown-arch", "generate", gen("--config", "{root}/arch_nope.yaml"),
     "--config {root}/arch_nope.yaml line 2 (arch): unknown arch 'no_such_arch'; choose from: bart_base"),
    ("score-references-all-empty", "score", ["--sys", "{raw}/valid.tgt", "--ref", "{root}/blank12.txt"],
     "{root}/blank12.txt: all 12 references are empty lines; nothing to score against"),
    ("generate-rerank-one-candidate", "generate", gen("--rerank", "mbr", "--beam", "1"),
     "--rerank mbr chooses among the beam's finished hypotheses, and --beam 1 leaves one: nothing to rerank; give "
     "--beam 2 or more (or drop --rerank)"),
    ("train-distill-temperature-tiny", "train",
     train("--criterion", KD, "--teacher-path", "{ck}", "--distill-temperature", "1e-30"),
     "argument --distill-temperature: must be between 0.01 and 1000, got 1e-30 (see --help)"),
    ("train-teacher-positions-below-the-students", "train",
     train("--criterion", KD, "--teacher-path", "{ck}", "--max-source-positions", "2048"),
     "--teacher-path {ck}: the teacher reads at most 1024 source and 1024 target tokens (its max_source_positions "
     "/ max_target_positions), fewer than this run's --max-source-positions 2048 / --max-target-positions 1024"),
    ("train-denoising-teacher-other-dictionary", "train",
     train("--task", "denoising", "--criterion", KD, "--teacher-path", "{ck}", data="bin_mono"),
     "--teacher-path {ck}: its dictionary differs from {bin_mono}/dict.txt"),
    ("preprocess-parquet-invalid-utf8", "preprocess",
     pre("--parquet", "--source-key", "src", "--target-key", "tgt", prefix="{raw}/bad_utf8"),
     "{raw}/bad_utf8.parquet:2: 'src' holds invalid UTF-8 (byte 0xed at byte 4 of the value), which is no text"),
]  # fmt: skip

# Environment variables a case runs with (set for the in-process run only)
_SLURM = dict(SLURM_STEP_ID="0", SLURM_JOB_ID="9", SLURM_PROCID="0", SLURM_NTASKS="2", SLURM_NNODES="1")
ENV = {
    "train-slurm-procid-beyond-ntasks": dict(_SLURM, SLURM_PROCID="5", SLURM_NODELIST="n1"),
    "train-slurm-nodelist-unclosed": dict(_SLURM, SLURM_NODELIST="node[01-"),
    "train-deterministic-cublas-config": {"CUBLAS_WORKSPACE_CONFIG": ":0:0"},
}

# Run through the installed console scripts (a fresh process each), not in-process.
SUBPROCESS = {
    "train-unknown-arch",
    "train-corrupt-idx",
    "generate-min-len-above-max-len",
    "convert-not-a-checkpoint",
    "score-line-counts-differ",
    "train-wandb-without-api-key",
}
NEEDS = {
    "train-wandb-without-api-key": "wandb",
    "preprocess-parquet-invalid-utf8": "pyarrow",
}  # optional packages

# The environment of a subprocess case (placeholders filled), besides OMP_NUM_THREADS=1; WANDB_* variables are
# left out of every subprocess case's environment.
CASE_ENV = {
    "train-wandb-without-api-key": {
        "HOME": "{home}",
        "WANDB_DIR": "{home}",
        "WANDB_BASE_URL": "http://127.0.0.1:9",
    },
}


def fill(items: list, w: dict) -> list:
    return [s.format(**w) for s in items]


def tree_hashes(root: str) -> dict:
    """sha256 of every regular file under `root`; a FIFO, device or socket by its kind and inode (opening a FIFO
    would wait for a writer)."""
    import stat

    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                out[os.path.relpath(path, root)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
            else:
                out[os.path.relpath(path, root)] = f"{stat.S_IFMT(st.st_mode):o} {st.st_ino}"
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


def run_subprocess(cli: str, argv: list, env: dict | None = None) -> tuple:
    script = os.path.join(os.path.dirname(sys.executable), f"seqtrain-{cli}")
    cmd = [script] if os.path.exists(script) else [sys.executable, "-m", f"seqtrain_cli.{cli}"]
    base = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    proc = subprocess.run(
        cmd + argv,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=dict(base, OMP_NUM_THREADS="1", **(env or {})),
        stdin=subprocess.DEVNULL,
    )
    return proc.returncode, proc.stderr


def error_lines(err: str) -> list:
    # log records are not errors: training and generation log to stdout, a few warnings reach stderr
    return [
        ln for ln in err.strip().splitlines() if ln and " | WARNING | " not in ln and " | INFO | " not in ln
    ]


def test_catalogue_is_large_and_covers_every_cli():
    assert len(CASES) >= 80 and len({c[0] for c in CASES}) == len(CASES)
    assert {c[1] for c in CASES} == {
        "train",
        "generate",
        "preprocess",
        "convert",
        "score",
        "average_checkpoints",
        "eval",
        "tune",
        "interactive",
    }


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c[0], marks=[pytest.mark.slow] if c[0] in SUBPROCESS else []) for c in CASES]
)
def test_bad_input_gives_one_clear_line(world, capsys, monkeypatch, case):
    name, cli, argv, expected = case
    if name in NEEDS:
        pytest.importorskip(NEEDS[name], reason=f"{NEEDS[name]} is an optional extra")
    argv, expected = fill(argv, world), expected.format(**world)
    for k in list(os.environ):
        if k.startswith("SLURM_"):
            monkeypatch.delenv(k)
    for k, v in ENV.get(name, {}).items():
        monkeypatch.setenv(k, v)
    before = tree_hashes(world["root"])
    if name in SUBPROCESS:
        env = {k: v.format(**world) for k, v in CASE_ENV.get(name, {}).items()}
        code, err = run_subprocess(cli, argv, env)
    else:
        code, err = run_in_process(cli, argv, capsys)
    lines = error_lines(err)
    assert code not in (0, None) and "Traceback" not in err, err
    assert len(lines) == 1, err
    prog = f"seqtrain-{cli.replace('_', '-')}"
    assert lines[0].startswith(f"{prog}: error: ") and expected in lines[0], lines[0]
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
