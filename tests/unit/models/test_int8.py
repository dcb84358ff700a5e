"""--compute-type int8 (seqtrain.models.int8): on the bundled pretrained bart_small (trained weights), the int8
model's log-probabilities stay near fp32's and its summaries are mostly fp32's; where it cannot run, one line."""

import copy
import io

import pytest
import torch

from seqtrain.checkpoint.load import load_model
from seqtrain.errors import SeqtrainError
from seqtrain.generation import runner
from seqtrain.models.int8 import Int8Linear, int8_supported, quantize_int8
from tests.utils import REPO, SAMPLE

PRETRAINED = str(REPO / "models" / "debdesc-small-denoising")
pytestmark = [
    pytest.mark.slow,  # the bundled model, 24 summaries
    pytest.mark.skipif(not int8_supported(), reason="torch has no quantized CPU engine here"),
]


def lines(n):
    return (SAMPLE / "valid.source").read_text(encoding="utf-8").split("\n")[:n]


def test_int8_log_probabilities_stay_near_fp32():
    lm = load_model(PRETRAINED)
    fp32 = lm.model.float().eval()
    int8 = quantize_int8(copy.deepcopy(fp32))
    assert isinstance(int8.decoder.layers[0].fc1, Int8Linear)
    assert isinstance(int8.decoder.output_projection, Int8Linear)
    ids = [lm.src_dict.encode_line(lm.tokenizer.encode(t), add_if_not_exist=False)[:48] for t in lines(16)]
    src = torch.nn.utils.rnn.pad_sequence(ids, batch_first=True, padding_value=1).long()
    prev = torch.cat([torch.full((len(ids), 1), 2), src[:, :-1]], 1)  # the denoiser rebuilds its input
    real = src.ne(1)
    with torch.no_grad():
        a = torch.log_softmax(fp32(src, None, prev)[0], -1)[real]
        b = torch.log_softmax(int8(src, None, prev)[0], -1)[real]
    top = a.argmax(-1)
    assert (b.argmax(-1) == top).float().mean() >= 0.98  # measured 0.997
    # the fp32 best token's log-probability moves by at most 0.5 (measured 0.24), on average by 0.02
    drift = (a.gather(1, top[:, None]) - b.gather(1, top[:, None])).abs()
    assert drift.max() <= 0.5 and drift.mean() <= 0.02
    assert not torch.equal(a, b)  # it is int8 arithmetic


def test_int8_summaries_are_mostly_fp32s_through_summarizer_and_the_cli(tmp_path):
    from seqtrain import Summarizer
    from seqtrain_cli.generate import generate_main

    texts = lines(24)
    flags = dict(beam=4, max_len_b=20, no_repeat_ngram_size=3)
    fp32 = Summarizer.from_pretrained(PRETRAINED, dtype=torch.float32).summarize(texts, **flags)
    summarizer = Summarizer.from_pretrained(PRETRAINED, dtype=torch.float32, compute_type="int8")
    int8 = summarizer.summarize(texts, **flags)
    same = sum(a == b for a, b in zip(fp32, int8))
    assert same >= 0.6 * len(texts), (same, list(zip(fp32, int8))[:3])
    (tmp_path / "in.txt").write_text("\n".join(texts[:6]) + "\n", encoding="utf-8")
    out = io.StringIO()
    args = ["--path", PRETRAINED, "--input", str(tmp_path / "in.txt"), "--cpu", "--compute-type", "int8"]
    generate_main([*args, "--beam", "4", "--max-len-b", "20", "--no-repeat-ngram-size", "3"], out=out)
    # the same batch (an input's scale is its batch's: the summaries can depend on the batch's other texts)
    assert out.getvalue().split("\n")[:-1] == summarizer.summarize(texts[:6], **flags)
    from seqtrain_cli.interactive import interactive_main

    out = io.StringIO()
    cli = ["--path", PRETRAINED, "--cpu", "--compute-type", "int8", "--buffer-size", "1", "--quiet"]
    cli += ["--beam", "4", "--max-len-b", "20", "--no-repeat-ngram-size", "3"]
    interactive_main(cli, inp=io.StringIO(texts[0] + "\n"), out=out)
    assert out.getvalue().strip().split("\n")[-1] == summarizer.summarize(texts[:1], **flags)[0]


def test_int8_refuses_where_it_cannot_run():
    loaded = runner.load_for_generation(PRETRAINED)
    runner.cast(loaded, "cpu", torch.bfloat16)
    with pytest.raises(
        SeqtrainError, match=r"^--compute-type int8 quantizes fp32 weights: not with --fp16 / --bf16$"
    ):
        runner.set_compute_type(loaded, "int8", "--compute-type")
    assert runner.set_compute_type(loaded, "auto") == "default"  # auto: int8 only where it holds
    loaded.lm.model = loaded.lm.model.to("meta")  # a device that is not the CPU (as CUDA is)
    with pytest.raises(SeqtrainError, match=r"int8 runs on the CPU only .* on meta$"):
        runner.set_compute_type(loaded, "int8", "--compute-type")
    with pytest.raises(SeqtrainError, match="must be one of default, auto, float32, int8, got 'int4'"):
        runner.set_compute_type(loaded, "int4")
