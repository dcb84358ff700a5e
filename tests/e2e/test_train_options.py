"""seqtrain-train beyond the basics: validation with ROUGE (--eval-rouge) picking checkpoint_best, the
memory-efficient precision flags, --stop-min-lr and --stop-time-hours. Tiny: bart_tiny on the toy task of
test_train.py (200 examples, 4 updates per epoch)."""

from __future__ import annotations

import os

import pytest
import torch

from seqtrain.checkpoint.fairseq import model_config
from seqtrain.config import from_args
from seqtrain.errors import SeqtrainError
from seqtrain.flags import parsing, training
from seqtrain.generation import options
from seqtrain.scoring.settings import EvalRougeConfig
from seqtrain.train.program import train_config
from seqtrain.train.rouge_validation import RougeValidator, generation_args
from seqtrain_cli.train import train_main
from tests.utils import base_args, parse_log


def load(path):
    return torch.load(path, weights_only=True)


@pytest.mark.slow
def test_eval_rouge_logs_scores_and_picks_best_checkpoint(databin, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    save_dir, log, tb = str(tmp_path / "ck"), str(tmp_path / "log"), tmp_path / "tb"
    train_main(
        base_args(
            databin,
            save_dir,
            "--lr",
            "5e-3",
            "--max-epoch",
            "6",
            "--no-epoch-checkpoints",
            "--log-format",
            "simple",
            "--log-file",
            log,
            "--tensorboard-logdir",
            str(tb),
            "--eval-rouge",
            "--eval-rouge-args",
            '{"beam": 2, "max_len_b": 8, "lenpen": 1.0}',
            "--eval-rouge-print-samples",
            "--best-checkpoint-metric",
            "rouge_l",
            "--maximize-best-checkpoint-metric",
        )
    )
    valid = parse_log(log, "valid")
    assert len(valid) == 6
    for v in valid:
        assert {"rouge1", "rouge2", "rouge_l", "rouge_lsum", "loss"} <= set(v)
        assert 0.0 <= v["rouge2"] <= v["rouge1"] <= 100.0
    best_value = max(v["rouge_l"] for v in valid)
    assert best_value > valid[0]["rouge_l"]  # the model learns something in 24 updates
    best = load(os.path.join(save_dir, "checkpoint_best.pt"))
    assert best["extra_state"]["best"] == pytest.approx(best_value)
    # ties count as better (fairseq), so the best file holds the last validation reaching the maximum
    assert best["extra_state"]["num_updates"] == max(
        v["num_updates"] for v in valid if v["rouge_l"] == best_value
    )
    assert valid[-1]["best_rouge_l"] == best_value
    text = open(log, encoding="utf-8").read()
    assert text.count("example hypothesis: ") == 6 and text.count("example reference: ") == 6
    acc = EventAccumulator(str(tb / "valid"))
    acc.Reload()
    assert [round(e.value, 2) for e in acc.Scalars("rouge_l")] == [v["rouge_l"] for v in valid]


def test_rouge_validator_scores_what_it_generates(databin, monkeypatch):
    """The validator's numbers are seqtrain.scoring.rouge's on the detokenized hypotheses and references. On the
    CPU it searches through the compiled step's loop, with the eager step's hypotheses."""
    from seqtrain.generation import cpu_step
    from seqtrain.scoring.rouge import score_pairs
    from seqtrain.tasks import setup_task

    parser = training.get_training_parser()
    args = parsing.parse_args_and_arch(
        parser, base_args(databin, "unused", "--eval-rouge-args", "--beam 3 --max-len-b 5")
    )
    task = setup_task(train_config(args).task)
    task.load_dataset("valid")
    torch.manual_seed(0)
    model = task.build_model(model_config(args))
    rv = RougeValidator(from_args(EvalRougeConfig, args), task, args.seed, args.prepend_bos)
    assert (rv.gen_args.beam, rv.gen_args.max_len_b) == (3, 5)
    itr = task.get_batch_iterator(task.dataset("valid"), max_tokens=512).next_epoch_itr(shuffle=False)
    samples = list(itr)
    calls = []
    search = cpu_step.CompiledSteps.search
    monkeypatch.setattr(cpu_step.CompiledSteps, "search", lambda *a: calls.append(1) or search(*a))
    n = 0
    for sample in samples:
        rv.add_batch(model, sample)
        n += len(sample["id"])
    assert len(rv.hypotheses) == n == 40
    assert bool(calls) == (cpu_step.extension() is not None)
    compiled = rv.hypotheses
    monkeypatch.setenv("SEQTRAIN_CPU_STEP", "eager")
    rv.reset()
    for sample in samples:
        rv.add_batch(model, sample)
    assert rv.hypotheses == compiled
    assert all(1 <= len(h.split()) <= 5 for h in rv.hypotheses)  # max_len_b 5 (the EOS is not a word)
    assert all(r.split()[0].startswith("w") for r in rv.references)
    want = score_pairs(rv.hypotheses, rv.references)
    assert rv.scores() == {
        "rouge1": want["rouge1"],
        "rouge2": want["rouge2"],
        "rouge_l": want["rougeL"],
        "rouge_lsum": want["rougeLsum"],
    }
    assert model.training  # restored after generating


def test_eval_rouge_bootstrap_interval_is_seqtrain_scores(databin, tmp_path, caplog, capsys):
    """--eval-rouge-bootstrap N logs, and returns as rouge*_lo / rouge*_hi, the interval seqtrain-score
    --bootstrap N --seed S prints and writes for the same hypotheses and references."""
    import json
    import logging

    from seqtrain.tasks import setup_task
    from seqtrain_cli.score import main as score_main

    parser = training.get_training_parser()
    flags = ("--eval-rouge-args", "--beam 2 --max-len-b 5", "--eval-rouge-bootstrap", "300", "--seed", "7")
    args = parsing.parse_args_and_arch(parser, base_args(databin, "unused", *flags))
    task = setup_task(train_config(args).task)
    task.load_dataset("valid")
    torch.manual_seed(0)
    model = task.build_model(model_config(args))
    rv = RougeValidator(from_args(EvalRougeConfig, args), task, args.seed, args.prepend_bos)
    for sample in task.get_batch_iterator(task.dataset("valid"), max_tokens=512).next_epoch_itr(
        shuffle=False
    ):
        rv.add_batch(model, sample)
    with caplog.at_level(logging.INFO, logger="seqtrain.eval_rouge"):
        got = rv.scores()
    logged = [r.getMessage() for r in caplog.records if "95% CI" in r.getMessage()]
    sys_file, ref_file, out = tmp_path / "hyp.txt", tmp_path / "ref.txt", tmp_path / "score.json"
    sys_file.write_text("\n".join(rv.hypotheses) + "\n", encoding="utf-8")
    ref_file.write_text("\n".join(rv.references) + "\n", encoding="utf-8")
    capsys.readouterr()
    score_main(
        [
            "--sys",
            str(sys_file),
            "--ref",
            str(ref_file),
            "--bootstrap",
            "300",
            "--seed",
            "7",
            "--json",
            str(out),
        ]
    )
    printed = capsys.readouterr().out.splitlines()
    assert logged == ["validation ROUGE " + printed[1]] and printed[1].startswith(
        "95% CI (bootstrap 300, seed 7)"
    )
    ci = json.loads(out.read_text())["ci"]
    names = {"rouge1": "rouge1", "rouge2": "rouge2", "rougeL": "rouge_l", "rougeLsum": "rouge_lsum"}
    for key, name in names.items():
        assert [got[f"{name}_lo"], got[f"{name}_hi"]] == ci[key]
        assert got[f"{name}_lo"] <= got[name] <= got[f"{name}_hi"]
    assert got["rouge1_lo"] < got["rouge1_hi"]  # a real spread: the hypotheses differ from example to example


@pytest.mark.slow
def test_eval_rouge_bootstrap_in_the_valid_line(databin, tmp_path):
    log = str(tmp_path / "log")
    flags = ("--max-update", "4", "--no-epoch-checkpoints", "--log-format", "simple", "--log-file", log)
    rouge = ("--eval-rouge", "--eval-rouge-args", "--beam 2 --max-len-b 5", "--eval-rouge-bootstrap", "100")
    assert train_main(base_args(databin, str(tmp_path / "ck"), *flags, *rouge)) == 0
    (valid,) = parse_log(log, "valid")
    for name in ("rouge1", "rouge2", "rouge_l", "rouge_lsum"):
        assert valid[f"{name}_lo"] <= valid[name] <= valid[f"{name}_hi"]
    assert "validation ROUGE 95% CI (bootstrap 100, seed 3): ROUGE-1 " in open(log, encoding="utf-8").read()


def test_eval_rouge_args_json_or_flags():
    a = generation_args('{"beam": 4, "max_len_b": 30, "lenpen": 1.0, "no_repeat_ngram_size": 3}')
    b = generation_args("--beam 4 --max-len-b 30 --lenpen 1.0 --no-repeat-ngram-size 3")
    assert vars(a) == vars(b)
    assert (a.beam, a.max_len_b, a.lenpen, a.no_repeat_ngram_size, a.min_len) == (4, 30, 1.0, 3, 1)
    assert generation_args("{}").beam == 5  # seqtrain-generate's (fairseq's) defaults
    with pytest.raises(SeqtrainError, match="unknown generation setting 'beams'"):
        generation_args('{"beams": 4}')
    with pytest.raises(SeqtrainError, match="beam must be a number"):
        generation_args('{"beam": "four"}')
    with pytest.raises(SeqtrainError, match="--eval-rouge-args: not valid JSON"):
        generation_args('{"beam": 4')
    with pytest.raises(SeqtrainError, match="unknown generation flags --beems 4"):
        generation_args("--beems 4")
    with pytest.raises(SeqtrainError, match="--eval-rouge-args: --beam must be between 1 and 10000, got 0"):
        generation_args('{"beam": 0}')
    # issue 31: the command line's rule, one check for every source: 3.7 was truncated to 3 here
    with pytest.raises(SeqtrainError, match="--eval-rouge-args: --beam must be an integer, got 3.7"):
        generation_args('{"beam": 3.7}')
    with pytest.raises(
        SeqtrainError, match=r"--eval-rouge-args: not valid JSON \(nested more than 100 levels"
    ):
        generation_args('{"beam": ' + "[" * 100_000 + "]" * 100_000 + "}")  # was a RecursionError
    assert generation_args('{"lenpen": 2}').lenpen == 2.0 and isinstance(
        generation_args('{"lenpen": 2}').lenpen, float
    )


def test_rouge_metric_needs_eval_rouge(databin, tmp_path):
    with pytest.raises(SeqtrainError, match="--best-checkpoint-metric rouge_l needs --eval-rouge"):
        train_main(base_args(databin, str(tmp_path / "ck"), "--best-checkpoint-metric", "rouge_l"))
    with pytest.raises(SeqtrainError, match="unknown generation setting"):
        train_main(
            base_args(databin, str(tmp_path / "ck"), "--eval-rouge", "--eval-rouge-args", '{"bam": 2}')
        )
    assert not os.path.exists(tmp_path / "ck")  # failed before training


def test_memory_efficient_precision_flags(databin, tmp_path):
    parser = training.get_training_parser()
    args = parsing.parse_args_and_arch(parser, base_args(databin, "x", "--memory-efficient-fp16"))
    assert args.fp16 and args.memory_efficient_fp16
    if not torch.cuda.is_available():
        with pytest.raises(SeqtrainError, match="--fp16 needs a CUDA device"):
            train_main(base_args(databin, str(tmp_path / "a"), "--memory-efficient-fp16"))
    save_dir = str(tmp_path / "b")
    train_main(
        base_args(databin, save_dir, "--memory-efficient-bf16", "--max-update", "2", "--no-epoch-checkpoints")
    )
    last = load(os.path.join(save_dir, "checkpoint_last.pt"))
    assert last["args"]["bf16"] is True and last["loss_scaler"] is None
    assert last["extra_state"]["num_updates"] == 2
    assert last["model"]["encoder.layers.0.fc1.weight"].dtype == torch.float32  # fp32 master weights
    state = last["optimizer"]["state"]
    assert all(
        v.dtype == torch.float32 for s in state.values() for v in s.values() if torch.is_tensor(v) and v.dim()
    )


@pytest.mark.cuda
def test_memory_efficient_fp16_on_cuda(databin, tmp_path):
    save_dir, log = str(tmp_path / "ck"), str(tmp_path / "log")
    argv = [a for a in base_args(databin, save_dir) if a != "--cpu"]
    train_main(
        argv
        + [
            "--memory-efficient-fp16",
            "--max-update",
            "4",
            "--log-format",
            "simple",
            "--log-file",
            log,
            "--no-epoch-checkpoints",
        ]
    )
    last = load(os.path.join(save_dir, "checkpoint_last.pt"))
    assert last["extra_state"]["num_updates"] == 4 and last["loss_scaler"]["loss_scale"] > 0
    assert last["model"]["encoder.layers.0.fc1.weight"].dtype == torch.float32
    assert "loss_scale" in parse_log(log, "train")[-1]


@pytest.mark.slow
def test_stop_min_lr_stops_at_epoch_boundary(databin, tmp_path):
    # fixed schedule, one lr per epoch: 0.01, 0.005, 0.001, ... Like fairseq, the lr is checked before each epoch
    # with the value the previous epoch ended on, so epoch 3 (lr 0.001) runs and epoch 4 does not.
    save_dir, log = str(tmp_path / "ck"), str(tmp_path / "log")
    train_main(
        base_args(
            databin,
            save_dir,
            "--lr-scheduler",
            "fixed",
            "--lr",
            "0.01,0.005,0.001,0.0005",
            "--max-epoch",
            "10",
            "--stop-min-lr",
            "0.001",
            "--no-epoch-checkpoints",
            "--log-format",
            "simple",
            "--log-file",
            log,
        )
    )
    train = parse_log(log, "train")
    assert [t["lr"] for t in train] == [0.01, 0.005, 0.001]
    assert load(os.path.join(save_dir, "checkpoint_last.pt"))["extra_state"]["num_updates"] == 12
    assert "is smaller than or equal to minimum learning rate (--stop-min-lr=0.001)" in open(log).read()


@pytest.mark.slow
def test_stop_time_hours_counts_resumed_time(databin, tmp_path):
    save_dir = str(tmp_path / "ck")
    train_main(
        base_args(
            databin, save_dir, "--max-epoch", "10", "--stop-time-hours", "1e-9", "--no-epoch-checkpoints"
        )
    )
    last = load(os.path.join(save_dir, "checkpoint_last.pt"))
    assert last["extra_state"]["num_updates"] == 1  # over the limit after the first update: saved and stopped
    spent = last["extra_state"]["previous_training_time"]
    assert spent > 0
    # a resumed run carries the time already spent: a limit just above it allows only one more update
    train_main(
        base_args(
            databin,
            save_dir,
            "--max-epoch",
            "10",
            "--stop-time-hours",
            str(spent / 3600 * 1.0001),
            "--no-epoch-checkpoints",
        )
    )
    last = load(os.path.join(save_dir, "checkpoint_last.pt"))
    assert last["extra_state"]["num_updates"] == 2
    assert last["extra_state"]["previous_training_time"] > spent


@pytest.mark.parametrize("after,expected", [(0, [3, 6]), (4, [6])])
def test_validate_interval_updates(databin, tmp_path, after, expected):
    # 4 updates per epoch; epoch-end validation is off (--validate-interval 100), so validations fall on multiples
    # of --validate-interval-updates (mid-epoch too) and at the final update, none before --validate-after-updates.
    log = str(tmp_path / "log")
    train_main(
        base_args(
            databin,
            str(tmp_path / "ck"),
            "--max-update",
            "6",
            "--validate-interval",
            "100",
            "--validate-interval-updates",
            "3",
            "--validate-after-updates",
            str(after),
            "--no-save",
            "--log-format",
            "simple",
            "--log-file",
            log,
        )
    )
    assert [v["num_updates"] for v in parse_log(log, "valid")] == expected


def test_padded_batch_matches_unpadded_examples():
    """A padded batch without the collater's layout runs padded (masks keep pads from real tokens); its loss and
    gradients must equal the sums over the examples run one by one without any padding (the packed path's
    twin: tests/unit/models/test_packed.py)."""
    from seqtrain.criterions import CrossEntropyCriterion
    from seqtrain.models.bart import BartConfig, BARTModel

    torch.manual_seed(0)
    cfg = BartConfig(
        vocab_size=40,
        encoder_layers=2,
        decoder_layers=2,
        encoder_embed_dim=16,
        decoder_embed_dim=16,
        encoder_ffn_embed_dim=32,
        decoder_ffn_embed_dim=32,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        dropout=0.0,
        max_source_positions=32,
        max_target_positions=32,
    )
    model = BARTModel(cfg).double()
    crit = CrossEntropyCriterion(padding_idx=1)
    pairs = [(7, 5), (3, 2), (5, 4)]
    examples = [
        (torch.randint(4, 40, (s - 1,)).tolist() + [2], torch.randint(4, 40, (t - 1,)).tolist() + [2])
        for s, t in pairs
    ]

    def sample(exs):
        s, t = max(len(e[0]) for e in exs), max(len(e[1]) for e in exs)
        src = torch.tensor([[1] * (s - len(a)) + a for a, _ in exs])  # left-padded
        tgt = torch.tensor([b + [1] * (t - len(b)) for _, b in exs])  # right-padded
        prev = torch.tensor([[2] + b[:-1] + [1] * (t - len(b)) for _, b in exs])
        return {
            "net_input": {"src_tokens": src, "src_lengths": None, "prev_output_tokens": prev},
            "target": tgt,
        }

    def grads(exs):
        model.zero_grad()
        loss, _, _ = crit(model, sample(exs))
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    loss, batch_grads = grads(examples)
    singles = [grads([e]) for e in examples]
    assert loss.item() == pytest.approx(sum(s[0].item() for s in singles), rel=1e-10)
    for name, g in batch_grads.items():
        torch.testing.assert_close(g, sum(s[1][name] for s in singles), rtol=1e-9, atol=1e-10, msg=name)


def test_cuda_kernel_choices_are_set_as_asked():
    """seqtrain.cuda.set_cuda_kernels (what a Trainer or a generator on CUDA calls; these are torch's global
    switches, settable without a GPU): TF32 on unless --no-tf32, None leaves it; cuDNN attention off unless
    --cudnn-attention; both flags parse for train and generate."""
    from seqtrain.cuda import set_cuda_kernels

    set_cuda_kernels(tf32=True, cudnn_attention=False)
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    set_cuda_kernels(tf32=None, cudnn_attention=True)
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cuda.cudnn_sdp_enabled()
    set_cuda_kernels(tf32=False, cudnn_attention=False)
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    train = parsing.parse_args_and_arch(
        training.get_training_parser(), ["d", "--arch", "bart_tiny", "--cudnn-attention", "--no-tf32"]
    )
    assert train.cudnn_attention and train.no_tf32
    assert options.get_generation_parser().parse_args(["d", "--cudnn-attention"]).cudnn_attention
