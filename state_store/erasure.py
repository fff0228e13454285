"""Erasure: `sessionctl forget --user U` removes a user from everything the product keeps -- raw_events, sessions,
quarantine, the live state, every savepoint, the files of older table versions (within SESSIONS_ERASURE_DEADLINE_HOURS)
and the archived landing files -- and `forget --verify` says where U still appears.

Every step is idempotent, so a forget that was killed is finished by running it again. The live state of a stopped
job is erased by a savepoint, that savepoint erased like every other, and a restore from it (the checkpoint it
replaces, which holds U, is removed); a running stream does the same between two batches when it finds the request
(state_store.stream_control). The erasure log (a Delta table beside the others) records when, what and how many rows,
with a keyed hash of U (HMAC-SHA256, SESSIONS_ERASURE_KEY or a key generated once in $SESSIONS_HOME), never U."""
from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from pipelines.checkpoint import inspect_checkpoint, read_restore_marker
from pipelines.config import SessionsConfig
from pipelines.errors import NoCommittedBatch, SessionsError, StopIncomplete
from pipelines.fencing import fenced_delete
from pipelines.ingest.landing import INGESTED_DIR
from pipelines.locks import Lease
from pipelines.results import Result
from pipelines.storage import filesystem, join, read_rows, sql_literal, storage_options, table_exists
from state_store.lifecycle import replaced_checkpoints
from state_store.restoring import restore_unlocked
from state_store.savepoint_chain import savepoint_checksum
from state_store.savepointing import savepoint_last_batch
from state_store.savepoints import SavepointStore
from state_store.state import lookup_user

KEY_FILE = "erasure.key"
LOG_TABLE = "erasure_log"
LOG_SCHEMA = pa.schema([("erasure_id", pa.string()), ("user_hash", pa.string()), ("status", pa.string()),
                        ("at", pa.timestamp("us", tz="UTC")), ("removed", pa.string()),
                        ("deadline_hours", pa.float64())])


@dataclass(frozen=True)
class ForgetResult(Result):
    """What `sessionctl forget --user U` prints: rows removed per place (never U itself)."""
    erasure_id: str
    user_hash: str
    removed: dict[str, int]
    purged_files: int      # files of older table versions deleted now (the rest within the deadline)
    seconds: float


@dataclass(frozen=True)
class ForgetVerification(Result):
    """What `sessionctl forget --verify --user U` prints: where U still appears (place -> rows, lines or files)."""
    user_hash: str
    clean: bool
    found: dict[str, int]


def user_hash(config: SessionsConfig, user_id: str) -> str:
    """The keyed hash the erasure log records instead of U."""
    key = config.erasure_key.encode()
    if not key:
        path = config.home / KEY_FILE
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_hex(32))
        key = path.read_text().strip().encode()
    return "hmac-sha256:" + hmac.new(key, user_id.encode(), hashlib.sha256).hexdigest()


def _raw_pattern(user_id: str) -> str:
    """A rejected line that still names U as its user_id (its raw text is kept for the operator)."""
    return r'"user_id"\s*:\s*' + re.escape(json.dumps(user_id))


def _erase_rows(config: SessionsConfig, uri: str, user_id: str, has_raw: bool, leases: list[Lease]) -> int:
    """Delete U's rows from one Delta table (rows of U, and rejected lines whose raw text names U), fenced by the job
    lease where the stream writes; the rows removed."""
    if not table_exists(config, uri):
        return 0
    options = storage_options(config, uri)
    removed = fenced_delete(uri, f"user_id = {sql_literal(user_id)}", leases, options)
    if has_raw:  # the raw column is read once; the (few) rejected lines that name U are deleted by their text
        raw = pc.fill_null(read_rows(DeltaTable(uri, storage_options=options), ["raw"])["raw"], "")
        for text in set(pc.filter(raw, pc.match_substring_regex(raw, _raw_pattern(user_id))).to_pylist()):
            removed += fenced_delete(uri, f"raw = {sql_literal(text)}", leases, options)
    return removed


