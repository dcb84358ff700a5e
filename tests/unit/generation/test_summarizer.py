"""seqtrain.Summarizer: from_pretrained for the three checkpoint formats, summarize in input order with
the summaries seqtrain-generate writes, dtype/device, a Hugging Face folder's generation_config.json (compared
with transformers' generate), and the runnable example of docs/generate.md."""

import io
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from seqtrain.errors import SeqtrainError
from tests.utils import REPO

N = 16


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The fairseq-tiny model as fairseq model.pt + dict.txt, as a seqtrain checkpoint, and its source texts."""
    from tests.utils import FAIRSEQ_TINY

    if not (FAIRSEQ_TINY / "checkpoint_last.pt").exists():
        pytest.skip(f"fairseq fixture not found at {FAIRSEQ_TINY} (it lives in ../shared)")
    from seqtrain_cli.convert import main as convert

    tmp = tmp_path_factory.mktemp("summarizer")
    (tmp / "fairseq").mkdir()
    shutil.copy(FAIRSEQ_TINY / "checkpoint_last.pt", tmp / "fairseq" / "model.pt")
    shutil.copy(FAIRSEQ_TINY / "data-bin" / "dict.src.txt", tmp / "fairseq" / "dict.txt")
    convert([str(tmp / "fairseq" / "model.pt"), str(tmp / "seqtrain.pt"), "--to", "seqtrain"])
    texts = (FAIRSEQ_TINY / "raw" / "valid.src").read_text(encoding="utf-8").split("\n")[:N]
    refs = (FAIRSEQ_TINY / "raw" / "valid.tgt").read_text(encoding="utf-8").split("\n")[:N]
    return tmp, texts, refs, FAIRSEQ_TINY


def test_summarize_matches_generate_in_input_order(tiny):
    from seqtrain import Summarizer
    from seqtrain_cli.generate import generate_main

    tmp, texts, refs, fx = tiny
    fairseq = Summarizer.from_pretrained(tmp / "fairseq" / "model.pt")  # dict.txt found next to model.pt
    own = Summarizer.from_pretrained(tmp / "seqtrain.pt")  # carries its dictionary
    got = fairseq.summarize(texts, beam=4, max_tokens=64)  # a small budget: several length-sorted batches
    assert len(got) == N and sum(g == r for g, r in zip(got, refs)) >= N - 3
    assert own.summarize(texts, beam=4, batch_size=3) == got
    assert own.summarize(texts[5], beam=4) == [got[5]]  # one text, one summary, same as in a batch
    (tmp / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = io.StringIO()
    generate_main(
        ["--path", str(tmp / "seqtrain.pt"), "--input", str(tmp / "in.txt"), "--beam", "4"], out=out
    )
    assert out.getvalue().split("\n")[:-1] == got
    # generation flags change the result; unknown ones are refused with their names
    short = own.summarize(texts, beam=2, max_len_b=2)
    assert all(len(s.split()) <= 2 for s in short) and short != got
    with pytest.raises(SeqtrainError, match="unknown generation flag.*beem"):
        own.summarize(texts, beem=4)
    assert own.summarize([]) == []


def test_front_ends_give_the_same_summaries_with_the_encoder_packed_or_padded(tiny, monkeypatch):
    """--packed-encoder reaches the encoder from all three front ends (Summarizer, seqtrain-generate --input,
    seqtrain-interactive), and the summaries are the padded encoder's. (The model's own encoder: the compiled
    CPU step always encodes the real tokens only.)"""
    monkeypatch.setenv("SEQTRAIN_CPU_STEP", "eager")
    from seqtrain import Summarizer
    from seqtrain.models.bart import BartEncoder
    from seqtrain_cli.generate import generate_main
    from seqtrain_cli.interactive import interactive_main

    packed_calls = []
    real = BartEncoder.forward_padded_as_packed

    def spy(self, src_tokens, padding_mask):
        packed_calls.append(src_tokens.size(0))
        return real(self, src_tokens, padding_mask)

    monkeypatch.setattr(BartEncoder, "forward_padded_as_packed", spy)
    tmp, texts, _, _ = tiny
    own = Summarizer.from_pretrained(tmp / "seqtrain.pt")
    padded = own.summarize(texts, beam=4, batch_size=5, packed_encoder=False)
    assert packed_calls == []
    assert own.summarize(texts, beam=4, batch_size=5, packed_encoder=True) == padded
    assert sum(packed_calls) == N
    (tmp / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    flags = ["--path", str(tmp / "seqtrain.pt"), "--beam", "4", "--batch-size", "5"]
    for switch in ("--packed-encoder", "--no-packed-encoder"):
        packed_calls.clear()
        out = io.StringIO()
        generate_main(flags + ["--input", str(tmp / "in.txt"), switch], out=out)
        assert out.getvalue().split("\n")[:-1] == padded
        out = io.StringIO()
        interactive_main(flags + ["--buffer-size", "3", switch], inp=io.StringIO("\n".join(texts)), out=out)
        assert out.getvalue().split("\n")[:-1] == padded
        assert sum(packed_calls) == (2 * N if switch == "--packed-encoder" else 0)


def test_dtype_and_device(tiny):
    from seqtrain import Summarizer

    tmp, texts, _, _ = tiny
    s = Summarizer.from_pretrained(tmp / "seqtrain.pt", dtype=torch.bfloat16)
    assert s.dtype == torch.bfloat16 and s.device.type == "cpu"
    bf16 = s.summarize(texts, beam=4)
    assert s.float().dtype == torch.float32 and s.to("cpu").device.type == "cpu"
    fp32 = s.summarize(texts, beam=4)
    assert sum(a == b for a, b in zip(bf16, fp32)) >= N - 2  # this well-trained model barely notices bf16
    assert s.half().dtype == torch.float16
    s.float()


def test_widest_beam_the_vocabulary_allows_runs(tiny):
    """The limit is exact: 207 hypotheses of the 208-symbol model run (also in two diverse groups), as does a
    sampled beam wider than the vocabulary."""
    from seqtrain import Summarizer

    tmp, texts, _, _ = tiny
    s = Summarizer.from_pretrained(tmp / "seqtrain.pt")
    assert len(s.summarize(texts[:1], beam=207, max_len_b=3)) == 1
    assert len(s.summarize(texts[:1], beam=414, diverse_beam_groups=2, max_len_b=2)) == 1
    assert len(s.summarize(texts[:1], beam=300, nbest=300, sampling=True, max_len_b=2)) == 1


def test_int8_summarizer_refuses_another_dtype_device_or_static_decoding_at_the_call(tiny):
    """Issue 48, class 7: .half() / .bfloat16() / static_decoding=True on an int8 Summarizer failed only when it
    summarized, deep inside; now the call itself is refused in the API's words, and the Summarizer still works."""
    from seqtrain import Summarizer
    from seqtrain.models.int8 import int8_supported

    if not int8_supported():
        pytest.skip("this torch build has no quantized CPU engine")
    tmp, texts, _, _ = tiny
    s = Summarizer.from_pretrained(tmp / "seqtrain.pt", compute_type="int8")
    want = s.summarize(texts[:3], beam=2)
    for call, name, target in (
        (s.half, "Summarizer.half()", "float16"),
        (s.bfloat16, "Summarizer.bfloat16()", "bfloat16"),
        (lambda: s.to("cuda"), "Summarizer.to(device='cuda')", "cuda"),
        (lambda: s.to(dtype=torch.float16), "Summarizer.to(dtype=torch.float16)", "float16"),
    ):
        with pytest.raises(SeqtrainError) as e:
            call()
        assert str(e.value) == (
            f"{name}: the model runs int8 linear layers (compute_type int8), which take fp32 inputs on the CPU, "
            f"not {target}; load it again without compute_type='int8' for that"
        )
    with pytest.raises(SeqtrainError) as e:
        s.summarize(texts[:3], beam=2, static_decoding=True)
    assert str(e.value) == (
        "Summarizer.summarize(static_decoding=...): static decoding runs float weights; not with the model's "
        "int8 linear layers (compute_type int8)"
    )
    assert s.float().dtype == torch.float32 and s.summarize(texts[:3], beam=2) == want


