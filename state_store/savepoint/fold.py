"""Savepoint retention over chains, and folding a chain into a new full savepoint (`sessionctl compact`).

Retention keeps what its policy keeps (state_store.maintenance.savepoints_to_delete) and every savepoint a kept one's
chain needs: a chain is never broken. So that old chains can go, compaction folds: the oldest kept incremental
savepoint of a chain whose full savepoint retention would not keep becomes full itself -- the executors write the
chain's resolved rows as new files into its own table, those are checked against its catalog count and checksum
(the state it represents, unchanged), and one Delta commit replaces its increment (schema: canonical, no `deleted`).
Then one catalog transaction makes it full and re-bases the kept savepoints after it on it; the older members go.

Crash safety: before the table's commit nothing changed (the written files are unreferenced; compaction removes such
files from kept savepoint tables). A table without the `deleted` column is full, so from its commit on every reader
starts resolution there (SavepointStore.chain_members) whatever the catalog still says; the next compaction finishes
the catalog's part.
"""
from __future__ import annotations

import time
from dataclasses import replace

import pyarrow.fs as pafs
from deltalake import DeltaTable, Schema
from deltalake.transaction import AddAction, CommitProperties
from pyspark.sql import SparkSession

from pipelines.coordination import kill_point
from pipelines.errors import SavepointDamaged
from pipelines.storage import filesystem, s3_errors
from state_store.results import SavepointInfo
from state_store.savepoint.catalog import FULL, INCREMENTAL, SavepointStore, StateFiles, written_schema
from state_store.savepoint.chain import resolved_rows
from state_store.savepoint.files import files_checksum, write_state_files

__all__ = ["fold", "fold_plan", "needed", "sweep_unreferenced"]


def fold_plan(catalog: list[SavepointInfo], keep: set[str]) -> tuple[list[SavepointInfo], dict[str, list[str]]]:
    """The savepoints to fold (oldest first) so that no kept one needs a savepoint outside `keep`'s chains more than
    necessary, and every complete savepoint's chain once they are folded."""
    complete = [s for s in reversed(catalog) if s.status == "complete"]  # oldest first
    chains = {s.savepoint_id: s.chain_ids for s in complete}
    folds = []
    for saved in complete:
        chain = chains[saved.savepoint_id]
        if saved.savepoint_id in keep and len(chain) > 1 and chain[0] not in keep:
            folds.append(saved)
            for other, members in chains.items():
                if saved.savepoint_id in members:
                    chains[other] = members[members.index(saved.savepoint_id):]
    return folds, chains


def needed(chains: dict[str, list[str]], keep: set[str]) -> set[str]:
    """`keep` and every savepoint the chains of those need."""
    return {member for saved in keep for member in chains.get(saved, [saved])}


def fold(spark: SparkSession, store: SavepointStore, saved: SavepointInfo, catalog: list[SavepointInfo]) -> None:
    """Make `saved` (an incremental savepoint) full in place, and re-base the savepoints after it (see the module
    docstring)."""
    uri = store.state_uri(saved.savepoint_id)
    if store.is_increment(uri):
        schema = written_schema(increment=False, attributes=bool(saved.rules.attributes))
        resolved = resolved_rows(spark, store, store.chain_members(saved, catalog)).select(*schema.names)
        written = write_state_files(spark, resolved, uri, schema=schema)
        fs, root = filesystem(uri)
        files = StateFiles(uri, tuple(schema.names),
                           tuple(f"{uri.rstrip('/')}/{f['path']}" for f in written.files),
                           tuple(int(f["size"]) for f in written.files))
        if (written.rows, written.checksum) != (saved.rows, saved.checksum) or \
                files_checksum(spark, files) != (saved.rows, saved.checksum):
            for f in written.files:  # never committed
                fs.delete_file(f"{root}/{f['path']}")
            raise SavepointDamaged(f"folding savepoint {saved.savepoint_id}: its chain resolves to {written.rows} "
                                   f"rows / {written.checksum}, the catalog says {saved.rows} / {saved.checksum}")
        kill_point("fold:written")
        now_ms = int(time.time() * 1000)
        with s3_errors(uri):
            DeltaTable(uri, storage_options=store.options).create_write_transaction(
                [AddAction(f["path"], int(f["size"]), {}, now_ms, True, f["stats"]) for f in written.files],
                mode="overwrite", schema=Schema.from_arrow(schema),
                commit_properties=CommitProperties(custom_metadata={
                    "sessions.rows": written.rows, "sessions.checksum": written.checksum,
                    "sessions.folded": ",".join(saved.chain_ids)}))
        kill_point("fold:committed")
    # One catalog transaction: the folded savepoint is full, the ones after it in its chain start from it.
    rows = [replace(saved, kind=FULL, base_id=None, chain=(saved.savepoint_id,), table_rows=saved.rows,
                    bytes=store.data_files(saved.savepoint_id).bytes)]
    for other in catalog:
        members = other.chain_ids
        if other.savepoint_id != saved.savepoint_id and saved.savepoint_id in members[:-1]:
            rows.append(replace(other, kind=INCREMENTAL, base_id=saved.savepoint_id,
                                chain=tuple(members[members.index(saved.savepoint_id):])))
    store.update_rows(rows, ("kind", "base_id", "chain", "table_rows", "bytes"))


def sweep_unreferenced(store: SavepointStore, savepoint_id: str) -> int:
    """Data files in a savepoint's table folder that its Delta log does not list (tasks of a failed attempt, a fold
    killed before its commit, files a fold or an erasure replaced): deleted. A savepoint table is never read at an
    older version. The caller holds the lifecycle lease (nothing writes the folder meanwhile)."""
    uri = store.state_uri(savepoint_id)
    listed = {f.rsplit("/", 1)[-1] for f in store.data_files(savepoint_id).files}
    fs, root = filesystem(uri)
    removed = 0
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
        relative = info.path[len(root):].lstrip("/")
        if info.type != pafs.FileType.File or relative.startswith("_delta_log") or not relative.endswith(".parquet"):
            continue
        if relative.rsplit("/", 1)[-1] not in listed:
            fs.delete_file(info.path)
            removed += 1
    return removed
