"""The `sessionctl` console script: Ctrl-C is caught from the first instant of the process, before the CLI's heavy
imports (pyspark, pandas) run, so an early Ctrl-C is the same one line as a late one, never a traceback."""
from __future__ import annotations

import signal
import threading
from types import FrameType

# Set by the first Ctrl-C; `run` uses it as its stop event (an orderly stop between batches).
INTERRUPTED = threading.Event()


def _record(signum: int, frame: FrameType | None) -> None:
    if INTERRUPTED.is_set():  # a second Ctrl-C: the impatient kind
        raise KeyboardInterrupt
    INTERRUPTED.set()


def main() -> int:
    signal.signal(signal.SIGINT, _record)
    from sessionctl.cli import main as cli_main

    return cli_main()
