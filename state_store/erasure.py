"""Erasure: `sessionctl forget --user U [--user V ...]` removes users from everything the product keeps --
raw_events, sessions, quarantine, the live state and the versions its checkpoint retains, every savepoint, the files
of older table versions (within SESSIONS_ERASURE_DEADLINE_HOURS), the tables' Delta logs (predicates and statistics
scrubbed) and every landed file (pending, still being written or archived; any spelling of the id); `forget
--verify` (state_store.verification) says where U still appears. Events of U that arrive later are dropped at ingest
(the standing erasure, pipelines.ingest.erased.ErasedUsers).

Several users are one erasure that costs about what one user costs: one state rewrite, one DELETE per table (`user_id
IN (...)`), one pass over each landed file, each savepoint and each Delta log; the erasure log still has one row per
user.

Every step is idempotent, so a forget that was killed is finished by running it again. The live state of a stopped
job is erased in place: the state partitions the users are placed in are rewritten without them at the version the
stream resumes from, and every other file of those partitions (the versions they retained) removed -- the stream
resumes at its own position, nothing replayed. A checkpoint of an older layout is rebuilt whole instead: a savepoint,
that savepoint erased like every other, a restore from it. A running stream does the same between two batches when
it finds the request (state_store.stream_control). The erasure log (a Delta table beside the others) records when,
what and how many rows, with a keyed hash of U (HMAC-SHA256, SESSIONS_ERASURE_KEY or a key generated once in
$SESSIONS_HOME), never U."""
from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pipelines.config import SessionsConfig
from pipelines.coordination import kill_point
from pipelines.coordination.fencing import fenced_delete
from pipelines.coordination.job_leases import running_stream
from pipelines.coordination.leases import Lease
from pipelines.coordination.requests import await_answer, request_erasure
from pipelines.errors import Result, StopIncomplete
from pipelines.ingest.erase_lines import erase_landed_lines_of
from pipelines.ingest.erased import COMPLETE, STARTED, UserSpelling, log_erasures, user_hash
from pipelines.job.checkpoint import (
    PROVIDER_CLASSES,
    CheckpointInfo,
    inspect_checkpoint,
    read_restore_marker,
)
from pipelines.job.operators.jvm import STATE_LAYOUT
from pipelines.job.operators.state_writer import erase_state, purge_erased
from pipelines.job.runtime import stop_state_stores
from pipelines.locations import checkpoint_path, remove_tree
from pipelines.storage import filesystem, join, read_rows, sql_literal, storage_options, table_exists
from state_store.audit import StoreFiles, mentions_of, scan_for, scrub_delta_log
from state_store.audit_index import AuditIndex
from state_store.kernel import exclusive, replaced_checkpoints, session
from state_store.restore import restore_unlocked
from state_store.results import Phases
from state_store.savepoint import native
from state_store.savepoint.catalog import SavepointStore
from state_store.savepoint.chain import savepoint_checksum
from state_store.savepoint.damage import damaged_members, table_damage
from state_store.savepoint.take import savepoint_last_batch
from state_store.verification import live_events, state_layout, user_ids_of

__all__ = ["ForgetResult", "UserErased", "forget", "forget_unlocked"]

# The places counted per user (rows, events or lines of that user); the other places of `removed` are the erasure's
# own (savepoints rewritten, native copies and set-aside checkpoints dropped, log files scrubbed).
PER_USER = ("live_state_events", "savepoint_rows", "raw_events", "sessions", "quarantine", "landed_lines")


@dataclass(frozen=True)
class UserErased(Result):
    """One user of an erasure: its keyed hash (never the id) and its rows, events or lines removed per place
    (PER_USER)."""
    user_hash: str
    removed: dict[str, int]


@dataclass(frozen=True)
class ForgetResult(Result):
    """What `sessionctl forget --user U [--user V ...]` prints: rows removed per place, for all the users together, and
    per user in `users` (in the order given; never an id)."""
    erasure_id: str
    user_hash: str          # the (first) user's keyed hash: the only one of a single-user erasure
    removed: dict[str, int]  # PER_USER places summed over the users, and the erasure's own places
    purged_files: int      # files of older table versions deleted now (the rest within the deadline)
    seconds: float
    users: list[UserErased] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per step, in the order they ran

    @classmethod
    def from_dict(cls, found: Mapping[str, Any]) -> ForgetResult:
        """A ForgetResult from its to_dict() (a running stream's answer)."""
        return cls(found["erasure_id"], found["user_hash"], dict(found["removed"]), found["purged_files"],
                   found["seconds"], [UserErased(u["user_hash"], dict(u["removed"])) for u in found.get("users", [])],
                   dict(found.get("phases", {})))