def test_import_seqtrain_is_cheap():
    code = "import sys, seqtrain; assert 'torch' not in sys.modules; print(seqtrain.Summarizer.__name__)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "Summarizer", proc.stderr


def test_docs_example_runs(tiny, tmp_path, monkeypatch):
    """The ```python block under "### Python API" in docs/generate.md, run as written, in a folder holding the
    checkpoint the quickstart leaves (here the tiny model)."""
    doc = (REPO / "docs" / "generate.md").read_text(encoding="utf-8")
    section = doc[doc.index("### Python API") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    tmp, texts, _, _ = tiny
    (tmp_path / ".quickstart" / "checkpoints").mkdir(parents=True)
    shutil.copy(tmp / "seqtrain.pt", tmp_path / ".quickstart" / "checkpoints" / "checkpoint_best.pt")
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(code, "docs/generate.md", "exec"), ns)
    from seqtrain import Summarizer

    want = Summarizer.from_pretrained(tmp / "seqtrain.pt").summarize(ns["texts"], beam=4, max_len_b=30)
    assert ns["summaries"] == want and len(want) == len(ns["texts"]) >= 2


# ------------------------------------------------------------------ a Hugging Face folder's generation_config.json
CHARS = "abcdefgh"


def _hf_folder(folder, transformers):
    """A tiny random BART saved by transformers, with a byte-level BPE vocabulary (no merges) of a-h and space."""
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({c: 4 + i for i, c in enumerate(CHARS)})
    vocab["\u0120"] = len(vocab)  # byte-level space
    torch.manual_seed(0)
    cfg = transformers.BartConfig(
        vocab_size=len(vocab),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        scale_embedding=False,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        dropout=0.0,
        init_std=0.5,  # large weights: summaries that depend on the text
    )
    model = transformers.BartForConditionalGeneration(cfg).eval()
    gen = dict(num_beams=3, length_penalty=2.0, min_length=4, max_length=9, no_repeat_ngram_size=2)
    model.generation_config = transformers.GenerationConfig(
        **gen,
        forced_bos_token_id=0,
        forced_eos_token_id=2,
        decoder_start_token_id=2,
        early_stopping=True,
        bos_token_id=0,
        pad_token_id=1,
        eos_token_id=2,
    )
    model.save_pretrained(folder)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return model


