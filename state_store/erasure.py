"""Erasure: `sessionctl forget --user U [--user V ...]` removes users from everything the product keeps --
raw_events, sessions, quarantine, the live state and the versions its checkpoint retains, every savepoint, the files
of older table versions (within SESSIONS_ERASURE_DEADLINE_HOURS), the tables' Delta logs (predicates and statistics
scrubbed) and every landed file (pending, still being written or archived; any spelling of the id) -- and `forget
--verify` reads the files under every location the product writes, as an auditor would (skipping only those the
audit's index says cannot name U; `--full`: every one), and says where U still appears. Events of U that arrive
later are dropped at ingest (the standing erasure, pipelines.ingest.erased.ErasedUsers).

Several users are one erasure that costs about what one user costs: one state rewrite, one DELETE per table (`user_id
IN (...)`), one pass over each landed file, each savepoint and each Delta log, one scan of every file for verify;
the erasure log still has one row per user.

Every step is idempotent, so a forget that was killed is finished by running it again. The live state of a stopped
job is erased in place: the state partitions the users are placed in are rewritten without them at the version the
stream resumes from, and every other file of those partitions (the versions they retained) removed -- the stream
resumes at its own position, nothing replayed. A checkpoint of an older layout is rebuilt whole instead: a savepoint,
that savepoint erased like every other, a restore from it. A running stream does the same between two batches when
it finds the request (state_store.stream_control). The erasure log (a Delta table beside the others) records when,
what and how many rows, with a keyed hash of U (HMAC-SHA256, SESSIONS_ERASURE_KEY or a key generated once in
$SESSIONS_HOME), never U."""
from __future__ import annotations

import contextlib
import datetime as dt
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
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
from pipelines.errors import NoCommittedBatch, Result, SessionsError, StopIncomplete
from pipelines.ingest.erase_lines import erase_landed_lines_of
from pipelines.ingest.erased import COMPLETE, STARTED, UserSpelling, log_erasures, user_hash
from pipelines.job.checkpoint import (
    PROVIDER_CLASSES,
    CheckpointInfo,
    inspect_checkpoint,
    read_job_metadata,
    read_restore_marker,
)
from pipelines.job.operators.jvm import STATE_LAYOUT
from pipelines.job.operators.state_writer import erase_state, purge_erased
from pipelines.job.runtime import spark_failures, stop_state_stores
from pipelines.locations import checkpoint_path, remove_tree
from pipelines.storage import filesystem, join, read_rows, sql_literal, storage_options, table_exists
from state_store.audit import StoreFiles, mentions_of, scan_for, scrub_delta_log
from state_store.audit_index import MIN_BYTES, AuditIndex
from state_store.kernel import exclusive, replaced_checkpoints, session
from state_store.restore import restore_unlocked
from state_store.results import Phases
from state_store.savepoint import native
from state_store.savepoint.catalog import SavepointStore
from state_store.savepoint.chain import savepoint_checksum
from state_store.savepoint.damage import damaged_members, table_damage
from state_store.savepoint.take import savepoint_last_batch
from state_store.state import open_events_of

__all__ = ["ForgetResult", "ForgetVerification", "UserErased", "Verifications", "forget",
           "forget_unlocked", "user_ids_of", "verify", "verify_forgotten", "verify_forgotten_many", "verify_many"]

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


@dataclass(frozen=True)
class ForgetVerification(Result):
    """What `sessionctl forget --verify --user U` prints: where U still appears (place -> rows, lines or files)."""
    user_hash: str
    clean: bool
    found: dict[str, int]
    files: dict[str, int] = field(default_factory=dict)  # location/relative path -> mentions, where found
    unreadable: dict[str, str] = field(default_factory=dict)  # location/relative path -> why: never clean while any
    live_state_asked: bool = True  # false: no file of the checkpoint names the users, so its state cannot hold them
    files_read: int = 0     # files read for the verify (all the users of one at once)
    files_skipped: int = 0  # files not read: the audit's index says they cannot name any of the users (not --full)


