"""What must hold before the job touches its checkpoint: the leases (one stream, one lifecycle operation), the
checkpoint's fitness to run (metadata, half-done restores and rescales), the output tables, and stop requests
(how `sessionctl stop` reaches a stream that another process or host runs)."""
from __future__ import annotations

import datetime as dt
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipelines.checkpoint import (
    JobMetadata,
    inspect_checkpoint,
    read_job_metadata,
    read_restore_marker,
    rescale_command,
    write_job_metadata,
)
from pipelines.config import SessionsConfig
from pipelines.errors import (
    CheckpointMismatch,
    CheckpointMissing,
    JobRunning,
    LifecycleBusy,
    RestoreIncomplete,
    StopIncomplete,
)
from pipelines.lease_stores import LeaseStore, store_for
from pipelines.locks import Lease, LeaseHeld, LeaseInfo, acquire, holding, live_holder
from pipelines.operator import StateOperator
from pipelines.operator_registry import for_layout, for_new_checkpoint
from pipelines.runtime import rescale_incomplete
from pipelines.storage import is_s3, storage_options
from pipelines.tables import QUARANTINE_SCHEMA, SESSIONS_SCHEMA, ensure_table, table_rows

JOB, LIFECYCLE = "job", "lifecycle"


@contextmanager
def job_lock(config: SessionsConfig, what: str, name: str = JOB, wait_s: float = 0.0) -> Iterator[Lease]:
    """One process at a time, on any host, may hold each lease at SESSIONS_LEASE_URI (pipelines.locks).

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


def ensure_tables(config: SessionsConfig) -> None:
    if not is_s3(config.warehouse_uri):
        Path(config.warehouse_uri).mkdir(parents=True, exist_ok=True)
    options = storage_options(config, config.warehouse_uri)
    ensure_table(config.sessions_table, SESSIONS_SCHEMA, options)
    ensure_table(config.quarantine_table, QUARANTINE_SCHEMA, options)


def checkpoint_metadata(config: SessionsConfig) -> tuple[JobMetadata, StateOperator]:
    """The checkpoint's job metadata (created for a new checkpoint) and the operator that runs it, decided here once;
    refuses settings that do not fit."""
    marker = read_restore_marker(config.checkpoint)
    if marker is not None:
        raise RestoreIncomplete(
            f"a restore from {marker['savepoint_id']} started at {marker['started_at']} did not finish (the process "
            f"was stopped): finish it with `{marker['command']}` before running the job", next_step=marker["command"])
    finish = rescale_command(inspect_checkpoint(config.checkpoint))
    if finish is not None:
        raise rescale_incomplete(finish)
    meta = read_job_metadata(config.checkpoint)
    if meta is None:
        if table_rows(config.sessions_table, storage_options(config, config.sessions_table)) > 0:
            raise CheckpointMissing(
                f"no checkpoint at {config.checkpoint} but the sessions table already has rows: "
                "restore one with `sessionctl restore --savepoint latest` (a fresh start would write them again)")
        operator = for_new_checkpoint()
        meta = JobMetadata.new(config.gap_ms, config.lateness_ms, config.state_buckets, state_layout=operator.layout)
        write_job_metadata(config.checkpoint, meta)
        return meta, operator
    operator = for_layout(meta.state_layout)  # one line for a layout this build cannot read
    if operator.retired is not None:  # readable, not runnable: refused before Spark starts
        raise CheckpointMismatch(f"{operator.retired} ({config.checkpoint})")
    if (meta.gap_ms, meta.lateness_ms) != (config.gap_ms, config.lateness_ms):
        raise CheckpointMismatch(
            f"the checkpoint was made with gap {meta.gap_ms // 60000} min and lateness {meta.lateness_ms // 60000} "
            f"min; the settings say gap {config.gap_minutes} and lateness {config.lateness_minutes}: restore a "
            f"savepoint with --migrate to change them")
    return meta, operator


# ---- stop requests ---------------------------------------------------------------------------------
# A stop request is a file beside the leases (in the lease store, so any host can write it). It names
# the job lease it is for: the stream holding that lease honours it between batches and answers in a response file
# before it releases the lease; a request for a lease that is gone is stale and ignored by the next stream.

STOP_REQUEST = "stop.request.json"
# An erasure request (`sessionctl forget` beside a running stream): the stream applies it between two batches and
# goes on. It names the user until the stream answers, then it is removed (the answer names only a keyed hash).
ERASE_REQUEST = "erase.request.json"


@dataclass(frozen=True)
class StopRequest:
    token: str
    run_token: str     # the job lease (token) of the stream it asks to stop
    savepoint: bool    # take the savepoint of the last batch as part of the stop
    requested_by: str
    requested_at: str
    erase_user: str | None = None  # an erasure request: the stream erases this user between batches, not stop

    @property
    def response_path_name(self) -> str:
        return f"stop.response-{self.token}.json"

    @property
    def name(self) -> str:
        return ERASE_REQUEST if self.erase_user is not None else STOP_REQUEST


def _store(config: SessionsConfig) -> LeaseStore:
    return store_for(config.lease_uri)


def _write_json(config: SessionsConfig, name: str, payload: dict[str, Any]) -> None:
    _store(config).replace(name, json.dumps(payload, default=str).encode())


def _read_json(config: SessionsConfig, name: str) -> dict[str, Any] | None:
    record = _store(config).read(name)
    if record is None:
        return None
    try:
        found = json.loads(record.data)
    except ValueError:
        return None
    return dict(found) if isinstance(found, dict) else None


def request_stop(config: SessionsConfig, stream: LeaseInfo | Lease, savepoint: bool) -> StopRequest:
    """Ask the stream holding `stream` to stop; a request already made for it is joined, not repeated."""
    current = _read_json(config, STOP_REQUEST)
    if current is not None and current.get("run_token") == stream.token:
        return StopRequest(**current)
    request = StopRequest(token=uuid.uuid4().hex, run_token=stream.token, savepoint=savepoint,
                          requested_by=f"pid {os.getpid()} on {socket.gethostname()}",
                          requested_at=dt.datetime.now(dt.timezone.utc).isoformat())
    _write_json(config, STOP_REQUEST, asdict(request))
    return request


def request_erasure(config: SessionsConfig, stream: LeaseInfo | Lease, user_id: str) -> StopRequest:
    """Ask the stream holding `stream` to erase `user_id` between two batches (one request at a time)."""
    current = _read_json(config, ERASE_REQUEST)
    if current is not None and current.get("run_token") == stream.token and current.get("erase_user") == user_id:
        return StopRequest(**current)
    request = StopRequest(token=uuid.uuid4().hex, run_token=stream.token, savepoint=False,
                          requested_by=f"pid {os.getpid()} on {socket.gethostname()}",
                          requested_at=dt.datetime.now(dt.timezone.utc).isoformat(), erase_user=user_id)
    _write_json(config, ERASE_REQUEST, asdict(request))
    return request


def pending_stop(config: SessionsConfig, run: LeaseInfo | Lease) -> StopRequest | None:
    """The stop request -- or else an erasure request -- for the stream holding lease `run`, if one was made (checked
    between batches)."""
    for name in (STOP_REQUEST, ERASE_REQUEST):
        current = _read_json(config, name)
        if current is not None and current.get("run_token") == run.token:
            return StopRequest(**current)
    return None


def _withdraw(config: SessionsConfig, request: StopRequest) -> None:
    current = _read_json(config, request.name)
    if current is not None and current.get("token") == request.token:
        _store(config).delete(request.name)


def answer_stop(config: SessionsConfig, request: StopRequest, answer: dict[str, Any]) -> None:
    """The stream's answer, written before it releases the job lease; the request is done with."""
    _write_json(config, request.response_path_name, answer)
    _withdraw(config, request)


