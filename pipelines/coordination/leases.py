"""Leases that hold across hosts, with fencing: one holder at a time of each lease (`job`, `lifecycle`, `ingest`), and
a holder that lost its lease finds out before it writes.

A lease `<name>` is a series of epoch records `<name>.lease.epoch-<N>` (N zero-padded) in a lease store
(pipelines.coordination.lease_stores: by default `_leases` beside the checkpoint, on its store -- a directory every host
shares, an S3 prefix or an HDFS directory -- or where SESSIONS_LEASE_URI says). The holder is the highest epoch. Acquiring creates epoch N+1, put-if-absent, once epoch N is
released or expired (of two contenders for N+1 exactly one wins); each record names its holder (operation, host,
pid, and the host's boot id and PID namespace) and an expiry the holder's thread renews every TTL/3 by a
compare-and-swap of its own record (anyone else's write in between fences it, never overwritten). Renewing, and
`Lease.check()` (every fenced write calls it first), fail with LeaseLost when a newer epoch exists or when the
holder's own renewals lapsed past the TTL, measured on its monotonic clock (a process resumed after SIGSTOP sees
itself fenced before it writes); a lost lease is never released. Releasing marks the holder's own record released;
records older than the last few epochs are collected. The Delta writers record the epoch in each commit and refuse
to commit under a newer one (pipelines.coordination.fencing).

A holder is judged gone when its record expired, or at once when its pid is dead and the record was written on this
very host, boot and PID namespace (a pid means nothing in another container sharing the host name). A record that
cannot be read (empty: a kill between create and write, a full disk) expires a TTL after it was last written.
What the store must give: pipelines.coordination.lease_stores.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import NoReturn

from pipelines.coordination import kill_point
from pipelines.coordination.lease_stores import LeaseStore, Record, store_for
from pipelines.coordination.liveness import Identity, dead_here, identity, started
from pipelines.errors import LeaseLost, LeaseWaitTimedOut

__all__ = ["Lease", "LeaseHeld", "LeaseInfo", "acquire", "holding", "lease", "live_holder", "waiting_lease"]
log = logging.getLogger(__name__)

KEEP_EPOCHS = 4                # epoch records kept behind the newest (older ones are collected)
MAX_RENEW_INTERVAL_S = 3600.0  # renewals at least this often, whatever the TTL
DEFAULT_WAIT_S = 300.0         # waiting_lease's deadline when the caller names none
Location = LeaseStore | Path | str


@dataclass(frozen=True)
class LeaseInfo:
    what: str
    host: str
    pid: int
    token: str
    expires_at: float
    epoch: int = 0       # 0: a record of the single-file lease format before epochs
    series: str = ""     # the epochs' series (a new one when the lease store was emptied): see Lease.app_id
    boot_id: str = ""    # /proc/sys/kernel/random/boot_id of the holder's host
    pid_ns: str = ""     # the holder's PID namespace (/proc/self/ns/pid)
    started: str = ""    # the holder's process start time (/proc/<pid>/stat): a reused pid is not the holder
    released: bool = False

    def describe(self) -> str:
        return f"{self.what} (pid {self.pid} on {self.host}{f', epoch {self.epoch}' if self.epoch else ''})"

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def parse(cls, data: bytes) -> LeaseInfo | None:
        """The record, or None when it is empty or not one (half-written)."""
        try:
            raw = json.loads(data)
        except ValueError:
            return None
        if not isinstance(raw, dict):
            return None
        known = {f.name for f in fields(cls)}
        try:
            info = cls(**{key: value for key, value in raw.items() if key in known})
        except TypeError:
            return None
        ok = isinstance(info.pid, int) and isinstance(info.expires_at, (int, float)) and isinstance(info.epoch, int)
        return info if ok else None


class LeaseHeld(Exception):
    """Another holder has the lease (its LeaseInfo attached; None when its record cannot be read: `detail` says)."""

    def __init__(self, info: LeaseInfo | None, path: str | Path, detail: str = "") -> None:
        self.info, self.path = info, path
        self.holder = info.describe() if info else (detail or "another process")
        super().__init__(f"{self.holder} holds {path}")


# ---- who is alive --------------------------------------------------------------------------------------------

def _live(record: Record, ttl_s: float) -> tuple[LeaseInfo | None, bool]:
    """The record's holder and whether it still holds (an unreadable record: until a TTL after its last write)."""
    info = LeaseInfo.parse(record.data)
    if info is None:
        return None, record.mtime + ttl_s > time.time()
    gone = dead_here(Identity(info.host, info.boot_id, info.pid_ns), info.pid, info.started)
    return info, not info.released and info.expires_at >= time.time() and not gone


