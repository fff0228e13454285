"""The one waiter: wait on observable state instead of sleeping and hoping.

``wait_until(condition, *, timeout_s, what, interval_s=0.05) -> T``
    Polls ``condition()`` until it returns a truthy value and returns that value; after ``timeout_s`` seconds an
    AssertionError names ``what`` and the last value seen. Exceptions raised by ``condition`` propagate (a condition
    that may fail while the state is being built catches what it expects itself).
``still_running(process, log=None) -> bool``
    True while ``process`` runs, else an AssertionError with its exit code and the tail of ``log`` (a path) or of
    its stderr pipe: put it first in a condition (``lambda: still_running(run) and ...``) so that a process that
    died fails the wait at once instead of after the timeout.
``stream_caught_up(config) -> bool``
    The job's last committed batch read up to the newest ingest commit of raw_events (and settled): what a stream
    has to show before a test lands more, compacts beside it, or stops it.
"""
from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], *, timeout_s: float, what: str, interval_s: float = 0.05) -> T:
    """Poll `condition` until it returns a truthy value (returned); AssertionError naming `what` after `timeout_s`."""
    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {time.monotonic() - started:.1f} s waiting for {what}; "
                                 f"last value: {value!r}")
        time.sleep(interval_s)


def still_running(process: subprocess.Popen, log: Path | str | None = None) -> bool:
    """True while `process` runs; an AssertionError with its exit code and output tail once it exited."""
    code = process.poll()
    if code is None:
        return True
    if log is not None:
        tail = Path(log).read_text(errors="replace")[-3000:] if Path(log).exists() else ""
    elif process.stderr is not None and not process.stderr.closed:
        tail = process.stderr.read()
        tail = (tail.decode(errors="replace") if isinstance(tail, bytes) else tail)[-3000:]
    else:
        tail = ""
    raise AssertionError(f"process {process.pid} ({process.args!r:.200}) exited with {code} while waited on:\n{tail}")


def stream_caught_up(config) -> bool:
    """The last committed batch's source offset is the newest ingest_seq of raw_events, settled."""
    from pipelines.ingest import latest_ingest_seq
    from pipelines.job.checkpoint import inspect_checkpoint

    offset = inspect_checkpoint(config.checkpoint).source_offset or {}
    return offset.get("seq") == latest_ingest_seq(config.raw_events_table) and bool(offset.get("settled"))