def _in_list(users: Sequence[UserSpelling]) -> str:
    return ", ".join(sql_literal(user.user_id) for user in users)


def _erase_rows(config: SessionsConfig, uri: str, users: Sequence[UserSpelling], *, has_raw: bool,
                leases: list[Lease]) -> dict[str, int]:
    """Delete the users' rows from one Delta table in one DELETE (`user_id IN (...)`; and with `has_raw` one more for
    the rejected lines whose raw text names one of them in any spelling), fenced by the job lease where the stream
    writes; the rows removed per user. The predicates the log records are scrubbed afterwards
    (state_store.audit.scrub_delta_log)."""
    removed = dict.fromkeys((user.user_id for user in users), 0)
    if not table_exists(config, uri) or not users:
        return removed
    options = storage_options(config, uri)
    predicate = f"user_id IN ({_in_list(users)})"
    if len(users) == 1:  # the DELETE's own count is the user's: no read before it
        removed[users[0].user_id] = fenced_delete(uri, predicate, leases, options)
    else:
        found = read_rows(DeltaTable(uri, storage_options=options), columns=["user_id"], where=predicate)["user_id"]
        if len(found):
            for item in pc.value_counts(found).to_pylist():
                removed[item["values"]] += item["counts"]
            fenced_delete(uri, predicate, leases, options)
    if has_raw:  # the raw column is read once; the (few) rejected lines that name a user are deleted by their text
        raw = read_rows(DeltaTable(uri, storage_options=options), columns=["raw"], where="raw IS NOT NULL")["raw"]
        texts: dict[str, str] = {}
        for user in users:
            for text in user.matching(raw):
                texts.setdefault(text, user.user_id)
        if texts:
            named = pc.filter(raw, pc.is_in(raw, value_set=pa.array(list(texts), pa.string())))
            for item in pc.value_counts(named).to_pylist():
                removed[texts[item["values"]]] += item["counts"]
            fenced_delete(uri, f"raw IN ({', '.join(sql_literal(text) for text in texts)})", leases, options)
    return removed


def _purge_old_versions(config: SessionsConfig, uri: str) -> int:
    """Files of older versions (the erased rows among them) past the erasure deadline: deleted now."""
    if not table_exists(config, uri):
        return 0
    table = DeltaTable(uri, storage_options=storage_options(config, uri))
    return len(table.vacuum(retention_hours=int(config.erasure_deadline_hours), dry_run=False,
                            enforce_retention_duration=False))


def _erase_savepoints(config: SessionsConfig, spark: SparkSession, users: Sequence[UserSpelling]
                      ) -> tuple[dict[str, int], dict[str, int], list[str], list[str]]:
    """The users' rows out of every savepoint's state table (one DELETE each), its catalog row's count and checksum
    recomputed in the executors: a restore of any of them cannot bring a user back. A damaged savepoint
    (state_store.savepoint.damage) never blocks the others: it cannot be restored anyway, so the data files of its own
    table that name a user are deleted and it is counted; so are the files of state tables no catalog row names
    (savepoints killed before they were recorded). (counts, rows per user, the readable tables, the damaged and
    unrecorded ones)"""
    store = SavepointStore.of(config)
    counts = {"savepoint_rows": 0, "savepoints_changed": 0, "savepoints_damaged": 0, "savepoint_files_removed": 0}
    per_user = dict.fromkeys((user.user_id for user in users), 0)
    uris: list[str] = []
    damaged: list[str] = []  # tables whose own log or files are damaged: their logs are scrubbed, never vacuumed
    catalog = store.list()
    checked: dict[str, Any] = {}
    # Oldest first: an incremental savepoint's state resolves through the older tables of its chain, so those are
    # erased before its own count and checksum are recomputed.
    for saved in reversed(catalog):
        if table_damage(store, saved.savepoint_id)[0] is not None:  # its own table cannot be read
            counts["savepoint_files_removed"] += _remove_files_naming(saved.state_uri, users)
            counts["savepoints_damaged"] += 1
            damaged.append(saved.state_uri)
            continue
        if not table_exists(config, saved.state_uri):
            continue
        uris.append(saved.state_uri)
        erased = _erase_rows(config, saved.state_uri, users, has_raw=False, leases=[])
        gone = sum(erased.values())
        for user_id, rows in erased.items():
            per_user[user_id] += rows
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
    # savepoint holds the lifecycle lease this erasure holds). Never restorable; their files that name a user go.
    listed = {saved.savepoint_id for saved in catalog}
    fs, root = filesystem(join(store.uri, "state"))
    for info in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True)):
        if info.type == pafs.FileType.Directory and info.base_name not in listed:
            counts["savepoint_files_removed"] += _remove_files_naming(store.state_uri(info.base_name), users)
            damaged.append(store.state_uri(info.base_name))
    return counts, per_user, uris, damaged