def _purge_old_versions(config: SessionsConfig, uri: str) -> int:
    """Files of older versions (the erased rows among them) past the erasure deadline: deleted now."""
    if not table_exists(config, uri):
        return 0
    table = DeltaTable(uri, storage_options=storage_options(config, uri))
    return len(table.vacuum(retention_hours=int(config.erasure_deadline_hours), dry_run=False,
                            enforce_retention_duration=False))


def _erase_savepoints(config: SessionsConfig, spark: SparkSession, user_id: str) -> tuple[int, int, list[str]]:
    """U's rows out of every savepoint's state table, its catalog row's count and checksum recomputed in the
    executors: a restore of any of them cannot bring U back. (rows removed, savepoints changed, their tables)"""
    store = SavepointStore.of(config)
    removed = changed = 0
    uris = []
    # Oldest first: an incremental savepoint's state resolves through the older tables of its chain, so those are
    # erased before its own count and checksum are recomputed.
    for saved in reversed(store.list()):
        if not table_exists(config, saved.state_uri):
            continue
        uris.append(saved.state_uri)
        gone = _erase_rows(config, saved.state_uri, user_id, has_raw=False, leases=[])
        if gone == 0 and saved.status != "complete":
            continue
        rows, checksum = savepoint_checksum(spark, store, saved.savepoint_id)
        if gone or (rows, checksum) != (saved.rows, saved.checksum):  # a rerun after a kill between the two
            DeltaTable(store.catalog_uri, storage_options=store.options).update(
                updates={"rows": str(rows), "checksum": sql_literal(checksum)},
                predicate=f"savepoint_id = {sql_literal(saved.savepoint_id)}")
            changed += 1
        removed += gone
    return removed, changed, uris


def _archived_files(config: SessionsConfig) -> Iterator[tuple[pafs.FileSystem, str]]:
    fs, root = filesystem(join(config.landing_uri, INGESTED_DIR))
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return
    for info in infos:
        if info.type == pafs.FileType.File and not info.base_name.startswith("_"):
            yield fs, info.path


def _user_lines(data: bytes, user_id: str) -> list[tuple[int, int]]:
    """(start, end) of each line of an archived landing file whose user_id is U (as the ingest rules read it)."""
    spans, start = [], 0
    needle = user_id.encode()
    for line in data.split(b"\n"):
        end = start + len(line)
        if needle in line:
            try:
                event = json.loads(line)
            except ValueError:
                event = None
            if (isinstance(event, dict) and event.get("user_id") == user_id) or \
                    re.search(_raw_pattern(user_id).encode(), line):
                spans.append((start, end))
        start = end + 1
    return spans


def _erase_landed(config: SessionsConfig, user_id: str, count_only: bool = False) -> int:
    """U's lines in archived landing files overwritten with spaces: the same size and line count, so the ingest
    positions kept for them stay true (a blank line is no event)."""
    found = 0
    for fs, path in _archived_files(config):
        with fs.open_input_stream(path) as handle:
            data = handle.read()
        spans = _user_lines(data, user_id)
        found += len(spans)
        if spans and not count_only:
            cleaned = bytearray(data)
            for start, end in spans:
                cleaned[start:end] = b" " * (end - start)
            with fs.open_output_stream(path) as handle:
                handle.write(bytes(cleaned))
    return found


def _log(config: SessionsConfig, erasure_id: str, hashed: str, status: str, removed: dict[str, int]) -> None:
    uri = config.table_uri(LOG_TABLE)
    row = {"erasure_id": erasure_id, "user_hash": hashed, "status": status, "at": dt.datetime.now(dt.timezone.utc),
           "removed": json.dumps(removed, sort_keys=True), "deadline_hours": float(config.erasure_deadline_hours)}
    write_deltalake(uri, pa.Table.from_pylist([row], schema=LOG_SCHEMA), mode="append",
                    storage_options=storage_options(config, uri))


