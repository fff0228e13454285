"""The operator surface on the command line: `sessionctl` and the demo (top layer).

This module is the console script (`main`): Ctrl-C is caught from the first instant of the process, before the CLI's
heavy imports (pyspark, pandas) run, so an early Ctrl-C is the same one line as a late one, never a traceback. The
first Ctrl-C is recorded (an orderly stop for `run`), a second one raises. And the process's clean end
(`await_arrow_readers`)."""
from __future__ import annotations

import gc
import signal
import sys
import threading
import time
import weakref
from types import FrameType

__all__ = ["INTERRUPTED", "await_arrow_readers", "install", "main", "record"]

# Set by the first Ctrl-C; `run` uses it as its stop event (an orderly stop between batches).
INTERRUPTED = threading.Event()


def record(signum: int, frame: FrameType | None) -> None:
    if INTERRUPTED.is_set():  # a second Ctrl-C: the impatient kind
        raise KeyboardInterrupt
    INTERRUPTED.set()


def install() -> None:
    signal.signal(signal.SIGINT, record)


def main() -> int:
    install()
    from sessionctl.cli import main as cli_main

    return cli_main()


def await_arrow_readers(timeout_s: float = 10.0) -> None:
    """Wait, with the GIL free, until Arrow's threads hold no Python filesystem handler: before the interpreter's
    teardown, which otherwise aborts one `savepoints --json` in about twenty after its output.

    deltalake reads a table (`to_pyarrow_table`, `to_pyarrow_dataset`) as a pyarrow dataset over a Python filesystem
    (`pyarrow.fs.PyFileSystem` around its `DeltaStorageHandler`). Arrow's scan returns its last batch before it has
    finished: a thread of Arrow's CPU pool then releases the fragments, the file it read and the filesystem, which
    takes the GIL to drop the Python objects inside (the handler last). Asked for after finalization began, the GIL
    ends that thread with pthread_exit (CPython 3.11), whose unwinding through Arrow's noexcept destructor is
    `terminate called without an active exception`, exit 134 (delta-io/delta-rs#2184; apache/arrow#36389: the scanner
    still running after the call returned). A handler that Python itself still holds keeps this waiting `timeout_s`."""
    handler = getattr(sys.modules.get("pyarrow.fs"), "FileSystemHandler", None)
    if handler is None:  # nothing was read through pyarrow
        return

    def kinds(cls: type) -> list[type]:
        direct: list[type] = cls.__subclasses__()
        return [cls, *(sub for child in direct for sub in kinds(child))]

    # Instances of Python classes refer to their class: gc.get_referrers finds the live handlers (in C: far cheaper
    # than an isinstance test of every object).
    held = [weakref.ref(obj) for obj in gc.get_referrers(*kinds(handler))
            if isinstance(obj, handler) and type(obj).__weakrefoffset__]
    if not held:
        return
    gc.collect()  # one that only a reference cycle still holds (a failed read's frames) is dropped here, on this thread
    deadline = time.monotonic() + timeout_s
    while any(ref() is not None for ref in held) and time.monotonic() < deadline:
        time.sleep(0.001)  # the GIL free: Arrow's thread takes it, drops the handler, and is idle