def _remove_files_naming(uri: str, users: Sequence[UserSpelling]) -> int:
    """The data files of a damaged savepoint table that name one of the users, deleted (its log is scrubbed with the
    others); the files deleted."""
    fs, root = filesystem(uri)
    removed = 0
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
        if info.type != pafs.FileType.File or "/_delta_log/" in info.path:
            continue
        with fs.open_input_stream(info.path) as handle:
            data = handle.read()
        if any(mentions_of(info.path, data, users).values()):
            fs.delete_file(info.path)
            removed += 1
    return removed


def _checkpoint_names(config: SessionsConfig, spark: SparkSession, users: Sequence[UserSpelling]) -> set[str]:
    """The files of the live checkpoint (relative paths) that name one of the users, or cannot be read (then they
    may); a large file the audit's index says names none of them is not read."""
    with AuditIndex(config.home) as index:
        findings = scan_for(str(config.checkpoint), users, store_files=StoreFiles(spark), index=index)
    return {path for found in findings.values() for path in (*found.files, *found.unreadable)}


def _erase_in_place(config: SessionsConfig, spark: SparkSession, user_ids: Sequence[str], info: CheckpointInfo
                    ) -> int | None:
    """The users erased from the live state where it is (pipelines.job.operators.state_writer.erase_state): only the
    state partitions they are placed in are rewritten, at the version the stream resumes from, and everything else
    those partitions held -- older versions, changelogs, SSTs, an uncommitted newer version -- is removed. Returns the
    partitions rewritten; None where the checkpoint's layout is not the one keyed by user (then the whole state is
    rebuilt)."""
    if state_layout(config) != STATE_LAYOUT or info.provider not in PROVIDER_CLASSES or not info.partitions \
            or info.last_committed_batch is None:
        return None
    stop_state_stores(spark)  # a provider this JVM holds would serve its loaded version, users and all
    try:
        rewritten = erase_state(spark, config.checkpoint, user_ids, partitions=info.partitions,
                                version=info.last_committed_batch + 1, provider_class=PROVIDER_CLASSES[info.provider])
        kill_point("forget:state-installed")
        purge_erased(spark, config.checkpoint, rewritten)
    finally:
        stop_state_stores(spark)
    return len(rewritten)


