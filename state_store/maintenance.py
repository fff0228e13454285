"""Compaction and retention: Delta OPTIMIZE + VACUUM, savepoint retention, checkpoint retention."""
from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
from deltalake import DeltaTable

from pipelines.config import SessionsConfig
from pipelines.ingest.erased import erasures_recorded
from pipelines.job.checkpoint import directory_size
from pipelines.locations import checkpoint_path, remove_tree
from pipelines.storage import is_s3, join, open_table, storage_options, table_exists
from state_store.kernel import beside_stream, replaced_checkpoints, session
from state_store.results import CompactionResult, MaintenanceDue, SavepointInfo
from state_store.savepoint import native
from state_store.savepoint.catalog import SavepointStore
from state_store.savepoint.damage import damaged_members, table_damage
from state_store.savepoint.fold import fold, fold_plan, needed, sweep_unreferenced

__all__ = ["compact", "maintenance_due"]


def _s3_objects(config: SessionsConfig, uri: str) -> tuple[Any, str, list[dict[str, Any]]]:
    """(client, bucket, objects under the prefix as list_objects_v2 items): the one S3 listing here."""
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    options = storage_options(config, uri) or {}
    client = boto3.client("s3", endpoint_url=options.get("AWS_ENDPOINT_URL"), region_name=options.get("AWS_REGION"))
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/")
    return client, bucket, [item for page in pages for item in page.get("Contents", [])]


def _table_footprint(config: SessionsConfig, uri: str) -> tuple[int, int]:
    """(files, bytes) of everything under a Delta table, log included, local or S3."""
    if is_s3(uri):
        _, _, objects = _s3_objects(config, uri)
        return len(objects), sum(item["Size"] for item in objects)
    return directory_size(Path(uri))


def _data_files(table: DeltaTable) -> int:
    return pa.table(table.get_add_actions(flatten=True)).num_rows


def _maintain_table(config: SessionsConfig, uri: str, dry_run: bool) -> dict[str, int]:
    """files_* count the table's live data files (what OPTIMIZE merges); bytes_* everything stored."""
    options = storage_options(config, uri)
    retention_hours = config.vacuum_retention_hours
    if erasures_recorded(config):  # files of older versions may hold an erased user: purged within the deadline
        retention_hours = min(retention_hours, int(config.erasure_deadline_hours))
    if not DeltaTable.is_deltatable(uri, storage_options=options):
        return {}
    _, bytes_before = _table_footprint(config, uri)
    table = DeltaTable(uri, storage_options=options)
    report = {"files_before": _data_files(table), "bytes_before": bytes_before}
    if dry_run:
        report["would_vacuum"] = len(table.vacuum(retention_hours=retention_hours, dry_run=True,
                                                  enforce_retention_duration=False))
        return report
    optimized = table.optimize.compact()
    vacuumed = table.vacuum(retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False)
    if table.version() >= 10:  # a log checkpoint lets old commit files go
        table.create_checkpoint()
        table.cleanup_metadata()
    _, bytes_after = _table_footprint(config, uri)
    report.update(files_after=_data_files(DeltaTable(uri, storage_options=options)), bytes_after=bytes_after,
                  compacted_files=optimized.get("numFilesRemoved", 0), vacuumed_files=len(vacuumed))
    return report


def savepoints_to_delete(catalog: list[SavepointInfo], keep_last: int, keep_daily_days: int,
                         now: dt.datetime) -> list[SavepointInfo]:
    """Keep the newest `keep_last` complete savepoints and the newest one of each of the last
    `keep_daily_days` days; never the newest complete one. Failed attempts go. (The policy alone: compact then keeps
    what the chains of the kept ones need, state_store.savepoint.fold.)"""
    complete = [s for s in catalog if s.status == "complete"]  # the catalog is newest first
    keep = {s.savepoint_id for s in complete[:max(1, keep_last)]}
    horizon = (now - dt.timedelta(days=keep_daily_days)).date()
    seen_days: set[dt.date] = set()
    for saved in complete:
        day = dt.datetime.fromisoformat(saved.created_at).date()
        if day > horizon and day not in seen_days:
            seen_days.add(day)
            keep.add(saved.savepoint_id)
    return [s for s in catalog if s.savepoint_id not in keep]


