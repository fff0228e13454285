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
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipelines import state_format
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
)
from pipelines.locks import LeaseHeld, LeaseInfo, lease, live_holder
from pipelines.operator import JVM_STATE_LAYOUT, state_layout
from pipelines.runtime import rescale_incomplete
from pipelines.storage import is_s3, storage_options
from pipelines.tables import QUARANTINE_SCHEMA, SESSIONS_SCHEMA, ensure_table, table_rows

JOB, LIFECYCLE = "job", "lifecycle"


@contextmanager
def job_lock(config: SessionsConfig, what: str, name: str = JOB, wait_s: float = 0.0) -> Iterator[LeaseInfo]:
    """One process at a time, on any host, may hold each lease beside the checkpoint (pipelines.locks).

    `job` is held by the running stream and by operations that need it stopped (restore, rescale, catch-up);
    `lifecycle` by every lifecycle operation (savepoints, compaction included), which may run beside the stream
    but never beside another lifecycle operation. With `wait_s`, a held lease is waited for that long."""
    deadline = time.monotonic() + wait_s
    with ExitStack() as stack:
        while True:
            try:
                info = stack.enter_context(lease(config.lease_dir, name, what, config.lease_ttl_s))
                break
            except LeaseHeld as held:
                if time.monotonic() < deadline:
                    time.sleep(0.5)
                    continue
                holder = held.info.describe() if held.info else "another process"
                if name == JOB:
                    raise JobRunning(f"the job is running: {holder} holds {held.path}; {what} needs it stopped: "
                                     f"stop it with `sessionctl stop` (or wait for it)", holder, str(held.path)) from None
                raise LifecycleBusy(f"another lifecycle operation is running: {holder} holds {held.path}; wait for "
                                    f"it and run {what} again", holder, str(held.path)) from None
        yield info


def running_stream(config: SessionsConfig) -> LeaseInfo | None:
    """The live holder of the job lease (a stream or an operation that needs it stopped), or None."""
    return live_holder(config.lease_dir, JOB)


def ensure_tables(config: SessionsConfig) -> None:
    if not is_s3(config.warehouse_uri):
        Path(config.warehouse_uri).mkdir(parents=True, exist_ok=True)
    options = storage_options(config, config.warehouse_uri)
    ensure_table(config.sessions_table, SESSIONS_SCHEMA, options)
    ensure_table(config.quarantine_table, QUARANTINE_SCHEMA, options)


def checkpoint_metadata(config: SessionsConfig) -> JobMetadata:
    """The checkpoint's job metadata, created for a new checkpoint; refuses settings that do not fit."""
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
        meta = JobMetadata.new(config.gap_ms, config.lateness_ms, config.state_buckets,
                               state_layout=state_layout(config.new_checkpoint_operator))
        write_job_metadata(config.checkpoint, meta)
        return meta
    if meta.state_layout not in (state_format.SCHEMA_ID, JVM_STATE_LAYOUT):
        raise CheckpointMismatch(
            f"the checkpoint at {config.checkpoint} holds state in an older layout ({meta.state_layout or 'JSON, v1'}) "
            "that this build cannot run on: restore a savepoint (`sessionctl restore --savepoint latest`; v1 "
            "savepoints are upgraded and the events after them replayed exactly once)")
    if config.operator and meta.state_layout != state_layout(config.operator):  # unset: the checkpoint's own
        made_by = "jvm" if meta.state_layout == JVM_STATE_LAYOUT else "python"
        raise CheckpointMismatch(
            f"the checkpoint at {config.checkpoint} was made by the {made_by} operator and SESSIONS_OPERATOR is "
            f"{config.operator}: set SESSIONS_OPERATOR={made_by}, or restore a savepoint with SESSIONS_OPERATOR="
            f"{config.operator} to move its state to the {config.operator} operator")
    buckets = config.state_buckets if meta.state_layout == state_format.SCHEMA_ID else meta.buckets  # jvm: per user
    if (meta.gap_ms, meta.lateness_ms, meta.buckets) != (config.gap_ms, config.lateness_ms, buckets):
        raise CheckpointMismatch(
            f"the checkpoint was made with gap {meta.gap_ms // 60000} min, lateness {meta.lateness_ms // 60000} min, "
            f"{meta.buckets} buckets; the settings say gap {config.gap_minutes}, lateness {config.lateness_minutes}, "
            f"{config.state_buckets} buckets: restore a savepoint with --migrate to change them")
    return meta


# ---- stop requests ---------------------------------------------------------------------------------
# A stop request is a file beside the leases (the shared checkpoint filesystem, so any host can write it). It names
# the job lease it is for: the stream holding that lease honours it between batches and answers in a response file
# before it releases the lease; a request for a lease that is gone is stale and ignored by the next stream.

STOP_REQUEST = "stop.request.json"


@dataclass(frozen=True)
class StopRequest:
    token: str
    run_token: str     # the job lease (token) of the stream it asks to stop
    savepoint: bool    # take the savepoint of the last batch as part of the stop
    requested_by: str
    requested_at: str

    @property
    def response_path_name(self) -> str:
        return f"stop.response-{self.token}.json"


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps(payload, default=str))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (FileNotFoundError, ValueError):
        return None


def request_stop(config: SessionsConfig, stream: LeaseInfo, savepoint: bool) -> StopRequest:
    """Ask the stream holding `stream` to stop; a request already made for it is joined, not repeated."""
    path = config.lease_dir / STOP_REQUEST
    current = _read_json(path)
    if current is not None and current.get("run_token") == stream.token:
        return StopRequest(**current)
    request = StopRequest(token=uuid.uuid4().hex, run_token=stream.token, savepoint=savepoint,
                          requested_by=f"pid {os.getpid()} on {socket.gethostname()}",
                          requested_at=dt.datetime.now(dt.timezone.utc).isoformat())
    _write_json(path, asdict(request))
    return request


def pending_stop(config: SessionsConfig, run: LeaseInfo) -> StopRequest | None:
    """The stop request for the stream holding lease `run`, if one was made (checked between batches)."""
    current = _read_json(config.lease_dir / STOP_REQUEST)
    if current is None or current.get("run_token") != run.token:
        return None
    return StopRequest(**current)


def answer_stop(config: SessionsConfig, request: StopRequest, answer: dict[str, Any]) -> None:
    """The stream's answer, written before it releases the job lease; the request is done with."""
    _write_json(config.lease_dir / request.response_path_name, answer)
    path = config.lease_dir / STOP_REQUEST
    current = _read_json(path)
    if current is not None and current.get("token") == request.token:
        path.unlink(missing_ok=True)


def take_stop_answer(config: SessionsConfig, request: StopRequest) -> dict[str, Any] | None:
    """The answer to `request` if the stream gave one (the file is removed once read)."""
    path = config.lease_dir / request.response_path_name
    answer = _read_json(path)
    if answer is not None:
        path.unlink(missing_ok=True)
    return answer


def withdraw_stop(config: SessionsConfig, request: StopRequest) -> None:
    """Remove a request nobody will answer (its stream went away), so the next stream does not see it."""
    path = config.lease_dir / STOP_REQUEST
    current = _read_json(path)
    if current is not None and current.get("token") == request.token:
        path.unlink(missing_ok=True)
