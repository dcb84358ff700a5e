"""GPU check stage `determinism` (issue 26 item 5): exact training at real size under --deterministic.

To register it in scripts/gpu/gpu_check.py (it needs nothing else from there):

    from stage_determinism import stage_determinism
    STAGES.append(("determinism", stage_determinism))        # bart_base, about 1 minute on an H200
    # or functools.partial(stage_determinism, arch="bart_large") when the run has time for it

`stage_determinism(check)` takes gpu_check.py's Check (check.device, check.dry, check.out, check.sync()) and returns
its figures. With the flag (seqtrain.cuda.set_deterministic: deterministic algorithms without warn_only, so
flash / memory-efficient attention backward and the varlen kernel's run their deterministic variants; cuDNN
deterministic; CUBLAS_WORKSPACE_CONFIG, which gpu_check.sh exports before Python starts) it trains `arch` at real
lengths (sources 900-1024 tokens, targets 50-110, 16 a step: ~16k source tokens; bf16 autocast, fused AdamW,
dropout 0.1) from one initial state:
  - k updates twice: parameters and losses bitwise equal;
  - k/2 updates, saved (Trainer.state_dict, through a file), loaded into a fresh trainer, resumed to k: bitwise
    equal to the unbroken run;
  - ms/step of the same updates with the flag, without it (deterministic algorithms off: the cost), and with it
    but torch.utils.deterministic.fill_uninitialized_memory off (deterministic mode fills every new tensor, the
    step's own buffers included, with NaN; correct code never reads it, so that share of the cost is a safety
    net, not determinism). All three share this process's cuBLAS workspace setting, which cuBLAS read once.
An operator without a deterministic kernel stops the stage with the Trainer's one line naming it. Global
settings are put back afterwards. --dry-run: bart_tiny on the CPU, tiny shapes (tests/repo/test_gpu_check.py).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import gpu_check_lib as lib
import torch

from seqtrain.models import varlen
from seqtrain.models.transformer import MultiheadAttention


def determinism_settings() -> tuple[Any, ...]:
    """torch's process-wide settings that --deterministic changes (restore_determinism_settings puts them back)."""
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.utils.deterministic.fill_uninitialized_memory,
        torch.backends.cuda.cudnn_sdp_enabled(),
    )


def restore_determinism_settings(saved: tuple[Any, ...]) -> None:
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2:4]
    torch.utils.deterministic.fill_uninitialized_memory = saved[4]
    torch.backends.cuda.enable_cudnn_sdp(saved[5])


def stage_determinism(check: Any, arch: str | None = None, updates: int | None = None) -> dict[str, Any]:
    """Bitwise repeat and resume of `arch` (default bart_base; bart_tiny in a dry run) over `updates` updates
    (default 8; 4 dry) under --deterministic, and the flag's cost in ms/step (see the module docstring)."""
    saved = determinism_settings()
    try:
        return _determinism(check, arch, updates)
    finally:
        restore_determinism_settings(saved)
        if check.device.type == "cuda":
            torch.cuda.empty_cache()


