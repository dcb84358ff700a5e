"""label_smoothed_cross_entropy_with_distillation on made BART models: loss and gradients equal the formula written
plainly on full logits (pads masked, token and sentence normalisation), the teacher stays frozen and out of the
graph, and bad settings are one line."""

import math

import pytest
import torch

from seqtrain.config import from_args
from seqtrain.criterions import (
    DistillationConfig,
    LabelSmoothedCrossEntropyWithDistillationCriterion,
    build_criterion,
    check_criterion_flags,
)
from seqtrain.criterions.distillation import NAME
from seqtrain.errors import SeqtrainError
from tests.unit.criterions.test_criterions import PAD, V, _tiny_bart, make_sample


def hand_loss(student, teacher, sample, eps, temperature, alpha):
    """(1 - a) * fairseq's label-smoothed NLL + a * T^2 * KL(p_teacher^T || p_student^T), summed over non-pad
    targets; also the plain NLL sum and the KD sum."""
    s = student(**sample["net_input"])[0]
    with torch.no_grad():
        t = teacher(**sample["net_input"])[0]
    target = sample["target"]
    keep = target.ne(PAD)
    lprobs = torch.log_softmax(s, -1)
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    eps_i = eps / (V - 1)
    ce = (1 - eps - eps_i) * nll + eps_i * (-lprobs.sum(-1))
    p_t = torch.softmax(t / temperature, -1)
    kl = (p_t * (torch.log_softmax(t / temperature, -1) - torch.log_softmax(s / temperature, -1))).sum(-1)
    kd = temperature**2 * kl
    loss = ((1 - alpha) * ce + alpha * kd)[keep].sum()
    return loss, nll[keep].sum(), kd[keep].sum()


@pytest.mark.parametrize("eps,temperature,alpha", [(0.0, 1.0, 0.5), (0.1, 2.0, 0.8), (0.1, 3.0, 1.0)])
@pytest.mark.parametrize("sentence_avg", [False, True])
def test_loss_and_gradients_equal_the_hand_formula(eps, temperature, alpha, sentence_avg):
    student, teacher = _tiny_bart(V, seed=0), _tiny_bart(V, seed=1)
    crit = LabelSmoothedCrossEntropyWithDistillationCriterion(
        PAD, teacher, temperature, alpha, label_smoothing=eps, sentence_avg=sentence_avg
    )
    sample = make_sample()
    loss, size, log = crit(student, sample)
    assert sample["ntokens"] == 9 and size == (3 if sentence_avg else 9)
    grads = torch.autograd.grad(loss, list(student.parameters()))
    ref, ref_nll, ref_kd = hand_loss(student, teacher, sample, eps, temperature, alpha)
    ref_grads = torch.autograd.grad(ref, list(student.parameters()))
    assert loss.item() == pytest.approx(ref.item(), rel=1e-10)
    assert log["nll_loss"].item() == pytest.approx(ref_nll.item(), rel=1e-10)
    assert log["distill_loss"].item() == pytest.approx(ref_kd.item(), rel=1e-10)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-12)
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    stats = type(crit).reduce_metrics([log])
    assert stats["loss"] == pytest.approx(ref.item() / size / math.log(2), rel=1e-10)
    assert stats["distill_loss"] == pytest.approx(ref_kd.item() / size / math.log(2), rel=1e-10)
    assert stats["nll_loss"] == pytest.approx(ref_nll.item() / 9 / math.log(2), rel=1e-10)


def test_alpha_zero_is_the_label_smoothed_loss_and_equal_models_have_no_kd():
    student = _tiny_bart(V, seed=0)
    teacher = _tiny_bart(V, seed=0)
    sample = make_sample()
    crit = LabelSmoothedCrossEntropyWithDistillationCriterion(PAD, teacher, 2.0, 0.0, label_smoothing=0.1)
    plain = build_criterion(
        from_args(
            DistillationConfig,
            type("A", (), {"criterion": "label_smoothed_cross_entropy", "label_smoothing": 0.1})(),
        ),
        PAD,
    )
    loss, _, log = crit(student, sample)
    assert loss.item() == pytest.approx(plain(student, sample)[0].item(), rel=1e-10)
    assert abs(log["distill_loss"].item()) < 1e-12  # the same weights: KL 0


def test_teacher_is_frozen_in_eval_mode_and_follows_the_student_dtype():
    bart = pytest.importorskip("seqtrain.models.bart")
    teacher = _tiny_bart(V, dtype=torch.float32, seed=1)
    teacher.train()
    for m in teacher.modules():  # dropout on: eval mode must switch it off
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.5
    assert isinstance(teacher, bart.BARTModel)
    crit = LabelSmoothedCrossEntropyWithDistillationCriterion(PAD, teacher, 2.0, 0.8)
    assert not crit.teacher.training
    student = _tiny_bart(V, dtype=torch.float64, seed=0)
    first = crit(student, make_sample())[2]["distill_loss"]
    second = crit(student, make_sample())[2]["distill_loss"]
    assert first.item() == second.item()  # no dropout in the teacher
    assert next(crit.teacher.parameters()).dtype == torch.float64


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"distill_temperature": 0.0}, r"--distill-temperature must be between 0.01 and 1000, got 0.0"),
        # issue 48, class 10: T^2 * KL at T = 1e-30 was exactly 0 in fp32, the KD term gone without a word
        ({"distill_temperature": 1e-30}, r"--distill-temperature must be between 0.01 and 1000, got 1e-30"),
        ({"distill_alpha": 1.5}, "--distill-alpha must be between 0 and 1"),
    ],
)
def test_bad_settings_are_one_line(kw, message):
    with pytest.raises(SeqtrainError, match=message):
        LabelSmoothedCrossEntropyWithDistillationCriterion(PAD, _tiny_bart(V), **kw)