def erasures_recorded(config: SessionsConfig) -> bool:
    """Whether any erasure was logged (compaction then vacuums within the erasure deadline)."""
    return table_exists(config, config.table_uri(LOG_TABLE))


def _live_rows(spark: SparkSession, config: SessionsConfig, user_id: str) -> int:
    try:
        found = lookup_user(spark, config, user_id)
    except NoCommittedBatch:
        return 0
    return sum(int(s["events"]) for s in found["open_sessions"])


def forget_unlocked(config: SessionsConfig, spark: SparkSession, user_id: str, lease: Lease | None = None
                    ) -> ForgetResult:
    """The erasure, for a caller that holds the job and lifecycle leases (the stream stopped, or the run loop between
    two batches); with `lease` (the job lease) its table writes are fenced by it."""
    leases = [lease] if lease else []
    if not user_id:
        raise SessionsError("forget needs a user id: --user U")
    started = time.monotonic()
    hashed = user_hash(config, user_id)
    erasure_id = f"er-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    _log(config, erasure_id, hashed, "started", {})
    removed: dict[str, int] = {}
    marker = read_restore_marker(config.checkpoint)
    if marker is not None:  # a forget killed inside its restore: finish that restore first
        restore_unlocked(config, marker["savepoint_id"], None, True, spark, lease=lease)
    live = _live_rows(spark, config, user_id) if inspect_checkpoint(config.checkpoint).last_committed_batch is not None \
        else 0
    removed["live_state_events"] = live
    if live:
        erased_at = savepoint_last_batch(config, "erasure", spark)
    removed["savepoint_rows"], removed["savepoints_changed"], savepoint_tables = _erase_savepoints(config, spark,
                                                                                                   user_id)
    if live:
        result = restore_unlocked(config, erased_at.savepoint_id, None, False, spark, lease=lease)
        if result.previous_checkpoint:  # the replaced checkpoint's state files hold U
            _remove(Path(result.previous_checkpoint))
    removed["raw_events"] = _erase_rows(config, config.raw_events_table, user_id, True, leases)
    removed["sessions"] = _erase_rows(config, config.sessions_table, user_id, False, leases)
    removed["quarantine"] = _erase_rows(config, config.quarantine_table, user_id, True, leases)
    removed["landed_lines"] = _erase_landed(config, user_id)
    removed["set_aside_checkpoints"] = _remove_set_aside(config)
    purged = sum(_purge_old_versions(config, uri) for uri in
                 (config.raw_events_table, config.sessions_table, config.quarantine_table, *savepoint_tables))
    _log(config, erasure_id, hashed, "complete", removed)
    return ForgetResult(erasure_id, hashed, removed, purged, round(time.monotonic() - started, 3))


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _remove_set_aside(config: SessionsConfig) -> int:
    """Checkpoints earlier restores set aside hold old state, U's among it: removed."""
    found = replaced_checkpoints(config)
    for path in found:
        _remove(path)
    return len(found)


def _count_in_files(config: SessionsConfig, uri: str, user_id: str) -> int:
    """U's rows in every data file under a table's directory -- current and older versions alike (file by file: files
    delta-rs rewrote may type strings as views)."""
    if not table_exists(config, uri):
        return 0
    fs, root = filesystem(uri)
    found = 0
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        if info.type != pafs.FileType.File or not info.path.endswith(".parquet") or "/_delta_log/" in info.path:
            continue
        with fs.open_input_file(info.path) as handle:
            data = pq.ParquetFile(handle)
            columns = [name for name in ("user_id", "raw") if name in data.schema_arrow.names]
            table = data.read(columns=columns)
        if "user_id" in columns:
            found += int(pc.sum(pc.equal(table["user_id"].cast(pa.string()), user_id)).as_py() or 0)
        if "raw" in columns:
            raw = pc.fill_null(table["raw"].cast(pa.string()), "")
            found += int(pc.sum(pc.match_substring_regex(raw, _raw_pattern(user_id))).as_py() or 0)
    return found