def _unreadable(where: str, record: Record, ttl_s: float) -> str:
    at = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.mtime + ttl_s))
    return (f"an unreadable lease record {where} (its writer died while writing it, or the disk was full; it "
            f"expires at {at}, {ttl_s:g} s after its last change)")


# ---- records --------------------------------------------------------------------------------------------------

def _epoch_name(name: str, epoch: int) -> str:
    return f"{name}.lease.epoch-{epoch:012d}"


def _epochs(store: LeaseStore, name: str) -> list[int]:
    prefix = f"{name}.lease.epoch-"
    return sorted(int(rest) for rest in (n[len(prefix):] for n in store.names(prefix)) if rest.isdigit())


def _series_below(store: LeaseStore, name: str, epochs: list[int]) -> str:
    for epoch in reversed(epochs[-KEEP_EPOCHS:]):
        record = store.read(_epoch_name(name, epoch))
        info = LeaseInfo.parse(record.data) if record else None
        if info and info.series:
            return info.series
    return ""


def _collect(store: LeaseStore, name: str, newest: int) -> None:
    """Remove the records (and leftover temporary files) of epochs older than the last KEEP_EPOCHS."""
    prefix = f"{name}.lease.epoch-"
    try:
        for found in store.names(prefix):
            digits = found[len(prefix):].split(".", 1)[0]
            if digits.isdigit() and int(digits) <= newest - KEEP_EPOCHS:
                store.delete(found)
    except Exception as error:  # noqa: BLE001 -- housekeeping: the next holder collects them
        log.warning("could not collect old %s lease records: %s", name, error)


def _clear_legacy(store: LeaseStore, name: str, ttl_s: float) -> None:
    """A single-file lease `<name>.lease` of the format before epochs (a process of an older version): honoured while
    it lives, removed once it expired."""
    legacy = f"{name}.lease"
    record = store.read(legacy)
    if record is None:
        return
    info = LeaseInfo.parse(record.data)
    if info is None:
        if record.mtime + ttl_s > time.time():
            raise LeaseHeld(None, store.where(legacy), _unreadable(store.where(legacy), record, ttl_s))
    elif info.expires_at >= time.time():
        raise LeaseHeld(info, store.where(legacy))
    store.delete(legacy)


# ---- holding a lease ------------------------------------------------------------------------------------------