def test_needs_a_teacher_and_teacher_path_needs_the_criterion(tmp_path):
    args = type("A", (), {"criterion": "label_smoothed_cross_entropy_with_distillation"})()
    with pytest.raises(SeqtrainError, match="needs --teacher-path CKPT"):
        build_criterion(from_args(DistillationConfig, args), PAD)
    args.teacher_path = str(tmp_path / "missing.pt")
    with pytest.raises(SeqtrainError, match=r"--teacher-path .*missing.pt: no such file"):
        build_criterion(from_args(DistillationConfig, args), PAD)
    with pytest.raises(
        SeqtrainError,
        match=f"--teacher-path is read only by --criterion {NAME}, not cross_entropy",
    ):  # seqtrain-train lists every criterion's flags: one the chosen criterion does not read is refused
        check_criterion_flags("cross_entropy", lambda dest: getattr(args, dest, None))
    check_criterion_flags(NAME, lambda dest: getattr(args, dest, None))


def test_packed_batch_equals_padded_batch():
    """The collater's packed layout (teacher and student both run packed) gives the padded batch's loss and
    gradients: the two models' rows line up."""
    packed_mod = pytest.importorskip("tests.unit.models.test_packed")
    student = packed_mod.model_of(torch.float64)
    torch.manual_seed(5)
    teacher = packed_mod.model_of(torch.float64)
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(0.05 * torch.randn_like(p))  # another model than the student
    sample = packed_mod.sample_of()
    assert "layout" in sample["net_input"]
    crit = LabelSmoothedCrossEntropyWithDistillationCriterion(
        packed_mod.PAD, teacher, 2.0, 0.8, label_smoothing=0.1
    )
    out = []
    for s in (sample, packed_mod.padded(sample)):
        loss, _, log = crit(student, s)
        out.append((loss, log["distill_loss"], torch.autograd.grad(loss, list(student.parameters()))))
    (a, kd_a, ga), (b, kd_b, gb) = out
    assert kd_a.item() > 0 and kd_a.item() == pytest.approx(kd_b.item(), rel=1e-9)
    assert a.item() == pytest.approx(b.item(), rel=1e-9)
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, rtol=1e-7, atol=1e-10)


@pytest.mark.cuda
def test_teacher_moves_to_the_students_device():
    teacher = _tiny_bart(V, dtype=torch.float32, seed=1)
    crit = LabelSmoothedCrossEntropyWithDistillationCriterion(PAD, teacher, 2.0, 0.8).to("cuda")
    student = _tiny_bart(V, dtype=torch.float32, seed=0)
    cpu_loss = crit.to("cpu")(student, make_sample())[0].item()
    crit.to("cuda")
    assert next(crit.teacher.parameters()).is_cuda
    sample = make_sample()
    sample["net_input"] = {k: v.cuda() for k, v in sample["net_input"].items()}
    sample["target"] = sample["target"].cuda()
    loss = crit(student.cuda(), sample)[0]
    assert loss.is_cuda and loss.item() == pytest.approx(cpu_loss, rel=1e-4)


def test_the_students_limits_must_fit_the_teachers():
    """Issue 48, class 10: a teacher with fewer positions than the run's limits ended the first update with the
    teacher's own error naming the student's flag (`source of 10 tokens exceeds --max-source-positions 8`); the
    criterion now refuses at its setup, naming the teacher and the flags that fix it."""
    from seqtrain.criterions.distillation import _check_positions

    _check_positions((1024, 1024), (1024, 1024), "t.pt")
    _check_positions((1024, 1024), (512, 128), "t.pt")
    with pytest.raises(SeqtrainError) as e:
        _check_positions((8, 16), (1024, 12), "t.pt")
    assert str(e.value) == (
        "--teacher-path t.pt: the teacher reads at most 8 source and 16 target tokens (its max_source_positions / "
        "max_target_positions), fewer than this run's --max-source-positions 1024 / --max-target-positions 12; "
        "give the student at most the teacher's (--max-source-positions 8 --max-target-positions 12), so every "
        "example fits both"
    )


def test_resuming_with_another_teacher_or_temperature_is_said(caplog):
    from seqtrain.train.checkpoints import note_teacher_changes

    kd = "label_smoothed_cross_entropy_with_distillation"
    stored = {"criterion": kd, "teacher_path": "a.pt", "distill_temperature": 2.0, "distill_alpha": 0.8}
    caplog.set_level("WARNING")
    note_teacher_changes(stored, dict(stored), "ck.pt")
    note_teacher_changes({"criterion": "cross_entropy"}, {"criterion": "cross_entropy"}, "ck.pt")
    assert caplog.records == []
    note_teacher_changes(stored, {**stored, "teacher_path": "b.pt", "distill_temperature": 1.0}, "ck.pt")
    assert [r.getMessage() for r in caplog.records] == [
        "resuming ck.pt with another distillation objective: --teacher-path a.pt -> b.pt, --distill-temperature "
        "2.0 -> 1.0; the run continues with the new one (restart from its weights with --finetune-from-model for "
        "a clean schedule)"
    ]
