import argparse
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from seqtrain.config import from_args
from seqtrain.criterions import (
    CrossEntropyCriterion,
    DistillationConfig,
    LabelSmoothedCrossEntropyCriterion,
    build_criterion,
    smoothed_nll_loss,
)
from seqtrain.errors import SeqtrainError
from seqtrain.registry import CRITERIONS

PAD = 1
V = 11


class ToyModel(nn.Module):
    """Implements the model interface the criteria use: forward(..., features_only) and output_layer."""

    def __init__(self, dtype=torch.float64):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(V, 8).to(dtype)
        self.src_proj = nn.Linear(8, 8).to(dtype)
        self.proj = nn.Linear(8, V).to(dtype)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, features_only=False):
        ctx = self.src_proj(self.embed(src_tokens).mean(dim=1, keepdim=True))
        x = torch.tanh(self.embed(prev_output_tokens) + ctx)
        return (x if features_only else self.output_layer(x)), {}

    def output_layer(self, x):
        return self.proj(x)


class FullLogitsOnly(ToyModel):
    """A model without output_layer: the criterion must use the full logits."""

    def __getattribute__(self, name):
        if name == "output_layer":
            raise AttributeError(name)
        return super().__getattribute__(name)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, features_only=False):
        assert not features_only
        ctx = self.src_proj(self.embed(src_tokens).mean(dim=1, keepdim=True))
        return self.proj(torch.tanh(self.embed(prev_output_tokens) + ctx)), {}


def make_sample():
    target = torch.tensor([[5, 6, 7, 2], [8, 9, 2, PAD], [4, 2, PAD, PAD]])
    prev = torch.tensor([[2, 5, 6, 7], [2, 8, 9, PAD], [2, 4, PAD, PAD]])
    src = torch.tensor([[4, 5, 6, 2], [PAD, 7, 8, 2], [PAD, PAD, 9, 2]])
    return {
        "id": torch.arange(3),
        "nsentences": 3,
        "ntokens": int(target.ne(PAD).sum()),
        "net_input": {"src_tokens": src, "src_lengths": torch.tensor([4, 3, 2]), "prev_output_tokens": prev},
        "target": target,
    }


def reference_loss(model, sample, eps, prefix=0):
    """fairseq's label_smoothed_nll_loss written plainly on the full log-softmax."""
    logits = model(**sample["net_input"])[0][:, prefix:]
    target = sample["target"][:, prefix:]
    lprobs = F.log_softmax(logits.float() if logits.dtype != torch.float64 else logits, dim=-1)
    lprobs, target = lprobs.reshape(-1, V), target.reshape(-1, 1)
    nll = -lprobs.gather(-1, target)
    smooth = -lprobs.sum(-1, keepdim=True)
    pad = target.eq(PAD)
    nll, smooth = nll.masked_fill(pad, 0.0).sum(), smooth.masked_fill(pad, 0.0).sum()
    eps_i = eps / (V - 1)
    return (1.0 - eps - eps_i) * nll + eps_i * smooth, nll


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothed_matches_full_logits_formula_and_gradients(eps):
    model, sample = ToyModel(), make_sample()
    crit = LabelSmoothedCrossEntropyCriterion(PAD, label_smoothing=eps)
    loss, sample_size, log = crit(model, sample)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref, ref_nll = reference_loss(model, sample, eps)
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12)
    assert log["nll_loss"].item() == pytest.approx(ref_nll.item(), rel=1e-12)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-10, atol=1e-12)
    assert sample_size == 9 and log["ntokens"] == 9 and log["nsentences"] == 3 and log["sample_size"] == 9


def test_float32_model_within_1e6():
    model, sample = ToyModel(torch.float32), make_sample()
    loss, _, _ = LabelSmoothedCrossEntropyCriterion(PAD, label_smoothing=0.1)(model, sample)
    ref, _ = reference_loss(model, sample, 0.1)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)


def test_bf16_logits_are_scored_in_float32():
    torch.manual_seed(1)
    logits = torch.randn(6, V).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, V, (6,))
    loss, nll = smoothed_nll_loss(logits, target, 0.1)
    lp = F.log_softmax(logits.float(), -1)
    eps_i = 0.1 / (V - 1)
    ref = (1 - 0.1 - eps_i) * -lp.gather(-1, target[:, None]).squeeze(-1) + eps_i * -lp.sum(-1)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    loss.sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    expected = torch.softmax(logits.float(), -1) - eps_i
    expected[torch.arange(6), target] -= 1 - 0.1 - eps_i
    torch.testing.assert_close(logits.grad.float(), expected, rtol=1e-2, atol=1e-2)