@pytest.mark.slow
def test_generation_config_gives_the_defaults_as_transformers_reads_them(tmp_path, caplog):
    transformers = pytest.importorskip("transformers")
    from seqtrain import Summarizer
    from seqtrain.generation import runner

    hf = _hf_folder(tmp_path / "hf", transformers)
    s = Summarizer.from_pretrained(tmp_path / "hf")
    assert s.generation_defaults == dict(beam=3, lenpen=2.0, min_len=3, max_len_b=7, no_repeat_ngram_size=2)
    texts = ["abc hgf ed", "a b c d e f g h", "hhh", "fed cba gg hh", "bad cafe"]
    mine = s.summarize(texts)
    from tests.unit.generation.reference_beam_search import fairseq_forced_eos

    class ForceBosKeepScore(transformers.LogitsProcessor):  # fairseq's forced prefix: <s> keeps its log-prob
        def __call__(self, input_ids, scores):
            if input_ids.shape[-1] == 1:
                kept = scores[:, 0].clone()
                scores = torch.full_like(scores, -float("inf"))
                scores[:, 0] = kept
            return scores

    assert s._loaded.force_bos == 0  # the folder's forced_bos_token_id
    for text, got in zip(texts, mine):
        ids = [0] + runner.encode(s._loaded, [text])[0].tolist()  # <s> text </s>, as HF's BART tokenizer
        # only what seqtrain does by design differently is passed: forced <s> and </s> keep their real
        # log-probs, <pad> is never generated (docs/generate.md, "Coming from Hugging Face transformers")
        out = hf.generate(
            input_ids=torch.tensor([ids]),
            forced_bos_token_id=None,
            forced_eos_token_id=None,
            suppress_tokens=[1],
            logits_processor=transformers.LogitsProcessorList(
                [ForceBosKeepScore(), fairseq_forced_eos(9, 2)]
            ),
        )
        seq = out[0].tolist()[1:]  # drop the decoder start token
        assert seq[0] == 0 and 4 <= len(seq) - 1 <= 8  # forced <s>, min_length / max_length as HF counts them
        assert runner.decode(s._loaded, torch.tensor(seq)) == got
    # flags given win over the folder's defaults, and the CLI logs which defaults it took
    assert all(len(x.replace(" ", "")) <= 1 for x in s.summarize(texts, max_len_b=2, min_len=0))
    from seqtrain_cli.generate import generate_main

    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    out = io.StringIO()
    with caplog.at_level("INFO"):
        generate_main(
            ["--path", str(tmp_path / "hf"), "--input", str(tmp_path / "in.txt"), "--beam", "2"], out=out
        )
    line = next(r.getMessage() for r in caplog.records if "generation defaults taken" in r.getMessage())
    assert line.endswith(
        "generation_config.json: generation defaults taken: --lenpen 2.0, --max-len-b 7, --min-len 3, "
        "--no-repeat-ngram-size 2; forced first token: 0; given flags kept: --beam"
    )
    assert out.getvalue().split("\n")[:-1] == s.summarize(texts, beam=2)
    os.remove(tmp_path / "hf" / "generation_config.json")
    (tmp_path / "hf" / "generation_config.json").write_text('{"max_length": "nine"}')
    with pytest.raises(SeqtrainError, match="generation_config.json: max_length='nine' is not a valid value"):
        Summarizer.from_pretrained(tmp_path / "hf")


