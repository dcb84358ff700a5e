"""mBART fine-tuning and generation with fairseq's translation_from_pretrained_bart conventions, end to end on
files made here: a tiny mbart_large model.pt with [en_XX] [ro_RO] <mask> after dict.txt's words (as mBART's
pretraining left them), a data-bin whose languages are en_XX and ro_RO, seqtrain-train --task
translation_from_pretrained_bart --langs, then seqtrain-generate. fairseq's rule: source `tokens </s> [src]`,
target `tokens </s> [tgt]`, decoder input `[tgt] tokens </s>`; decoding starts from [tgt] and ends at it."""

import argparse
import io
import random

import pytest
import torch

from seqtrain.checkpoint.fairseq import model_config
from seqtrain.data.dictionary import Dictionary
from seqtrain.errors import SeqtrainError
from seqtrain.train.program import train_config
from tests.utils import completed

LANGS = "en_XX,ro_RO"
DIMS = [
    "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
    "--decoder-attention-heads", "2", "--max-source-positions", "64", "--max-target-positions", "64",
]  # fmt: skip


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(folder, raw train lines): raw/{train,valid}.{en_XX,ro_RO} (target: the first 4 source words reversed),
    data-bin/ from them, and mbart/model.pt + dict.txt, a fairseq mbart_large checkpoint of tiny sizes."""
    from seqtrain.models.bart import build_model
    from seqtrain.registry import ARCHS
    from seqtrain_cli.preprocess import preprocess_main as preprocess

    folder = tmp_path_factory.mktemp("mbart")
    raw = folder / "raw"
    raw.mkdir()
    r = random.Random(0)
    lines = {}
    for split, n in (("train", 120), ("valid", 12)):
        src = [[f"w{r.randrange(20)}" for _ in range(r.randint(4, 7))] for _ in range(n)]
        lines[split] = [(" ".join(s), " ".join(reversed(s[:4]))) for s in src]
        (raw / f"{split}.en_XX").write_text("".join(s + "\n" for s, _ in lines[split]))
        (raw / f"{split}.ro_RO").write_text("".join(t + "\n" for _, t in lines[split]))
    common = ["--source-lang", "en_XX", "--target-lang", "ro_RO", "--tokenizer", "none", "--no-progress-bar"]
    preprocess([*common, "--trainpref", str(raw / "train"), "--validpref", str(raw / "valid"),
                "--destdir", str(folder / "data-bin"), "--joined-dictionary"])  # fmt: skip
    words = Dictionary.load(str(folder / "data-bin" / "dict.en_XX.txt"))
    (folder / "mbart").mkdir()
    words.save(str(folder / "mbart" / "dict.txt"))
    full = Dictionary.load(str(folder / "mbart" / "dict.txt"))
    for sym in ("[en_XX]", "[ro_RO]", "<mask>"):
        full.add_symbol(sym)
    p = argparse.ArgumentParser()
    for flag in DIMS[::2]:
        p.add_argument(flag, type=int)
    margs = p.parse_args(DIMS)
    margs.arch, margs.langs, margs.task = "mbart_large", LANGS, "multilingual_denoising"
    ARCHS.get("mbart_large")(margs)
    torch.manual_seed(0)
    model = build_model(model_config(completed(argparse.Namespace(**vars(margs)))), full, full)
    state = dict(model.state_dict())
    torch.save(
        {"args": margs, "model": state, "optimizer_history": [], "extra_state": {}},
        folder / "mbart" / "model.pt",
    )
    return folder, lines


def task_args(data: str, *extra: str) -> argparse.Namespace:
    from seqtrain.flags.training import parse_train_args

    argv = [
        data,
        "--task",
        "translation_from_pretrained_bart",
        "--langs",
        LANGS,
        "--arch",
        "mbart_large",
        *DIMS,
    ]
    return parse_train_args([*argv, "--cpu", *extra])


def test_batches_follow_fairseqs_layout_token_by_token(made):
    from seqtrain.tasks import setup_task

    folder, lines = made
    task = setup_task(train_config(task_args(str(folder / "data-bin"), "-s", "en_XX", "-t", "ro_RO")).task)
    d = task.src_dict
    en, ro, eos, pad = d.index("[en_XX]"), d.index("[ro_RO]"), d.eos(), d.pad()
    # the symbols follow dict.txt's words, then <mask>: the rows of the pretrained embedding
    assert d.symbols[-3:] == ["[en_XX]", "[ro_RO]", "<mask>"] and task.tgt_dict == d
    ds = task.load_dataset("valid")
    sample = ds.collater([ds[i] for i in range(len(ds))])
    for row, sid in enumerate(sample["id"].tolist()):
        src_text, tgt_text = lines["valid"][sid]
        words = d.encode_line(src_text, append_eos=False).tolist()
        target = d.encode_line(tgt_text, append_eos=False).tolist()
        src = [t for t in sample["net_input"]["src_tokens"][row].tolist() if t != pad]
        assert src == words + [eos, en]  # tokens </s> [src]
        assert [t for t in sample["target"][row].tolist() if t != pad] == target + [eos, ro]
        prev = sample["net_input"]["prev_output_tokens"][row].tolist()
        assert [t for t in prev if t != pad] == [ro] + target + [eos]  # [tgt] tokens </s>
        assert int(sample["net_input"]["src_lengths"][row]) == len(words) + 2
    assert list(ds.sizes[0]) == [ds[0]["source"].numel(), ds[0]["target"].numel()]


def test_language_errors_name_the_flag(made):
    from seqtrain.tasks import setup_task

    data = str(made[0] / "data-bin")
    with pytest.raises(SeqtrainError, match="needs --langs"):
        setup_task(train_config(argparse.Namespace(**{**vars(task_args(data)), "langs": None})).task)
    with pytest.raises(SeqtrainError, match="--target-lang 'ro_RO' is not one of --langs en_XX,de_DE"):
        setup_task(train_config(task_args(data, "--langs", "en_XX,de_DE")).task)


def greedy(model, src: torch.Tensor, start: int, end: int, steps: int) -> list[int]:
    """Greedy decoding by full forward passes (no cache, no search): from `start` until `end`."""
    out = [start]
    for _ in range(steps):
        logits = model(src.unsqueeze(0), None, torch.tensor([out]))[0][0, -1]
        out.append(int(logits.argmax()))
        if out[-1] == end:
            break
    return out[1:]


@pytest.mark.slow
def test_finetune_then_generate_starts_and_ends_with_the_target_language(made, tmp_path):
    from seqtrain.generation import runner
    from seqtrain.generation.search import GenerationConfig
    from seqtrain.generation.sequence_generator import build_generator
    from seqtrain_cli.generate import generate_main
    from seqtrain_cli.train import train_main

    folder, lines = made
    data, save = str(folder / "data-bin"), tmp_path / "ck"
    train_main(
        [data, "--task", "translation_from_pretrained_bart", "--langs", LANGS, "-s", "en_XX", "-t", "ro_RO",
         "--arch", "mbart_large", *DIMS, "--finetune-from-model", str(folder / "mbart" / "model.pt"),
         "--lr", "3e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "5", "--max-update", "60",
         "--max-tokens", "512", "--cpu", "--log-format", "none", "--seed", "3", "--save-dir", str(save),
         "--no-epoch-checkpoints"]
    )  # fmt: skip
    ck = str(save / "checkpoint_last.pt")
    loaded = runner.load_for_generation(ck, data)  # the checkpoint says which task and languages
    d = loaded.lm.tgt_dict
    en, ro = d.index("[en_XX]"), d.index("[ro_RO]")
    assert (loaded.src_append, loaded.start, loaded.end) == (en, ro, ro)
    generator = build_generator(
        loaded.model, d, GenerationConfig(beam=1, max_len_b=10), bos=loaded.start, eos=loaded.end
    )
    assert (generator.bos, generator.eos) == (ro, ro)
    sources = runner.encode(loaded, [s for s, _ in lines["valid"][:4]])
    for src in sources:
        src = torch.cat([src, torch.tensor([en])])
        hyp = generator.generate(src.unsqueeze(0))[0][0]["tokens"].tolist()
        assert hyp == greedy(loaded.model, src, ro, ro, 10)  # begins after [ro_RO], ends at it
        assert hyp[-1] == ro
    out = io.StringIO()
    r = generate_main(
        [data, "--path", ck, "--gen-subset", "valid", "--beam", "2", "--max-len-b", "10"], out=out
    )
    text = out.getvalue()
    assert "[ro_RO]" not in "".join(ln for ln in text.splitlines() if ln[:2] in ("H-", "D-", "T-"))
    assert any(
        ln.startswith("S-") and ln.endswith("[en_XX]") for ln in text.splitlines()
    )  # fairseq's S- line
    assert all(set(h.split()) <= {f"w{i}" for i in range(20)} for h in r["hypotheses"])
    assert all(h for h in r["hypotheses"]) and len(r["hypotheses"]) == len(lines["valid"])