def test_cross_entropy_equals_nll_loss_and_sentence_avg():
    model, sample = ToyModel(), make_sample()
    logits = model(**sample["net_input"])[0]
    ref = F.nll_loss(
        F.log_softmax(logits, -1).view(-1, V), sample["target"].view(-1), ignore_index=PAD, reduction="sum"
    )
    loss, sample_size, log = CrossEntropyCriterion(PAD)(model, sample)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12)
    assert log["nll_loss"].item() == pytest.approx(ref.item(), rel=1e-12)
    assert sample_size == 9
    loss2, sample_size2, log2 = CrossEntropyCriterion(PAD, sentence_avg=True)(model, sample)
    assert sample_size2 == 3 and log2["sample_size"] == 3 and loss2.item() == pytest.approx(ref.item())


def test_full_logits_fallback_matches():
    model, sample = FullLogitsOnly(), make_sample()
    loss, _, _ = LabelSmoothedCrossEntropyCriterion(PAD, label_smoothing=0.1)(model, sample)
    ref, _ = reference_loss(model, sample, 0.1)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12)


def test_reduce_false_gives_per_token_losses_with_zero_pads():
    model, sample = ToyModel(), make_sample()
    crit = LabelSmoothedCrossEntropyCriterion(PAD, label_smoothing=0.1)
    per_tok, _, _ = crit(model, sample, reduce=False)
    total, _, _ = crit(model, sample)
    assert per_tok.shape == (12,)
    assert torch.all(per_tok[sample["target"].view(-1).eq(PAD)] == 0)
    assert torch.all(per_tok[sample["target"].view(-1).ne(PAD)] > 0)
    assert per_tok.sum().item() == pytest.approx(total.item(), rel=1e-12)


def test_ignore_prefix_size_drops_first_target_tokens():
    model, sample = ToyModel(), make_sample()
    loss, _, log = LabelSmoothedCrossEntropyCriterion(PAD, label_smoothing=0.1, ignore_prefix_size=1)(
        model, sample
    )
    ref, _ = reference_loss(model, sample, 0.1, prefix=1)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12)


def test_report_accuracy_and_reduce_metrics():
    model, sample = ToyModel(), make_sample()
    with torch.no_grad():
        model.proj.bias[2] += 20.0  # the model now always predicts </s>: right on exactly the 3 final tokens
    crit = LabelSmoothedCrossEntropyCriterion(PAD, label_smoothing=0.1, report_accuracy=True)
    loss, _, log = crit(model, sample)
    logits = model(**sample["net_input"])[0]
    mask = sample["target"].ne(PAD)
    n_correct = int(logits.argmax(-1)[mask].eq(sample["target"][mask]).sum())
    assert n_correct == 3
    assert int(log["n_correct"]) == n_correct and log["total"] == 9
    # two "workers" with the same batch: sums, then fairseq's base-2 normalisation
    m = crit.reduce_metrics([log, log])
    assert m["loss"] == pytest.approx(2 * loss.item() / 18 / math.log(2))
    assert m["nll_loss"] == pytest.approx(2 * log["nll_loss"].item() / 18 / math.log(2))
    assert m["ppl"] == round(2 ** m["nll_loss"], 2)
    assert m["accuracy"] == round(100.0 * 3 / 9, 3)
    assert m["ntokens"] == 18 and m["nsentences"] == 6 and m["sample_size"] == 18


def test_build_criterion_from_args_and_registry():
    assert set(CRITERIONS.names()) >= {"cross_entropy", "label_smoothed_cross_entropy"}
    args = argparse.Namespace(
        criterion="label_smoothed_cross_entropy",
        label_smoothing=0.2,
        report_accuracy=True,
        sentence_avg=False,
        ignore_prefix_size=0,
    )

    class Dict_:
        def pad(self):
            return PAD

    class Task:
        target_dictionary = Dict_()

    crit = build_criterion(from_args(DistillationConfig, args), Task())
    assert isinstance(crit, LabelSmoothedCrossEntropyCriterion)
    assert crit.eps == 0.2 and crit.report_accuracy and crit.padding_idx == PAD
    with pytest.raises(SeqtrainError, match="--criterion: unknown criterion 'nope'"):
        build_criterion(from_args(DistillationConfig, argparse.Namespace(criterion="nope")), PAD)
    with pytest.raises(SeqtrainError, match="--label-smoothing"):
        LabelSmoothedCrossEntropyCriterion(PAD, label_smoothing=1.5)