def forget_unlocked(config: SessionsConfig, spark: SparkSession, users: str | Sequence[str], *,
                    lease: Lease | None = None) -> ForgetResult:
    """The erasure of one user or several at once, for a caller that holds the job and lifecycle leases (the stream
    stopped, or the run loop between two batches); with `lease` (the job lease) its table writes are fenced by it."""
    leases = [lease] if lease else []
    ids = user_ids_of(users)
    started = time.monotonic()
    phase = Phases(started)
    spelled = [UserSpelling(user_id) for user_id in ids]
    hashes = [user_hash(config, user_id) for user_id in ids]
    erasure_id = f"er-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    log_erasures(config, erasure_id=erasure_id, status=STARTED, rows=[(hashed, {}) for hashed in hashes])
    phase("log_started")
    per_user: dict[str, dict[str, int]] = {place: dict.fromkeys(ids, 0) for place in PER_USER}
    removed: dict[str, int] = {}
    named: set[str] = set()
    marker = read_restore_marker(config.checkpoint)
    if marker is not None:  # a forget killed inside its restore: finish that restore first
        restore_unlocked(config, marker["savepoint_id"], partitions=None, migrate=True, spark=spark, lease=lease)
    info = inspect_checkpoint(config.checkpoint)
    committed = info.last_committed_batch is not None
    if committed:
        per_user["live_state_events"] = live_events(spark, config, ids)
        phase("live_state_asked")
    # The live state is rewritten (once for all users) when a user is in its current state, or when one of its files
    # names a user: the versions it retains (RocksDB changelogs and snapshots, the HDFS provider's delta files) may
    # hold them from earlier batches. A checkpoint none of whose files names any of them, read as `forget --verify`
    # reads it, is left as it is: no rewrite for users it never held or no longer holds in any file.
    if committed and not any(per_user["live_state_events"].values()):
        named = _checkpoint_names(config, spark, spelled)
        phase("checkpoint_scanned")
    rebuild = committed and (any(per_user["live_state_events"].values()) or bool(named))
    removed["state_rebuilt"] = int(rebuild)
    # In place where only state files name the users (the rest of a checkpoint -- logs, offsets, metadata -- holds no
    # user id); else, or in an older layout, the whole state is rebuilt: an erasure savepoint and a restore from it.
    only_state = all(path.startswith("state/") for path in named)
    rewritten = _erase_in_place(config, spark, ids, info) if rebuild and only_state else None
    in_place = rewritten is not None
    if rewritten is not None:
        removed["state_partitions_rewritten"] = rewritten
        phase("state_rewritten")
    if rebuild and not in_place:
        erased_at = savepoint_last_batch(config, "erasure", spark, native_copy=False)  # every native copy goes below
    erased_savepoints, per_user["savepoint_rows"], savepoint_tables, damaged_tables = \
        _erase_savepoints(config, spark, spelled)
    removed.update(erased_savepoints)
    removed["native_copies"] = _drop_native_copies(config)
    phase("savepoints_erased")
    if rebuild and not in_place:
        result = restore_unlocked(config, erased_at.savepoint_id, partitions=None, migrate=False, spark=spark, lease=lease)
        if result.previous_checkpoint:  # the replaced checkpoint's state files hold the users
            remove_tree(checkpoint_path(result.previous_checkpoint, webhdfs=config.webhdfs_address))
        phase("state_restored")
    per_user["raw_events"] = _erase_rows(config, config.raw_events_table, spelled, has_raw=True, leases=leases)
    kill_point("forget:rows-erased")
    per_user["sessions"] = _erase_rows(config, config.sessions_table, spelled, has_raw=False, leases=leases)
    per_user["quarantine"] = _erase_rows(config, config.quarantine_table, spelled, has_raw=True, leases=leases)
    phase("tables_erased")
    per_user["landed_lines"] = erase_landed_lines_of(config, ids)
    phase("landed_lines_erased")
    removed["set_aside_checkpoints"] = _remove_set_aside(config)
    tables = (config.raw_events_table, config.sessions_table, config.quarantine_table, *savepoint_tables)
    purged = sum(_purge_old_versions(config, uri) for uri in tables)
    phase("old_versions_purged")
    # Last: the DELETE predicates above and older statistics are in the logs until now.
    removed["log_files_scrubbed"] = sum(scrub_delta_log(uri, ids) for uri in
                                        (*tables, *damaged_tables, SavepointStore.of(config).catalog_uri)
                                        if uri in damaged_tables or table_exists(config, uri))
    phase("logs_scrubbed")
    users_erased = [UserErased(hashed, {place: per_user[place][user_id] for place in PER_USER})
                    for user_id, hashed in zip(ids, hashes)]
    removed.update({place: sum(per_user[place].values()) for place in PER_USER})
    shared = {place: count for place, count in removed.items() if place not in PER_USER}
    log_erasures(config, erasure_id=erasure_id, status=COMPLETE,
                 rows=[(user.user_hash, {**shared, **user.removed, "users_erased": len(ids)}) for user in users_erased])
    phase("log_completed")
    return ForgetResult(erasure_id, hashes[0], _in_order(removed), purged, round(time.monotonic() - started, 3),
                        users_erased, phase.seconds)


def _in_order(removed: dict[str, int]) -> dict[str, int]:
    """The places as a single-user erasure always listed them."""
    order = ("live_state_events", "state_rebuilt", "savepoint_rows", "savepoints_changed", "savepoints_damaged",
             "savepoint_files_removed", "native_copies", "raw_events", "sessions", "quarantine", "landed_lines",
             "set_aside_checkpoints", "log_files_scrubbed")
    return {place: removed[place] for place in (*order, *sorted(set(removed) - set(order))) if place in removed}


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


def forget(config: SessionsConfig, users: str | Sequence[str], *, spark: SparkSession | None = None,
           timeout_s: float | None = None) -> ForgetResult:
    """Erase one user or several everywhere (see the module docstring), several at about the cost of one. A running
    stream (any host) is asked to do it between two batches and goes on; otherwise it is done here under the job and
    lifecycle leases."""
    ids = user_ids_of(users)
    stream = running_stream(config)
    if stream is None or stream.what != "run":
        with exclusive(config, "forget") as held:
            return forget_unlocked(config, session(config, spark), ids, lease=held)
    request = request_erasure(config, stream=stream, user_ids=ids)
    patience = timeout_s if timeout_s is not None else config.stop_timeout_s * 2
    answer = await_answer(config, stream=stream, request=request, patience_s=patience, withdraw_on_timeout=True)
    whom = "the user" if len(ids) == 1 else f"the {len(ids)} users"
    if answer is None:
        raise StopIncomplete(f"the stream ({stream.describe()}) went away before it erased {whom}: run the same "
                             "forget again (with the stream stopped, it runs here)", next_step="run the same forget again")
    if answer.error or not answer.erased:
        raise StopIncomplete(f"the stream could not erase {whom} ({answer.error}): run the same forget again",
                             next_step="run the same forget again")
    return ForgetResult.from_dict(answer.erased)
