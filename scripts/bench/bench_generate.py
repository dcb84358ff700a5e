#!/usr/bin/env python
"""Benchmark beam search: seqtrain's SequenceGenerator vs Hugging Face transformers' `generate`, same weights.

One process holds both models with identical weights (a transformers BartForConditionalGeneration and the
seqtrain BARTModel loaded from its state dict) and decodes the same batches of real sources (debdesc-sample valid,
sentencepiece pieces, truncated to --max-source tokens) with both, alternating toolkits batch by batch after a
warm-up, several rounds. Reported per toolkit: sentences/s and generated tokens/s (best hypothesis incl. its EOS;
medians over rounds, wall clock), sentences per CPU-second (time.process_time; with one thread this is what the
toolkit costs even when other processes take turns on the cores, so it is the steadier figure on a shared
machine), the share of sentences whose best hypothesis is token-for-token identical, and the peak
memory of one batch (each toolkit decodes in a fresh subprocess; benchlib.PeakRSS measures from after the model
is loaded, so the figure is the memory generation adds on top of the weights).

Weights (no pretrained BART is reachable offline):
- `base`: bart_base shapes (d 768, 6+6 layers, 12 heads, FFN 3072), random weights drawn wider than the usual
  init so the next-token distribution is peaked (near-uniform logits would make rankings depend on float
  rounding), and the EOS embedding row scaled up so hypotheses end at varied lengths instead of all running to
  max length.
- `small`: bart_small (d 256, 3+3 layers) trained for --train-seconds on debdesc-sample train: real, if weak,
  learned weights; outputs end where the model chooses. Cached in --workdir.

Settings: beam 4 with CNN/DM's search settings (lenpen 2.0, no-repeat-ngram 3, min/max length; the lengths are
scaled to debdesc's one-line targets by default: --min-len 5 --max-len-b 60). transformers gets the equivalent
arguments (max_length = max_len + 2 and min_length = min_len + 1 since it counts the start token, EOS, pad
suppressed, early_stopping=True, decoder start = EOS) and a processor that forces EOS at max length keeping its
real log-prob as fairseq does (transformers' own forced_eos sets it to 0, which changes the ranking of
max-length hypotheses).

    python scripts/bench/bench_generate.py             # both models, batch sizes 8 and 16, 3 rounds (~10 min + 2.5 min
                                                 # the first time, to train the small model; idle machine)
    python scripts/bench/bench_generate.py --quick     # small model, one batch size, 2 rounds
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from benchlib import MIB, PeakRSS, peak_weights_, release_free_heap  # noqa: E402  (scripts/bench/benchlib.py)

from seqtrain.checkpoint.hf import hf_state_to_seqtrain, seqtrain_state_to_hf  # noqa: E402
from seqtrain.data.dictionary import Dictionary  # noqa: E402
from seqtrain.data.tokenizer import SentencePieceTokenizer  # noqa: E402
from seqtrain.generation.sequence_generator import SequenceGenerator  # noqa: E402
from seqtrain.models.bart import BartConfig, BARTModel  # noqa: E402

PAD, EOS, BOS = 1, 2, 0
SHAPES = {  # d_model, ffn, layers, heads
    "base": (768, 3072, 6, 12),
    "small": (256, 1024, 3, 4),
    # bart_base's depth at a width where arithmetic is negligible (scripts/bench/bench_host_overhead.py)
    "narrow": (32, 64, 6, 2),
}


# ------------------------------------------------------------------ data


def build_vocab(data: str, workdir: str, pieces: int) -> tuple[SentencePieceTokenizer, Dictionary]:
    """A sentencepiece model trained on the sample's train split, and the fairseq dictionary of its pieces
    (counted on the same text, as seqtrain-preprocess does). Cached in workdir."""
    spm_path = os.path.join(workdir, f"spm{pieces}.model")
    if os.path.exists(spm_path):
        tok = SentencePieceTokenizer.from_file(spm_path)
    else:
        tok = SentencePieceTokenizer.train(
            [f"{data}/train.source", f"{data}/train.target"], vocab_size=pieces
        )
        with open(spm_path + ".tmp", "wb") as f:
            f.write(tok.model_proto)
        os.replace(spm_path + ".tmp", spm_path)
    d = Dictionary()
    for split in ("train.source", "train.target"):
        with open(f"{data}/{split}", encoding="utf-8") as f:
            for line in tok.encode_batch(f.read().splitlines()):
                for piece in line.split():
                    d.add_symbol(piece)
    d.finalize(padding_factor=8)
    return tok, d


def encode_file(
    tok: SentencePieceTokenizer, d: Dictionary, path: str, max_tokens: int, limit: int = 0
) -> list[list[int]]:
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if limit:
        lines = lines[:limit]
    out = []
    for line in tok.encode_batch(lines):
        ids = d.encode_line(line, append_eos=False).tolist()[: max_tokens - 1]
        out.append(ids + [EOS])
    return out


def pad_batch(seqs: list[list[int]], left: bool) -> torch.Tensor:
    width = max(map(len, seqs))
    return torch.tensor(
        [[PAD] * (width - len(s)) + s if left else s + [PAD] * (width - len(s)) for s in seqs]
    )


# ------------------------------------------------------------------ models


def hf_config(vocab: int, shape: str):
    import transformers

    dim, ffn, layers, heads = SHAPES[shape]
    return transformers.BartConfig(
        vocab_size=vocab,
        d_model=dim,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn,
        max_position_embeddings=1024,
        scale_embedding=False,
        activation_function="gelu",
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        decoder_start_token_id=EOS,
        forced_bos_token_id=None,
        forced_eos_token_id=None,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
    )


def seqtrain_config(vocab: int, shape: str) -> BartConfig:
    dim, ffn, layers, heads = SHAPES[shape]
    return BartConfig(
        vocab_size=vocab,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_embed_dim=dim,
        decoder_embed_dim=dim,
        encoder_ffn_embed_dim=ffn,
        decoder_ffn_embed_dim=ffn,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        dropout=0.0,
    )


def peaked_random_state(
    vocab: int, seed: int, eos_scale: float, shape: str = "base"
) -> dict[str, torch.Tensor]:
    """Random weights of a SHAPES shape (seqtrain names) with a peaked next-token distribution and an EOS that
    is likely enough to end hypotheses at varied lengths. Deterministic for a seed."""
    torch.manual_seed(seed)
    model = BARTModel(seqtrain_config(vocab, shape))
    peak_weights_(model, eos_scale, PAD, EOS)
    return {k: v.clone() for k, v in model.state_dict().items()}


TRAIN_TOKENS = 1024  # source tokens per training batch: small batches give more updates in a short budget


def train_small(
    d: Dictionary, train_src: list[list[int]], train_tgt: list[list[int]], seconds: float, seed: int = 1
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """bart_small trained for `seconds` on the sample (Adam, inverse-sqrt schedule, 1k-token batches)."""
    torch.manual_seed(seed)
    model = BARTModel(seqtrain_config(len(d), "small"))
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-8, foreach=True)
    order = sorted(range(len(train_src)), key=lambda i: len(train_src[i]))
    batches, cur, width = [], [], 0
    for i in order:
        width = max(width, len(train_src[i]))
        if cur and width * (len(cur) + 1) > TRAIN_TOKENS:
            batches.append(cur)
            cur, width = [], len(train_src[i])
        cur.append(i)
    batches.append(cur)
    g = torch.Generator().manual_seed(seed)
    start, step, loss_v, epoch = time.perf_counter(), 0, float("nan"), 0
    while time.perf_counter() - start < seconds:
        for b in torch.randperm(len(batches), generator=g).tolist():
            if time.perf_counter() - start >= seconds:
                break
            idx = batches[b]
            src = pad_batch([train_src[i] for i in idx], left=True)
            tgt = pad_batch([train_tgt[i] for i in idx], left=False)
            prev = torch.cat([torch.full((len(idx), 1), EOS), tgt[:, :-1]], dim=1)
            prev = prev.masked_fill(prev.eq(EOS) & (torch.arange(prev.size(1)) > 0), PAD)
            logits, _ = model(src, None, prev)
            loss = torch.nn.functional.cross_entropy(
                logits.view(-1, logits.size(-1)), tgt.view(-1), ignore_index=PAD
            )
            step += 1
            for group in opt.param_groups:
                group["lr"] = 1e-3 * min(step / 100, (100 / step) ** 0.5)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            loss_v = loss.item()
        epoch += 1
    info = {
        "train_steps": step,
        "train_seconds": round(time.perf_counter() - start, 1),
        "final_loss_nats": round(loss_v, 3),
        "epochs_started": epoch,
    }
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, info


def load_pair(state: dict[str, torch.Tensor], vocab: int, shape: str):
    """(transformers model, seqtrain model) holding the same weights."""
    import transformers

    hf = transformers.BartForConditionalGeneration(hf_config(vocab, shape))
    missing, unexpected = hf.load_state_dict(seqtrain_state_to_hf(state), strict=False)
    assert not unexpected and all("lm_head" in k or "embed_tokens" in k for k in missing), (
        missing,
        unexpected,
    )
    hf.tie_weights()
    ours = BARTModel(seqtrain_config(vocab, shape))
    ours.load_state_dict(hf_state_to_seqtrain(hf.state_dict(), "bench", []), strict=True)
    assert torch.equal(hf.lm_head.weight, ours.decoder.output_projection.weight)
    return hf.eval(), ours.eval()


# ------------------------------------------------------------------ the two decoders


class Settings(argparse.Namespace):
    beam: int
    lenpen: float
    no_repeat_ngram_size: int
    min_len: int
    max_len_b: int


def make_generator(model: Any, d: Dictionary, s: Settings, **extra: Any) -> SequenceGenerator:
    """seqtrain's beam search with these settings (best hypothesis only); `extra`: more SequenceGenerator
    arguments (static_decoding, packed_encoder). Shared by bench_packed_encoder.py and the GPU check."""
    return SequenceGenerator(
        model,
        d,
        beam_size=s.beam,
        nbest=1,
        max_len_b=s.max_len_b,
        min_len=s.min_len,
        len_penalty=s.lenpen,
        no_repeat_ngram_size=s.no_repeat_ngram_size,
        **extra,
    )


def seqtrain_decode(model: BARTModel, batch: list[list[int]], s: Settings, d: Dictionary) -> list[list[int]]:
    gen = make_generator(model, d, s)
    return [h[0]["tokens"].tolist() for h in gen.generate(pad_batch(batch, left=True))]


def fairseq_forced_eos(max_length: int, eos: int = EOS) -> Any:
    """A transformers LogitsProcessor forcing EOS at `max_length` the way fairseq does: every other token gets
    -inf and EOS keeps its log-prob (HF's forced_eos_token_id would give it 0). Also used by
    tests/unit/generation/test_sequence_generator.py."""
    import transformers

    class ForceEosKeepScore(transformers.LogitsProcessor):
        def __call__(self, input_ids, scores):
            if input_ids.shape[-1] == max_length - 1:
                kept = scores[:, eos].clone()
                scores = torch.full_like(scores, -math.inf)
                scores[:, eos] = kept
            return scores

    return ForceEosKeepScore()


def hf_decode(model, batch: list[list[int]], s: Settings) -> list[list[int]]:
    import transformers

    # transformers' learned positions count pads, so sources are right-padded for it (fairseq's skip pads)
    src = pad_batch(batch, left=False)
    max_length = s.max_len_b + 2
    out = model.generate(
        input_ids=src,
        attention_mask=src.ne(PAD),
        num_beams=s.beam,
        length_penalty=s.lenpen,
        early_stopping=True,
        no_repeat_ngram_size=s.no_repeat_ngram_size,
        min_length=s.min_len + 1,
        max_length=max_length,
        decoder_start_token_id=EOS,
        forced_bos_token_id=None,
        forced_eos_token_id=None,
        suppress_tokens=[PAD],
        logits_processor=transformers.LogitsProcessorList([fairseq_forced_eos(max_length)]),
        do_sample=False,
        num_return_sequences=1,
    )
    hyps = []
    for row in out.tolist():
        row = row[1:]  # the decoder start token
        hyps.append(row[: row.index(EOS) + 1] if EOS in row else row)
    return hyps


# ------------------------------------------------------------------ memory probe (run in a subprocess)


def memory_probe(case_path: str, toolkit: str) -> None:
    case = torch.load(case_path, weights_only=False)
    torch.set_num_threads(case["threads"])
    if toolkit == "transformers":
        import transformers

        model = transformers.BartForConditionalGeneration(hf_config(case["vocab"], case["shape"]))
        model.load_state_dict(seqtrain_state_to_hf(case["state"]), strict=False)
        model.tie_weights()
    else:
        model = BARTModel(seqtrain_config(case["vocab"], case["shape"]))
        model.load_state_dict(case["state"])
    model.eval()
    del case["state"]
    gc.collect()
    release_free_heap()  # so generation cannot hide its peak in memory freed while loading
    s, d = Settings(**case["settings"]), Dictionary.from_list(case["dict"])
    with PeakRSS() as mem, torch.inference_mode():
        if toolkit == "transformers":
            hf_decode(model, case["batch"], s)
        else:
            seqtrain_decode(model, case["batch"], s, d)
    print(
        json.dumps(
            {
                "rss_before_mb": mem.base / MIB,
                "peak_rss_mb": mem.peak / MIB,
                "peak_increase_mb": mem.increase / MIB,
            }
        )
    )


def measure_memory(case: dict[str, Any], workdir: str) -> dict[str, dict[str, float]]:
    path = os.path.join(workdir, "memory_case.pt")
    torch.save(case, path)
    out = {}
    for toolkit in ("seqtrain", "transformers"):
        res = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--memory-probe", toolkit, "--case", path],
            capture_output=True,
            text=True,
            check=True,
        )
        out[toolkit] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


# ------------------------------------------------------------------ the benchmark


def load_avg() -> float:
    return os.getloadavg()[0]


def bench_model(
    name: str, state, vocab: int, shape: str, sources: list[list[int]], args, d: Dictionary, workdir: str
) -> list[dict[str, Any]]:
    s = Settings(
        beam=args.beam,
        lenpen=args.lenpen,
        no_repeat_ngram_size=args.no_repeat_ngram_size,
        min_len=args.min_len,
        max_len_b=args.max_len_b,
    )
    hf, ours = load_pair(state, vocab, shape)
    rows = []
    for bsz in args.batch_sizes:
        batches = [sources[i * bsz : (i + 1) * bsz] for i in range(args.batches)]
        if any(len(b) < bsz for b in batches):
            raise SystemExit(f"not enough sources for {args.batches} batches of {bsz}")
        with torch.inference_mode():
            seqtrain_decode(ours, batches[0][:2], s, d)  # warm-up: thread pools, kernel selection
            hf_decode(hf, batches[0][:2], s)
        times: dict[str, list[float]] = {"seqtrain": [], "transformers": []}
        cpu: dict[str, list[float]] = {"seqtrain": [], "transformers": []}
        outputs: dict[str, list[list[int]]] = {}
        loads = []
        for r in range(args.rounds):
            per_round = {"seqtrain": 0.0, "transformers": 0.0}
            cpu_round = {"seqtrain": 0.0, "transformers": 0.0}
            outs: dict[str, list[list[int]]] = {"seqtrain": [], "transformers": []}
            for bi, batch in enumerate(batches):
                # alternate which toolkit goes first so slow drifts in machine load hit both alike
                order = ["seqtrain", "transformers"] if (r + bi) % 2 == 0 else ["transformers", "seqtrain"]
                for tk in order:
                    gc.collect()
                    t0, c0 = time.perf_counter(), time.process_time()
                    with torch.inference_mode():
                        hyps = (
                            seqtrain_decode(ours, batch, s, d)
                            if tk == "seqtrain"
                            else hf_decode(hf, batch, s)
                        )
                    per_round[tk] += time.perf_counter() - t0
                    cpu_round[tk] += time.process_time() - c0
                    outs[tk].extend(hyps)
            loads.append(load_avg())
            for tk in times:
                times[tk].append(per_round[tk])
                cpu[tk].append(cpu_round[tk])
            if r == 0:
                outputs = outs
            else:  # both decoders are deterministic; a difference between rounds would be a bug
                assert outs == outputs, "outputs changed between rounds"
        n = len(outputs["seqtrain"])
        same = sum(a == b for a, b in zip(outputs["seqtrain"], outputs["transformers"]))
        lengths = [len(h) for h in outputs["seqtrain"]]
        mem = (
            measure_memory(
                {
                    "state": state,
                    "vocab": vocab,
                    "shape": shape,
                    "settings": vars(s),
                    "batch": batches[0],
                    "dict": d.to_list(),
                    "threads": torch.get_num_threads(),
                },
                workdir,
            )
            if not args.no_memory
            else {}
        )
        row = {
            "model": name,
            "batch_size": bsz,
            "sentences": n,
            "identical": same,
            "out_len_mean": round(statistics.mean(lengths), 1),
            "out_len_min": min(lengths),
            "out_len_max": max(lengths),
            "load_avg_1min": [round(x, 2) for x in loads],
        }
        for tk in times:
            med, cpu_med = statistics.median(times[tk]), statistics.median(cpu[tk])
            ntok = sum(len(h) for h in outputs[tk])
            row[tk] = {
                "seconds_median": round(med, 3),
                "seconds_all": [round(t, 3) for t in times[tk]],
                "cpu_seconds_median": round(cpu_med, 3),
                "cpu_seconds_all": [round(t, 3) for t in cpu[tk]],
                "sentences_per_s": round(n / med, 3),
                "tokens_per_s": round(ntok / med, 1),
                "sentences_per_cpu_s": round(n / cpu_med, 3),
                **{k: round(v, 1) for k, v in mem.get(tk, {}).items() if v is not None},
            }
        row["speedup"] = round(row["transformers"]["seconds_median"] / row["seqtrain"]["seconds_median"], 2)
        row["speedup_cpu"] = round(
            row["transformers"]["cpu_seconds_median"] / row["seqtrain"]["cpu_seconds_median"], 2
        )
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| weights | batch | toolkit | sentences/s | gen. tokens/s | sentences/CPU-s | peak RSS +MB | identical "
        "| speedup (wall / CPU) |\n|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        for tk in ("seqtrain", "transformers"):
            m = r[tk]
            lines.append(
                f"| {r['model']} | {r['batch_size']} | {tk} | {m['sentences_per_s']:.2f} | {m['tokens_per_s']:.0f} | "
                f"{m['sentences_per_cpu_s']:.2f} | {m.get('peak_increase_mb', float('nan')):.0f} | "
                f"{r['identical']}/{r['sentences']} | "
                + (f"{r['speedup']:.2f}x / {r['speedup_cpu']:.2f}x |" if tk == "seqtrain" else "1 / 1 |")
            )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small model only, batch size 8, 2 batches, 2 rounds")
    p.add_argument(
        "--models", default="small,base", help="comma list of: small (trained), base (random, peaked)"
    )
    p.add_argument("--batch-sizes", default="8,16")
    p.add_argument(
        "--batches", type=int, default=2, help="batches per batch size (consecutive valid sources)"
    )
    p.add_argument("--rounds", type=int, default=3, help="timed rounds after the warm-up (medians reported)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--lenpen", type=float, default=2.0)
    p.add_argument("--no-repeat-ngram-size", type=int, default=3)
    p.add_argument("--min-len", type=int, default=5)
    p.add_argument("--max-len-b", type=int, default=60)
    p.add_argument("--max-source", type=int, default=256, help="source tokens kept (incl. EOS)")
    p.add_argument("--pieces", type=int, default=8000, help="sentencepiece vocabulary size")
    p.add_argument(
        "--eos-scale", type=float, default=4.0, help="EOS embedding scale of the random base model"
    )
    p.add_argument("--train-seconds", type=float, default=150.0, help="training time of the small model")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (0: torch's default). 1 by default: on a machine shared with other "
        "work, several threads wait on each other at every op and wall times swing 10x",
    )
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument(
        "--memory-only", action="store_true", help="only the peak-memory subprocesses (first batch)"
    )
    p.add_argument("--data", default=os.path.join(REPO, "data", "debdesc-sample"))
    p.add_argument("--workdir", default="/tmp/seqtrain-bench-generate")
    p.add_argument("--json", help="write all results here")
    p.add_argument("--memory-probe", choices=["seqtrain", "transformers"], help=argparse.SUPPRESS)
    p.add_argument("--case", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.memory_probe:
        memory_probe(args.case, args.memory_probe)
        return
    if args.quick:
        args.models, args.batch_sizes, args.batches, args.rounds = "small", "8", 2, 2
        args.train_seconds = min(args.train_seconds, 60.0)
    args.batch_sizes = [int(x) for x in str(args.batch_sizes).split(",")]
    if args.threads:
        torch.set_num_threads(args.threads)
    os.makedirs(args.workdir, exist_ok=True)
    import transformers

    transformers.logging.set_verbosity_error()
    t_start = time.perf_counter()
    tok, d = build_vocab(args.data, args.workdir, args.pieces)
    valid = encode_file(tok, d, f"{args.data}/valid.source", args.max_source)
    print(
        f"# torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads, "
        f"{os.cpu_count()} cpus, load {load_avg():.2f}; dictionary {len(d)}",
        flush=True,
    )
    rows = []
    for name in args.models.split(","):
        info: dict[str, Any] = {}
        if name == "base":
            state = peaked_random_state(len(d), seed=0, eos_scale=args.eos_scale)
            shape = "base"
        elif name == "small":
            cache = os.path.join(
                args.workdir, f"small_{len(d)}_{TRAIN_TOKENS}tok_{int(args.train_seconds)}s.pt"
            )
            if os.path.exists(cache):
                saved = torch.load(cache, weights_only=True)
                state, info = saved["state"], saved["info"]
            else:
                src = encode_file(tok, d, f"{args.data}/train.source", 128)
                tgt = encode_file(tok, d, f"{args.data}/train.target", 128)
                state, info = train_small(d, src, tgt, args.train_seconds)
                torch.save({"state": state, "info": info}, cache + ".tmp")
                os.replace(cache + ".tmp", cache)
            shape = "small"
        else:
            raise SystemExit(f"--models: unknown {name!r}")
        print(f"# model {name}: {info}", flush=True)
        if args.memory_only:
            s = Settings(
                beam=args.beam,
                lenpen=args.lenpen,
                no_repeat_ngram_size=args.no_repeat_ngram_size,
                min_len=args.min_len,
                max_len_b=args.max_len_b,
            )
            for bsz in args.batch_sizes:
                mem = measure_memory(
                    {
                        "state": state,
                        "vocab": len(d),
                        "shape": shape,
                        "settings": vars(s),
                        "batch": valid[:bsz],
                        "dict": d.to_list(),
                        "threads": torch.get_num_threads(),
                    },
                    args.workdir,
                )
                print(json.dumps({"model": name, "batch_size": bsz, **mem}), flush=True)
            continue
        for row in bench_model(name, state, len(d), shape, valid, args, d, args.workdir):
            row["weights_info"] = info
            rows.append(row)
    if rows:
        print(table(rows))
    print(f"# total {time.perf_counter() - t_start:.0f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items()}, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
