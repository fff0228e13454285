"""Erasure: `sessionctl forget --user U` removes a user from everything the product keeps -- raw_events, sessions,
quarantine, the live state and the versions its checkpoint retains, every savepoint, the files of older table
versions (within SESSIONS_ERASURE_DEADLINE_HOURS), the tables' Delta logs (predicates and statistics scrubbed) and
every landed file (pending, still being written or archived; any spelling of the id) -- and `forget --verify` reads
every file under every location the product writes, as an auditor would, and says where U still appears. Events of
U that arrive later are dropped at ingest (the standing erasure, pipelines.ingest.erased.ErasedUsers).

Every step is idempotent, so a forget that was killed is finished by running it again. The live state of a stopped
job is erased by a savepoint, that savepoint erased like every other, and a restore from it (the checkpoint it
replaces, which holds U, is removed); a running stream does the same between two batches when it finds the request
(state_store.stream_control). The erasure log (a Delta table beside the others) records when, what and how many rows,
with a keyed hash of U (HMAC-SHA256, SESSIONS_ERASURE_KEY or a key generated once in $SESSIONS_HOME), never U."""
from __future__ import annotations

import datetime as dt
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow.fs as pafs
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pipelines.config import SessionsConfig
from pipelines.coordination.fencing import fenced_delete
from pipelines.coordination.job_leases import running_stream
from pipelines.coordination.leases import Lease
from pipelines.coordination.requests import await_answer, request_erasure
from pipelines.errors import NoCommittedBatch, Result, SessionsError, StopIncomplete
from pipelines.ingest.erase_lines import erase_landed_lines
from pipelines.ingest.erased import COMPLETE, LOG_TABLE, STARTED, UserSpelling, log_erasure, user_hash
from pipelines.job.checkpoint import inspect_checkpoint, read_restore_marker
from pipelines.job.runtime import get_spark, spark_failures
from pipelines.locations import checkpoint_path, remove_tree
from pipelines.storage import filesystem, join, read_rows, sql_literal, storage_options, table_exists
from state_store.audit import StoreFiles, mentions, scan, scrub_delta_log
from state_store.lifecycle import lifecycle_locks, replaced_checkpoints
from state_store.restore import restore_unlocked
from state_store.savepoint import native
from state_store.savepoint.catalog import SavepointStore
from state_store.savepoint.chain import savepoint_checksum
from state_store.savepoint.damage import damaged_members, table_damage
from state_store.savepoint.take import savepoint_last_batch
from state_store.state import lookup_user

__all__ = ["erasures_recorded", "forget", "forget_unlocked", "verify", "verify_forgotten"]


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
    files: dict[str, int] = field(default_factory=dict)  # location/relative path -> mentions, where found
    unreadable: dict[str, str] = field(default_factory=dict)  # location/relative path -> why: never clean while any


def _erase_rows(config: SessionsConfig, uri: str, user: UserSpelling, *, has_raw: bool, leases: list[Lease]) -> int:
    """Delete U's rows from one Delta table (rows of U, and rejected lines whose raw text names U in any spelling),
    fenced by the job lease where the stream writes; the rows removed. The predicates the log records are scrubbed
    afterwards (state_store.audit.scrub_delta_log)."""
    if not table_exists(config, uri):
        return 0
    options = storage_options(config, uri)
    removed = fenced_delete(uri, f"user_id = {sql_literal(user.user_id)}", leases, options)
    if has_raw:  # the raw column is read once; the (few) rejected lines that name U are deleted by their text
        raw = read_rows(DeltaTable(uri, storage_options=options), columns=["raw"], where="raw IS NOT NULL")["raw"]
        for text in user.matching(raw):
            removed += fenced_delete(uri, f"raw = {sql_literal(text)}", leases, options)
    return removed


