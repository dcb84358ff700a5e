"""Which checkpoints a training run writes, keeps and resumes from: fairseq's names and policy.

Names, in the order fairseq evaluates them (the first one that applies is written, the rest are hard links to
it, or copies where links are impossible):

    checkpoint{epoch}.pt              end of every --save-interval-th epoch (unless --no-epoch-checkpoints)
    checkpoint_{epoch}_{updates}.pt   every --save-interval-updates updates, mid-epoch
    checkpoint_best.pt                when the validation --best-checkpoint-metric is the best so far (ties too)
    checkpoint.best_{metric}_{value:.3f}.pt   the --keep-best-checkpoints best ones
    checkpoint_last.pt                every save (unless --no-last-checkpoints)

Every file is written atomically and never modified in place afterwards (a new save replaces the name with a
new file), so names sharing one file via hard links never change under each other. The best value and the
--patience counter live in this object, not in globals, and travel inside each checkpoint's training state
(seqtrain.checkpoint.train_state).

Why one module: what a save names and keeps, what pruning removes and which file a resume starts from (and what
it resets) are one policy: the files one writes are the files the others find, and a damaged one is named with
the intact one to use instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from seqtrain import distributed
from seqtrain.checkpoint.files import CheckpointContents, load_checkpoint_file
from seqtrain.checkpoint.formats import read_checkpoint, read_loaded
from seqtrain.checkpoint.hub import resolve_model_path
from seqtrain.checkpoint.options import CheckpointConfig
from seqtrain.checkpoint.train_state import TrainState
from seqtrain.errors import SeqtrainError
from seqtrain.fileio import atomic_write, file_kind, link_or_copy, loads_bounded

logger = logging.getLogger("seqtrain.train_checkpoints")  # the name log lines have always shown


def checkpoint_paths(folder: str, pattern: str) -> list[str]:
    """Files in `folder` whose name fully matches `pattern`, sorted by the pattern's first group (a number),
    largest first."""
    regex = re.compile(pattern)
    found = []
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        m = regex.fullmatch(name)
        if m:
            found.append((float(m.group(1)), name))
    return [os.path.join(folder, name) for _, name in sorted(found, reverse=True)]


# Temporary names of interrupted writes: atomic_write's ".NAME.XXXX.tmp" and link_or_copy's ".NAME.XXXX.link"
# (and the --save-dir write probe of prepare_save_dir, the lock record of seqtrain.train.savedir_lock, config.yaml's).
_PARTIAL_WRITE = re.compile(
    r"\.(checkpoint[^/]*\.pt\.[A-Za-z0-9_]+\.(tmp|link)|write-test\.[A-Za-z0-9_]+"
    r"|seqtrain\.lock\.[0-9a-f]+\.tmp|config\.yaml\.[A-Za-z0-9_]+\.tmp)"
)


def checkpoint_problem(path: str) -> str | None:
    """Why `path` is not an intact checkpoint file (None if it is). A torch zip archive must have its central
    directory (missing when truncated) and every record must match its CRC-32 (torch.load itself checks neither,
    so a flipped bit in a tensor would load silently)."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):  # a FIFO would make the checks below wait for a writer for ever
            return f"{file_kind(mode)}, not a checkpoint file"
        if not zipfile.is_zipfile(path):
            with open(path, "rb") as f:
                head = f.read(4)
            if head[:2] == b"\x80\x02":
                return None  # torch's legacy format has no checksums; torch.load judges it
            return (
                "truncated (no zip central directory)" if head == b"PK\x03\x04" else "not a torch checkpoint"
            )
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
        return f"corrupted (record {bad} fails its checksum)" if bad is not None else None
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as e:
        return f"unreadable ({e})"


def newest_intact_checkpoint(folder: str, exclude: str) -> str | None:
    """The most recently written intact checkpoint*.pt in `folder`, skipping `exclude` and its hard links."""
    found = []
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        path = os.path.join(folder, name)
        if not (name.startswith("checkpoint") and name.endswith(".pt")) or not os.path.isfile(path):
            continue
        if os.path.exists(exclude) and os.path.samefile(path, exclude):
            continue
        found.append((os.path.getmtime(path), name == "checkpoint_last.pt", path))
    for _, _, path in sorted(found, reverse=True):
        if checkpoint_problem(path) is None:
            return path
    return None