def take_stop_answer(config: SessionsConfig, request: StopRequest) -> dict[str, Any] | None:
    """The answer to `request` if the stream gave one (the file is removed once read)."""
    answer = _read_json(config, request.response_path_name)
    if answer is not None:
        _store(config).delete(request.response_path_name)
    return answer


def withdraw_stop(config: SessionsConfig, request: StopRequest) -> None:
    """Remove a request nobody will answer (its stream went away), so the next stream does not see it."""
    _withdraw(config, request)


def await_answer(config: SessionsConfig, stream: LeaseInfo, request: StopRequest, patience: float,
                 withdraw_on_timeout: bool) -> dict[str, Any] | None:
    """The stream's answer to `request` (a stop or an erasure), or None when the stream went away without one (the
    request is withdrawn then); StopIncomplete after `patience` seconds (the request stands unless
    `withdraw_on_timeout`)."""
    deadline = time.monotonic() + patience
    while True:
        answer = take_stop_answer(config, request)
        if answer is not None:
            return answer
        holder = running_stream(config)
        if holder is None or holder.token != stream.token:
            answer = take_stop_answer(config, request)  # answered just before it went away
            if answer is None:
                withdraw_stop(config, request)
            return answer
        if time.monotonic() > deadline:
            if withdraw_on_timeout:
                withdraw_stop(config, request)
            what = "take the erasure" if request.erase_user is not None else "stop"
            again = "forget" if request.erase_user is not None else "stop"
            raise StopIncomplete(f"the stream ({stream.describe()}) did not {what} within {patience:g} s: run "
                                 f"`sessionctl {again}` again" + ("" if withdraw_on_timeout else
                                                                  " to wait for it (the request stands)"),
                                 next_step=f"sessionctl {again}")
        time.sleep(0.5)