class Lease:
    """A held lease: its record (`info`, as LeaseInfo: token, epoch, holder), the thread that renews it, and
    `check()`, which a holder calls before every write that must be its own."""

    def __init__(self, store: LeaseStore, name: str, info: LeaseInfo, ttl_s: float, renewed_at: float) -> None:
        self.store, self.name, self.ttl_s, self.info = store, name, ttl_s, info
        self.token, self.epoch = info.token, info.epoch  # for good (renewals move only the expiry)
        self.where = store.where(f"{name}.lease")
        self._record = _epoch_name(name, info.epoch)
        self._renewed_at = renewed_at  # time.monotonic() just before the last expiry written was computed
        self._lost: LeaseLost | None = None
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._observer: Callable[[float], None] | None = None

    def describe(self) -> str:
        return self.info.describe()

    @property
    def app_id(self) -> str:
        """The Delta application id under which writers record this lease's epoch (pipelines.coordination.fencing). It names the
        series, so a lease store emptied by hand (epochs from 1 again) never makes the tables refuse every writer."""
        return f"sessions.lease.{self.name}.{self.info.series}"

    @property
    def lost(self) -> LeaseLost | None:
        return self._lost

    def fence(self, why: str, newer: int | None = None) -> NoReturn:
        """Mark the lease lost (for good) and raise LeaseLost."""
        with self._mutex:
            if self._lost is None:
                self._lost = LeaseLost(f"the {self.name} lease {self.where} was lost by {self.describe()}: {why}; it "
                                       "wrote nothing after that", self.where, self.epoch, newer)
                log.info("%s", self._lost)
            raise self._lost

    def _lapsed(self) -> None:
        idle = time.monotonic() - self._renewed_at
        if idle <= self.ttl_s:
            return
        why = f"not renewed for {idle:.1f} s, past its TTL of {self.ttl_s:g} s (the process was paused or starved)"
        try:
            newer = self._newest_other()
        except Exception:  # noqa: BLE001 -- the store cannot say who: the lapse alone fences it
            newer = None
        if newer is None:
            self.fence(f"{why}, so another process may hold it now")
        self.fence(f"{why}, and a newer holder took it: {newer[1]}", newer[0])

    def _newest_other(self) -> tuple[int, str] | None:
        """The newest epoch above this one and its holder's description, or None."""
        epochs = [e for e in _epochs(self.store, self.name) if e > self.epoch]
        if not epochs:
            return None
        record = self.store.read(_epoch_name(self.name, epochs[-1]))
        info = LeaseInfo.parse(record.data) if record else None
        return epochs[-1], info.describe() if info else f"epoch {epochs[-1]}"

    def _newer(self) -> None:
        newer = self._newest_other()
        if newer is not None:
            self.fence(f"a newer holder took it: {newer[1]}", newer[0])

    def _own(self) -> Record | None:
        """This epoch's record as stored, while it is still this holder's (its token)."""
        record = self.store.read(self._record)
        info = LeaseInfo.parse(record.data) if record else None
        return record if info is not None and info.token == self.token else None

    def check(self) -> None:
        """Raise LeaseLost unless this is still the newest epoch and its renewals have not lapsed past the TTL."""
        if self._lost is not None:
            raise self._lost
        self._lapsed()
        try:
            self._newer()
        except LeaseLost:
            raise
        except Exception as error:  # noqa: BLE001 -- the store cannot say now: renewed within the TTL, nobody else
            log.debug("could not list the %s lease's epochs (%s): relying on the last renewal", self.name, error)

    def renew(self) -> None:
        """Move the expiry on (the renewal thread calls it every TTL/3); LeaseLost when it was lost."""
        began = time.monotonic()
        self._lapsed()
        self._newer()
        record = self._own()
        if record is None:
            self.fence(f"its record {self.store.where(self._record)} was removed or rewritten by another process")
        renewed = replace(self.info, expires_at=time.time() + self.ttl_s)
        # A compare-and-swap on the version read: a write by anyone else in between fences this holder instead of
        # being overwritten by it.
        if not self.store.swap(self._record, renewed.to_bytes(), record.version):
            self.fence(f"its record {self.store.where(self._record)} was rewritten or removed by another process "
                       "while it renewed")
        with self._mutex:
            if self._lost is None:
                self.info, self._renewed_at = renewed, began
                self._tell(self._observer)

    def observe(self, observer: Callable[[float], None] | None) -> None:
        """`observer(seconds)` now and after every renewal: for how long this holder may still write (the TTL less the
        time since the renewal began, never past the record's expiry) -- a writer outside Python (Spark's JVM) fences
        itself by it. None: no more calls once this returns."""
        with self._mutex:
            self._observer = observer
            if self._lost is None:
                self._tell(observer)

    @property
    def observed(self) -> bool:
        """Whether an observer (observe) is set."""
        return self._observer is not None

    def _tell(self, observer: Callable[[float], None] | None) -> None:
        if observer is None:
            return
        try:
            observer(max(0.0, self.ttl_s - (time.monotonic() - self._renewed_at)))
        except Exception as error:  # noqa: BLE001 -- the renewal stands; the observer's own deadline then runs out
            log.warning("could not pass the %s lease's renewal on (%s)", self.name, error)

    def _renew_loop(self) -> None:
        interval = min(self.ttl_s / 3, MAX_RENEW_INTERVAL_S)
        wait = interval
        while not self._stop.wait(wait):
            try:
                self.renew()
                wait = interval
            except LeaseLost:
                return
            except Exception as error:  # noqa: BLE001 -- the store did not answer: try again sooner
                log.warning("renewing the %s lease failed (%s); retrying", self.name, error)
                wait = interval / 3

    def start_renewing(self) -> None:
        self._renewer = threading.Thread(target=self._renew_loop, daemon=True, name=f"lease-{self.name}")
        self._renewer.start()

    def release(self) -> None:
        """Stop renewing and mark the record released -- unless the lease was lost: then nothing is touched. Once."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if self._lost is not None:
            return
        try:
            self._newer()
            record = self._own()
            if record is not None:  # else: not ours to mark
                self.store.swap(self._record, replace(self.info, released=True, expires_at=time.time()).to_bytes(),
                                record.version)
        except LeaseLost:
            pass
        except Exception as error:  # noqa: BLE001 -- never fail on the way out: the record expires by itself
            log.warning("could not release the %s lease (%s): it expires after %g s", self.name, error, self.ttl_s)


def acquire(location: Location, name: str, what: str, ttl_s: float) -> Lease:
    """Take lease `name` (not yet renewing: see lease()), or raise LeaseHeld naming the holder."""
    store = store_for(location)
    where = store.where(f"{name}.lease")
    for _ in range(5):  # a record collected between the listing and the read: look again
        _clear_legacy(store, name, ttl_s)
        epochs = _epochs(store, name)
        top, series = (epochs[-1] if epochs else 0), ""
        if top:
            record = store.read(_epoch_name(name, top))
            if record is None:
                continue
            info, live = _live(record, ttl_s)
            if live:
                raise LeaseHeld(info, where, _unreadable(store.where(_epoch_name(name, top)), record, ttl_s))
            series = info.series if info else _series_below(store, name, epochs)
        me = identity()
        began = time.monotonic()
        mine = LeaseInfo(what=what, host=me.host, pid=os.getpid(), token=uuid.uuid4().hex,
                         expires_at=time.time() + ttl_s, epoch=top + 1, series=series or uuid.uuid4().hex[:12],
                         boot_id=me.boot_id, pid_ns=me.pid_ns, started=started(os.getpid()))
        if not store.create(_epoch_name(name, top + 1), mine.to_bytes()):
            record = store.read(_epoch_name(name, top + 1))
            raise LeaseHeld(LeaseInfo.parse(record.data) if record else None, where, "a process that took it just now")
        newer = [e for e in _epochs(store, name) if e > top + 1]
        if newer:  # the listing was stale (records below the newest were collected meanwhile): not ours after all
            store.replace(_epoch_name(name, top + 1), replace(mine, released=True).to_bytes())
            record = store.read(_epoch_name(name, newer[-1]))
            raise LeaseHeld(LeaseInfo.parse(record.data) if record else None, where, f"epoch {newer[-1]}")
        kill_point("lease:taken")
        _collect(store, name, top + 1)
        return Lease(store, name, mine, ttl_s, began)
    raise LeaseHeld(None, where, "a holder whose records kept changing while they were read")


@contextmanager
def holding(held: Lease) -> Iterator[Lease]:
    """Renew `held` for the block, then release it (unless lost: then LeaseLost, if the block raised nothing)."""
    held.start_renewing()
    failed = False
    try:
        yield held
    except BaseException:
        failed = True
        raise
    finally:
        held.release()
        if held.lost is not None and not failed:
            raise held.lost  # the block ran to its end, but not alone: say so


@contextmanager
def lease(location: Location, name: str, what: str, ttl_s: float) -> Iterator[Lease]:
    """Hold the lease `name` at `location` (a lease store: a directory or s3://bucket/prefix) for the block, or raise
    LeaseHeld naming the holder. A lease lost during the block raises LeaseLost at its end."""
    with holding(acquire(location, name, what, ttl_s)) as held:
        yield held


@contextmanager
def waiting_lease(location: Location, name: str, what: str, ttl_s: float, *, timeout_s: float | None = None,
                  poll_s: float = 0.2) -> Iterator[Lease]:
    """lease(), waiting while another live holder has it -- at most `timeout_s` (DEFAULT_WAIT_S when None), then
    LeaseWaitTimedOut naming the holder."""
    limit = DEFAULT_WAIT_S if timeout_s is None else timeout_s
    deadline = time.monotonic() + limit
    while True:
        try:
            held = acquire(location, name, what, ttl_s)
            break
        except LeaseHeld as busy:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LeaseWaitTimedOut(
                    f"{what} waited {limit:g} s for the {name} lease {busy.path}, and {busy.holder} still holds it: "
                    f"wait for it to finish (a holder that died lets go within {ttl_s:g} s) and run {what} again",
                    busy.holder, str(busy.path)) from None
            time.sleep(min(poll_s, left))
    with holding(held):
        yield held


def live_holder(location: Location, name: str, ttl_s: float = 60.0) -> LeaseInfo | None:
    """The holder of lease `name` if it is live (not released, not expired, not a dead process here), else None
    (`ttl_s`: how long an unreadable record counts as held)."""
    store = store_for(location)
    legacy = store.read(f"{name}.lease")
    if legacy is not None:
        info = LeaseInfo.parse(legacy.data)
        if info is not None and info.expires_at >= time.time():
            return info
    epochs = _epochs(store, name)
    record = store.read(_epoch_name(name, epochs[-1])) if epochs else None
    if record is None:
        return None
    info, live = _live(record, ttl_s)
    if not live:
        return None
    return info or LeaseInfo(what="unknown (an unreadable lease record)", host="?", pid=0, token="",
                             expires_at=record.mtime + ttl_s, epoch=epochs[-1])