def _chain_retention(config: SessionsConfig, store: SavepointStore, catalog: list[SavepointInfo],
                     expired: list[SavepointInfo], dry_run: bool
                     ) -> tuple[list[SavepointInfo], list[str], list[SavepointInfo]]:
    """Retention over incremental chains (state_store.savepoint.fold): the chains of kept savepoints folded where
    their full savepoint expires, and of `expired` only what no kept savepoint's chain needs. (expired, folded ids,
    the catalog after the folds)"""
    keep = {s.savepoint_id for s in catalog} - {s.savepoint_id for s in expired}
    folds, chains = fold_plan(catalog, keep)
    if folds and not dry_run:
        spark = session(config, None)
        # A chain with a damaged savepoint cannot be resolved: left unfolded (the chains read back below keep it
        # whole), the rest of compaction goes on.
        folds = [saved for saved in folds if not damaged_members(store, saved, catalog=catalog)]
        for saved in folds:
            fold(spark, store, saved, catalog)
        catalog = store.list()
        chains = {s.savepoint_id: s.chain_ids for s in catalog if s.status == "complete"}
    required = needed(chains, keep)
    return [s for s in catalog if s.savepoint_id not in required], [s.savepoint_id for s in folds], catalog


def _state_folders(config: SessionsConfig, store: SavepointStore) -> set[str]:
    """Savepoint ids that have a folder under state/ (written or half-written)."""
    root = join(store.uri, "state")
    if is_s3(root):
        _, _, objects = _s3_objects(config, root)
        return {item["Key"][len(root[len("s3://"):].split("/", 1)[1]) + 1:].split("/", 1)[0] for item in objects}
    return {p.name for p in Path(root).iterdir() if p.is_dir()} if Path(root).exists() else set()


def _delete_savepoint(config: SessionsConfig, store: SavepointStore, saved: SavepointInfo) -> None:
    native.drop(store.uri, saved.savepoint_id)
    _delete_state(config, store.state_uri(saved.savepoint_id))  # this store's table, never a recorded location
    store.forget(saved.savepoint_id)


def _delete_state(config: SessionsConfig, state: str) -> None:
    if is_s3(state):
        client, bucket, objects = _s3_objects(config, state)
        for start in range(0, len(objects), 1000):  # delete_objects takes at most 1000 keys
            keys = [{"Key": item["Key"]} for item in objects[start:start + 1000]]
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys})
    else:
        remove_tree(checkpoint_path(state))