@dataclass(frozen=True)
class Verifications(Result):
    """What `sessionctl forget --verify` prints for several users: clean only if every one is; `found` summed per
    place; each user's answer in `users`, in the order given (by keyed hash, never the id)."""
    clean: bool
    found: dict[str, int]
    users: list[ForgetVerification]

    @classmethod
    def of(cls, answers: Sequence[ForgetVerification]) -> Verifications:
        found: dict[str, int] = {}
        for answer in answers:
            for place, count in answer.found.items():
                found[place] = found.get(place, 0) + count
        return cls(all(answer.clean for answer in answers), found, list(answers))


def user_ids_of(users: str | Sequence[str]) -> list[str]:
    """The users of an erasure: one id or several, each once, in the order given (SessionsError: none)."""
    ids = list(dict.fromkeys([users] if isinstance(users, str) else users))
    if not ids or not all(ids):
        raise SessionsError("forget needs user ids: --user U (repeatable) or --users-file PATH; an empty id erases "
                            "nobody")
    return ids


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


def _live_events(spark: SparkSession, config: SessionsConfig, user_ids: Sequence[str]) -> dict[str, int]:
    """Each user's open events in the live state (one pass over it, whatever the number of users)."""
    try:
        return open_events_of(spark, config, user_ids)
    except NoCommittedBatch:
        return dict.fromkeys(user_ids, 0)


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
    if _layout(config) != STATE_LAYOUT or info.provider not in PROVIDER_CLASSES or not info.partitions \
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
        per_user["live_state_events"] = _live_events(spark, config, ids)
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


def _places(config: SessionsConfig) -> list[tuple[str, str]]:
    """(place, location) of everything the product writes, the tables first (so their files count under them)."""
    places = [("raw_events", config.raw_events_table), ("sessions", config.sessions_table),
              ("quarantine", config.quarantine_table), ("savepoints", config.savepoint_uri),
              ("checkpoint", str(config.checkpoint)), ("landed_lines", config.landing_uri),
              ("leases", config.lease_uri), ("warehouse", config.warehouse_uri),
              ("erasure_requests", config.erasure_requests_uri), ("home", str(config.home))]
    return [(place, uri) for place, uri in places if uri]


def verify_forgotten(config: SessionsConfig, spark: SparkSession | Callable[[], SparkSession], user_id: str, *,
                     full: bool = False) -> ForgetVerification:
    """As an auditor would: every file under every location the product writes (tables with every version and their
    logs, savepoints, the checkpoint and those set aside, landing, leases, the home), each read for every spelling
    of U (state_store.audit), and the live state asked through Spark where a file of the checkpoint names U. A large
    file the audit's index says cannot name U is not read (state_store.audit_index); `full`: every file is, the
    index's own too, and the live state is always asked. `spark` may be a callable: Spark is then started only
    if a state store file must be decoded or the live state asked."""
    return verify_forgotten_many(config, spark, [user_id], full=full)[0]