def _purge_old_versions(config: SessionsConfig, uri: str) -> int:
    """Files of older versions (the erased rows among them) past the erasure deadline: deleted now."""
    if not table_exists(config, uri):
        return 0
    table = DeltaTable(uri, storage_options=storage_options(config, uri))
    return len(table.vacuum(retention_hours=int(config.erasure_deadline_hours), dry_run=False,
                            enforce_retention_duration=False))


def _erase_savepoints(config: SessionsConfig, spark: SparkSession, user: UserSpelling
                      ) -> tuple[dict[str, int], list[str], list[str]]:
    """U's rows out of every savepoint's state table, its catalog row's count and checksum recomputed in the
    executors: a restore of any of them cannot bring U back. A damaged savepoint (state_store.savepoint.damage) never
    blocks the others: it cannot be restored anyway, so the data files of its own table that name U are deleted and
    it is counted; so are the files of state tables no catalog row names (savepoints killed before they were recorded).
    (counts, the readable tables, the damaged and unrecorded ones)"""
    store = SavepointStore.of(config)
    counts = {"savepoint_rows": 0, "savepoints_changed": 0, "savepoints_damaged": 0, "savepoint_files_removed": 0}
    uris: list[str] = []
    damaged: list[str] = []  # tables whose own log or files are damaged: their logs are scrubbed, never vacuumed
    catalog = store.list()
    checked: dict[str, Any] = {}
    # Oldest first: an incremental savepoint's state resolves through the older tables of its chain, so those are
    # erased before its own count and checksum are recomputed.
    for saved in reversed(catalog):
        if table_damage(store, saved.savepoint_id)[0] is not None:  # its own table cannot be read
            counts["savepoint_files_removed"] += _remove_files_naming(saved.state_uri, user)
            counts["savepoints_damaged"] += 1
            damaged.append(saved.state_uri)
            continue
        if not table_exists(config, saved.state_uri):
            continue
        uris.append(saved.state_uri)
        gone = _erase_rows(config, saved.state_uri, user, has_raw=False, leases=[])
        counts["savepoint_rows"] += gone
        if damaged_members(store, saved, catalog=catalog, checked=checked):
            counts["savepoints_damaged"] += 1  # its chain cannot be resolved: no count or checksum to recompute
            continue
        if gone == 0 and saved.status != "complete":
            continue
        rows, checksum = savepoint_checksum(spark, store, saved.savepoint_id)
        if gone or (rows, checksum) != (saved.rows, saved.checksum):  # a rerun after a kill between the two
            DeltaTable(store.catalog_uri, storage_options=store.options).update(
                updates={"rows": str(rows), "checksum": sql_literal(checksum)},
                predicate=f"savepoint_id = {sql_literal(saved.savepoint_id)}")
            counts["savepoints_changed"] += 1
    # State tables no catalog row names: savepoints killed before they were recorded (none is in flight: a
    # savepoint holds the lifecycle lease this erasure holds). Never restorable; their files that name U go.
    listed = {saved.savepoint_id for saved in catalog}
    fs, root = filesystem(join(store.uri, "state"))
    for info in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True)):
        if info.type == pafs.FileType.Directory and info.base_name not in listed:
            counts["savepoint_files_removed"] += _remove_files_naming(store.state_uri(info.base_name), user)
            damaged.append(store.state_uri(info.base_name))
    return counts, uris, damaged


def _remove_files_naming(uri: str, user: UserSpelling) -> int:
    """The data files of a damaged savepoint table that name U, deleted (its log is scrubbed with the others); the
    files deleted."""
    fs, root = filesystem(uri)
    removed = 0
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
        if info.type != pafs.FileType.File or "/_delta_log/" in info.path:
            continue
        with fs.open_input_stream(info.path) as handle:
            data = handle.read()
        if mentions(info.path, data, user):
            fs.delete_file(info.path)
            removed += 1
    return removed


def erasures_recorded(config: SessionsConfig) -> bool:
    """Whether any erasure was logged (compaction then vacuums within the erasure deadline)."""
    return table_exists(config, config.table_uri(LOG_TABLE))


