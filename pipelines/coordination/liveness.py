"""Whether a lease holder's process is alive, judged only where its pid means something: the same host name, boot
and PID namespace (containers sharing a host name, with host networking, have separate PID namespaces)."""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from functools import cache

__all__ = ["Identity", "dead_here", "identity", "started"]


def _read_text(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Identity:
    host: str
    boot_id: str  # /proc/sys/kernel/random/boot_id
    pid_ns: str   # /proc/self/ns/pid, as "pid:[inode]"


@cache
def identity() -> Identity:
    """This process's host, boot and PID namespace ("" where /proc does not say: never judged by pid then)."""
    try:
        pid_ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pid_ns = ""
    return Identity(socket.gethostname(), _read_text("/proc/sys/kernel/random/boot_id"), pid_ns)


def proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks) of `pid` in this PID namespace, or None when /proc does not say."""
    after = _read_text(f"/proc/{pid}/stat").rpartition(")")[2].split()
    return (after[0], after[19]) if len(after) > 19 else None


def started(pid: int) -> str:
    stat = proc_stat(pid)
    return stat[1] if stat else ""


def dead_here(where: Identity, pid: int, process_start: str) -> bool:
    """True only when `where` is this very host, boot and PID namespace and process `pid` (started at
    `process_start`, when known) is gone: no such pid, a zombie, or the pid reused by a later process."""
    me = identity()
    if not (where.boot_id and where.pid_ns) or where != me:
        return False  # elsewhere, or unknown: its pid means nothing here; wait for the expiry
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    stat = proc_stat(pid)
    if stat is None:
        return False
    state, began = stat
    return state in ("Z", "X") or bool(process_start and began != process_start)