class CheckpointManager:
    """Applies the checkpoint flags of one run: what to save after an update or epoch, what to prune, where to
    resume from, and --patience."""

    def __init__(self, cfg: CheckpointConfig, config_text: str | None = None):
        """`cfg`: the run's Checkpoint settings (read from the flags by the training loop); `config_text`: the
        run's resolved flags (seqtrain.flags.training.resolved_train_config), written to SAVE_DIR/config.yaml with
        the run's first checkpoint."""
        self.cfg = cfg
        self.config_text = config_text
        self.save_dir = self.cfg.save_dir
        self.best: float | None = None
        self.patience_best: float | None = None
        self.patience_runs = 0
        # update count held by checkpoint_last.pt (None: unknown / not written by this run), for graceful stops
        self.last_saved_updates: int | None = None

    def prepare_save_dir(self) -> None:
        """fairseq's verify_checkpoint_directory: fail at start-up, not hours later at the first save, when
        --save-dir cannot be written; and remove temporary files that a killed save left behind."""
        if self.cfg.no_save or self.cfg.distributed_rank != 0:
            return
        try:
            os.makedirs(self.save_dir, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".write-test.", dir=self.save_dir)
            try:
                os.write(fd, b"ok")
            finally:
                os.close(fd)
                os.unlink(probe)
        except OSError as e:
            raise SeqtrainError(
                f"--save-dir {self.save_dir}: cannot write checkpoints there "
                f"({e.strerror or e}); pass a writable --save-dir or --no-save"
            ) from None
        stale = [n for n in os.listdir(self.save_dir) if _PARTIAL_WRITE.fullmatch(n)]
        for name in stale:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(self.save_dir, name))
        if stale:
            logger.info(
                f"removed {len(stale)} incomplete checkpoint file(s) left by an interrupted save "
                f"in {self.save_dir}"
            )

    # -------------------------------------------------------------------------------------------- comparison
    def is_better(self, a: float, b: float) -> bool:
        """fairseq's tie rule for checkpoint_best: an equal value counts as better."""
        return a >= b if self.cfg.maximize_best_checkpoint_metric else a <= b

    def _strictly_better(self, a: float, b: float) -> bool:
        return a > b if self.cfg.maximize_best_checkpoint_metric else a < b

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "patience_best": self.patience_best, "patience_runs": self.patience_runs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state.get("best")
        self.patience_best = state.get("patience_best")
        self.patience_runs = int(state.get("patience_runs", 0))

    # -------------------------------------------------------------------------------------------- early stop
    def should_stop_early(self, val_metric: float | None) -> bool:
        """True once validation has not strictly improved for --patience consecutive validations."""
        if val_metric is None or self.cfg.patience <= 0:
            return False
        if self.patience_best is None or self._strictly_better(val_metric, self.patience_best):
            self.patience_best = val_metric
            self.patience_runs = 0
            return False
        self.patience_runs += 1
        if self.patience_runs >= self.cfg.patience:
            logger.info(
                f"early stop since valid performance hasn't improved for last {self.cfg.patience} runs"
            )
            return True
        return False

    # -------------------------------------------------------------------------------------------- saving
    def checkpoint_names(
        self, epoch: int, updates: int, end_of_epoch: bool, val_metric: float | None
    ) -> list[str]:
        """File names this save writes, updating the best value as a side effect (call once per save)."""
        a = self.cfg
        names: list[str] = []
        if end_of_epoch and not a.no_epoch_checkpoints and epoch % a.save_interval == 0:
            names.append(f"checkpoint{epoch}.pt")
        if not end_of_epoch and a.save_interval_updates > 0 and updates % a.save_interval_updates == 0:
            names.append(f"checkpoint_{epoch}_{updates}.pt")
        if val_metric is not None:
            if self.best is None or self.is_better(val_metric, self.best):
                self.best = val_metric
                names.append("checkpoint_best.pt")
            if a.keep_best_checkpoints > 0:
                kept = self._best_paths()
                worst = None
                if kept:
                    worst = float(self._best_value(kept[-1]))
                if (
                    len(kept) < a.keep_best_checkpoints
                    or worst is None
                    or self._strictly_better(val_metric, worst)
                ):
                    names.append(f"checkpoint.best_{a.best_checkpoint_metric}_{val_metric:.3f}.pt")
        if not a.no_last_checkpoints:
            names.append("checkpoint_last.pt")
        return names

    def _best_paths(self) -> list[str]:
        """checkpoint.best_* files, best first."""
        metric = re.escape(self.cfg.best_checkpoint_metric)
        paths = checkpoint_paths(self.save_dir, rf"checkpoint\.best_{metric}_(-?\d+\.?\d*)\.pt")
        return paths if self.cfg.maximize_best_checkpoint_metric else paths[::-1]

    @staticmethod
    def _best_value(path: str) -> str:
        return os.path.basename(path)[: -len(".pt")].rsplit("_", 1)[-1]

    def save(self, trainer: Any, epoch_itr: Any, val_metric: float | None) -> list[str]:
        """Write this update's checkpoints (maybe none) and prune old ones. Returns the paths written."""
        a = self.cfg
        epoch, updates, end_of_epoch = epoch_itr.epoch, trainer.get_num_updates(), epoch_itr.end_of_epoch()
        names = self.checkpoint_names(epoch, updates, end_of_epoch, val_metric)
        if a.no_save or not names:
            return []
        paths = self._write(trainer, epoch_itr, names, val_metric)
        try:
            if distributed.get_rank() == 0:
                self.prune()
        except OSError as e:  # an old file that cannot be removed costs disk space, not correctness
            logger.warning(f"could not remove an old checkpoint in {self.save_dir}: {e}")
        distributed.barrier()  # the other ranks wait until rank 0 has written (and pruned)
        return paths

    def save_last(self, trainer: Any, epoch_itr: Any) -> str | None:
        """Write checkpoint_last.pt at the current position (a graceful stop), unless it already holds this
        update. Returns the path, or None when nothing was written (--no-save, or already saved)."""
        if self.cfg.no_save:
            logger.warning("--no-save: stopping without writing a checkpoint")
            return None
        if self.last_saved_updates == trainer.get_num_updates():
            return os.path.join(self.save_dir, "checkpoint_last.pt")
        path = self._write(trainer, epoch_itr, ["checkpoint_last.pt"], None)[0]
        distributed.barrier()
        return path

    def _write(self, trainer: Any, epoch_itr: Any, names: list[str], val_metric: float | None) -> list[str]:
        """One file for the first name, hard links for the others. An OSError (disk full, permissions) becomes
        a SeqtrainError; since every name is replaced atomically, the files written before stay intact."""
        a = self.cfg
        epoch, updates = epoch_itr.epoch, trainer.get_num_updates()
        logger.info(f"Preparing to save checkpoint for epoch {epoch} @ {updates} updates")
        start = time.perf_counter()
        position = TrainState.at_save(epoch, epoch_itr.state_dict(), val_metric, self.state_dict(), self.best)
        paths = [os.path.join(self.save_dir, n) for n in names]
        current = paths[0]
        self.check_finite(trainer, paths[0])
        try:
            os.makedirs(self.save_dir, exist_ok=True)
            if self.config_text is not None and distributed.get_rank() == 0:
                # the flags of the run whose checkpoints these are (`--config` it alone to reproduce the run)
                current = os.path.join(self.save_dir, "config.yaml")
                with atomic_write(current, "w") as f:
                    f.write(self.config_text)
                self.config_text, current = None, paths[0]
            # every rank calls it (FSDP gathers the full state); only rank 0 writes
            trainer.save_checkpoint(current, position, with_optimizer=not a.no_save_optimizer_state)
            for current in paths[1:] if distributed.get_rank() == 0 else []:
                link_or_copy(paths[0], current)
        except OSError as e:
            kept = (
                f"checkpoint_last.pt (update {self.last_saved_updates}) is intact"
                if self.last_saved_updates is not None
                else "checkpoints written before are intact"
            )
            raise SeqtrainError(
                f"could not write checkpoint {current} at update {updates}: {e.strerror or e}; {kept}. "
                "Free disk space or fix permissions of --save-dir, then rerun the same command to resume"
            ) from None
        if "checkpoint_last.pt" in names:
            self.last_saved_updates = updates
        logger.info(
            f"Saved checkpoint {paths[0]} (epoch {epoch} @ {updates} updates, score {val_metric}) "
            f"(writing took {time.perf_counter() - start:.3f} seconds)"
        )
        return paths

    def check_finite(self, trainer: Any, path: str) -> None:
        """Never save inf / NaN weights: checkpoint_last.pt must stay a good one to resume from."""
        bad = distributed.first_nonfinite_parameter(trainer.model)  # one host-device sync per save
        if not distributed.agree({"bad": bad is not None}, trainer.device)["bad"]:
            return
        last = self.last_saved_updates
        good = (
            f"the last good checkpoint is {os.path.join(self.save_dir, 'checkpoint_last.pt')} (update {last})"
            if last is not None
            else "no checkpoint was saved before"
        )
        n = trainer.get_num_updates()
        last_update = (
            f"the last good update is {n - 1} (its weights gave update {n} a finite loss)"
            if n > 0
            else "the starting weights are not finite"
        )
        raise SeqtrainError(
            f"parameters are not finite (inf / NaN{', first: ' + bad if bad else ''}) at update "
            f"{n}: not saving {path}; {last_update}, {good}. Resume from it with a lower --lr, --clip-norm or a "
            "longer --warmup-updates"
        )

    def prune(self) -> None:
        """Apply --keep-interval-updates, --keep-last-epochs and --keep-best-checkpoints."""
        a = self.cfg
        doomed: list[str] = []
        if a.keep_interval_updates > 0:
            doomed += checkpoint_paths(self.save_dir, r"checkpoint_\d+_(\d+)\.pt")[a.keep_interval_updates :]
        if a.keep_last_epochs > 0:
            doomed += checkpoint_paths(self.save_dir, r"checkpoint(\d+)\.pt")[a.keep_last_epochs :]
        if a.keep_best_checkpoints > 0:
            doomed += self._best_paths()[a.keep_best_checkpoints :]
        for path in doomed:
            if os.path.lexists(path):
                os.remove(path)

    # -------------------------------------------------------------------------------------------- resuming
    def restore(
        self, trainer: Any, get_train_iterator: Callable[[int], Any]
    ) -> tuple[TrainState | None, Any]:
        """fairseq's load_checkpoint: resume from --restore-file (default: checkpoint_last.pt in --save-dir),
        or start from --finetune-from-model when this run has no checkpoint yet. Returns (the training state
        resumed, or None when training starts fresh; the train EpochBatchIterator positioned where training
        continues)."""
        a = self.cfg
        self.prepare_save_dir()
        overrides = self._optimizer_overrides()
        resets = Resets(a.reset_optimizer, a.reset_lr_scheduler, a.reset_meters, a.reset_dataloader)
        own_last = os.path.join(self.save_dir, "checkpoint_last.pt")
        default_restore = a.restore_file == "checkpoint_last.pt" or (
            os.path.exists(a.restore_file)
            and os.path.exists(own_last)
            and os.path.samefile(a.restore_file, own_last)
        )
        if a.finetune_from_model is not None:
            self._check_finetune_flags(resets, default_restore)
        if default_restore:
            path = own_last
            if not os.path.exists(path) and a.finetune_from_model is not None:
                self._load_pretrained(trainer)
                return None, get_train_iterator(1)
            if os.path.exists(path) and a.finetune_from_model is not None:
                logger.info(f"resuming from {path} (--finetune-from-model is used only by a first launch)")
        elif self._is_relaunch(own_last):
            # A relaunch (preemption, crash) continues this run; the initial weights and the --reset-* flags
            # only served the first launch. fairseq reloads --restore-file at every launch: --restore-file-always.
            # (A checkpoint inside --save-dir is a deliberate resume point, e.g. the intact one check_resumable
            # names when checkpoint_last.pt is damaged: it is loaded as asked.)
            logger.info(
                f"resuming from {own_last}: --restore-file {a.restore_file} initialises only a first launch "
                "(an empty --save-dir); --restore-file-always loads it at every launch"
            )
            path, resets = own_last, Resets()
        else:
            path = self._restore_file(own_last, resets)
        return self._load(trainer, path, resets, overrides, get_train_iterator)

    def _optimizer_overrides(self) -> dict[str, Any]:
        text = self.cfg.optimizer_overrides
        try:
            overrides = loads_bounded(text) if text else {}
        except ValueError:
            overrides = None
        if not isinstance(overrides, dict):  # '[1]' is JSON, but no object: group.update raised a TypeError
            raise SeqtrainError(f"--optimizer-overrides: not a JSON object: {text!r}")
        return overrides

    @staticmethod
    def _check_finetune_flags(resets: Resets, default_restore: bool) -> None:
        if resets.any():
            raise SeqtrainError(
                "--finetune-from-model cannot be combined with --reset-optimizer, --reset-lr-scheduler, "
                "--reset-meters or --reset-dataloader (it implies them; turn a config's off with "
                "--no-reset-..., or use --restore-file, which also initialises only a first launch)"
            )
        if not default_restore:
            raise SeqtrainError("--finetune-from-model and --restore-file cannot be given together")

    def _load_pretrained(self, trainer: Any) -> None:
        """--finetune-from-model, at a first launch: its weights only."""
        a = self.cfg
        # a hub name (org/name[@revision]) is resolved here, by the first launch only
        pretrained = resolve_model_path(a.finetune_from_model, "--finetune-from-model")
        if not os.path.exists(pretrained):
            raise SeqtrainError(f"--finetune-from-model {a.finetune_from_model}: file not found")
        logger.info(
            f"first launch ({self.save_dir} has no checkpoint_last.pt): loading pretrained model from "
            f"{pretrained}; optimizer, lr scheduler, meters, dataloader start fresh"
        )
        trainer.load_model_weights(
            read_checkpoint(pretrained, unsafe=a.unsafe_load, require_dict=False), pretrained
        )

    def _is_relaunch(self, own_last: str) -> bool:
        """Whether a --restore-file outside --save-dir gives way to this run's own checkpoint_last.pt."""
        a = self.cfg
        return (
            os.path.exists(own_last)
            and not a.restore_file_always
            and os.path.dirname(os.path.abspath(a.restore_file)) != os.path.abspath(self.save_dir)
        )

    def _restore_file(self, own_last: str, resets: Resets) -> str:
        """The --restore-file to initialise from (a hub name: its cached snapshot), and why, logged."""
        a = self.cfg
        path = resolve_model_path(a.restore_file, "--restore-file")
        if not os.path.exists(path):
            raise SeqtrainError(f"--restore-file {path}: file not found")
        if not os.path.exists(own_last):
            why = f"{self.save_dir} has no checkpoint_last.pt"
        elif a.restore_file_always:
            why = "--restore-file-always"
        else:
            why = "a checkpoint of this --save-dir, chosen as the point to resume from"
        names = resets.names()
        logger.info(
            f"initialising from --restore-file {path} ({why})"
            + (f"; reset: {', '.join(names)}" if names else "")
        )
        return path

    def _load(
        self,
        trainer: Any,
        path: str,
        resets: Resets,
        overrides: dict[str, Any],
        get_train_iterator: Callable[[int], Any],
    ) -> tuple[TrainState | None, Any]:
        """Load checkpoint `path`: a seqtrain checkpoint whole (less what `resets` resets), any other model's
        weights only."""
        a = self.cfg
        logger.info(f"Preparing to load checkpoint {path}")
        if not os.path.exists(path):
            logger.info(f"No existing checkpoint found {path}")
            return None, get_train_iterator(1)
        if os.path.isdir(path):  # a Hugging Face folder (a hub model's snapshot): weights only
            trainer.load_model_weights(read_checkpoint(path, unsafe=a.unsafe_load, require_dict=False), path)
            logger.info(f"{path} is a Hugging Face model: loaded its weights only")
            return None, get_train_iterator(1)
        # one pass: the file's integrity, one load, then checks on the loaded contents
        check_resumable(path)
        # (an adapters-only LoRA checkpoint comes back over its base: the one --finetune-from-model names, if given)
        ck = read_loaded(
            path,
            load_checkpoint_file(path, unsafe=a.unsafe_load),
            lora_base=a.finetune_from_model,
            unsafe=a.unsafe_load,
            base_flag="--finetune-from-model",
        )
        if ck.format != "seqtrain":
            # A fairseq model (e.g. BART fine-tuning's --restore-file model.pt): weights only.
            trainer.load_model_weights(ck, path)
            logger.info(
                f"{path} is not a seqtrain checkpoint: loaded its weights only; optimizer, lr scheduler, "
                "meters and data position start fresh"
            )
            return None, get_train_iterator(1)
        check_same_dictionaries(ck, trainer.task)
        note_teacher_changes(ck.args, trainer.run_args, path)
        saved = trainer.load_state_dict(
            ck.state,
            path,
            reset_optimizer=resets.optimizer,
            reset_lr_scheduler=resets.lr_scheduler,
            reset_meters=resets.meters,
            optimizer_overrides=overrides,
        )
        if not resets.optimizer and not resets.meters:
            # (checkpoints before the CheckpointManager's record kept only the best value)
            self.load_state_dict(
                saved.checkpoint_manager if saved.says("checkpoint_manager") else {"best": saved.best}
            )
        epoch_itr = self._data_position(saved, ck, resets, get_train_iterator)
        if os.path.abspath(path) == os.path.abspath(os.path.join(self.save_dir, "checkpoint_last.pt")):
            self.last_saved_updates = trainer.get_num_updates()
        logger.info(f"Loaded checkpoint {path} (epoch {saved.epoch} @ {trainer.get_num_updates()} updates)")
        return saved, epoch_itr

    def _data_position(
        self,
        saved: TrainState,
        ck: CheckpointContents,
        resets: Resets,
        get_train_iterator: Callable[[int], Any],
    ) -> Any:
        """The train iterator where the checkpoint's run stopped (epoch 1's start with --reset-dataloader)."""
        if resets.dataloader or saved.train_iterator is None:
            return get_train_iterator(1)
        # a position saved by another number of ranks counts batches per rank: rescale it
        itr_state = distributed.rescale_iterator_position(
            saved.train_iterator,
            int(getattr(ck.args, "distributed_world_size", 1) or 1),
            int(self.cfg.distributed_world_size or 1),
        )
        epoch_itr = get_train_iterator(itr_state["epoch"])
        epoch_itr.load_state_dict(itr_state)
        return epoch_itr


