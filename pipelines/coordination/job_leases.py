"""The product's two leases: `job` (the running stream, or an operation that needs it stopped) and `lifecycle`
(one lifecycle operation at a time), taken with a one-line answer when someone else holds them."""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from pipelines.config import SessionsConfig
from pipelines.coordination.leases import Lease, LeaseHeld, LeaseInfo, acquire, holding, live_holder
from pipelines.errors import JobRunning, LifecycleBusy

__all__ = ["JOB", "LIFECYCLE", "job_lock", "running_stream"]

JOB, LIFECYCLE = "job", "lifecycle"


@contextmanager
def job_lock(config: SessionsConfig, what: str, *, name: str = JOB, wait_s: float = 0.0) -> Iterator[Lease]:
    """One process at a time, on any host, may hold each lease at SESSIONS_LEASE_URI (pipelines.coordination.leases).

    `job` is held by the running stream and by operations that need it stopped (restore, rescale, catch-up);
    `lifecycle` by every lifecycle operation (savepoints, compaction included), which may run beside the stream
    but never beside another lifecycle operation. With `wait_s`, a held lease is waited for that long. The block
    gets the held Lease: `check()` it before writes that must be this holder's (a lease lost meanwhile raises
    LeaseLost at the end of the block)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            held = acquire(config.lease_uri, name, what, config.lease_ttl_s)
            break
        except LeaseHeld as busy:
            if time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            if name == JOB:
                raise JobRunning(f"the job is running: {busy.holder} holds {busy.path}; {what} needs it stopped: "
                                 f"stop it with `sessionctl stop` (or wait for it)", busy.holder, str(busy.path)) from None
            raise LifecycleBusy(f"another lifecycle operation is running: {busy.holder} holds {busy.path}; wait for "
                                f"it and run {what} again", busy.holder, str(busy.path)) from None
    with holding(held):
        yield held


def running_stream(config: SessionsConfig) -> LeaseInfo | None:
    """The live holder of the job lease (a stream or an operation that needs it stopped), or None."""
    return live_holder(config.lease_uri, JOB, config.lease_ttl_s)