def verify_forgotten_many(config: SessionsConfig, spark: SparkSession | Callable[[], SparkSession],
                          users: Sequence[str], *, full: bool = False, index_min_bytes: int = MIN_BYTES
                          ) -> list[ForgetVerification]:
    """verify_forgotten for several users at once, in the order given: every file read once for all of them (or
    skipped by the index for all of them), the live state asked once. `index_min_bytes`: the smallest file the index
    covers (Spark's state files: any size)."""
    ids = user_ids_of(users)
    spelled = [UserSpelling(user_id) for user_id in ids]
    # Said in _places' order (the tables first), whatever order they are read in.
    found: dict[str, dict[str, int]] = {user_id: dict.fromkeys(dict(_places(config)), 0) for user_id in ids}
    files: dict[str, dict[str, int]] = {user_id: {} for user_id in ids}
    unreadable: dict[str, str] = {}
    seen: set[str] = set()
    index = None if full else AuditIndex(config.home, min_bytes=index_min_bytes)
    # The checkpoint read first: whatever other location holds it, its files count under it (the live state's check).
    places = sorted(_places(config), key=lambda place: place[0] != "checkpoint")
    labelled = [(place, uri, f"{place}:") for place, uri in places]
    # Checkpoints restores set aside live beside the checkpoint (outside it when the home is elsewhere).
    labelled += [("set_aside_checkpoints", str(path), f"set_aside:{path.name}/") for path in replaced_checkpoints(config)]
    # State store files are compressed: read decoded, or named as unreadable. Where the live state is asked whatever
    # the files say, through the Spark that asks it; else in a JVM of their own, with no Spark session, unless Spark
    # was given.
    always_ask = full or _layout(config) != STATE_LAYOUT
    store_files = StoreFiles(spark, config=None if always_ask else config)
    with store_files, index if index is not None else contextlib.nullcontext():
        for place, uri, label in labelled:
            for user_id, findings in scan_for(uri, spelled, seen=seen, store_files=store_files, index=index).items():
                found[user_id][place] = found[user_id].get(place, 0) + findings.total()
                files[user_id].update({f"{label}{path}": count for path, count in findings.files.items()})
                unreadable.update({f"{label}{path}": why for path, why in findings.unreadable.items()})
    skipped = 0
    if index is not None:
        index.finish()  # every location was scanned: entries no file had are of files gone or changed
        skipped = index.skipped
    # The live state is made of the checkpoint's state files, just read decoded (or skipped by an index entry built
    # from them decoded): in the layout keyed by user, each key row holds the user's id between non-id bytes, so
    # where no file of the checkpoint names any of the users, the state holds none of them, and Spark is not asked.
    named = any(found[user_id].get("checkpoint") for user_id in ids) or any(
        path.startswith("checkpoint:") for path in unreadable)
    ask = always_ask or named
    live = dict.fromkeys(ids, 0)
    if ask:
        started = store_files.session()  # the Spark given, or started now
        assert started is not None  # verify is always given Spark or a way to start it
        live = _live_events(started, config, ids)
    answers = []
    for user_id in ids:
        found[user_id]["live_state_events"] = live[user_id]
        clean = not any(found[user_id].values()) and not unreadable
        answers.append(ForgetVerification(user_hash(config, user_id), clean, found[user_id], files[user_id],
                                          dict(unreadable), files_read=len(seen) - skipped, files_skipped=skipped,
                                          live_state_asked=ask))
    return answers


def _layout(config: SessionsConfig) -> str | None:
    meta = read_job_metadata(config.checkpoint)
    return meta.state_layout if meta is not None else STATE_LAYOUT  # no job yet: no state to ask


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


def verify(config: SessionsConfig, user_id: str, *, spark: SparkSession | None = None, full: bool = False
           ) -> ForgetVerification:
    """`forget --verify [--full]` of one user (verify_forgotten; Spark started only if it is needed)."""
    with spark_failures(config):
        return verify_forgotten(config, _given_or_started(config, spark), user_id, full=full)


def verify_many(config: SessionsConfig, users: Sequence[str], *, spark: SparkSession | None = None,
                full: bool = False) -> Verifications:
    """`forget --verify [--full]` of several users: every file read once for all of them (verify_forgotten_many)."""
    ids = user_ids_of(users)
    with spark_failures(config):
        return Verifications.of(verify_forgotten_many(config, _given_or_started(config, spark), ids, full=full))


def _given_or_started(config: SessionsConfig, spark: SparkSession | None
                      ) -> SparkSession | Callable[[], SparkSession]:
    """The caller's Spark (state files decoded in its JVM), or a way to start this process's if it is needed."""
    return spark if spark is not None else (lambda: session(config, None))