def _determinism(check: Any, arch: str | None, updates: int | None) -> dict[str, Any]:
    arch = arch or ("bart_tiny" if check.dry else "bart_base")
    k = updates or (4 if check.dry else 8)
    warmup = 1 if check.dry else 2  # timed steps: k - warmup of each run
    if k < 2 or k - warmup < 1:
        raise ValueError(f"stage_determinism: updates must be at least {warmup + 1}, got {k}")
    vocab = 1000 if check.dry else lib.BART_VOCAB
    bsz, src_len, tgt_len = (4, (40, 64), (8, 16)) if check.dry else (16, (900, 1024), (50, 110))
    pairs = [lib.make_pairs(bsz, src_len, tgt_len, vocab, seed=300 + i) for i in range(k)]
    batches = [lib.pinned(lib.seqtrain_sample(p), check.device) for p in pairs]
    extra = ("--dropout", "0.1")

    def trainer(*flags: str):
        return lib.make_trainer(check.dry, arch, vocab, "bf16", *extra, *flags)[0]

    def run(t, steps: range) -> tuple[list[float], list[float]]:
        """(losses, seconds) of the given updates."""
        losses, seconds = [], []
        for i in steps:
            check.sync()
            start = time.perf_counter()
            stats = t.train_step([batches[i]])
            check.sync()
            seconds.append(time.perf_counter() - start)
            if stats is None:
                raise RuntimeError(f"update {i + 1} was skipped")
            losses.append(stats["loss"])
        return losses, seconds

    def params(t) -> list[torch.Tensor]:
        return [p.detach().clone() for p in t.model.parameters()]

    def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
        return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=True))

    out: dict[str, Any] = {"arch": arch, "updates": k, "resumed_at": k // 2, "precision": "bf16"}
    out["tokens_per_step"] = statistics.mean(sum(len(s) + len(t) for s, t in p) for p in pairs)

    # with the flag: the unbroken run, twice
    first = trainer("--deterministic")
    out["cublas_workspace_config"] = os.environ.get(
        "CUBLAS_WORKSPACE_CONFIG"
    )  # (the flag exports it if unset)
    head_dim = next(m for m in first.model.modules() if isinstance(m, MultiheadAttention)).head_dim
    probe = torch.zeros(1, 1, head_dim)  # which attention the packed path runs under the flag
    out["varlen_kernel"] = check.device.type == "cuda" and varlen.kernel_serves(
        probe.to(check.device, torch.bfloat16), 0.0
    )
    losses_a, times_det = run(first, range(k))
    whole = params(first)
    del first
    second = trainer("--deterministic")
    losses_b, _ = run(second, range(k))
    out["max_param_diff_two_runs"] = max_diff(whole, params(second))
    out["losses_equal_two_runs"] = losses_a == losses_b
    del second

    # saved at k/2, resumed in a fresh trainer
    before = trainer("--deterministic")
    losses_c, _ = run(before, range(k // 2))
    path = os.path.join(check.out, "determinism-checkpoint.pt")
    torch.save(before.state_dict({}), path)
    del before
    after = trainer("--deterministic")
    after.load_state_dict(torch.load(path, map_location="cpu", weights_only=False), path)
    os.remove(path)
    losses_d, _ = run(after, range(k // 2, k))
    out["max_param_diff_resume"] = max_diff(whole, params(after))
    out["losses_equal_resume"] = losses_c + losses_d == losses_a
    out["num_updates_resumed"] = after.get_num_updates()
    del after

    # deterministic mode, but new tensors not filled with NaN
    torch.utils.deterministic.fill_uninitialized_memory = False
    nofill = trainer("--deterministic")
    _, times_nofill = run(nofill, range(k))
    del nofill
    torch.utils.deterministic.fill_uninitialized_memory = True

    # without the flag (torch's defaults): the cost
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic = False
    plain = trainer()
    losses_p, times_plain = run(plain, range(k))
    out["max_param_diff_vs_default"] = max_diff(whole, params(plain))  # summation order only
    del plain

    def ms(times: list[float]) -> float:
        return 1000 * statistics.median(times[warmup:])

    out["deterministic_ms_per_step"] = ms(times_det)
    out["deterministic_nofill_ms_per_step"] = ms(times_nofill)
    out["default_ms_per_step"] = ms(times_plain)
    out["deterministic_cost"] = out["deterministic_ms_per_step"] / out["default_ms_per_step"] - 1
    out["nofill_cost"] = out["deterministic_nofill_ms_per_step"] / out["default_ms_per_step"] - 1
    out["loss_rel_diff_vs_default"] = abs(losses_a[-1] - losses_p[-1]) / abs(losses_p[-1])
    out["bitwise_two_runs"] = out["max_param_diff_two_runs"] == 0.0 and out["losses_equal_two_runs"]
    out["bitwise_resume"] = (
        out["max_param_diff_resume"] == 0.0 and out["losses_equal_resume"] and out["num_updates_resumed"] == k
    )
    if not (out["bitwise_two_runs"] and out["bitwise_resume"]):
        raise RuntimeError(f"--deterministic runs differ: {out}")
    return out
