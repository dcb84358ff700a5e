"""Trainer: runs optimizer updates for a task's model and criterion, and holds all state a resume needs.

It owns device placement, mixed precision (--fp16 autocast + dynamic loss scaling, --bf16 autocast, or with
--bf16-mode fairseq a bf16 copy of the model over fp32 master weights: seqtrain.train.precision), gradient
accumulation (a list of batches per update, --update-freq), normalization by sample size, clipping (--clip-norm),
skipping an update on CUDA out-of-memory or fp16 overflow, the learning-rate schedule calls, the training
meters, and the checkpoint state (model, optimizer, scheduler, loss scaler, meters, RNG states, update count).
It parses no flags and opens no files other than the checkpoints it is asked to write.

Exact resume: every update first seeds torch's RNG from (--seed, num_updates), as fairseq does, so dropout
masks depend only on the update number, not on what ran before; a resumed run repeats them bit for bit.

The step contract: for each batch of an update, Trainer.train_step calls
`task.train_step(sample, model, criterion, step, update_num, ignore_grad)`, where `step` is a StepContext (the
autocast context and the loss-scaled backward); the task returns (loss, sample_size, logging_output), with the
logging output's figures left as device tensors (the criterion does not sync).

Host-device syncs (CUDA; each makes the host wait for the device's queued work): none in the forward and
backward passes (the collater gives the model its padding layout and the loss its target rows, computed on the
CPU; batches arrive pinned and are copied with `non_blocking`), and one per update: after the backward passes,
the gradient norm and every logged figure (summed over the update's batches, and over ranks in one all-reduce,
all on the device) come back to the host in one transfer, which the fp16 overflow check, the divergence check,
a zero-sized update and the meters need before the optimizer step. With several ranks the training loop adds
one more per update (seqtrain.train.loop: the stop decisions, agreed in one all-reduce).
tests/unit/train/test_sync_free.py counts them.

Why one module: the update step, its numerics (loss scaling, clipping, the NaN/inf checks) and the
state a checkpoint stores must change together; they are one contract.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from seqtrain import distributed
from seqtrain.checkpoint.adapters import adapter_state, base_record
from seqtrain.checkpoint.files import check_still_mapped, save_checkpoint_file, strip_wrapper_prefix
from seqtrain.checkpoint.native import make_checkpoint_state
from seqtrain.checkpoint.options import CheckpointConfig
from seqtrain.checkpoint.train_state import TrainState
from seqtrain.cuda import (
    Bf16ModeConfig,
    DeviceConfig,
    nondeterministic_error,
    set_cuda_kernels,
    set_deterministic,
)
from seqtrain.data.iterators import spare_data_workers
from seqtrain.data.pair_dataset import split_batch
from seqtrain.errors import SeqtrainError
from seqtrain.logging.meters import MetersDict, perplexity
from seqtrain.logging.progress import LoggingConfig
from seqtrain.models.freeze import FreezeConfig, freeze
from seqtrain.models.resize import (
    check_state_fits,
    fill_adapters,
    fit_positions,
    keep_layers,
    resize_embeddings,
)
from seqtrain.models.transformer import compile_layers
from seqtrain.optim import (
    DynamicLossScaler,
    GradientOverflow,
    OptimizationConfig,
    build_lr_scheduler,
    build_optimizer,
    check_optimizer_overrides,
)
from seqtrain.optim.ema import EMA, EmaConfig
from seqtrain.optim.loss_scaler import LossScalerConfig
from seqtrain.optim.lr_scheduler import SchedulerConfig
from seqtrain.optim.optimizers import LrConfig
from seqtrain.tasks.step import StepContext
from seqtrain.train.flops import Seq2SeqFlops, device_peak_flops
from seqtrain.train.precision import Bf16Compute, bf16_mode

logger = logging.getLogger("seqtrain.trainer")  # the name log lines have always shown

# Above this loss scale the fp16 fold into fused Adam(W) is skipped (the multiply pass runs): its divisor, scale
# x sample size, must be an fp32 number and the scaled gradients' norm within fp32's range (2^140, as a test
# sets, is neither; fairseq's scaler starts at 2^7 and doubles per window).
FOLD_MAX_SCALE = 2.0**64


def is_oom(e: BaseException, device: torch.device) -> bool:
    return device.type == "cuda" and (isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e))


AUTO = "auto"  # --max-tokens auto (seqtrain.train.auto_tokens)
_SPLIT = object()  # Trainer._train_step's answer when it split a batch after an OOM: run the update again


@dataclass
class _Accumulated:
    """What the forward/backward passes of one update add up, for the update."""

    logging_outputs: list[dict[str, Any]] = field(default_factory=list)
    sample_size: Any = 0.0  # a host number from the collater, or a device tensor (summed without a sync)
    flops: float = 0.0  # counted FLOPs of the update's real batches (mfu)


@dataclass
class TrainerConfig:
    """The Trainer's settings: the flag groups it reads, composed (each declared once, beside its own code); for a
    seqtrain-train run, TrainConfig.trainer's (seqtrain.train.program: the flags read once)."""

    device: DeviceConfig = field(default_factory=DeviceConfig)
    precision: Bf16ModeConfig = field(default_factory=Bf16ModeConfig)
    launch: distributed.LaunchConfig = field(default_factory=distributed.LaunchConfig)  # --device-id
    parallel: distributed.DataParallelConfig = field(default_factory=distributed.DataParallelConfig)
    update: OptimizationConfig = field(default_factory=OptimizationConfig)  # --clip-norm, --update-freq
    loss_scaler: LossScalerConfig = field(default_factory=LossScalerConfig)
    freeze: FreezeConfig = field(default_factory=FreezeConfig)
    ema: EmaConfig = field(default_factory=EmaConfig)
    checkpoint: CheckpointConfig = field(
        default_factory=CheckpointConfig
    )  # --save-adapters-only, --resize-vocab
    logging: LoggingConfig = field(default_factory=LoggingConfig)  # --peak-flops
    optimizer: str = "adam"  # the chosen --optimizer
    # the chosen optimizer's and schedule's own settings (OPTIMIZERS.config(name), LR_SCHEDULERS.config(name))
    optim: Any = field(default_factory=LrConfig)
    schedule: Any = field(default_factory=SchedulerConfig)
    lora_rank: int | None = None  # --lora-rank (the task applies the adapters; the Trainer freezes the rest)
    # --encoder/decoder-layers-to-keep: a deeper checkpoint's layers kept when its weights load
    encoder_layers_to_keep: str | None = None
    decoder_layers_to_keep: str | None = None
    max_tokens: int | str | None = (
        None  # --max-tokens ("auto": a resume takes the budget the checkpoint holds)
    )