# ---- issue 31, item 4: one check of generation settings for every source, before anything is generated
@pytest.mark.parametrize(
    "flags,message",
    [
        (dict(beam=1000000), "Summarizer.summarize(beam=...) must be between 1 and 10000, got 1000000"),
        (dict(lenpen=float("nan")), "Summarizer.summarize(lenpen=...) must be a finite number, got nan"),
        (dict(lenpen=1e308), "Summarizer.summarize(lenpen=...) must be between -1000 and 1000, got 1e+308"),
        (dict(beam="4"), "Summarizer.summarize(beam=...) must be an integer, got '4'"),
        (dict(beam=4.0), "Summarizer.summarize(beam=...) must be an integer, got 4.0"),
        (dict(sampling="yes"), "Summarizer.summarize(sampling=...) must be True or False, got 'yes'"),
        (dict(min_len=True), "Summarizer.summarize(min_len=...) must be an integer, got True"),
        (
            dict(beam=2, nbest=3),
            "Summarizer.summarize(nbest=...) must be between 1 and Summarizer.summarize(beam=...) (2), got 3",
        ),
        (dict(seed=-1), "Summarizer.summarize(seed=...) must be between 0 and 4294967295, got -1"),
        (dict(max_tokens="64"), "Summarizer.summarize(max_tokens=...) must be an integer, got '64'"),
        # issue 48, class 5: the 208-symbol model's beam search fills at most 207 hypotheses (a RuntimeError in
        # the search before); sampling draws with replacement and has no such limit
        (
            dict(beam=208),
            "Summarizer.summarize(beam=...) 208 is wider than the model's vocabulary allows: beam search keeps at "
            "most 207 hypotheses (its 208 target symbols less <pad>, which no search picks); give "
            "Summarizer.summarize(beam=...) 207 or less",
        ),
        (
            dict(beam=416, diverse_beam_groups=2),
            "Summarizer.summarize(beam=...) 416 is wider than the model's vocabulary allows: beam search keeps at "
            "most 207 hypotheses per group of Summarizer.summarize(diverse_beam_groups=...) 2 (its 208 target "
            "symbols less <pad>, which no search picks); give Summarizer.summarize(beam=...) 414 or less",
        ),
    ],
)
def test_summarize_checks_its_flags_as_the_command_line_does(tiny, flags, message):
    """Before: lenpen=nan and beam="4" were accepted (nan scores; a TypeError deep in the search), beam=10^6
    allocated gigabytes."""
    from seqtrain import Summarizer

    tmp, texts, _, _ = tiny
    s = Summarizer.from_pretrained(tmp / "seqtrain.pt")
    with pytest.raises(SeqtrainError) as e:
        s.summarize(texts[:2], **flags)
    assert str(e.value) == message


