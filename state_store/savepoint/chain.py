"""Incremental savepoints in the executors: the increment read from Spark's state change feed, a chain resolved into
the state it represents, and the checksums that tie the two (state_store.savepoint.catalog, "Incremental savepoints").

Increment. Spark's state data source reads the change feed of batches (a, b] (`readChangeFeed`; the RocksDB
provider needs changelog checkpointing, the HDFS-backed one reads its delta files): per state partition, the changes
of every version in order, a value for an update and none for a delete. One task per state partition keeps, per user,
its last change (every change of a user is in its partition, in version order), decodes the value (`DecodeState`,
pipelines.job.operators.jvm) into the user's canonical rows, or writes a tombstone for a removed user. The same task
writes the rows (state_store.savepoint.files): no shuffle, nothing on the driver.

Resolution. The chain's tables, one task per data file; per user the rows of the newest table holding the user, a
tombstone dropping it; the full table's rows kept unless a newer table holds the user (an anti-join with the
increments' users, broadcast while they are small).

Checksum of an increment's state. The resolved state of savepoint b = that of a (its catalog checksum), without the
rows the changed users had at a, with their rows at b: the checksum is a count and a wrapping sum, so the executors
compute only the changed users' old rows (one pass over a's chain files keeping those users) and the increment's
new ones. Nothing holds the whole state anywhere.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.core import state_format
from pipelines.errors import SavepointDamaged
from pipelines.job.operators.jvm import _ROWS_DDL, register_decoder
from pipelines.job.operators.seam import register_coordinator
from pipelines.job.task_files import share_aws_env
from pipelines.locations import CheckpointPath
from state_store.savepoint.catalog import DELETED, INCREMENT_SCHEMA, SavepointStore, StateFiles
from state_store.savepoint.checksum import MOD64, combine_checksum, frame_checksum, row_hashes, signed
from state_store.savepoint.files import file_batches, files_checksum, table_rows, table_rows_by_spark, table_rows_placed

__all__ = ["change_feed", "check_increment", "latest_per_user", "resolved_rows", "savepoint_checksum", "savepoint_rows",
           "savepoint_rows_by_spark"]

INCREMENT_DDL = state_format.spark_ddl(INCREMENT_SCHEMA)
_POSITIONED_DDL = INCREMENT_DDL + ", pos int"
CANONICAL = state_format.SAVED_SCHEMA.names
BROADCAST_BYTES = 32 << 20  # increments' files up to this size: their users go to every task (no shuffle of a base)


# ---- the increment: the change feed -> canonical rows and tombstones ------------------------------------------------

def _tombstones(users: pa.Array | pa.ChunkedArray) -> pa.Table:
    n = len(users)
    columns = {name: pa.nulls(n, field.type) for name, field in zip(CANONICAL, state_format.SAVED_SCHEMA)}
    columns["user_id"] = users
    return pa.table({**columns, DELETED: pa.array([True] * n, pa.bool_())}, schema=INCREMENT_SCHEMA)


def latest_per_user(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow function over one state partition's change feed (change_feed: user_id, change_type, rows) in
    version order: per user its last change -> its rows (`deleted` false), or a tombstone (a delete, or a value
    without rows). Runs in the task that writes the increment (files.write_state_files' `prepare`)."""
    tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
    if not tables:
        return
    changes = pa.concat_tables(tables)
    changes = changes.append_column("i", pa.array(np.arange(changes.num_rows), pa.int64()))
    last = changes.group_by("user_id", use_threads=False).aggregate([("i", "max")])["i_max"]
    changes = changes.take(pc.take(last, pc.sort_indices(last)))  # in change order
    removed = pc.or_(pc.equal(changes["change_type"], "delete"),
                     pc.fill_null(pc.equal(pc.list_value_length(changes["rows"]), 0), True))
    live, gone = changes.filter(pc.invert(removed)), changes.filter(removed)
    lists = live["rows"].combine_chunks()
    flat = pc.list_flatten(lists)
    stored = pa.table({"user_id": pc.take(live["user_id"], pc.list_parent_indices(lists)),
                       **{name: flat.field(name) for name in state_format.DECODED_ROW_SCHEMA.names}})
    rows = state_format.to_canonical(stored)
    rows = rows.append_column(DELETED, pa.array([False] * rows.num_rows, pa.bool_()))
    yield from pa.concat_tables([rows, _tombstones(gone["user_id"])]).to_batches()


def change_feed(spark: SparkSession, checkpoint: CheckpointPath, after_batch: int, batch_id: int) -> DataFrame:
    """The state's changes from batch `after_batch` to `batch_id` (user_id, change_type, rows: the value decoded by
    the JVM operator's DecodeState), in version order per state partition; latest_per_user makes the increment of
    them (INCREMENT_DDL): per user whose state changed, all its rows at `batch_id`, or a tombstone."""
    if batch_id <= after_batch:
        return spark.createDataFrame([], f"user_id string, change_type string, rows {_ROWS_DDL}")
    register_coordinator(spark)
    decode = register_decoder(spark, checkpoint)
    feed = (spark.read.format("statestore").option("readChangeFeed", "true")
            .option("changeStartBatchId", after_batch + 1).option("changeEndBatchId", batch_id).load(str(checkpoint)))
    return feed.select(F.col("key.user_id").alias("user_id"), "change_type",
                       F.call_function(decode, F.col("value.groupState.value")).alias("rows"))