TEACHER_FLAGS = ("criterion", "teacher_path", "distill_temperature", "distill_alpha")


def note_teacher_changes(stored: Any, current: dict[str, Any], path: str) -> None:
    """A resume with another distillation teacher or its settings continues another objective: one warning
    naming what changed (the teacher is no part of the checkpoint: a resume loads --teacher-path again, and
    before, another teacher or temperature went unsaid)."""
    stored = vars(stored) if not isinstance(stored, dict) else stored
    if "distillation" not in str(current.get("criterion")) and "distillation" not in str(
        stored.get("criterion")
    ):
        return
    changed = [
        f"--{k.replace('_', '-')} {stored.get(k)} -> {current.get(k)}"
        for k in TEACHER_FLAGS
        if k in stored and stored.get(k) != current.get(k)
    ]
    if changed:
        logger.warning(
            f"resuming {path} with another distillation objective: {', '.join(changed)}; the run continues "
            "with the new one (restart from its weights with --finetune-from-model for a clean schedule)"
        )


@dataclass(frozen=True)
class Resets:
    """The --reset-* flags a load applies (a relaunch resuming its own checkpoint applies none)."""

    optimizer: bool = False
    lr_scheduler: bool = False
    meters: bool = False
    dataloader: bool = False

    def names(self) -> list[str]:
        """What is reset, as the log line names it."""
        on = (
            ("optimizer", self.optimizer),
            ("lr scheduler", self.lr_scheduler),
            ("meters", self.meters),
            ("dataloader", self.dataloader),
        )
        return [name for name, reset in on if reset]

    def any(self) -> bool:
        return bool(self.names())