def _live_rows(spark: SparkSession, config: SessionsConfig, user_id: str) -> int:
    try:
        found = lookup_user(spark, config, user_id)
    except NoCommittedBatch:
        return 0
    return sum(int(s["events"]) for s in found["open_sessions"])


def forget_unlocked(config: SessionsConfig, spark: SparkSession, user_id: str, *, lease: Lease | None = None
                    ) -> ForgetResult:
    """The erasure, for a caller that holds the job and lifecycle leases (the stream stopped, or the run loop between
    two batches); with `lease` (the job lease) its table writes are fenced by it."""
    leases = [lease] if lease else []
    if not user_id:
        raise SessionsError("forget needs a user id: --user U")
    started = time.monotonic()
    user = UserSpelling(user_id)
    hashed = user_hash(config, user_id)
    erasure_id = f"er-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    log_erasure(config, erasure_id=erasure_id, hashed=hashed, status=STARTED, removed={})
    removed: dict[str, int] = {}
    marker = read_restore_marker(config.checkpoint)
    if marker is not None:  # a forget killed inside its restore: finish that restore first
        restore_unlocked(config, marker["savepoint_id"], partitions=None, migrate=True, spark=spark, lease=lease)
    committed = inspect_checkpoint(config.checkpoint).last_committed_batch is not None
    removed["live_state_events"] = _live_rows(spark, config, user_id) if committed else 0
    # The live checkpoint is rebuilt whether or not U is in its current state: the versions it retains (RocksDB
    # changelogs and snapshots, the HDFS provider's delta files) may hold U from earlier batches.
    if committed:
        erased_at = savepoint_last_batch(config, "erasure", spark, native_copy=False)  # every native copy goes below
    erased_savepoints, savepoint_tables, damaged_tables = _erase_savepoints(config, spark, user)
    removed.update(erased_savepoints)
    removed["native_copies"] = _drop_native_copies(config)
    if committed:
        result = restore_unlocked(config, erased_at.savepoint_id, partitions=None, migrate=False, spark=spark, lease=lease)
        if result.previous_checkpoint:  # the replaced checkpoint's state files hold U
            remove_tree(checkpoint_path(result.previous_checkpoint, webhdfs=config.webhdfs_address))
    removed["raw_events"] = _erase_rows(config, config.raw_events_table, user, has_raw=True, leases=leases)
    removed["sessions"] = _erase_rows(config, config.sessions_table, user, has_raw=False, leases=leases)
    removed["quarantine"] = _erase_rows(config, config.quarantine_table, user, has_raw=True, leases=leases)
    removed["landed_lines"] = erase_landed_lines(config, [user_id])
    removed["set_aside_checkpoints"] = _remove_set_aside(config)
    tables = (config.raw_events_table, config.sessions_table, config.quarantine_table, *savepoint_tables)
    purged = sum(_purge_old_versions(config, uri) for uri in tables)
    # Last: the DELETE predicates above and older statistics are in the logs until now.
    removed["log_files_scrubbed"] = sum(scrub_delta_log(uri, [user_id]) for uri in
                                        (*tables, *damaged_tables, SavepointStore.of(config).catalog_uri)
                                        if uri in damaged_tables or table_exists(config, uri))
    log_erasure(config, erasure_id=erasure_id, hashed=hashed, status=COMPLETE, removed=removed)
    return ForgetResult(erasure_id, hashed, removed, purged, round(time.monotonic() - started, 3))


def _drop_native_copies(config: SessionsConfig) -> int:
    """Every savepoint's native copy, dropped: its files are opaque (RocksDB's SSTs may keep a removed user's older
    values), so they cannot be erased row by row; the savepoints stay restorable from their erased canonical rows.
    The catalog first: a kill between the two leaves folders no row names, which a rerun or compaction removes."""
    store = SavepointStore.of(config)
    columns = ("native_files", "native_bytes", "native_checksum")
    store.update_rows([replace(s, native_files=None, native_bytes=None, native_checksum=None)
                       for s in store.list() if s.native_checksum], columns)
    found = native.folders(store.uri)
    for savepoint_id in found:
        native.drop(store.uri, savepoint_id)
    return len(found)