def _set_aside_since_erasure(config: SessionsConfig, hashed: str) -> list[Path]:
    """Checkpoints set aside before U's last completed erasure (that erasure removed those it found; one set aside
    later was made after it) -- all of them when U was never erased."""
    erased_at = None
    uri = config.table_uri(LOG_TABLE)
    if table_exists(config, uri):
        log = read_rows(DeltaTable(uri, storage_options=storage_options(config, uri))).to_pylist()
        done = [row["at"] for row in log if row["user_hash"] == hashed and row["status"] == "complete"]
        erased_at = max(done) if done else None
    found = []
    for path in replaced_checkpoints(config):
        stamp = path.name.rsplit("-", 1)[-1]
        try:
            set_aside = dt.datetime.strptime(stamp, "%Y%m%dT%H%M%S%f").replace(tzinfo=dt.timezone.utc)
        except ValueError:
            set_aside = None
        if erased_at is None or set_aside is None or set_aside < erased_at:
            found.append(path)
    return found


def verify_forgotten(config: SessionsConfig, spark: SparkSession, user_id: str) -> ForgetVerification:
    """Every place U could be, scanned: table files of every version, savepoint files, the live state, archived
    landing files, checkpoints set aside."""
    found = {
        "raw_events": _count_in_files(config, config.raw_events_table, user_id),
        "sessions": _count_in_files(config, config.sessions_table, user_id),
        "quarantine": _count_in_files(config, config.quarantine_table, user_id),
        "savepoints": sum(_count_in_files(config, saved.state_uri, user_id)
                          for saved in SavepointStore.of(config).list()),
        "live_state_events": _live_rows(spark, config, user_id),
        "landed_lines": _erase_landed(config, user_id, count_only=True),
        "set_aside_checkpoints": len(_set_aside_since_erasure(config, user_hash(config, user_id))),
    }
    return ForgetVerification(user_hash(config, user_id), not any(found.values()), found)


def forget(config: SessionsConfig, user_id: str, spark: SparkSession | None = None,
           timeout_s: float | None = None) -> ForgetResult:
    """Erase U everywhere (see the module docstring). A running stream (any host) is asked to do it between two
    batches and goes on; otherwise it is done here under the job and lifecycle leases."""
    from pipelines.guards import await_answer, request_erasure, running_stream
    from pipelines.runtime import get_spark, spark_failures
    from state_store.lifecycle import lifecycle_locks

    if not user_id:
        raise SessionsError("forget needs a user id: --user U")
    stream = running_stream(config)
    if stream is None or stream.what != "run":
        with lifecycle_locks(config, "forget") as held, spark_failures(config):
            return forget_unlocked(config, spark or get_spark(config), user_id, lease=held)
    request = request_erasure(config, stream, user_id)
    answer = await_answer(config, stream, request, timeout_s if timeout_s is not None else config.stop_timeout_s * 2,
                          withdraw_on_timeout=True)
    if answer is None:
        raise StopIncomplete(f"the stream ({stream.describe()}) went away before it erased the user: run the same "
                             "forget again (with the stream stopped, it runs here)", next_step="run the same forget again")
    if answer.get("error") or not answer.get("erased"):
        raise StopIncomplete(f"the stream could not erase the user ({answer.get('error')}): run the same forget again",
                             next_step="run the same forget again")
    erased = answer["erased"]
    return ForgetResult(erased["erasure_id"], erased["user_hash"], erased["removed"], erased["purged_files"],
                        erased["seconds"])


def verify(config: SessionsConfig, user_id: str, spark: SparkSession | None = None) -> ForgetVerification:
    from pipelines.runtime import get_spark, spark_failures

    with spark_failures(config):
        return verify_forgotten(config, spark or get_spark(config), user_id)