def check_same_dictionaries(ck: CheckpointContents, task: Any) -> None:
    """Token ids only mean the same words under the same dictionary: a seqtrain checkpoint must be resumed with
    the data-bin it was trained on (embedding rows would otherwise be silently resized and misread)."""
    for side, saved, have in (("source", ck.src_dict, task.src_dict), ("target", ck.tgt_dict, task.tgt_dict)):
        if saved is None or have is None:
            continue
        if saved != have:
            where = (
                task.dictionary_file(side) if hasattr(task, "dictionary_file") else f"the {side} dictionary"
            )
            raise SeqtrainError(
                f"{ck.path} was trained with another {side} dictionary than {where} ({saved.difference(have)}); "
                "resume with the data-bin it was trained on, or start from its weights with --finetune-from-model"
            )


def check_resumable(path: str) -> None:
    """A damaged checkpoint to resume from is an error that names the newest intact one to use instead."""
    problem = checkpoint_problem(path) if os.path.isfile(path) else None
    if problem is None or (
        problem == "not a torch checkpoint" and not os.path.basename(path).startswith("checkpoint")
    ):
        return  # an unrelated file (not one of ours gone bad): the loader's own message says what it is
    folder = os.path.dirname(os.path.abspath(path))
    other = newest_intact_checkpoint(folder, exclude=path)
    hint = (
        f"the newest intact checkpoint is {other}: resume from it with --restore-file {other} "
        f"(or copy it over {os.path.basename(path)})"
        if other is not None
        else f"no intact checkpoint in {folder}; move the damaged file away to start from scratch"
    )
    raise SeqtrainError(f"{path} is {problem}; {hint}")