def _remove_set_aside(config: SessionsConfig) -> int:
    """Checkpoints earlier restores set aside hold old state, U's among it: removed."""
    found = replaced_checkpoints(config)
    for path in found:
        remove_tree(path)
    return len(found)


def _places(config: SessionsConfig) -> list[tuple[str, str]]:
    """(place, location) of everything the product writes, the tables first (so their files count under them)."""
    places = [("raw_events", config.raw_events_table), ("sessions", config.sessions_table),
              ("quarantine", config.quarantine_table), ("savepoints", config.savepoint_uri),
              ("checkpoint", str(config.checkpoint)), ("landed_lines", config.landing_uri),
              ("leases", config.lease_uri), ("warehouse", config.warehouse_uri), ("home", str(config.home))]
    return [(place, uri) for place, uri in places if uri]


def verify_forgotten(config: SessionsConfig, spark: SparkSession, user_id: str) -> ForgetVerification:
    """As an auditor would: every file under every location the product writes (tables with every version and their
    logs, savepoints, the checkpoint and those set aside, landing, leases, the home), each read for every spelling
    of U (state_store.audit), and the live state asked through Spark."""
    user = UserSpelling(user_id)
    found: dict[str, int] = {}
    files: dict[str, int] = {}
    unreadable: dict[str, str] = {}
    seen: set[str] = set()
    store_files = StoreFiles(spark)  # state store files are compressed: read decoded, or named as unreadable
    # Checkpoints restores set aside live beside the checkpoint (outside it when the home is elsewhere).
    places = [(place, uri, f"{place}:") for place, uri in _places(config)]
    places += [("set_aside_checkpoints", str(path), f"set_aside:{path.name}/") for path in replaced_checkpoints(config)]
    for place, uri, label in places:
        findings = scan(uri, user, seen=seen, store_files=store_files)
        found[place] = found.get(place, 0) + findings.total()
        files.update({f"{label}{path}": count for path, count in findings.files.items()})
        unreadable.update({f"{label}{path}": why for path, why in findings.unreadable.items()})
    found["live_state_events"] = _live_rows(spark, config, user_id)
    clean = not any(found.values()) and not unreadable
    return ForgetVerification(user_hash(config, user_id), clean, found, files, unreadable)


def forget(config: SessionsConfig, user_id: str, *, spark: SparkSession | None = None,
           timeout_s: float | None = None) -> ForgetResult:
    """Erase U everywhere (see the module docstring). A running stream (any host) is asked to do it between two
    batches and goes on; otherwise it is done here under the job and lifecycle leases."""

    if not user_id:
        raise SessionsError("forget needs a user id: --user U")
    stream = running_stream(config)
    if stream is None or stream.what != "run":
        with lifecycle_locks(config, "forget") as held, spark_failures(config):
            return forget_unlocked(config, spark or get_spark(config), user_id, lease=held)
    request = request_erasure(config, stream=stream, user_id=user_id)
    patience = timeout_s if timeout_s is not None else config.stop_timeout_s * 2
    answer = await_answer(config, stream=stream, request=request, patience_s=patience, withdraw_on_timeout=True)
    if answer is None:
        raise StopIncomplete(f"the stream ({stream.describe()}) went away before it erased the user: run the same "
                             "forget again (with the stream stopped, it runs here)", next_step="run the same forget again")
    if answer.error or not answer.erased:
        raise StopIncomplete(f"the stream could not erase the user ({answer.error}): run the same forget again",
                             next_step="run the same forget again")
    erased = answer.erased
    return ForgetResult(erased["erasure_id"], erased["user_hash"], erased["removed"], erased["purged_files"],
                        erased["seconds"])


def verify(config: SessionsConfig, user_id: str, *, spark: SparkSession | None = None) -> ForgetVerification:

    with spark_failures(config):
        return verify_forgotten(config, spark or get_spark(config), user_id)
