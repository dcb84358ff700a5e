"""Training: fairseq_cli/train.py's flow with seqtrain's components (`seqtrain-train` parses, reads the flags once
into a TrainConfig, seqtrain.train.program, then calls `train`).

train(cfg) runs main on one process or on each rank (seqtrain.distributed.call_main). main: task -> model,
criterion -> Trainer -> resume (or --finetune-from-model) -> for each epoch: train -> validate and save (per
--save-interval[-updates]) -> lr step; stops on --max-update, --max-epoch, --patience, --stop-time-hours or
--stop-min-lr.

Every stop decision is agreed by all ranks (seqtrain.distributed.agree: one all-reduce of a small flags tensor
where the decision is made): a signal, the time budget or --max-update after each update, --patience after each
validation, --stop-min-lr at each epoch start. A rank whose clock runs ahead, or that alone got a SIGTERM,
cannot leave the others waiting in a collective: all of them stop after the same update and save once.

Why one module: the loop is fairseq_cli/train.py's one flow, read top to bottom (set up, resume, epochs, validate,
save, stop); its parts only make sense in that order, and the pieces that stand alone already live beside it
(checkpoint policy, stop signals, ROUGE validation, the save-dir lock).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import math
import os
import signal
import sys
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from seqtrain import distributed, host_cpu
from seqtrain.checkpoint.formats import read_checkpoint
from seqtrain.cuda import set_deterministic
from seqtrain.data.batching import resolve_max_positions
from seqtrain.data.iterators import GroupedIterator
from seqtrain.data.options import check_dataset_args
from seqtrain.data.pair_dataset import UpdateMerge
from seqtrain.distributed import call_main, is_master
from seqtrain.errors import SeqtrainError
from seqtrain.fileio import check_outputs_apart, folder_files
from seqtrain.flags.fairseq_compat import import_user_dir
from seqtrain.flags.training import resolved_train_config
from seqtrain.generation.options import preset_generation
from seqtrain.logging import progress as progress_lib
from seqtrain.logging import setup_logging
from seqtrain.logging.eta import Eta
from seqtrain.logging.trackers import Tracker, make_trackers
from seqtrain.models import as_built
from seqtrain.tasks import setup_task
from seqtrain.train.auto_tokens import resolve_max_tokens
from seqtrain.train.checkpoints import CheckpointManager
from seqtrain.train.program import TrainConfig, run_record
from seqtrain.train.rouge_validation import RougeValidator, generation_args
from seqtrain.train.savedir_lock import save_dir_lock
from seqtrain.train.stop_signals import GracefulStop
from seqtrain.train.trainer import AUTO, Trainer, rng_state, set_rng_state

logger = logging.getLogger("seqtrain.train")


def setup_train_logging(cfg: TrainConfig) -> logging.Handler | None:
    """The log on stdout (as fairseq-train); --log-file adds a file handler (returned, so main can remove it).
    fairseq: only rank 0 reports; the others log warnings and errors (with their rank in the message)."""
    if not is_master(cfg.launch):
        setup_logging(sys.stdout, logging.WARNING)
        return None
    log_file = cfg.loop.logging.log_file
    check_outputs_apart([("--log-file", log_file), ("--jsonl-log", cfg.tracking.jsonl_log)], _read_files(cfg))
    return setup_logging(sys.stdout, logging.INFO, log_file or None)


def _read_files(cfg: TrainConfig) -> list[tuple[str, str | None]]:
    """The files a training run reads, as (flag, path) for seqtrain.fileio.check_outputs_apart: the data-bins'
    files, the checkpoints it may start from (also --save-dir's), the teacher and the EMA's seed."""
    inputs = [("DATA", f) for d in (cfg.data_path or "").split(":") if d for f in folder_files(d)]
    inputs += [("--save-dir", f) for f in folder_files(cfg.checkpoint.save_dir) if f.endswith(".pt")]
    inputs += [
        ("--restore-file", cfg.checkpoint.restore_file),
        ("--finetune-from-model", cfg.checkpoint.finetune_from_model),
        ("--teacher-path", getattr(cfg.criterion, "teacher_path", None)),  # the distillation criterion's
        ("--ema-seed-model", cfg.ema.ema_seed_model),
    ]
    return inputs


def check_settings(cfg: TrainConfig) -> None:
    """What no single flag's range says: the batching settings (the validation ones filled from the training
    ones, into cfg.data, as fairseq does) and the combinations a run refuses. On each rank: the launcher decides
    the world size."""
    check_dataset_args(cfg.data)
    world, fsdp = cfg.launch.distributed_world_size, cfg.parallel.ddp_backend == "fully_sharded"
    if cfg.loop.update.merge_max_tokens and world > 1 and fsdp:
        # ranks would run different numbers of passes per update; FSDP's forward passes are collectives
        raise SeqtrainError(
            "--merge-max-tokens is not supported with --ddp-backend fully_sharded; use c10d, or drop it"
        )
    if cfg.data.max_tokens == AUTO and world > 1:
        raise SeqtrainError(
            "--max-tokens auto probes one device; with several ranks run it on one first and give the number "
            "it logs (--max-tokens N)"
        )
    metric = cfg.checkpoint.best_checkpoint_metric
    if metric.startswith("rouge") and not cfg.rouge.eval_rouge and not cfg.loop.validation.disable_validation:
        raise SeqtrainError(
            f"--best-checkpoint-metric {metric} needs --eval-rouge (validation only reports "
            "ROUGE when it generates)"
        )
    if cfg.rouge.eval_rouge:
        if world > 1 and fsdp:
            # beam search runs a different number of forward passes per rank; FSDP's are collectives
            raise SeqtrainError(
                "--eval-rouge is not supported with --ddp-backend fully_sharded; use c10d, or "
                "score checkpoints with seqtrain-generate"
            )

        # a bad --eval-rouge-args fails now, not after the first epoch
        generation_args(cfg.rouge.eval_rouge_args)


def model_summary(model: torch.nn.Module, task: Any) -> str:
    """The model in one line of sizes (fairseq logs the whole module tree: 39 lines for bart_small)."""
    cfg = getattr(model, "cfg", None)

    def get(name: str) -> Any:
        return getattr(cfg, name, None)

    parts = [type(model).__name__]
    enc, dec = get("encoder_layers"), get("decoder_layers")
    if enc is not None and dec is not None:
        parts.append(f"{enc}+{dec} layers")
    dim, ffn, heads = get("encoder_embed_dim"), get("encoder_ffn_embed_dim"), get("encoder_attention_heads")
    if dim is not None:
        parts.append(f"{dim} dims" + (f" (FFN {ffn}, {heads} heads)" if ffn and heads else ""))
    tgt = getattr(task, "target_dictionary", None)
    src = getattr(task, "src_dict", None) or tgt
    if src is not None and tgt is not None:
        sizes = f"{len(src):,}" if src is tgt or len(src) == len(tgt) else f"{len(src):,} / {len(tgt):,}"
        parts.append(f"dictionary {sizes} symbols")
    return ", ".join(parts)


def has_split(folder: str, split: str) -> bool:
    """Whether the data-bin `folder` holds `split` (preprocess's --testpref / --validpref)."""
    try:
        return any(name.startswith(f"{split}.") and name.endswith(".idx") for name in os.listdir(folder))
    except OSError:
        return False


def build_trainer(cfg: TrainConfig, task: Any, model: torch.nn.Module, criterion: Any) -> Trainer:
    """The Trainer of a run's settings (TrainConfig.trainer's groups; the checkpoints' `args` record is given to
    it once set-up has settled it: _train), with the generation settings of the --config preset, which the
    checkpoints store under a key of their own (seqtrain.checkpoint.generation_settings)."""
    generation = preset_generation(cfg.config)
    if generation is not None:
        logger.info(f"the checkpoints remember the preset's generation settings: {generation.describe()}")
    return Trainer(cfg.trainer, task, model, criterion, generation=generation)


def batch_budget(cfg: TrainConfig, trainer: Trainer, dataset: Any, limits: Any) -> None:
    """--max-tokens auto: probe the budget once, on the first launch (a resume took the stored one), and batch
    with it from then on (into cfg.data, which the record reads); --max-tokens-valid left unset follows it."""
    data = cfg.data
    resolve_max_tokens(trainer, dataset, limits, data.batch_size, data.required_batch_size_multiple)
    if trainer.auto_max_tokens is not None and data.max_tokens == AUTO:
        data.max_tokens = trainer.auto_max_tokens
        if data.max_tokens_valid in (None, AUTO):
            data.max_tokens_valid = trainer.auto_max_tokens


def local_ranks(cfg: TrainConfig) -> int:
    """Training processes on this machine (they share its CPUs)."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    return int(local) if local and local.isdigit() else max(1, cfg.launch.distributed_world_size)


# ---------------------------------------------------------------------------------------------------- main
def train(cfg: TrainConfig) -> int:
    """Train with the settings `cfg` (seqtrain.train.program.train_config of the parsed flags) on one process or
    one per rank; returns the exit code: 0, or 128 + signal number after a graceful stop
    (seqtrain.train.stop_signals). User errors raise SeqtrainError."""
    if cfg.device.deterministic:
        # before any rank starts: spawned ranks inherit CUBLAS_WORKSPACE_CONFIG from this process's
        # environment (the Trainer sets torch's own settings again in each rank)
        set_deterministic()
    return call_main(copy.deepcopy(cfg.launch), functools.partial(_rank_main, cfg)) or 0


def _rank_main(cfg: TrainConfig, launch: distributed.LaunchConfig) -> int:
    """main on one rank: its own copy of the settings, with the launcher's word on its place in the job."""
    cfg = copy.deepcopy(cfg)
    cfg.launch = launch
    cfg.checkpoint.distributed_rank = launch.distributed_rank
    cfg.checkpoint.distributed_world_size = launch.distributed_world_size
    return main(cfg)


def main(cfg: TrainConfig) -> int:
    """Train in this process (one rank); returns train's exit code."""
    # a spawned rank is a fresh interpreter: its registries need the --user-dir plugins again
    if cfg.user_dir:
        import_user_dir(cfg.user_dir)
    file_handler = setup_train_logging(cfg)
    try:
        return _main(cfg)
    finally:
        if file_handler is not None:
            logging.getLogger().removeHandler(file_handler)
            file_handler.close()


def _main(cfg: TrainConfig) -> int:
    check_settings(cfg)
    save_dir = cfg.checkpoint.save_dir
    if cfg.checkpoint.no_save:
        return _train(cfg)
    created = is_master(cfg.launch) and not os.path.exists(save_dir)
    try:
        # one run per --save-dir: the lock is held before anything there is read or deleted
        with save_dir_lock(save_dir, cfg.launch.distributed_rank, cfg.launch.distributed_world_size):
            return _train(cfg)
    finally:
        if created:
            # a run that failed before writing anything (a wrong DATA path, a bad flag the task finds) leaves no
            # empty --save-dir behind; rmdir removes only an empty folder
            with contextlib.suppress(OSError):
                os.rmdir(save_dir)


def _train(cfg: TrainConfig) -> int:
    # the full flags go to SAVE_DIR/config.yaml (and --print-config), not into the log: fairseq's one-line
    # Namespace (3.5 KB) buried the lines a user reads first. The record before the task and the model exist:
    # the flags as given (with the launcher's and the batching's settled values), not what the task infers
    config = resolved_train_config(run_record(cfg))
    data, ckpt, seed = cfg.data, cfg.checkpoint, cfg.device.seed
    where = "not saved (--no-save)" if ckpt.no_save else f"{os.path.join(ckpt.save_dir, 'config.yaml')}"
    logger.info(
        f"training {cfg.arch or '?'} on {cfg.data_path}; all flags: {where} (--print-config prints them)"
    )
    np.random.seed(seed)
    torch.manual_seed(seed)

    task = setup_task(cfg.task)
    for subset in data.valid_subset.split(","):
        if not cfg.loop.validation.disable_validation:
            task.load_dataset(subset)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    logger.info(f"task: {type(task).__name__}")
    logger.info(f"model: {model_summary(model, task)}")  # one line of sizes, not the module tree
    logger.info(f"criterion: {type(criterion).__name__}")

    trainer = build_trainer(cfg, task, model, criterion)
    logger.info(f"num. model params: {trainer.num_params:,} (num. trained: {trainer.num_trained_params:,})")
    threads = host_cpu.fit_threads(trainer.device.type, local_ranks(cfg))
    if threads:
        logger.info(threads)
    bf16_warning = host_cpu.bf16_cpu_warning(trainer.cfg.device.bf16, trainer.device.type)
    if bf16_warning:
        logger.warning(bf16_warning)
    world, rank = cfg.launch.distributed_world_size, cfg.launch.distributed_rank
    logger.info(
        f"training on {world} device{'s' if world > 1 else ''} ({trainer.device.type}"
        f"{', ' + cfg.parallel.ddp_backend if world > 1 else ''})"
    )
    logger.info(f"max tokens per device = {data.max_tokens} and max sentences per device = {data.batch_size}")

    def get_train_iterator(epoch: int) -> Any:
        split = data.train_subset
        if split not in task.datasets or ":" in str(cfg.data_path):
            logger.info(f"loading train data for epoch {epoch}")
            task.load_dataset(split, epoch=epoch)
        # --max-tokens auto: probed once, on the first launch (a resume took the stored budget)
        limits = resolve_max_positions(trainer.model.max_positions(), task.max_positions())
        batch_budget(cfg, trainer, task.dataset(split), limits)
        return task.get_batch_iterator(
            task.dataset(split),
            max_tokens=data.max_tokens,
            max_sentences=data.batch_size,
            max_positions=trainer.model.max_positions(),
            ignore_invalid_inputs=True,
            required_batch_size_multiple=data.required_batch_size_multiple,
            seed=seed,
            num_shards=world,
            shard_id=rank,
            num_workers=data.num_workers,
            epoch=epoch,
            split=split,
        )

    manager = CheckpointManager(ckpt, config)
    resumed, epoch_itr = manager.restore(trainer, get_train_iterator)
    # set-up has settled everything the record holds (the languages, the model, --max-tokens auto's budget)
    trainer.run_args = record = run_record(cfg, as_built(cfg.model))
    if trainer.save_adapters_only and trainer.lora_base is None:
        raise SeqtrainError(
            "--save-adapters-only: adapters need a base model file to be saved against; start from one with "
            "--finetune-from-model PATH"
        )
    ema_seed = trainer.cfg.ema.ema_seed_model
    if ema_seed and resumed is None:  # a first launch: the EMA starts from --ema-seed-model's
        if not os.path.exists(ema_seed):
            raise SeqtrainError(f"--ema-seed-model {ema_seed}: file not found")
        trainer.seed_ema(read_checkpoint(ema_seed, unsafe=ckpt.unsafe_load, require_dict=False), ema_seed)
    tracker = None
    if is_master(cfg.launch):
        run_dir = None if manager.cfg.no_save else manager.cfg.save_dir
        tracker = make_trackers(cfg.tracking, cfg.loop.logging.tensorboard_logdir, run_dir, record)
    loop = TrainLoop(cfg, trainer, task, manager, tracker)
    try:
        with loop.stop:
            loop.run(epoch_itr, get_train_iterator)
    finally:
        if tracker is not None:
            tracker.close()
        # no thread or worker process may still read data while the process group is torn down
        if hasattr(task, "close_iterators"):
            task.close_iterators()
    if loop.stop.requested:
        return loop.stop.exit_code
    logger.info(f"done training in {trainer.cumulative_training_time():.1f} seconds")
    for line in loop.end_summary():
        logger.info(line)
    return 0


class TrainLoop:
    """The epoch loop of one run (fairseq_cli/train.py's main/train/validate_and_save/validate)."""

    def __init__(
        self,
        cfg: TrainConfig,
        trainer: Trainer,
        task: Any,
        manager: CheckpointManager,
        tracker: Tracker | None,
    ):
        self.cfg, self.trainer, self.task, self.manager = cfg, trainer, task, manager
        self.tracker = tracker
        self.profiler: Any | None = None
        self.stop = GracefulStop()
        self.rouge: Any | None = None
        # the settings the loop reads (rank 0 reports; the other ranks' progress bars print nothing)
        self.update, self.validation, self.data = cfg.loop.update, cfg.loop.validation, cfg.data
        self.logging = cfg.loop.logging
        self.log_format = self.logging.log_format if is_master(cfg.launch) else "none"
        self.world, self.rank = cfg.launch.distributed_world_size, cfg.launch.distributed_rank
        if cfg.rouge.eval_rouge:
            self.rouge = RougeValidator(cfg.rouge, task, cfg.device.seed, cfg.data.prepend_bos)
        self.eta = Eta(trainer.get_num_updates())
        self.best_at: tuple[int, int] | None = None  # (update, epoch) of this launch's checkpoint_best.pt
        self.validations = 0  # this launch's, for the end summary
        self.stopped_by = ""  # the rule that ended training, for the end summary (checkpoint_rule)

    def run(self, epoch_itr: Any, get_train_iterator: Any) -> None:
        update, trainer = self.update, self.trainer
        max_epoch = update.max_epoch or math.inf
        if update.max_update > 0 and trainer.get_num_updates() >= update.max_update:
            logger.info(
                f"already at --max-update {update.max_update} ({trainer.get_num_updates()} updates): nothing to do"
            )
            return
        self.dry_run_validation()
        self.eta = Eta(trainer.get_num_updates())  # the pace of this launch's updates from here
        lr = trainer.get_lr()
        with self._profiling():
            while epoch_itr.next_epoch_idx <= max_epoch:
                self.check_has_batches(epoch_itr)
                agreed = distributed.agree(
                    {"stop": self.stop.requested, "min_lr": lr <= update.stop_min_lr}, trainer.device
                )
                # a stop asked for between updates (or in an epoch without one) ends the run here
                if agreed["stop"]:
                    self.stop.signum = self.stop.signum or signal.SIGTERM
                    self.save_and_stop(epoch_itr)
                    break
                if agreed["min_lr"]:
                    logger.info(
                        f"stopping training because current learning rate ({lr}) is smaller than or equal "
                        f"to minimum learning rate (--stop-min-lr={update.stop_min_lr})"
                    )
                    break
                should_stop = self.train_epoch(epoch_itr)
                if should_stop:
                    break
                lr = trainer.get_lr()
                epoch_itr = get_train_iterator(epoch_itr.next_epoch_idx)
            else:
                self.stopped_by = f"--max-epoch {update.max_epoch}"

    def check_has_batches(self, epoch_itr: Any) -> None:
        """An epoch without a batch would repeat forever: refuse it (the count is the same on every rank)."""
        if len(epoch_itr) > 0:
            return
        src, tgt = self.trainer.model.max_positions()
        raise SeqtrainError(
            f"epoch {epoch_itr.next_epoch_idx}: the training split {self.data.train_subset!r} has no batch: "
            f"every example is longer than the limits (--max-tokens {self.data.max_tokens}, "
            f"--max-source-positions {src}, --max-target-positions {tgt}); raise them or pass --truncate-source"
        )

    # ------------------------------------------------------------------------------------------------ one epoch
    def train_epoch(self, epoch_itr: Any) -> bool:
        update, trainer = self.update, self.trainer
        itr = epoch_itr.next_epoch_itr(shuffle=True)
        epoch = epoch_itr.epoch
        update_freq = update.update_freq[min(epoch, len(update.update_freq)) - 1]
        merge = self.update_merge(epoch_itr, update_freq)
        grouped = GroupedIterator(itr, update_freq, merge=merge)
        progress = progress_lib.progress_bar(
            grouped,
            self.log_format,
            epoch=epoch,
            total=len(grouped),
            offset=grouped.n,
            tracker=self.tracker,
            no_progress_bar=self.logging.no_progress_bar,
        )
        self.eta.set_target(
            update.max_update, update.max_epoch, epoch, trainer.get_num_updates() - grouped.n, len(grouped)
        )
        trainer.begin_epoch(epoch)
        if self.world > 1:  # a rank whose shard runs short steps on this, with zero weight
            trainer.set_dummy_batch(epoch_itr.first_batch)
        logger.info("Start iterating over samples")
        should_stop = False
        for samples in progress:
            with torch.autograd.profiler.record_function(f"update-{trainer.get_num_updates() + 1}"):
                log_output = trainer.train_step(samples)
            if self.profiler is not None:
                self.profiler.step()
            if log_output is not None:
                num_updates = trainer.get_num_updates()
                progress.eta = self.eta.text(num_updates)
                if num_updates == self.eta.start_updates + 1:
                    self.first_update_line(num_updates)
                if num_updates % self.logging.log_interval == 0:
                    progress.log(self.training_stats("train_inner"), tag="train_inner", step=num_updates)
                    trainer.meters["train_inner"].reset()
            end_of_epoch = epoch_itr.end_of_epoch()
            stops = self.agreed_stops()
            # every rank must stop after the same update, even if only some of them got the signal
            if stops["signal"] and not self.stop.requested:
                self.stop.signum = signal.SIGTERM
            should_stop = self.validate_and_save(epoch_itr, end_of_epoch, stops)
            if self.stop.requested:
                self.save_and_stop(epoch_itr)
                should_stop = True
            if should_stop:
                break
        if merge is not None:
            logger.info(
                f"--merge-max-tokens: {merge.batches} batches of epoch {epoch} ran as {merge.passes} passes"
            )
        logger.info(f"end of epoch {epoch} (average epoch stats below)")
        # an epoch left unfinished (a signal, --max-update, the time budget) gets its line but no tracker point:
        # the launch that finishes it logs the epoch's point, and TensorBoard's series keeps one per epoch
        finished = epoch_itr.end_of_epoch()
        progress.print(
            self.training_stats("train"), tag="train", step=trainer.get_num_updates() if finished else None
        )
        trainer.meters["train"].reset()
        trainer.meters["train_inner"].reset()
        return should_stop

    def update_merge(self, epoch_itr: Any, update_freq: int) -> UpdateMerge | None:
        """With --merge-max-tokens (and --update-freq > 1), what turns an update's batches into its passes."""
        if not self.update.merge_max_tokens or update_freq < 2:
            return None
        if not hasattr(epoch_itr.dataset, "merge_update"):
            raise SeqtrainError(
                f"--merge-max-tokens: the task's dataset ({type(epoch_itr.dataset).__name__}) cannot merge "
                "batches; drop the flag"
            )
        return UpdateMerge(epoch_itr.dataset, self.update.merge_max_tokens)

    def agreed_stops(self) -> dict[str, bool]:
        """After an update: should training stop for a signal, the time budget or --max-update? Decided by all
        ranks together (a rank's own clock may be ahead of the others')."""
        update, trainer = self.update, self.trainer
        hours = trainer.cumulative_training_time() / 3600
        local = {
            "signal": self.stop.requested,
            "time": update.stop_time_hours > 0 and hours > update.stop_time_hours,
            "max_update": update.max_update > 0 and trainer.get_num_updates() >= update.max_update,
        }
        return distributed.agree(local, trainer.device)

    def save_and_stop(self, epoch_itr: Any) -> None:
        """After SIGTERM / SIGINT: the update in progress is done (and saved if the policy said so); make sure
        checkpoint_last.pt holds exactly this position, then stop."""
        path = self.manager.save_last(self.trainer, epoch_itr) if self.trainer.get_num_updates() else None
        where = f"epoch {epoch_itr.epoch}, batch {epoch_itr.iterations_in_epoch}"
        saved = f"saved {path} ({where}); run the same command to continue" if path else "nothing saved"
        logger.warning(
            f"stopped by {self.stop.signal_name} after update {self.trainer.get_num_updates()}: "
            f"{saved} (exit code {self.stop.exit_code})"
        )

    def training_stats(self, which: str) -> OrderedDict[str, Any]:
        stats = self.trainer.meters[which].smoothed_values()
        flops = stats.pop(
            "flops", None
        )  # counted FLOP/s (seqtrain/train/flops.py), logged when a peak is known
        if flops is not None and self.trainer.peak_flops:
            stats["mfu"] = float(f"{flops / self.trainer.peak_flops:.4g}")
        stats["wall"] = round(self.trainer.cumulative_training_time(), 0)
        return stats

    # ------------------------------------------------------------------------------------------------ checkpoints
    def validate_and_save(self, epoch_itr: Any, end_of_epoch: bool, stops: dict[str, bool]) -> bool:
        """`stops`: agreed_stops()."""
        update, valid, ckpt, trainer = self.update, self.validation, self.cfg.checkpoint, self.trainer
        num_updates = trainer.get_num_updates()
        epoch = epoch_itr.epoch
        should_stop = False
        if stops["max_update"]:
            should_stop = True
            self.stopped_by = f"--max-update {update.max_update}"
            logger.info(
                f"Stopping training due to num_updates: {num_updates} >= max_update: {update.max_update}"
            )
        if stops["time"]:
            should_stop = True
            self.stopped_by = f"--stop-time-hours {update.stop_time_hours}"
            hours = trainer.cumulative_training_time() / 3600
            logger.info(
                f"Stopping training due to cumulative_training_time: {hours} > "
                f"stop_time_hours: {update.stop_time_hours} hour(s) (on this rank's clock or another's)"
            )
        do_save = (
            (end_of_epoch and epoch % ckpt.save_interval == 0)
            or should_stop
            or (
                ckpt.save_interval_updates > 0
                and num_updates > 0
                and num_updates % ckpt.save_interval_updates == 0
                and num_updates >= valid.validate_after_updates
            )
        )
        do_validate = (
            (
                (not end_of_epoch and do_save)
                or (end_of_epoch and epoch % valid.validate_interval == 0)
                or should_stop
                or (
                    valid.validate_interval_updates > 0
                    and num_updates > 0
                    and num_updates % valid.validate_interval_updates == 0
                )
            )
            and not valid.disable_validation
            and num_updates >= valid.validate_after_updates
        )
        valid_loss = self.validate(epoch) if do_validate else None
        if end_of_epoch:
            # Before saving (fairseq steps after), so an epoch-end checkpoint already holds this step and a
            # resumed run continues with the same schedule (matters for reduce_lr_on_plateau).
            trainer.lr_step(epoch, valid_loss)
        if do_validate:  # every rank validates at the same updates, so they all take part
            self.validations += 1
            patience = self.manager.should_stop_early(valid_loss)
            if distributed.agree({"patience": patience}, trainer.device)["patience"]:
                should_stop = True
                n, metric = ckpt.patience, ckpt.best_checkpoint_metric
                self.stopped_by = (
                    f"--patience {n} ({n} validation{'s' if n > 1 else ''} without a better {metric})"
                )
        if do_save or should_stop:
            paths = self.manager.save(trainer, epoch_itr, valid_loss)
            if any(os.path.basename(p) == "checkpoint_best.pt" for p in paths or ()):
                self.best_at = (num_updates, epoch)
        return should_stop

    # ------------------------------------------------------------------------------------------------ where it stands
    def first_update_line(self, num_updates: int) -> None:
        """A line after the launch's first update: without it a log file shows nothing until the first
        --log-interval (100 updates: minutes on a CPU), and nobody knows whether the run works or how long it takes."""
        max_update = self.update.max_update
        elapsed = self.eta.clock() - self.eta.start
        text = f"update {num_updates} done in {elapsed:.1f} s (data loading included)"
        left = self.eta.text(num_updates)
        if left is not None:
            goal = f"--max-update {max_update}" if self.eta.target == max_update else "--max-epoch"
            text += f"; at this pace {goal} ({self.eta.target} updates) is reached in {left}"
        text += f"; a progress line every {self.logging.log_interval} updates"
        logger.info(text)

    def end_summary(self) -> list[str]:
        """Where the run ended: the best checkpoint (path, metric, update) and the command that summarizes with
        it. Empty on ranks other than 0 and with --no-save."""
        cfg, ckpt = self.cfg, self.cfg.checkpoint
        if ckpt.no_save or not is_master(cfg.launch):
            return []
        path = os.path.join(ckpt.save_dir, "checkpoint_best.pt")
        if not os.path.exists(path):
            return []
        metric, value = ckpt.best_checkpoint_metric, self.manager.best
        score = f"{metric} {value:g}" if value is not None else "no validation score"
        if self.best_at is not None:
            where = f"update {self.best_at[0]}, epoch {self.best_at[1]}"
        else:
            where = "saved by an earlier launch"
        lines = [f"best checkpoint: {path} ({score}, {where})", self.checkpoint_rule()]
        data = str(cfg.data_path).split(":")[0]
        config = cfg.config
        # the preset's generation settings (beam, lengths) come with --config, unless the checkpoint stores them
        preset = (
            f"--config {config if os.path.relpath(config).startswith('..') else os.path.relpath(config)} "
            if config and self.trainer.generation is None
            else ""
        )
        subset = "test" if has_split(data, "test") else self.data.valid_subset.split(",")[0]
        results = os.path.join(ckpt.save_dir, "gen")
        lines.append(
            f"summarize the {subset} split with it: seqtrain-generate {data} {preset}--path {path} "
            f"--gen-subset {subset} --quiet --scoring rouge --results-path {results}"
        )
        lines.append(
            f"or your own text, one document per line: seqtrain-generate {preset}--path {path} --input FILE"
        )
        return lines

    def checkpoint_rule(self) -> str:
        """The rule that chose checkpoint_best.pt, and what ended training, in one line."""
        ckpt, valid = self.cfg.checkpoint, self.validation
        metric = ckpt.best_checkpoint_metric
        best = "highest" if ckpt.maximize_best_checkpoint_metric else "lowest"
        flags = f"--best-checkpoint-metric {metric}" + (
            " --maximize-best-checkpoint-metric" if ckpt.maximize_best_checkpoint_metric else ""
        )
        when = [f"every {valid.validate_interval} epochs" if valid.validate_interval > 1 else "every epoch"]
        for n in {valid.validate_interval_updates, ckpt.save_interval_updates} - {0}:
            when.append(f"every {n} updates")
        subset = self.data.valid_subset.split(",")[0]
        line = (
            f"checkpoint_best.pt holds the {best} validation {metric} ({flags}) on '{subset}', validated "
            f"{' and '.join(sorted(when))} ({self.validations} validations in this launch)"
        )
        return line + (f"; training ended at {self.stopped_by}" if self.stopped_by else "")

    def valid_iterator(self, subset: str) -> Any:
        """One pass over validation split `subset`, batched as fairseq's Trainer.get_valid_iterator does."""
        data, task = self.data, self.task
        return task.get_batch_iterator(
            task.dataset(subset),
            max_tokens=data.max_tokens_valid,
            max_sentences=data.batch_size_valid,
            max_positions=self.trainer.model.max_positions(),
            ignore_invalid_inputs=data.skip_invalid_size_inputs_valid_test,
            required_batch_size_multiple=data.required_batch_size_multiple,
            seed=self.cfg.device.seed,
            num_shards=self.world,
            shard_id=self.rank,
            num_workers=data.num_workers,
            split=subset,
        ).next_epoch_itr(shuffle=False)

    def dry_run_validation(self) -> None:
        """fairseq's dry run before the first update: batch and load every validation split once, so a split that
        cannot be batched (an example too long without --skip-invalid-size-inputs-valid-test, ...) fails at the
        start with the error validation would give, not after training up to the first validation."""
        if self.validation.disable_validation:
            return
        state = rng_state()  # a DataLoader draws its seed from torch's RNG: keep resumed runs exact
        for subset in self.data.valid_subset.split(","):
            logger.info(f'begin dry-run validation on "{subset}" subset')
            for _ in self.valid_iterator(subset):
                pass
        set_rng_state(state)

    def validate(self, epoch: int) -> float | None:
        """Validate on each --valid-subset; returns the --best-checkpoint-metric of the first one."""
        with self.trainer.validation_weights():  # the EMA's with --validate-with-ema
            return self._validate(epoch)

    def _validate(self, epoch: int) -> float | None:
        ckpt, trainer = self.cfg.checkpoint, self.trainer
        first: float | None = None
        for subset in self.data.valid_subset.split(","):
            logger.info(f'begin validation on "{subset}" subset')
            itr = self.valid_iterator(subset)
            progress = progress_lib.progress_bar(
                itr,
                self.log_format,
                epoch=epoch,
                prefix=f"valid on '{subset}' subset",
                tracker=self.tracker,
                no_progress_bar=self.logging.no_progress_bar,
            )
            trainer.begin_valid()
            if self.rouge is not None:
                self.rouge.reset()
            for i, sample in enumerate(progress):
                if self.validation.max_valid_steps is not None and i >= self.validation.max_valid_steps:
                    break
                trainer.valid_step(sample)
                if self.rouge is not None and sample:
                    self.rouge.add_batch(
                        trainer.compute_model, trainer.prepare_sample(sample), trainer.autocast
                    )
            if self.rouge is not None:
                if self.world > 1:  # score every rank's pairs, so all ranks agree on "best"
                    self.rouge.hypotheses, self.rouge.references = distributed.all_gather_lists(
                        self.rouge.hypotheses, self.rouge.references
                    )
                for name, value in self.rouge.scores().items():
                    trainer.meters["valid"].log_scalar(name, value, round=2)
            stats = trainer.meters["valid"].smoothed_values()
            stats["num_updates"] = trainer.get_num_updates()
            metric = ckpt.best_checkpoint_metric
            if metric not in stats:
                raise SeqtrainError(
                    f"--best-checkpoint-metric {metric}: validation reports no such value "
                    f"(it has: {', '.join(stats)})"
                )
            best = self.manager.best
            if best is not None:
                pick = max if ckpt.maximize_best_checkpoint_metric else min
                stats[f"best_{metric}"] = pick(best, stats[metric])
            progress.print(stats, tag=subset, step=trainer.get_num_updates())
            if first is None:
                first = float(stats[metric])  # the logged (rounded) value, as fairseq compares them
        return first

    # ------------------------------------------------------------------------------------------------ profiling
    @contextlib.contextmanager
    def _profiling(self):
        """--profile N: a torch.profiler trace of N updates (after one warm-up update), for TensorBoard."""
        n = self.logging.profile
        if n <= 0:
            yield
            return
        from torch.profiler import (  # only with --profile
            ProfilerActivity,
            profile,
            schedule,
            tensorboard_trace_handler,
        )

        folder = os.path.join(self.logging.tensorboard_logdir or self.cfg.checkpoint.save_dir, "profile")
        activities = [ProfilerActivity.CPU] + (
            [ProfilerActivity.CUDA] if self.trainer.device.type == "cuda" else []
        )
        logger.info(f"profiling {n} updates into {folder}")
        with profile(
            activities=activities,
            schedule=schedule(wait=0, warmup=1, active=n, repeat=1),
            on_trace_ready=tensorboard_trace_handler(folder),
            record_shapes=True,
            profile_memory=True,
        ) as prof:
            self.profiler = prof
            try:
                yield
            finally:
                self.profiler = None
