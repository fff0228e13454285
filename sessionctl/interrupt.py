"""Ctrl-C for sessionctl: the first one is recorded (an orderly stop for `run`), a second one raises."""
from __future__ import annotations

import signal
import threading
from types import FrameType

# Set by the first Ctrl-C; `run` uses it as its stop event (an orderly stop between batches).
INTERRUPTED = threading.Event()


def record(signum: int, frame: FrameType | None) -> None:
    if INTERRUPTED.is_set():  # a second Ctrl-C: the impatient kind
        raise KeyboardInterrupt
    INTERRUPTED.set()


def install() -> None:
    signal.signal(signal.SIGINT, record)
