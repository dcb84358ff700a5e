"""seqtrain's beam search reproduces fairseq-generate's output on the fairseq-tiny fixture.

The fixture's two logs were written by fairseq 0.12 itself (see its README): `--beam 4` and
`--beam 5 --nbest 5 --lenpen 2.0 --min-len 7 --max-len-a 0 --max-len-b 9`. fairseq prints H-/P- scores in base 2
(natural-log score / ln 2): H- with full float repr, P- rounded to 4 decimals. We generate from the same
checkpoint and data-bin and compare every hypothesis (tokens, order) and every score, on the eager loop and on the
static decoding path (--static-decoding: fixed-shape steps, finished on the device), each with the encoder pass
packed (--packed-encoder) and padded.
"""

import math
import re
from collections import defaultdict

import pytest
import torch

from seqtrain.generation.sequence_generator import SequenceGenerator, generate_batch


def parse_log(path):
    """{sample id: [(hypothesis text, H score, [P scores])]} in the order fairseq printed them."""
    hyps = defaultdict(list)
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^([HP])-(\d+)\t(.*)$", line.rstrip("\n"))
        if not m:
            continue
        kind, sid, rest = m.group(1), int(m.group(2)), m.group(3)
        if kind == "H":
            score, _, text = rest.partition("\t")
            hyps[sid].append([text, float(score), None])
        else:
            hyps[sid][-1][2] = [float(x) for x in rest.split()]
    return hyps


@pytest.fixture
def fixture_run(fairseq_tiny):
    from seqtrain.checkpoint.load import load_model
    from seqtrain.data.indexed_dataset import MMapIndexedDataset
    from seqtrain.data.pair_dataset import LanguagePairDataset

    bin_dir = fairseq_tiny / "data-bin"
    lm = load_model(str(fairseq_tiny / "checkpoint_last.pt"), dict_path=str(bin_dir / "dict.src.txt"))
    src = MMapIndexedDataset(str(bin_dir / "valid.src-tgt.src"))
    tgt = MMapIndexedDataset(str(bin_dir / "valid.src-tgt.tgt"))
    dataset = LanguagePairDataset(
        src, src.sizes, lm.src_dict, tgt, tgt.sizes, lm.tgt_dict, left_pad_source=True, shuffle=False
    )
    order = dataset.ordered_indices().tolist()
    batches = [dataset.collater([dataset[i] for i in order[k : k + 64]]) for k in range(0, len(order), 64)]
    return fairseq_tiny, lm, batches


def run(lm, batches, **kw):
    gen = SequenceGenerator(lm.model, lm.tgt_dict, **kw)
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model: more threads only add synchronization
    try:
        return dict(pair for batch in batches for pair in generate_batch(gen, batch))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    "log_name, settings",
    [
        ("generate_beam4_valid.log", dict(beam_size=4, nbest=1)),
        (
            "generate_nbest5_minlen7_valid.log",
            dict(beam_size=5, nbest=5, len_penalty=2.0, min_len=7, max_len_a=0, max_len_b=9),
        ),
    ],
)
@pytest.mark.parametrize("static_decoding", [False, True], ids=["eager", "static"])
@pytest.mark.parametrize("packed_encoder", [True, False], ids=["packed", "padded"])
def test_same_hypotheses_and_scores_as_fairseq(
    fixture_run, log_name, settings, static_decoding, packed_encoder
):
    fairseq_tiny, lm, batches = fixture_run
    expected = parse_log(fairseq_tiny / log_name)
    assert len(expected) == 200
    ours = run(lm, batches, static_decoding=static_decoding, packed_encoder=packed_encoder, **settings)
    assert sorted(ours) == sorted(expected)
    ln2 = math.log(2)
    n_checked = 0
    for sid, want in expected.items():
        got = ours[sid]
        assert len(got) == len(want) == settings["nbest"], sid
        for h, (text, h_score, p_scores) in zip(got, want):
            assert lm.tgt_dict.string(h["tokens"]) == text, sid
            assert h["tokens"][-1].item() == lm.tgt_dict.eos()
            assert float(h["score"]) / ln2 == pytest.approx(h_score, abs=1e-4), sid
            # P- values are rounded to 4 decimals when printed
            ours_p = [round(x / ln2, 4) for x in h["positional_scores"].tolist()]
            assert len(ours_p) == len(p_scores)
            assert max(abs(a - b) for a, b in zip(ours_p, p_scores)) <= 1e-4 + 1e-9, sid
            n_checked += 1
    assert n_checked == 200 * settings["nbest"]