@pytest.fixture(scope="module")
def hf_tiny(tiny):
    from seqtrain_cli.convert import main as convert

    tmp, texts, _, _ = tiny
    folder = tmp / "hf"
    if not folder.exists():
        convert([str(tmp / "seqtrain.pt"), str(folder), "--to", "hf"])
    return folder, texts


@pytest.mark.parametrize(
    "config,message",
    [
        (
            {"num_beams": 1000000},
            "num_beams=1000000 is out of range for --beam (must be between 1 and 10000, got",
        ),
        (
            {"length_penalty": 1e308},
            "length_penalty=1e+308 is out of range for --lenpen (must be between -1000",
        ),
        (
            {"no_repeat_ngram_size": 2**40},
            "no_repeat_ngram_size=1099511627776 is out of range for --no-repeat-n",
        ),
        (
            {"forced_bos_token_id": 10**9},
            "forced_bos_token_id=1000000000 is not a token of the model (ids 0 to",
        ),
        ({"forced_bos_token_id": -5}, "forced_bos_token_id=-5 is not a token id (an integer >= 0, or null)"),
        (
            {"forced_bos_token_id": "abc"},
            "forced_bos_token_id='abc' is not a token id (an integer >= 0, or null)",
        ),
        (
            {"min_new_tokens": 50, "max_new_tokens": 7},
            "min_length/min_new_tokens 50 is above the maximum length",
        ),
        (
            {"a": json.loads("[" * 101 + "]" * 101)},
            "cannot read the generation settings (nested more than 100 levels deep)",
        ),
    ],
)
def test_generation_config_is_checked_as_the_command_line_checks(hf_tiny, config, message):
    """Before: num_beams 10^6 reached 8 GB; length_penalty 1e308 and forced_bos_token_id 10^9, -5 or "abc"
    gave tracebacks (issue 31). Now one line naming the file and its key, before the model is built."""
    from seqtrain import Summarizer

    folder, _ = hf_tiny
    path = folder / "generation_config.json"
    path.write_text(json.dumps(config))
    try:
        with pytest.raises(SeqtrainError) as e:
            Summarizer.from_pretrained(folder)
    finally:
        path.unlink()
    assert str(e.value).startswith(f"{path}: {message}"), str(e.value)
    assert Summarizer.from_pretrained(folder).generation_defaults == {}  # the folder without it loads


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            {"encoder_embed_dim": "x"},
            "--model-overrides: encoder_embed_dim='x' does not fit the checkpoint's encoder_embed_dim=",
        ),
        ({"dropout": 5}, "--model-overrides: dropout=5: must be between 0 and 1, got 5"),
        (
            {"decoder_layers": 3},
            "--model-overrides: model arg decoder_layers=3 but the weights hold 2 decoder",
        ),
        ([1], "--model-overrides: give a JSON object"),
    ],
)
def test_model_overrides_are_checked_before_the_model_is_built(tiny, overrides, message):
    """Before (issue 31): '{"encoder_embed_dim": "x"}' reached the model builder (a TypeError traceback)."""
    from seqtrain import Summarizer

    tmp, _, _, _ = tiny
    with pytest.raises(SeqtrainError) as e:
        Summarizer.from_pretrained(tmp / "seqtrain.pt", model_overrides=overrides)
    assert str(e.value).startswith(message), str(e.value)