def test_real_bart_tiny_matches_full_logits():
    bart = pytest.importorskip("seqtrain.models.bart")
    torch.manual_seed(0)
    cfg = bart.BartConfig(
        vocab_size=V + 5,
        encoder_layers=1,
        decoder_layers=1,
        encoder_embed_dim=16,
        decoder_embed_dim=16,
        encoder_ffn_embed_dim=32,
        decoder_ffn_embed_dim=32,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        dropout=0.0,
    )
    model = bart.BARTModel(cfg, padding_idx=PAD).double().eval()
    sample = make_sample()
    loss, _, _ = LabelSmoothedCrossEntropyCriterion(PAD, label_smoothing=0.1)(model, sample)
    logits = model(**sample["net_input"])[0]
    lprobs = F.log_softmax(logits, -1).view(-1, logits.size(-1))
    t = sample["target"].view(-1, 1)
    keep = t.ne(PAD)
    eps_i = 0.1 / (logits.size(-1) - 1)
    ref = (1 - 0.1 - eps_i) * -lprobs.gather(-1, t)[keep].sum() + eps_i * -lprobs.sum(-1, keepdim=True)[
        keep
    ].sum()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-10)


def _tiny_bart(vocab, dtype=torch.float64, seed=0):
    bart = pytest.importorskip("seqtrain.models.bart")
    torch.manual_seed(seed)
    cfg = bart.BartConfig(
        vocab_size=vocab,
        encoder_layers=1,
        decoder_layers=1,
        encoder_embed_dim=16,
        decoder_embed_dim=16,
        encoder_ffn_embed_dim=32,
        decoder_ffn_embed_dim=32,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        dropout=0.0,
    )
    return bart.BARTModel(cfg, padding_idx=PAD).to(dtype).train()


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("rows", [1, 2, 1 << 20])
def test_projected_loss_matches_full_logits_values_gradients_and_accuracy(eps, rows, monkeypatch):
    """BART's path (projection and loss chunk by chunk, gradients made in the forward pass) gives the loss, nll,
    accuracy and every parameter gradient of the plain full-logits computation; chunks of 1 row, 2 rows and all
    rows."""
    import seqtrain.criterions.projected_loss as pl

    monkeypatch.setattr(pl, "chunk_rows", lambda n, v, budget, per_logit: rows)
    model, sample = _tiny_bart(V + 5), make_sample()
    crit = LabelSmoothedCrossEntropyCriterion(PAD, label_smoothing=eps, report_accuracy=True)
    loss, _, log = crit(model, sample)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    logits = model(**sample["net_input"])[0]
    keep = sample["target"].ne(PAD)
    lp = F.log_softmax(logits[keep], -1)
    t = sample["target"][keep]
    eps_i = eps / (logits.size(-1) - 1)
    nll = -lp.gather(-1, t[:, None]).sum()
    ref = (1 - eps - eps_i) * nll + eps_i * -lp.sum()
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12)
    assert log["nll_loss"].item() == pytest.approx(nll.item(), rel=1e-12)
    assert int(log["n_correct"]) == int(lp.argmax(-1).eq(t).sum()) and log["total"] == 9
    for n, p in model.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-10, atol=1e-12, msg=n)


def test_projected_loss_under_bf16_autocast_and_without_grad():
    """Under autocast the projection runs in bf16 like the model's own F.linear would, the loss in fp32, and the
    gradients land in fp32 parameters; under no_grad (validation) no gradient work is done and values agree."""
    model, sample = _tiny_bart(V + 5, torch.float32), make_sample()
    crit = LabelSmoothedCrossEntropyCriterion(PAD, label_smoothing=0.1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _, _ = crit(model, sample)
    assert loss.dtype == torch.float32
    loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(**sample["net_input"])[0]
    keep = sample["target"].ne(PAD)
    ref, _ = smoothed_nll_loss(logits[keep], sample["target"][keep], 0.1)
    ref.sum().backward()
    assert loss.item() == pytest.approx(ref.sum().item(), rel=1e-3)
    for n, p in model.named_parameters():
        assert got[n].dtype == torch.float32
        torch.testing.assert_close(got[n], p.grad, rtol=0.05, atol=2e-3, msg=n)
    with torch.no_grad():
        plain, _, _ = crit(model, sample)
    fresh, _, _ = crit(model, sample)
    assert not plain.requires_grad and plain.item() == pytest.approx(fresh.item(), rel=1e-6)