class Trainer:
    def __init__(
        self,
        cfg: TrainerConfig,
        task: Any,
        model: torch.nn.Module,
        criterion: Any,
        run_args: dict[str, Any] | None = None,
        generation: Any = None,
    ):
        """`cfg`: the Trainer's settings (a seqtrain-train run's: TrainConfig.trainer). `run_args`: the `args`
        record its checkpoints store (seqtrain.train.program.run_record; the training loop sets it once set-up
        has settled it): the Trainer only hands it to the checkpoint writer, unread; so with `generation`, the
        generation settings the checkpoints remember (seqtrain.checkpoint.generation_settings.StoredGeneration:
        the --config preset's)."""
        self.run_args = run_args if run_args is not None else {}
        self.generation = generation
        self.cfg = cfg
        self.task = task
        self.criterion = criterion
        dev = cfg.device
        use_cuda = torch.cuda.is_available() and not dev.cpu
        self.device = torch.device("cuda", cfg.launch.device_id) if use_cuda else torch.device("cpu")
        if dev.deterministic:
            if dev.cudnn_attention:
                raise SeqtrainError(
                    "--cudnn-attention and --deterministic exclude each other: cuDNN's attention backward is "
                    "not deterministic (in deterministic mode torch's attention leaves it out); drop one"
                )
            set_deterministic()  # in this rank, before its first CUDA work (seqtrain.cuda)
        if use_cuda:
            torch.cuda.set_device(self.device)
            set_cuda_kernels(tf32=not dev.no_tf32, cudnn_attention=dev.cudnn_attention)
        if dev.fp16 and dev.bf16:
            raise SeqtrainError("--fp16 and --bf16 exclude each other; pick one")
        if dev.fp16 and not use_cuda:
            raise SeqtrainError("--fp16 needs a CUDA device (use --bf16 on CPU, or drop --fp16)")
        fairseq_bf16 = (
            bf16_mode(cfg.precision.bf16_mode, dev, cfg.parallel.ddp_backend) == "fairseq"
        )  # (checked: it needs --bf16)
        # autocast's dtype; --bf16-mode fairseq runs a bf16 model instead (no autocast)
        self.amp_dtype: torch.dtype | None = (
            torch.float16 if dev.fp16 else torch.bfloat16 if dev.bf16 and not fairseq_bf16 else None
        )
        # Parameters stay fp32 (the optimizer's master copy); autocast runs matmuls in the low precision, or a
        # bf16 copy of the model computes (--bf16-mode fairseq, built below once freezing is applied).
        self.model = model.to(self.device)
        if hasattr(criterion, "to"):
            self.criterion = criterion.to(self.device)
        # Frozen weights first: DDP registers, and the optimizer keeps state for, trainable parameters only.
        freeze(
            self.model,
            cfg.freeze.freeze_encoder,
            cfg.freeze.freeze_embeddings,
            cfg.freeze.freeze_params,
            lora=bool(cfg.lora_rank),
        )
        # Several ranks: DDP around the model, or FSDP sharding it in place (before the optimizer sees it).
        self.world_size = distributed.get_world_size()
        self.bf16: Bf16Compute | None = None
        if fairseq_bf16:
            if self.world_size > 1:  # DDP starts every rank's bf16 copy from rank 0's; the masters must agree
                distributed.broadcast_tensors(list(self.model.state_dict().values()))
            self.bf16 = Bf16Compute(self.model)
        self.compute_model = self.bf16.compute if self.bf16 is not None else self.model
        self._forward_model = distributed.wrap_model(
            cfg.parallel, self.compute_model, self.device, self.amp_dtype
        )
        self.is_fsdp = distributed.is_fsdp(self.model)
        if dev.compile:
            # per layer, as torchtitan compiles per block: the packed path's layers, one graph per layer
            # class, reused across batch shapes; the criterion, the optimizer and generation stay eager
            compile_layers(self.compute_model)
        self.optimizer = build_optimizer(cfg.optim, self.model.parameters())
        self.lr_scheduler = build_lr_scheduler(cfg.schedule, self.optimizer)
        self.scaler = (
            DynamicLossScaler.from_config(cfg.loss_scaler, update_freq=cfg.update.update_freq[0])
            if self.amp_dtype == torch.float16
            else None
        )
        for flag in ("validate_with_ema", "ema_seed_model"):
            if getattr(cfg.ema, flag) and not cfg.ema.store_ema:
                raise SeqtrainError(
                    f"--{flag.replace('_', '-')} needs --store-ema (there is no EMA without it)"
                )
        self.ema = self._new_ema() if cfg.ema.store_ema else None
        self.save_adapters_only = cfg.checkpoint.save_adapters_only
        if self.save_adapters_only and not cfg.lora_rank:
            raise SeqtrainError(
                "--save-adapters-only needs --lora-rank R (a run without adapters saves it all)"
            )
        if self.save_adapters_only and cfg.ema.store_ema:
            raise SeqtrainError(
                "--save-adapters-only and --store-ema exclude each other (the EMA holds every weight)"
            )
        # the base model an adapters-only checkpoint names: set by whatever loaded the starting weights
        self.lora_base: dict[str, str] | None = None
        self.auto_max_tokens: int | None = None  # the budget --max-tokens auto chose (kept in checkpoints)
        self.num_updates = 0
        self.lr_step_update()
        # meters: the epoch ("train"), the current log interval ("train_inner"), the last validation ("valid")
        self.meters: dict[str, MetersDict] = {
            "train": MetersDict(),
            "train_inner": MetersDict(),
            "valid": MetersDict(),
        }
        self.previous_training_time = 0.0
        self._start_time = time.time()
        self.num_params = sum(p.numel() for p in self.model.parameters())
        self.num_trained_params = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        # mfu: counted FLOPs of each update (seqtrain/train/flops.py) against --peak-flops or the GPU's table figure
        low = torch.bfloat16 if fairseq_bf16 else self.amp_dtype
        self.peak_flops = device_peak_flops(self.device, low, cfg.logging.peak_flops)
        self._flop_count = Seq2SeqFlops.from_model(self.model) if self.peak_flops else None
        self._dummy_batch: dict[str, Any] | None = None
        self._valid_start: float | None = None
        spare_data_workers(self.state_tensors)  # forked DataLoader workers free their copies

    def _new_ema(self) -> EMA:
        c = self.cfg.ema
        return EMA(self.model, c.ema_decay, c.ema_start_update, c.ema_update_freq, c.ema_fp32)

    def state_tensors(self) -> list[torch.Tensor]:
        """The tensors of the training state: weights, buffers, gradients and optimizer state."""
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        tensors += [p.grad for p in self.model.parameters() if p.grad is not None]
        for state in self.optimizer.optimizer.state.values():
            tensors += [v for v in state.values() if torch.is_tensor(v)]
        if self.bf16 is not None:
            tensors += self.bf16.tensors()
        return tensors

    def zero_grad(self) -> None:
        """Drop every gradient: the optimizer's (fp32) and, with --bf16-mode fairseq, the bf16 copy's."""
        self.optimizer.zero_grad()
        if self.bf16 is not None:
            self.bf16.zero_grad()

    # ------------------------------------------------------------------------------------------------ basics
    def autocast(self) -> contextlib.AbstractContextManager:
        return self.step_context().autocast()

    def step_context(self) -> StepContext:
        """What task.train_step gets for each batch (built from the current precision and loss scaler)."""
        return StepContext(self.amp_dtype, self.device, self.scaler)

    def get_num_updates(self) -> int:
        return self.num_updates

    def set_num_updates(self, num_updates: int) -> None:
        self.num_updates = num_updates
        self.lr_step_update()

    def get_lr(self) -> float:
        return self.optimizer.get_lr()

    def lr_step_update(self) -> float:
        return self.lr_scheduler.step_update(self.num_updates)

    def lr_step_begin_epoch(self, epoch: int) -> float:
        self.lr_scheduler.step_begin_epoch(epoch)
        return self.lr_step_update()  # fairseq: the update count has the last word on the lr

    def lr_step(self, epoch: int, val_loss: float | None = None) -> float:
        self.lr_scheduler.step(epoch, val_loss)
        return self.lr_step_update()

    def begin_epoch(self, epoch: int) -> None:
        logger.info(f"begin training epoch {epoch}")
        self.lr_step_begin_epoch(epoch)

    def cumulative_training_time(self) -> float:
        return self.previous_training_time + (time.time() - self._start_time)

    def _set_seed(self) -> None:
        # Seed from the update count so a resumed run draws the same dropout masks as an uninterrupted one.
        torch.manual_seed(self.cfg.device.seed + self.num_updates)

    def set_dummy_batch(self, batch: dict[str, Any]) -> None:
        """The batch a rank runs, with zero weight, when its shard has no batch left (epoch_itr.first_batch):
        every rank must take part in each update's collectives."""
        if batch:
            self._dummy_batch = self.prepare_sample(batch)

    def prepare_sample(self, sample: Any) -> Any:
        """`sample` with every tensor moved to the training device, but those under keys ending in `_host`
        (the layout's host copies of its segment bounds, pair_dataset.batch_layout), which stay on the host."""

        def move(x: Any) -> Any:
            if torch.is_tensor(x):
                return x.to(self.device, non_blocking=True)
            if isinstance(x, dict):
                return {k: v if k.endswith("_host") else move(v) for k, v in x.items()}
            if isinstance(x, list):
                return [move(v) for v in x]
            return x

        return move(sample)

    # ------------------------------------------------------------------------------------------------ training
    def train_step(self, samples: list[dict[str, Any]]) -> dict[str, float] | None:
        """One optimizer update over `samples` (update_freq batches). Returns the update's stats, or None when
        the update was skipped (fp16 overflow; out of memory on one example, or with several ranks).

        A batch that runs out of memory is split in two and the update run again from its first batch (same
        seed, so the batches before it draw the same dropout): the same examples and sample size, so the same
        update up to summation order and the split batch's dropout masks. Halves are split again down to one
        example; each split is logged and counted (meter `oom_split`)."""
        samples = list(samples)
        while True:
            result = self._train_step(samples)
            if result is not _SPLIT:
                return result

    def _train_step(self, samples: list[dict[str, Any]]) -> Any:
        """One try at the update: forward and backward over each batch (their gradients add up), then the
        optimizer update. Returns its stats, None when it was skipped, or _SPLIT when a batch was split after
        running out of memory (`samples` then holds its halves: try again)."""
        self._begin_update()
        start = time.perf_counter()
        step = self.step_context()
        acc = _Accumulated()
        for i in range(len(samples)):
            oom = self._forward_backward(samples, i, step, acc)
            if (
                oom is not None
            ):  # (recovered here, once the error's frames, which hold the step's tensors, are gone)
                return self._recover_from_oom(samples, i, oom)
        if not acc.logging_outputs:
            return None
        return self._update(acc, start)

    def _begin_update(self) -> None:
        self._set_seed()
        if not self.compute_model.training:  # (train() walks every module: host time on each step)
            self.compute_model.train()
        self.zero_grad()
        if self.scaler is not None and hasattr(self.criterion, "loss_scale"):
            # the criterion makes gradients in its forward pass (projected loss): it scales them before fp16
            self.criterion.loss_scale = self.scaler.loss_scale

    # ------------------------------------------------------------------- forward and backward of one batch
    def _forward_backward(
        self, samples: list[dict[str, Any]], i: int, step: StepContext, acc: _Accumulated
    ) -> str | None:
        """Forward and backward of batch `i` of the update; its logging output and sample size go into `acc`.
        Returns the error's first line when it ran out of memory (on one rank; with several, an error)."""
        sample, is_dummy = self._micro_batch(samples[i], acc)
        if sample is None:
            return None
        try:
            # gradients are reduced across ranks only in the update's last backward pass
            with (
                torch.autograd.profiler.record_function(f"train_step-{i}"),
                distributed.no_sync(self._forward_model, i < len(samples) - 1),
            ):
                _, size, log = self.task.train_step(
                    sample, self._forward_model, self.criterion, step, self.num_updates, ignore_grad=is_dummy
                )
        except RuntimeError as e:
            if not is_oom(e, self.device):
                if (refused := nondeterministic_error(e)) is not None:
                    raise refused from None
                raise
            if self.world_size > 1:  # one rank cannot skip an update the others are reducing
                raise SeqtrainError(
                    f"CUDA out of memory on rank {distributed.get_rank()} in update "
                    f"{self.num_updates + 1}; lower --max-tokens or use --ddp-backend "
                    "fully_sharded"
                ) from None
            return str(e).splitlines()[0] if str(e) else type(e).__name__
        if not is_dummy:
            acc.logging_outputs.append(log)
            acc.sample_size = (
                acc.sample_size + size
            )  # a host number from the collater; a device tensor stays one
        elif self.world_size > 1:  # zeros, so every rank reduces the same keys
            acc.logging_outputs.append({k: 0.0 for k in log})
        return None

    def _micro_batch(self, sample: dict[str, Any], acc: _Accumulated) -> tuple[dict[str, Any] | None, bool]:
        """(the batch on the device, whether it is the dummy batch). An empty batch (a short shard) still runs,
        as the dummy batch with zero weight; None when there is none yet (one rank: nothing waits for it)."""
        if not sample:
            if self._dummy_batch is None and self.world_size > 1:
                # skipping would leave the other ranks waiting in a collective
                raise SeqtrainError(
                    "internal: a rank got an empty batch before any dummy batch was set (Trainer.set_dummy_batch)"
                )
            return self._dummy_batch, True
        if self._flop_count is not None:  # counted from the lengths while they are on the CPU
            acc.flops += self._flop_count.sample_train_flops(sample, self.task.tgt_dict.pad())
        sample = self.prepare_sample(sample)
        if self._dummy_batch is None:
            self._dummy_batch = sample
        return sample, False

    def _recover_from_oom(self, samples: list[dict[str, Any]], i: int, message: str) -> Any:
        """Split batch `i` in two and answer _SPLIT (the update runs again), or with a single example (or the
        dummy batch) skip the update."""
        host_sample = samples[i]
        if host_sample and host_sample.get("nsentences", 0) > 1:
            samples[i : i + 1] = split_batch(host_sample, self.task.tgt_dict.pad())
            self._after_oom(f"splitting batch {i + 1}'s {host_sample['nsentences']} examples in two", message)
            return _SPLIT
        self._after_oom("skipping this update", message)
        return None

    # ------------------------------------------------------------------------------------------- the update
    def _update(self, acc: _Accumulated, start: float) -> dict[str, float] | None:
        """The optimizer update from the summed gradients: normalised by the update's sample size (and the loss
        scale), clipped, checked (a zero sample size, fp16 overflow, NaN/inf), stepped; the EMA follows."""
        if self.bf16 is not None:  # the bf16 gradients, upcast into the fp32 master weights' .grad
            self.bf16.grads_to_master()
        # Every logged figure and the sample size, summed over batches and ranks on the device (no sync yet).
        keys, sums = distributed.sum_logging_outputs(
            [*acc.logging_outputs, {"_sample_size": acc.sample_size}], self.device
        )
        self._normalize_grads(acc.sample_size, sums[keys.index("_sample_size")])
        grad_norm = self._clip_grads()
        # The update's one host-device sync: the gradient norm and the logged figures in one transfer.
        host = torch.cat([grad_norm.reshape(1).to(sums), sums]).tolist()
        gnorm, totals = host[0], dict(zip(keys, host[1:]))
        if self._skip_update(totals, gnorm):
            self.zero_grad()
            return None
        self._optimizer_step()
        return self._log_train_stats([totals], gnorm, start, acc.flops)

    def _normalize_grads(self, sample_size: Any, device_size: torch.Tensor) -> None:
        """Gradients hold sums over tokens (or sentences); normalize them by the update's sample size and undo
        the loss scale in one pass (a zero sample size is caught before the optimizer step). `sample_size`: this
        rank's (a host number, or a device tensor); `device_size`: the sum over ranks, on the device."""
        sizes_on_host = self.world_size == 1 and not torch.is_tensor(sample_size)
        scale = self.scaler.loss_scale if self.scaler is not None else 1.0
        # (DDP and FSDP average gradients over ranks; world_size turns that back into the sum)
        if (
            self.scaler is not None
            and not self.is_fsdp
            and self.optimizer.folds_grad_scale
            and scale <= FOLD_MAX_SCALE
        ):
            # fp16 with fused Adam(W): no pass over the gradients here; the fused kernel divides them by the
            # loss scale and the sample size (the clip coefficient folded in) as it steps (docs/training.md)
            if sizes_on_host:  # (a fill on the device: no host-to-device copy)
                divisor = torch.full((), sample_size * scale, dtype=torch.float32, device=self.device)
            else:
                divisor = (device_size * scale / self.world_size).to(self.device, torch.float32)
            self.optimizer.divide_grads_in_step(divisor)
        elif sizes_on_host:
            self.optimizer.multiply_grads(1.0 / (sample_size * scale) if sample_size > 0 else 0.0)
        else:
            factor = self.world_size / (device_size * scale)
            self.optimizer.multiply_grads(factor.to(self.device, torch.float32))

    def _clip_grads(self) -> torch.Tensor:
        """--clip-norm (0: no clipping); returns the gradient norm before clipping, on the device."""
        if self.is_fsdp:  # sharded gradients: the norm is taken over all ranks' shards
            return distributed.clip_grad_norm_(list(self.optimizer.params), self.cfg.update.clip_norm)
        return self.optimizer.clip_grad_norm(self.cfg.update.clip_norm)

    def _skip_update(self, totals: dict[str, float], gnorm: float) -> bool:
        """Whether the update is skipped: only dummy batches on every rank, or an fp16 overflow (the loss scale
        goes down). Without loss scaling a NaN/inf is an error (_check_finite)."""
        if totals.pop("_sample_size") == 0:
            return True
        if self.scaler is None:
            self._check_finite(totals, gnorm)
            return False
        try:
            self.scaler.check_overflow(gnorm)
        except GradientOverflow as e:
            logger.info(str(e))
            return True
        return False

    def _optimizer_step(self) -> None:
        with torch.autograd.profiler.record_function("optimizer"):
            self.optimizer.step()
        if self.bf16 is not None:
            self.bf16.refresh()
        if self.scaler is not None:
            self.scaler.update()
        self.set_num_updates(self.num_updates + 1)
        if self.ema is not None:
            self.ema.step(self.model, self.num_updates)

    def _check_finite(self, totals: dict[str, float], gnorm: float) -> None:
        """Without loss scaling a NaN/inf loss or gradient cannot be skipped away: stop before the optimizer
        step spreads it into the weights, so the last checkpoint is a good place to resume from. The error
        names the last good update: the weights are checked (only on this path, agreed by all ranks) to tell a
        bad batch or loss (the current weights are good) from weights that the previous update's optimizer
        step made inf/NaN (e.g. an infinite or huge learning rate: then the update before it is the last
        good one, as its weights gave the previous update a finite loss)."""
        loss = totals.get("loss", 0.0)
        if math.isfinite(gnorm) and math.isfinite(loss):
            return
        what = f"loss is {loss}" if not math.isfinite(loss) else f"gradient norm is {gnorm}"
        nonfinite = distributed.first_nonfinite_parameter(self.model) is not None
        bad = distributed.agree({"bad": nonfinite}, self.device)["bad"]
        n = self.num_updates
        if not bad:
            where = f"the last good update is {n}"
        elif n > 0:
            where = (
                f"the weights became inf/NaN in update {n}'s optimizer step; the last good update is {n - 1}"
            )
        else:
            where = "the starting weights are inf/NaN: no update was good"
        raise SeqtrainError(
            f"{what} at update {n + 1}: training diverged ({where}); resume from the last checkpoint with a "
            "lower --lr, a longer --warmup-updates, --clip-norm (e.g. 1.0) or --bf16, and check the data for "
            "broken examples"
        )

    def _after_oom(self, action: str, message: str) -> None:
        logger.warning(f"out of memory in update {self.num_updates + 1}; {action} ({message})")
        self.zero_grad()
        self._dummy_batch = None
        meter = "oom" if action.startswith("skipping") else "oom_split"
        for meters in (self.meters["train"], self.meters["train_inner"]):
            meters.log_sum(meter, 1)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _log_train_stats(
        self, logging_outputs: list[dict[str, Any]], gnorm: float, start: float, flops: float = 0.0
    ) -> dict[str, float]:
        train_time = time.perf_counter() - start
        stats = self.task.reduce_metrics(logging_outputs, self.criterion)
        for meters in (self.meters["train"], self.meters["train_inner"]):
            log_criterion_stats(meters, stats, start)
            meters.log_speed("ups", 1.0, round=2, start=start)
            meters.log_scalar("wpb", stats["ntokens"], round=1)
            meters.log_scalar("bsz", stats["nsentences"], round=1)
            meters.log_last("num_updates", self.num_updates)
            meters.log_last("lr", self.get_lr())
            meters.log_scalar("gnorm", gnorm, round=3)
            if self.cfg.update.clip_norm > 0:
                meters.log_scalar("clip", 100.0 if gnorm > self.cfg.update.clip_norm else 0.0, round=1)
            if self.scaler is not None:
                meters.log_last("loss_scale", self.scaler.loss_scale, round=4)
            meters.log_sum("train_wall", train_time, round=0)
            if flops:  # FLOP/s of this rank; the training loop logs it as mfu
                meters.log_speed("flops", flops, start=start)
        return {**stats, "gnorm": gnorm, "lr": self.get_lr(), "num_updates": self.num_updates}

    # ------------------------------------------------------------------------------------------------ validation
    def validation_weights(self) -> contextlib.AbstractContextManager:
        """The weights validation runs with: the EMA's with --validate-with-ema (the model's own are back after
        the block), else the model's."""
        if self.ema is not None and self.cfg.ema.validate_with_ema:
            if self.bf16 is not None:
                return self._ema_in_bf16_copy()
            return self.ema.applied_to(self.model)
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def _ema_in_bf16_copy(self) -> Any:
        """The EMA's weights in the master and rounded into the bf16 copy; the master's own after the block."""
        try:
            with self.ema.applied_to(self.model):
                self.bf16.refresh(trained_only=False)
                yield
        finally:
            self.bf16.refresh(trained_only=False)

    def begin_valid(self) -> None:
        self.meters["valid"].reset()
        self._valid_start = time.perf_counter()

    def valid_step(self, sample: dict[str, Any]) -> dict[str, Any]:
        """Loss on one batch without gradients; logged into meters["valid"]. With several ranks the figures are
        summed over ranks first, and an empty batch runs the dummy batch (FSDP's forward is a collective)."""
        is_dummy = not sample
        if is_dummy and self.world_size <= 1:
            return {}
        if is_dummy and self._dummy_batch is None:
            raise SeqtrainError(
                "internal: a rank got an empty validation batch and has no dummy batch "
                "(Trainer.set_dummy_batch)"
            )
        sample = self._dummy_batch if is_dummy else self.prepare_sample(sample)
        try:
            with torch.no_grad(), self.autocast():
                _, _, log = self.task.valid_step(sample, self._forward_model, self.criterion)
        except RuntimeError as e:
            if (refused := nondeterministic_error(e)) is not None:
                raise refused from None
            raise
        if self.world_size > 1:
            keys, sums = distributed.sum_logging_outputs(
                [{k: 0.0 for k in log} if is_dummy else log], self.device
            )
            log = dict(zip(keys, sums.tolist()))
            if not log.get("sample_size"):
                return {}
        stats = self.task.reduce_metrics([log], self.criterion)
        meters = self.meters["valid"]
        log_criterion_stats(meters, stats, self._valid_start)
        meters.log_scalar("wpb", stats["ntokens"], round=1)
        meters.log_scalar("bsz", stats["nsentences"], round=1)
        return stats

    # ------------------------------------------------------------------------------------------------ checkpoints
    def state_dict(self, position: TrainState | None = None, with_optimizer: bool = True) -> dict[str, Any]:
        """The checkpoint dict: the weights and, over `position` (the CheckpointManager's data position and
        validation record), the Trainer's training state."""
        model_state = distributed.model_state_dict(self.model)
        if self.save_adapters_only:  # the frozen base stays in its own file (seqtrain.checkpoint.adapters)
            if self.lora_base is None:
                raise SeqtrainError(
                    "--save-adapters-only: the run started from no base model file; give it with "
                    "--finetune-from-model (or --restore-file)"
                )
            model_state = adapter_state(model_state)
        return make_checkpoint_state(
            self.run_args,
            model_state,
            self.task.src_dict,
            self.task.tgt_dict,
            getattr(self.task, "tokenizer_spec", None),
            training=self.train_state(position or TrainState(), with_optimizer),
            generation=self.generation,
        )

    def train_state(self, position: TrainState, with_optimizer: bool) -> TrainState:
        """`position` with the Trainer's own state added: what a resume needs besides the weights."""
        seconds = self.cumulative_training_time()
        state = position.replace(
            num_updates=self.num_updates,
            meters={
                "train": self.meters["train"].state_dict(),
                "train_inner": self.meters["train_inner"].state_dict(),
            },
            rng=rng_state(),
            train_wall=seconds,
            previous_training_time=seconds,
            auto_max_tokens=self.auto_max_tokens,
            lora_base=dict(self.lora_base) if self.save_adapters_only else None,
        )
        if self.ema is not None:
            state.ema, state.ema_counter, state.ema_fp32_params = self.ema.state()
        if with_optimizer:
            state.optimizer = distributed.optimizer_state_dict(self.model, self.optimizer.optimizer)
            state.lr_scheduler = self.lr_scheduler.state_dict()
            state.loss_scaler = self.scaler.state_dict() if self.scaler is not None else None
        return state

    def save_checkpoint(self, path: str, position: TrainState, with_optimizer: bool = True) -> None:
        """Rank 0 writes; under FSDP every rank must call this (gathering the full state is a collective)."""
        master = distributed.get_rank() == 0
        if not (master or self.is_fsdp):
            return
        state = self.state_dict(position, with_optimizer)
        if master:
            save_checkpoint_file(state, path)

    def _load_model_state(self, model_state: dict[str, torch.Tensor], where: str) -> None:
        state = resize_embeddings(
            keep_layers(model_state, self.cfg, where),
            len(self.task.src_dict),
            len(self.task.tgt_dict),
            padding_idx=self.task.src_dict.pad(),
            where=where,
            allow_any=self.cfg.checkpoint.resize_vocab,
        )
        state = fill_adapters(fit_positions(state, self.model, where), self.model, where)
        check_state_fits(self.model, state, where)
        distributed.load_model_state_dict(self.model, state)
        if self.bf16 is not None:
            self.bf16.refresh(trained_only=False)

    def load_model_weights(self, contents: Any, where: str) -> None:
        """Only the weights of a checkpoint of any supported format (--finetune-from-model, foreign files)."""
        if getattr(contents, "mapped", None) is not None:  # the copy into the model reads the mapping
            check_still_mapped(*contents.mapped)
        self._load_model_state(contents.model, where)
        self._note_base(
            TrainState.from_dict(getattr(contents, "state", None)).lora_base, where, contents.model
        )
        if self.ema is not None:  # the EMA follows the weights training starts from
            self.ema = self._new_ema()

    def _note_base(self, record: dict[str, str] | None, where: str, model_state: dict[str, Any]) -> None:
        """With --save-adapters-only, remember the base model the checkpoints will name: the one an
        adapters-only file was laid over, else the file the weights came from."""
        if self.save_adapters_only:
            self.lora_base = record or base_record(where, strip_wrapper_prefix(dict(model_state)))

    def load_state_dict(
        self,
        state: dict[str, Any],
        where: str,
        reset_optimizer: bool = False,
        reset_lr_scheduler: bool = False,
        reset_meters: bool = False,
        optimizer_overrides: dict[str, Any] | None = None,
    ) -> TrainState:
        """Restore a seqtrain checkpoint dict; returns its training state (for the data position and the
        CheckpointManager's record)."""
        saved = TrainState.from_dict(state)
        self._load_model_state(state["model"], where)
        self._note_base(saved.lora_base, where, state["model"])
        if not reset_optimizer and saved.optimizer is None:
            logger.info(
                f"{where} has no optimizer state (--no-save-optimizer-state): starting a fresh optimizer"
            )
            reset_optimizer = True
        if reset_optimizer:
            self.num_updates = 0
        else:
            self._load_optimizer(
                saved, (state.get("args") or {}).get("optimizer"), where, optimizer_overrides
            )
            if not reset_lr_scheduler and saved.lr_scheduler is not None:
                self.lr_scheduler.load_state_dict(saved.lr_scheduler)
            if self.scaler is not None and saved.loss_scaler is not None:
                self.scaler.load_state_dict(saved.loss_scaler)
            self.num_updates = int(saved.num_updates or 0)
        self.lr_step_update()
        if not reset_meters and saved.meters is not None:
            self.meters["train"].load_state_dict(saved.meters["train"])
            self.meters["train_inner"].load_state_dict(saved.meters["train_inner"])
            self.previous_training_time = float(saved.previous_training_time or 0.0)
            self._start_time = time.time()
        if saved.rng is not None:
            set_rng_state(saved.rng)
        if self.cfg.max_tokens == AUTO and isinstance(saved.auto_max_tokens, int):
            logger.info(f"--max-tokens auto: {saved.auto_max_tokens}, as the first launch chose ({where})")
            self.use_auto_max_tokens(saved.auto_max_tokens)
        if self.ema is not None:
            self._load_ema(saved, where)
        return saved

    def _load_optimizer(
        self, saved: TrainState, saved_name: str | None, where: str, overrides: dict[str, Any] | None
    ) -> None:
        """The optimizer's state from checkpoint `where` (trained with --optimizer `saved_name`), with
        --optimizer-overrides applied."""
        if saved_name is not None and saved_name != self.cfg.optimizer:
            raise SeqtrainError(
                f"{where} was trained with --optimizer {saved_name}, this run uses {self.cfg.optimizer}; "
                "pass --reset-optimizer to start the new optimizer fresh"
            )
        try:
            if self.is_fsdp:  # each rank keeps its shard of the full saved state
                distributed.load_optimizer_state_dict(self.model, self.optimizer.optimizer, saved.optimizer)
                checked = check_optimizer_overrides(overrides or {}, self.optimizer.param_groups[0])
                for group in self.optimizer.param_groups:
                    group.update(checked)
            else:
                self.optimizer.load_state_dict(saved.optimizer, overrides)
        except (ValueError, KeyError) as e:
            raise SeqtrainError(
                f"{where}: optimizer state does not fit this model/optimizer ({e}); pass --reset-optimizer"
            ) from None

    def _load_ema(self, saved: TrainState, where: str) -> None:
        if saved.says("ema"):
            self.ema.load(saved.ema, saved.ema_counter, saved.ema_fp32_params, where)
        else:  # fairseq: a checkpoint without an EMA starts it from the weights just loaded
            logger.info(f"{where} has no EMA: --store-ema starts it from the loaded weights")
            self.ema = self._new_ema()

    def use_auto_max_tokens(self, max_tokens: int) -> None:
        """Run with `max_tokens` for --max-tokens auto, and keep it in the checkpoints, so a resumed run batches
        as the first launch did (the training loop batches with trainer.auto_max_tokens)."""
        self.auto_max_tokens = max_tokens

    def seed_ema(self, contents: Any, where: str) -> None:
        """--ema-seed-model: the EMA starts from that checkpoint's EMA (or, without one, its weights)."""
        saved = TrainState.from_dict(contents.state)
        if saved.says("ema"):
            self.ema.load(saved.ema, saved.ema_counter, saved.ema_fp32_params, where)
        else:
            self.ema.load(contents.model, 0, None, where)


