"""Experiment trackers: where logged stats go besides the log lines. One small interface, one class each:

    TensorBoard   --tensorboard-logdir DIR     (TensorboardWriter, one event folder per tag as fairseq lays them out)
    Weights & Biases   --wandb-project NAME [--wandb-run-name NAME]   (pip install 'seqtrain[wandb]')
    JSON lines    --jsonl-log FILE             one {"tag", "step", stat: value, ...} object per line

A new tracker is one subclass of Tracker; `make_trackers` picks them from the flags. Only rank 0 tracks.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Mapping
from typing import Any

from seqtrain.config import setting, settings
from seqtrain.errors import SeqtrainError


@settings
class TrackingConfig:
    """Logging: the experiment trackers of seqtrain-train (make_trackers), besides --tensorboard-logdir"""

    wandb_project: str | None = setting(
        None,
        "also log to this Weights & Biases project (needs pip install 'seqtrain[wandb]'; WANDB_MODE=offline "
        "logs locally)",
        metavar="NAME",
    )
    wandb_run_name: str | None = setting(None, "the W&B run name (default: wandb's)", metavar="NAME")
    jsonl_log: str | None = setting(
        None,
        'also append every logged line\'s stats to FILE as JSON lines ({"tag", "step", stat: value, ...})',
        metavar="FILE",
    )


def numeric_stats(stats: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of `stats` (no num_updates: that is the step), as floats."""
    out = {}
    for key, value in stats.items():
        if key == "num_updates" or isinstance(value, bool) or not isinstance(value, numbers.Number):
            continue
        if math.isfinite(float(value)):
            out[key] = float(value)
    return out


class Tracker:
    """Receives the stats of every progress line: `tag` is train_inner, train or a validation subset."""

    def log(self, tag: str, stats: Mapping[str, Any], step: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Flush and release; called once at the end of the run (also after an error or a signal)."""


class Trackers(Tracker):
    """Several trackers as one."""

    def __init__(self, trackers: list[Tracker]):
        self.trackers = trackers

    def log(self, tag: str, stats: Mapping[str, Any], step: int) -> None:
        for tracker in self.trackers:
            tracker.log(tag, stats, step)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()


class TensorboardWriter(Tracker):
    """Writes numeric stats as scalars under `{logdir}/{tag}`; non-numeric values are skipped."""

    def __init__(self, logdir: str):
        self.logdir = logdir
        self._writers: dict[str, Any] = {}

    def _writer(self, tag: str):
        if tag not in self._writers:
            # Imported here so that runs without --tensorboard-logdir never pay for (or need) tensorboard.
            from torch.utils.tensorboard import SummaryWriter

            self._writers[tag] = SummaryWriter(os.path.join(self.logdir, tag))
        return self._writers[tag]

    def log(self, tag: str, stats: Mapping[str, Any], step: int) -> None:
        writer = self._writer(tag)
        for key, value in numeric_stats(stats).items():
            writer.add_scalar(key, value, step)
        writer.flush()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()


class JsonLinesTracker(Tracker):
    """Appends one JSON object per logged line to a file (a resumed run continues the same file)."""

    def __init__(self, path: str):
        self.path = path
        try:
            folder = os.path.dirname(os.path.abspath(path))
            os.makedirs(folder, exist_ok=True)
            self.file = open(path, "a", encoding="utf-8")
        except OSError as e:
            raise SeqtrainError(f"--jsonl-log {path}: cannot write ({e.strerror or e})") from None

    def log(self, tag: str, stats: Mapping[str, Any], step: int) -> None:
        self.file.write(json.dumps({"tag": tag, "step": step, **numeric_stats(stats)}) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class WandbTracker(Tracker):
    """Weights & Biases: stats as `{tag}/{name}` at step = the update count. fairseq's flags; WANDB_MODE=offline
    and the other WANDB_* variables work as usual."""

    def __init__(self, project: str, run_name: str | None, config: Mapping[str, Any], folder: str | None):
        try:
            import wandb  # optional dependency (pip install 'seqtrain[wandb]')
        except ImportError:
            raise SeqtrainError(
                "--wandb-project needs the wandb package: pip install 'seqtrain[wandb]' (or pip install wandb)"
            ) from None
        self.wandb = wandb
        try:
            self.run = wandb.init(
                project=project, name=run_name, config=dict(config), dir=folder, reinit=True
            )
        except (wandb.errors.Error, TimeoutError, OSError) as e:
            # no API key and no terminal to ask on (UsageError), a server out of reach (CommError after
            # wandb's init_timeout), a bad key: wandb's own messages are one line
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise SeqtrainError(
                f"--wandb-project {project}: W&B did not start ({reason}); log in with `wandb login` (or set "
                "WANDB_API_KEY), or log offline with WANDB_MODE=offline and upload later with `wandb sync`"
            ) from None

    def log(self, tag: str, stats: Mapping[str, Any], step: int) -> None:
        self.run.log({f"{tag}/{k}": v for k, v in numeric_stats(stats).items()}, step=step)

    def close(self) -> None:
        self.run.finish()


def make_trackers(
    cfg: TrackingConfig, tensorboard_logdir: str | None, run_dir: str | None, run_config: Mapping[str, Any]
) -> Tracker | None:
    """The trackers the settings ask for (None when none): `tensorboard_logdir` is LoggingConfig's, `run_dir`
    where W&B keeps its files (the run's --save-dir; None with --no-save), `run_config` the run's flags as W&B
    records them (the plain values)."""
    trackers: list[Tracker] = []
    if tensorboard_logdir:
        trackers.append(TensorboardWriter(tensorboard_logdir))
    if cfg.jsonl_log:
        trackers.append(JsonLinesTracker(cfg.jsonl_log))
    if cfg.wandb_project:
        config = {
            k: v for k, v in run_config.items() if isinstance(v, (str, int, float, bool, list, type(None)))
        }
        trackers.append(WandbTracker(cfg.wandb_project, cfg.wandb_run_name, config, run_dir))
    if not trackers:
        return None
    return trackers[0] if len(trackers) == 1 else Trackers(trackers)