def compact(config: SessionsConfig, dry_run: bool = False) -> CompactionResult:
    """OPTIMIZE and VACUUM every Delta table, apply savepoint retention (config.keep_savepoints,
    keep_daily_days), drop checkpoints set aside by restores. Runs beside the stream; never beside
    another lifecycle operation."""
    started = time.monotonic()
    with beside_stream(config, "compaction"):
        now = dt.datetime.now(dt.timezone.utc)
        store = SavepointStore.of(config)
        catalog = store.list()
        expired = savepoints_to_delete(catalog, config.keep_savepoints, config.keep_daily_days, now)
        expired, folded, catalog = _chain_retention(config, store, catalog, expired, dry_run)
        deleted = []
        for saved in expired:
            if not dry_run:
                _delete_savepoint(config, store, saved)
            deleted.append(saved.savepoint_id)
        # State tables no catalog row names: savepoints killed before they were recorded. No savepoint can be
        # in flight now (it would hold the lifecycle lease this holds), so every such folder is an orphan.
        orphans = sorted(_state_folders(config, store) - {s.savepoint_id for s in catalog})
        # Native copies no kept complete row names: a savepoint that failed or was killed after its copy.
        named = {s.savepoint_id for s in catalog if s.status == "complete" and s.native_checksum
                 and s.savepoint_id not in deleted}
        native_orphans = sorted(native.folders(store.uri) - named)
        if not dry_run:
            for savepoint_id in orphans:
                _delete_state(config, store.state_uri(savepoint_id))
            for savepoint_id in native_orphans:
                native.drop(store.uri, savepoint_id)
        old_checkpoints = replaced_checkpoints(config)
        checkpoint_bytes = sum(directory_size(p)[1] for p in old_checkpoints)
        if not dry_run:
            for path in old_checkpoints:
                remove_tree(path)
        tables = {}
        uris = {"sessions": config.sessions_table, "quarantine": config.quarantine_table,
                "raw_events": config.raw_events_table, "savepoint_catalog": store.catalog_uri}
        unreferenced = {}
        damaged = []
        for saved in catalog:
            if saved.savepoint_id not in deleted and saved.status == "complete":
                if table_damage(store, saved.savepoint_id)[0] is not None:  # OPTIMIZE would fail on it: left alone
                    damaged.append(saved.savepoint_id)
                    continue
                uris[f"savepoint:{saved.savepoint_id}"] = store.state_uri(saved.savepoint_id)
                if not dry_run and store.exists(saved.savepoint_id):
                    unreferenced[f"savepoint:{saved.savepoint_id}"] = sweep_unreferenced(store, saved.savepoint_id)
        for name, uri in uris.items():
            report = _maintain_table(config, uri, dry_run)
            if report:
                tables[name] = report
                if unreferenced.get(name):
                    report["unreferenced_files_removed"] = unreferenced[name]
        state_files, state_bytes = directory_size(config.checkpoint / "state")
        files_before = sum(t["files_before"] for t in tables.values())
        bytes_before = sum(t["bytes_before"] for t in tables.values()) + checkpoint_bytes
        files_after = sum(t.get("files_after", t["files_before"]) for t in tables.values())
        bytes_after = sum(t.get("bytes_after", t["bytes_before"]) for t in tables.values())
        return CompactionResult(
            dry_run=dry_run,
            files_before=files_before, files_after=files_after,
            bytes_before=bytes_before, bytes_after=bytes_after,
            bytes_reclaimed=bytes_before - bytes_after,
            savepoints_deleted=deleted,
            orphan_state_removed=orphans,
            replaced_checkpoints_removed=[str(p) for p in old_checkpoints] if not dry_run else [],
            replaced_checkpoint_bytes=checkpoint_bytes,
            state_files=state_files, state_bytes=state_bytes,
            tables=tables,
            seconds=round(time.monotonic() - started, 3),
            savepoints_folded=folded,
            savepoints_damaged=damaged,
            orphan_native_removed=native_orphans,
        )


def _live_data_files(config: SessionsConfig, uri: str) -> int:
    return _data_files(open_table(config, uri)) if table_exists(config, uri) else 0


def maintenance_due(config: SessionsConfig, now: dt.datetime | None = None) -> MaintenanceDue:
    """The policy: a savepoint when the newest complete one is older than savepoint_max_age_hours (or there
    is none); compaction when a table has more than compact_files data files or the state more than
    state_files files. Dagster's maintenance sensor asks this; the thresholds are settings."""
    now = now or dt.datetime.now(dt.timezone.utc)
    complete = [s for s in SavepointStore.of(config).list() if s.status == "complete"]
    newest = complete[0] if complete else None
    age = (now - dt.datetime.fromisoformat(newest.created_at)).total_seconds() if newest else None
    savepoint = None
    if newest is None:
        savepoint = "no complete savepoint yet"
    elif age is not None and age >= config.savepoint_max_age_hours * 3600:
        savepoint = f"newest savepoint {newest.savepoint_id} is {age / 3600:.1f} h old " \
                    f"(SESSIONS_SAVEPOINT_MAX_AGE_HOURS={config.savepoint_max_age_hours:g})"
    files = {name: _live_data_files(config, uri) for name, uri in
             (("sessions", config.sessions_table), ("quarantine", config.quarantine_table),
              ("raw_events", config.raw_events_table))}
    state_files, _ = directory_size(config.checkpoint / "state")
    crowded = [f"{name} has {n} data files" for name, n in files.items() if n > config.compact_files]
    if state_files > config.state_files:
        crowded.append(f"the state has {state_files} files")
    compaction = "; ".join(crowded) + f" (limits {config.compact_files} / {config.state_files})" if crowded else None
    return MaintenanceDue(savepoint=savepoint, compaction=compaction,
                          newest_savepoint_id=newest.savepoint_id if newest else None,
                          newest_savepoint_age_s=round(age, 1) if age is not None else None,
                          data_files=files, state_files=state_files)