# ---- resolution -----------------------------------------------------------------------------------------------------

def _positioned_frame(spark: SparkSession, tables: list[tuple[int, StateFiles]], function: Callable[..., Any],
                      ddl: str) -> DataFrame:
    """One task per data file of the tables (position in the chain, files), running `function` over (uri, pos)."""
    listed = [(uri, pos, DELETED in files.columns) for pos, files in tables for uri in files.files]
    data = spark.sparkContext.parallelize(listed, max(1, len(listed)))
    share_aws_env(spark, tables[0][1].uri)
    return spark.createDataFrame(data, "uri string, pos int, increment boolean").mapInArrow(function, ddl)


def _columns(increment: bool) -> tuple[str, ...]:
    return tuple(INCREMENT_SCHEMA.names if increment else CANONICAL)


def _read_positioned(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow function: (uri, pos, increment) -> the file's rows with `deleted` and `pos`."""
    for batch in batches:
        for uri, pos, increment in zip(*(batch.column(i).to_pylist() for i in range(3))):
            for part in file_batches(uri, _columns(increment)):
                part = state_format.conform(part, INCREMENT_SCHEMA if increment else state_format.SAVED_SCHEMA)
                if not increment:
                    part = part.append_column(DELETED, pa.array([False] * part.num_rows, pa.bool_()))
                yield from part.append_column("pos", pa.array([pos] * part.num_rows, pa.int32())).to_batches()


def resolved_rows(spark: SparkSession, store: SavepointStore, members: list[str]) -> DataFrame:
    """The state a chain represents (CANONICAL_DDL), read in the executors: `members` (SavepointStore.chain_members)
    the full table first, then the increments in order."""
    tables = [store.data_files(member) for member in members]
    base = table_rows(spark, tables[0])
    increments = [(pos, files) for pos, files in enumerate(tables[1:], 1) if files.files]
    if not increments:
        return base
    rows = _positioned_frame(spark, increments, _read_positioned, _POSITIONED_DDL)
    if len(increments) > 1:  # a user in several increments: the newest one's rows
        newest = rows.groupBy("user_id").agg(F.max("pos").alias("newest"))
        rows = rows.join(newest, "user_id").where(F.col("pos") == F.col("newest")).drop("newest")
    users = rows.select("user_id")
    if sum(files.bytes for _, files in increments) <= BROADCAST_BYTES:
        users = F.broadcast(users)
    kept = base.join(users, "user_id", "left_anti")
    return kept.unionByName(rows.where(~F.col(DELETED)).select(*CANONICAL))


# ---- an increment re-read, and the old rows of its users, in one pass ----------------------------------------------

_CHECK_SCHEMA = pa.schema([("key", pa.string()), ("pos", pa.int32()), ("rows", pa.int64()), ("hash_sum", pa.int64()),
                           ("tombstone", pa.bool_())])
_CHECK_DDL = state_format.spark_ddl(_CHECK_SCHEMA)
NEW = -1  # the position of the new increment's own files in that pass


def _per_user(part: pa.Table, pos: int, increment: bool) -> pa.RecordBatch:
    """Per user of `part`: its live rows' count and wrapping hash sum (canonical columns), or a tombstone."""
    deleted = pc.fill_null(part[DELETED], False) if increment else pa.array([False] * part.num_rows)
    gone = part.filter(deleted)["user_id"].to_pylist()
    live = part.filter(pc.invert(deleted))
    codes, uniques = pd.factorize(live["user_id"].to_numpy(zero_copy_only=False))
    sums = np.zeros(len(uniques), np.uint64)
    if live.num_rows:
        np.add.at(sums, codes, row_hashes(state_format.conform(live)).astype(np.uint64))
    counts = np.bincount(codes, minlength=len(uniques)) if live.num_rows else np.zeros(0, np.int64)
    return pa.RecordBatch.from_pydict({
        "key": list(uniques) + gone, "pos": [pos] * (len(uniques) + len(gone)),
        "rows": [int(c) for c in counts] + [0] * len(gone),
        "hash_sum": [signed(int(v)) for v in sums] + [0] * len(gone),
        "tombstone": [False] * len(uniques) + [True] * len(gone)}, schema=_CHECK_SCHEMA)


def _check(users: Any) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow function over (uri, pos, increment): a file of the new increment (pos NEW) -> its count and
    checksum (key = its uri); a file of the previous chain -> per user of `users` (a broadcast) in it, its rows'
    count and wrapping hash sum, or a tombstone (key = the user)."""

    def check(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        wanted = None
        for batch in batches:
            for uri, pos, increment in zip(*(batch.column(i).to_pylist() for i in range(3))):
                rows = total = 0
                for part in file_batches(uri, _columns(increment)):
                    if pos == NEW:
                        rows, total = rows + part.num_rows, (total + int(row_hashes(part).sum(dtype=np.uint64)))
                        continue
                    wanted = users.value if wanted is None else wanted
                    hit = part.filter(pc.is_in(part["user_id"], value_set=wanted))
                    if hit.num_rows:
                        yield _per_user(hit, pos, increment)
                if pos == NEW:
                    yield pa.RecordBatch.from_pylist([{"key": uri, "pos": NEW, "rows": rows,
                                                       "hash_sum": signed(total % MOD64), "tombstone": False}],
                                                     schema=_CHECK_SCHEMA)

    return check


@dataclass(frozen=True)
class IncrementCheck:
    """The new increment's table re-read (count, checksum), and what its users held in the previous savepoint's
    resolved state (count, wrapping uint64 sum of their rows' hashes)."""
    rows: int
    checksum: str
    old_rows: int
    old_sum: int


def check_increment(spark: SparkSession, store: SavepointStore, files: StateFiles, members: list[str],
                    users: pa.Array) -> IncrementCheck:
    """One pass of the executors over the new increment's files and the previous savepoint's chain (`members`,
    SavepointStore.chain_members of it), keeping only `users` there."""
    tables = [(NEW, files)] if files.files else []
    if len(users):
        tables += [(pos, t) for pos, t in enumerate(store.data_files(m) for m in members) if t.files]
    if not tables:
        return IncrementCheck(0, combine_checksum([]), 0, 0)
    wanted = spark.sparkContext.broadcast(users)
    try:
        found = _positioned_frame(spark, tables, _check(wanted), _CHECK_DDL).toArrow().to_pandas()
    finally:
        wanted.unpersist()
    own = found[found["pos"] == NEW]
    checksum = combine_checksum(zip(own["rows"].tolist(), own["hash_sum"].tolist()))
    old = found[found["pos"] != NEW]
    # per user the newest table of the chain holding it (its rows may be spread over several files of that table)
    old = old[old["pos"] == old.groupby("key")["pos"].transform("max")]
    old = old[~old["tombstone"]]
    total = int(old["hash_sum"].to_numpy().astype(np.int64).view(np.uint64).sum(dtype=np.uint64)) % MOD64
    return IncrementCheck(int(own["rows"].sum()), checksum, int(old["rows"].sum()), total)


# A savepoint's state, whichever its kind: a full one's table (state_store.savepoint.files), an incremental one's chain.
def savepoint_checksum(spark: SparkSession, store: SavepointStore, savepoint_id: str) -> tuple[int, str]:
    """(rows, checksum) of the state a savepoint holds, computed in the executors: its state table as stored for a
    full savepoint (v1 or v2 rows), the chain resolved for an incremental one -- what its catalog row records."""
    files = store.data_files(savepoint_id)
    if DELETED not in files.columns:
        return files_checksum(spark, files)
    return frame_checksum(resolved_rows(spark, store, _chain_members(store, savepoint_id)).select(*CANONICAL))


def _chain_members(store: SavepointStore, savepoint_id: str) -> list[str]:
    saved = store.find(savepoint_id)
    if saved is None:
        raise SavepointDamaged(f"{store.state_uri(savepoint_id)} is an incremental savepoint's table, but the "
                               "catalog has no row for it: its chain is unknown")
    return store.chain_members(saved)


def savepoint_rows_by_spark(spark: SparkSession, store: SavepointStore, savepoint_id: str, *,
                            placed_in: int | None = None) -> tuple[DataFrame | None, list[DataFrame] | None]:
    """savepoint_rows read by Spark's Parquet reader, with no Python worker, for a full savepoint of the current
    canonical rows on a local or HDFS store (files.table_rows_by_spark); None for any other. Its job fails on a file
    that reader refuses, where savepoint_rows reads it or names the damage: a caller falls back on it. With
    `placed_in`, the same rows also as one frame per state partition of that many (files.table_rows_placed: frame i
    the files written from state partition i), or None where that cannot be said. One read of the Delta log."""
    files = store.data_files(savepoint_id)
    if DELETED in files.columns:
        return None, None
    placed = table_rows_placed(spark, files, placed_in) if placed_in is not None else None
    return table_rows_by_spark(spark, files), placed


def savepoint_rows(spark: SparkSession, store: SavepointStore, savepoint_id: str) -> DataFrame:
    """The savepoint's state rows in the current canonical form (CANONICAL_DDL; a v1 savepoint's rows upgraded as
    state_format.upgrade_v1 does; an incremental savepoint's chain resolved), read by
    the executors from the files the Delta logs list: no copy in this process. Its count and checksum equal the
    driver-side store.read_state's (for a v2 savepoint)."""
    files = store.data_files(savepoint_id)
    if DELETED not in files.columns:
        return table_rows(spark, files)
    return resolved_rows(spark, store, _chain_members(store, savepoint_id))
