"""Child processes: how the worker processes that seqtrain forks (preprocessing pools, dictionary counting)
treat the signals meant for the run as a whole."""

from __future__ import annotations

import signal


def worker_sigterm_default() -> None:
    """multiprocessing.Pool initializer: SIGTERM ends the worker at once (the default action). Pool.terminate
    (and leaving a `with Pool(...)` block) ends workers with SIGTERM; a worker forked inside `work_folder`
    would inherit its Python-level handler, which runs only between bytecodes and can be swallowed (raised
    inside a __del__), and a worker that lives on keeps the pool's join waiting for ever. A worker owns nothing
    to clean up."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
