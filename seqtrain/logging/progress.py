"""Progress reporting in fairseq's formats: tqdm | simple | json | none, optionally mirrored to trackers
(TensorBoard, wandb, JSON lines: seqtrain.logging.trackers).

`log(stats, tag, step)` reports intermediate stats (every --log-interval updates, decided by the caller);
`print(stats, tag, step)` reports an end-of-epoch or validation summary. Lines go through Python logging under the
tag's logger name (train_inner, train, valid), so they read like fairseq's:

    epoch 001:     10 / 16 loss=7.592, nll_loss=7.574, ppl=190.48, wps=284.2, ...      (simple, log)
    epoch 001 | loss 7.454 | nll_loss 7.419 | ppl 171.09 | ...                          (simple/tqdm, print)
    {"epoch": 1, "update": 0.625, "loss": 7.592, ...}                                   (json, log)

A simple line shows `(eta 12m30s)` after its position (the time to --max-update, seqtrain.logging.eta) when the
training loop sets `bar.eta`; the tqdm bar shows it in its postfix. A tqdm bar is drawn only on a terminal:
off one (a pipe, a log file) the same progress comes as simple lines.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import sys
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from tqdm import tqdm

from seqtrain.config import setting, settings
from seqtrain.flag_bounds import POSITIVE_INT, Bounds
from seqtrain.logging.trackers import Tracker

LOG_FORMATS = ("tqdm", "simple", "json", "none")


@settings
class LoggingConfig:
    """Logging"""

    log_format: str | None = setting(
        None, "progress output (default: tqdm on a terminal, simple otherwise)", choices=LOG_FORMATS
    )
    log_interval: int = setting(
        100, "log progress every N updates", type=int, metavar="N", bounds=POSITIVE_INT
    )
    log_file: str | None = setting(None, "also write the log to this file", metavar="FILE")
    no_progress_bar: bool = setting(False, "disable the tqdm progress bar", action="store_true")
    tensorboard_logdir: str | None = setting(
        None,
        "write TensorBoard scalars (train_inner/, train/, valid/ subfolders) to DIR",
        metavar="DIR",
        not_in=("generate", "interactive", "tune"),
    )
    peak_flops: float | None = setting(
        None,
        "peak FLOP/s of one device (default: from a table of A100/H100/H200 by precision); logs "
        "mfu = counted FLOP/s (source and target tokens, attention included; docs/performance.md) / peak",
        type=float,
        metavar="FLOPS",
        bounds=Bounds(0, 1e21, lo_open=True),
        not_in=("generate", "interactive", "tune"),
    )
    profile: int = setting(
        0,
        "record a torch.profiler trace of N updates (bare --profile, as fairseq's: 10) after 1 warm-up, "
        "into --tensorboard-logdir or --save-dir",
        type=int,
        nargs="?",
        const=10,
        metavar="N",
        not_in=("generate", "interactive", "tune"),
    )


def format_stat(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, numbers.Number):
        return str(value)
    return f"{value:g}"


def _json_value(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, numbers.Number) or isinstance(value, int):
        return value
    value = float(value)
    if not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf literals
    return float(f"{value:g}")  # the digits the simple format shows (no 0.0012000000000000001)


class ProgressBar:
    """Iterates over `iterable` and reports stats; subclasses choose the output format."""

    def __init__(
        self,
        iterable: Iterable,
        epoch: int | None = None,
        prefix: str | None = None,
        total: int | None = None,
        offset: int = 0,
    ):
        self.iterable = iterable
        self.epoch = epoch
        self.offset = offset
        self.n = offset  # items consumed so far (continues from `offset` on a mid-epoch resume)
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
        self.prefix = ""
        if epoch is not None:
            self.prefix += f"epoch {epoch:03d}"
        if prefix:
            self.prefix += (" | " if self.prefix else "") + prefix
        self.tracker: Tracker | None = None
        # time left to --max-update/--max-epoch (seqtrain.logging.eta), set by the training loop before log();
        # shown on the line, never sent to trackers (it is no statistic of the model)
        self.eta: str | None = None

    def __iter__(self) -> Iterator:
        for item in self.iterable:
            self.n += 1
            yield item

    def log(self, stats: Mapping[str, Any], tag: str = "train_inner", step: int | None = None) -> None:
        if self.tracker is not None and step is not None:
            self.tracker.log(tag, stats, step)
        self._log(stats, tag, step)

    def print(self, stats: Mapping[str, Any], tag: str = "train", step: int | None = None) -> None:
        if self.tracker is not None and step is not None:
            self.tracker.log(tag, stats, step)
        self._print(stats, tag, step)

    def _log(self, stats: Mapping[str, Any], tag: str, step: int | None) -> None:
        pass

    def _print(self, stats: Mapping[str, Any], tag: str, step: int | None) -> None:
        pass

    def _summary(self, stats: Mapping[str, Any]) -> str:
        parts = [self.prefix] if self.prefix else []
        parts += [f"{k} {format_stat(v)}" for k, v in stats.items()]
        return " | ".join(parts)

    def _position(self) -> str:
        total = self.total if self.total is not None else "?"
        return f"{self.n:5d} / {total}"


class NoneProgressBar(ProgressBar):
    pass


class SimpleProgressBar(ProgressBar):
    def _log(self, stats, tag, step):
        body = ", ".join(f"{k}={format_stat(v)}" for k, v in stats.items())
        # beside the position, not among the stats: scripts that read every key=value as a number keep working
        eta = f" (eta {self.eta})" if self.eta is not None else ""
        logging.getLogger(tag).info(f"{self.prefix}: {self._position()}{eta} {body}")

    def _print(self, stats, tag, step):
        logging.getLogger(tag).info(self._summary(stats))


class JsonProgressBar(ProgressBar):
    def _log(self, stats, tag, step):
        out: OrderedDict[str, Any] = OrderedDict()
        if self.epoch is not None:
            out["epoch"] = self.epoch
            if self.total:
                out["update"] = round(self.epoch - 1 + self.n / float(self.total), 3)
        for k, v in stats.items():
            out[k] = _json_value(v)
        logging.getLogger(tag).info(json.dumps(out))

    def _print(self, stats, tag, step):
        out: OrderedDict[str, Any] = OrderedDict()
        if self.epoch is not None:
            out["epoch"] = self.epoch
        for k, v in stats.items():
            out[f"{tag}_{k}"] = _json_value(v)
        logging.getLogger(tag).info(json.dumps(out))


class TqdmProgressBar(ProgressBar):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)

        self._tqdm = tqdm(
            total=self.total,
            initial=self.offset,
            desc=self.prefix,
            leave=False,
            file=sys.stderr,
            dynamic_ncols=True,
        )

    def __iter__(self):
        try:
            for item in super().__iter__():
                self._tqdm.update(1)
                yield item
        finally:
            self._tqdm.close()

    def _log(self, stats, tag, step):
        postfix = OrderedDict((k, format_stat(v)) for k, v in stats.items())
        if self.eta is not None:
            postfix["eta"] = self.eta
        self._tqdm.set_postfix(postfix, refresh=False)

    def _print(self, stats, tag, step):
        # tqdm.write keeps the bar intact; the summary also goes to the log for log files.
        logging.getLogger(tag).info(self._summary(stats))


_BARS = {
    "tqdm": TqdmProgressBar,
    "simple": SimpleProgressBar,
    "json": JsonProgressBar,
    "none": NoneProgressBar,
}


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


def default_log_format(no_progress_bar: bool = False) -> str:
    """fairseq's default: tqdm on an interactive terminal, simple lines otherwise."""
    if no_progress_bar:
        return "simple"
    return "tqdm" if _is_terminal(sys.stderr) else "simple"


def progress_bar(
    iterable: Iterable,
    log_format: str | None = None,
    epoch: int | None = None,
    prefix: str | None = None,
    total: int | None = None,
    offset: int = 0,
    tracker: Tracker | None = None,
    no_progress_bar: bool = False,
) -> ProgressBar:
    fmt = log_format or default_log_format(no_progress_bar)
    if fmt == "tqdm" and (no_progress_bar or not _is_terminal(sys.stderr)):
        # a bar redraws itself with carriage returns and cursor escapes: in a log file or a pipe they are
        # garbage, and its stats never reach the log. Plain lines say the same there.
        fmt = "simple"
    if fmt not in _BARS:
        raise ValueError(f"unknown log format {fmt!r}; choose from: {', '.join(LOG_FORMATS)}")
    bar = _BARS[fmt](iterable, epoch=epoch, prefix=prefix, total=total, offset=offset)
    bar.tracker = tracker
    return bar
