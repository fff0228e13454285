"""Locks that hold across hosts: a lease file created atomically (O_CREAT | O_EXCL) in the checkpoint's
filesystem, which every host running the job shares. It names its holder (operation, host, pid) and an expiry that
a thread of the holder renews every ttl/3. A lease whose holder is gone is broken: at once when the holder was on
this host and its pid is dead (a kill -9 must not block the next command), after the expiry otherwise."""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class LeaseInfo:
    what: str
    host: str
    pid: int
    token: str
    expires_at: float

    def describe(self) -> str:
        return f"{self.what} (pid {self.pid} on {self.host})"


class LeaseHeld(Exception):
    """Another holder has the lease (its LeaseInfo attached)."""

    def __init__(self, info: LeaseInfo | None, path: Path) -> None:
        super().__init__(f"{info.describe() if info else 'another process'} holds {path}")
        self.info, self.path = info, path


def _read(path: Path) -> LeaseInfo | None:
    try:
        return LeaseInfo(**json.loads(path.read_text()))
    except (FileNotFoundError, ValueError, TypeError):
        return None


def _dead_here(info: LeaseInfo) -> bool:
    if info.host != socket.gethostname():
        return False
    try:
        os.kill(info.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _create(path: Path, info: LeaseInfo) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(asdict(info)))
        handle.flush()
        os.fsync(handle.fileno())
    return True


def _break(path: Path, stale: LeaseInfo) -> None:
    """Move a stale lease aside, but only the very lease found stale (a fresh one put back)."""
    aside = path.with_name(f"{path.name}.broken-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    moved = _read(aside)
    if moved is not None and moved.token != stale.token:  # someone took it in between: give it back
        os.rename(aside, path)
    else:
        aside.unlink(missing_ok=True)


def _renew(path: Path, info: LeaseInfo, ttl_s: float, stop: threading.Event) -> None:
    while not stop.wait(ttl_s / 3):
        current = _read(path)
        if current is None or current.token != info.token:
            return  # broken by someone who judged us dead: nothing of ours to renew
        renewed = LeaseInfo(**{**asdict(info), "expires_at": time.time() + ttl_s})
        tmp = path.with_name(f"{path.name}.{info.token}.tmp")
        tmp.write_text(json.dumps(asdict(renewed)))
        os.replace(tmp, path)


def live_holder(directory: Path, name: str) -> LeaseInfo | None:
    """The holder of lease `name` if it is live (not expired, not a dead process on this host), else None."""
    current = _read(directory / f"{name}.lease")
    if current is None or current.expires_at < time.time() or _dead_here(current):
        return None
    return current


@contextmanager
def lease(directory: Path, name: str, what: str, ttl_s: float) -> Iterator[LeaseInfo]:
    """Hold the lease `name` in `directory` for the block, or raise LeaseHeld naming the holder."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.lease"
    info = LeaseInfo(what=what, host=socket.gethostname(), pid=os.getpid(), token=uuid.uuid4().hex,
                     expires_at=time.time() + ttl_s)
    if not _create(path, info):
        current = _read(path)
        if current is not None and (current.expires_at < time.time() or _dead_here(current)):
            _break(path, current)
            if not _create(path, info):
                raise LeaseHeld(_read(path), path)
        elif current is None:  # half-written by a holder that died mid-create, or just removed
            raise LeaseHeld(None, path)
        else:
            raise LeaseHeld(current, path)
    stop = threading.Event()
    renewer = threading.Thread(target=_renew, args=(path, info, ttl_s, stop), daemon=True, name=f"lease-{name}")
    renewer.start()
    try:
        yield info
    finally:
        stop.set()
        renewer.join()
        current = _read(path)
        if current is not None and current.token == info.token:
            path.unlink(missing_ok=True)


@contextmanager
def waiting_lease(directory: Path, name: str, what: str, ttl_s: float, poll_s: float = 0.2) -> Iterator[LeaseInfo]:
    """lease(), waiting while another live holder has it (its renewals keep it; a dead holder's is broken)."""
    while True:
        try:
            held = lease(directory, name, what, ttl_s)
            info = held.__enter__()
        except LeaseHeld:
            time.sleep(poll_s)
            continue
        try:
            yield info
        except BaseException:
            if not held.__exit__(*sys.exc_info()):
                raise
        else:
            held.__exit__(None, None, None)
        return