def log_criterion_stats(meters: MetersDict, stats: dict[str, float], start: float | None = None) -> None:
    """loss (per sample_size), nll_loss (per token), ppl and wps into `meters`, weighted as fairseq does."""
    meters.log_scalar("loss", stats["loss"], weight=stats["sample_size"], round=3)
    if "nll_loss" in stats:
        meters.log_scalar("nll_loss", stats["nll_loss"], weight=stats["ntokens"], round=3)
        meters.log_derived("ppl", lambda m: perplexity(m.avg("nll_loss")))
    if "distill_loss" in stats:  # --criterion label_smoothed_cross_entropy_with_distillation's KD term
        meters.log_scalar("distill_loss", stats["distill_loss"], weight=stats["sample_size"], round=3)
    if "accuracy" in stats:
        meters.log_scalar("accuracy", stats["accuracy"], weight=stats.get("total", 1), round=3)
    meters.log_speed("wps", stats["ntokens"], round=1, start=start)


# ---------------------------------------------------------------------------------------------------- RNG states
def rng_state() -> dict[str, Any]:
    """Every global RNG state, as plain data (tensors, ints, floats, lists) so weights_only loading accepts it."""
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    if state.get("python") is not None:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if state.get("numpy") is not None:
        s = state["numpy"]
        np.random.set_state(
            (s["kind"], s["keys"].numpy().astype(np.uint32), s["pos"], s["has_gauss"], s["cached_gaussian"])
        )
    if state.get("torch") is not None:
        torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