def test_every_front_end_takes_the_compiled_cpu_loop(tiny, monkeypatch, tmp_path):
    """On the CPU, Summarizer, seqtrain-generate (--input and a data-bin split), seqtrain-interactive and
    seqtrain-tune search through the compiled step's C++ loop, and their summaries are the eager step's."""
    from seqtrain import Summarizer
    from seqtrain.generation import cpu_step
    from seqtrain_cli.generate import generate_main
    from seqtrain_cli.interactive import interactive_main
    from seqtrain_cli.tune import main as tune_main

    if cpu_step.extension() is None:
        pytest.skip(f"the compiled CPU step cannot be built here: {cpu_step.unavailable_reason()}")
    tmp, texts, _, fx = tiny
    calls = []
    search = cpu_step.CompiledSteps.search
    monkeypatch.setattr(cpu_step.CompiledSteps, "search", lambda *a: calls.append(1) or search(*a))

    def compiled_then_eager(run):
        calls.clear()
        monkeypatch.setenv("SEQTRAIN_CPU_STEP", "auto")
        got = run()
        assert calls, "the compiled loop was not taken"
        monkeypatch.setenv("SEQTRAIN_CPU_STEP", "eager")
        assert run() == got
        return got

    own = Summarizer.from_pretrained(tmp / "seqtrain.pt")
    want = compiled_then_eager(lambda: own.summarize(texts, beam=4, batch_size=5))
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    flags = ["--path", str(tmp / "seqtrain.pt"), "--beam", "4", "--batch-size", "5"]

    def generate(*extra):
        out = io.StringIO()
        generate_main(flags + list(extra), out=out)
        return out.getvalue().split("\n")[:-1]

    assert compiled_then_eager(lambda: generate("--input", str(tmp_path / "in.txt"))) == want
    split = ["--path", str(fx / "checkpoint_last.pt"), str(fx / "data-bin"), "-s", "src", "-t", "tgt"]
    split += ["--gen-subset", "valid", "--beam", "4", "--results-path", str(tmp_path / "r")]

    scores = []

    def generate_split():  # H- lines: id and hypothesis; the scores to 1e-5 (the steps sum in other orders)
        generate_main(split, out=io.StringIO())
        lines = (tmp_path / "r" / "generate-valid.txt").read_text(encoding="utf-8").split("\n")
        hyps = [line.split("\t") for line in lines if line.startswith("H-")]
        scores.append(torch.tensor([float(h[1]) for h in hyps]))
        return [(h[0], h[2]) for h in hyps]

    assert len(compiled_then_eager(generate_split)) == 200
    torch.testing.assert_close(scores[0], scores[1], rtol=0, atol=1e-5)

    def interactive():
        out = io.StringIO()
        interactive_main(flags + ["--buffer-size", "3"], inp=io.StringIO("\n".join(texts)), out=out)
        return out.getvalue().split("\n")[:-1]

    assert compiled_then_eager(interactive) == want

    def tune():
        argv = [
            str(fx / "data-bin"),
            "--path",
            str(fx / "checkpoint_last.pt"),
            "--cpu",
            "-s",
            "src",
            "-t",
            "tgt",
        ]
        argv += ["--tune-output", str(tmp_path / "t"), "--tune", "max-len-b", "--tune-grid", "max-len-b=3,6"]
        argv += ["--tune-subset", "30", "--batch-size", "10"]
        result = tune_main(argv, out=io.StringIO())
        return [(t["settings"], t["rouge"]) for t in result["trials"]]

    compiled_then_eager(tune)
