"""Incremental savepoints in the executors: the increment read from Spark's state change feed, a chain resolved into
the state it represents, and the checksums that tie the two (state_store.savepoints, "Incremental savepoints").

Increment. Spark's state data source reads the change feed of batches (a, b] (`readChangeFeed`; the RocksDB
provider needs changelog checkpointing, the HDFS-backed one reads its delta files): per state partition, the changes
of every version in order, a value for an update and none for a delete. One task per state partition keeps, per user,
its last change (every change of a user is in its partition, in version order), decodes the value (`DecodeState`,
pipelines.operator_jvm) into the user's canonical rows, or writes a tombstone for a removed user. The same task
writes the rows (state_store.savepoint_io): no shuffle, nothing on the driver.

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
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines import state_format
from pipelines.operator import register_coordinator
from pipelines.operator_jvm import _DECODE_STATE, _ROWS_DDL
from state_store.savepoint_io import CANONICAL_DDL, _file_batches, _signed, executor_env, table_rows
from state_store.savepoints import DELETED, INCREMENT_SCHEMA, SavepointStore, StateFiles, combine_checksum, row_hashes

INCREMENT_DDL = CANONICAL_DDL + f", {DELETED} boolean"
_POSITIONED_DDL = INCREMENT_DDL + ", pos int"
_FACTS_DDL = "rows long, hash_sum long, state_rows long, state_hash_sum long, users array<string>"
_OLD_DDL = "user_id string, pos int, rows long, hash_sum long, tombstone boolean"
CANONICAL = state_format.CANONICAL_SCHEMA.names
BROADCAST_BYTES = 32 << 20  # increments' files up to this size: their users go to every task (no shuffle of a base)
_MOD64 = 1 << 64


# ---- the increment: the change feed -> canonical rows and tombstones ------------------------------------------------

def _tombstones(users: pa.Array | pa.ChunkedArray) -> pa.Table:
    n = len(users)
    columns = {name: pa.nulls(n, field.type) for name, field in zip(CANONICAL, state_format.CANONICAL_SCHEMA)}
    columns["user_id"] = users
    return pa.table({**columns, DELETED: pa.array([True] * n, pa.bool_())}, schema=INCREMENT_SCHEMA)


def _latest_per_user(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow function over one state partition's change feed (user_id, change_type, rows) in version order:
    per user its last change -> its rows (`deleted` false), or a tombstone (a delete, or a value without rows)."""
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
                       **{name: flat.field(name) for name in state_format.ROW_FIELDS[1:]}})
    rows = state_format.to_canonical(stored)
    rows = rows.append_column(DELETED, pa.array([False] * rows.num_rows, pa.bool_()))
    yield from pa.concat_tables([rows, _tombstones(gone["user_id"])]).to_batches()


def changed_rows(spark: SparkSession, checkpoint: Path, after_batch: int, batch_id: int) -> DataFrame:
    """The increment from the state of batch `after_batch` to that of `batch_id` (INCREMENT_DDL): per user whose state
    changed in between, all its rows at `batch_id`, or a tombstone. The JVM operator's state (one key per user)."""
    if batch_id <= after_batch:
        return spark.createDataFrame([], INCREMENT_DDL)
    register_coordinator(spark)
    spark.udf.registerJavaFunction(_DECODE_STATE, "sessions.DecodeState", _ROWS_DDL)
    feed = (spark.read.format("statestore").option("readChangeFeed", "true")
            .option("changeStartBatchId", after_batch + 1).option("changeEndBatchId", batch_id).load(str(checkpoint)))
    return feed.select(F.col("key.user_id").alias("user_id"), "change_type",
                       F.call_function(_DECODE_STATE, F.col("value.groupState.value")).alias("rows")
                       ).mapInArrow(_latest_per_user, INCREMENT_DDL)


# ---- resolution -----------------------------------------------------------------------------------------------------

def _positioned_frame(spark: SparkSession, tables: list[tuple[int, StateFiles]], function: Callable[..., Any],
                      ddl: str) -> DataFrame:
    """One task per data file of the tables (position in the chain, files), running `function` over (uri, pos)."""
    listed = [(uri, pos, DELETED in files.columns) for pos, files in tables for uri in files.files]
    data = spark.sparkContext.parallelize(listed, max(1, len(listed)))
    with executor_env(spark, tables[0][1].uri):
        return spark.createDataFrame(data, "uri string, pos int, increment boolean").mapInArrow(function, ddl)


def _columns(increment: bool) -> tuple[str, ...]:
    return tuple(INCREMENT_SCHEMA.names if increment else CANONICAL)


def _read_positioned(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow function: (uri, pos, increment) -> the file's rows with `deleted` and `pos`."""
    for batch in batches:
        for uri, pos, increment in zip(*(batch.column(i).to_pylist() for i in range(3))):
            for part in _file_batches(uri, _columns(increment)):
                part = part.select(list(_columns(increment))).cast(
                    INCREMENT_SCHEMA if increment else state_format.CANONICAL_SCHEMA)
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


def _partials(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    count = total = 0
    for batch in batches:
        if batch.num_rows:
            count += batch.num_rows
            total = (total + int(row_hashes(batch).sum(dtype=np.uint64))) % _MOD64
    yield pa.RecordBatch.from_pylist([{"rows": count, "hash_sum": _signed(total)}])


def frame_checksum(rows: DataFrame) -> tuple[int, str]:
    """(rows, checksum) of canonical rows where they are (a partial per task, combined here)."""
    parts = rows.select(*CANONICAL).mapInArrow(_partials, "rows long, hash_sum long").collect()
    return sum(int(p["rows"]) for p in parts), combine_checksum((p["rows"], p["hash_sum"]) for p in parts)


# ---- an increment's own facts, and the old rows of its users --------------------------------------------------------

@dataclass(frozen=True)
class IncrementFacts:
    """An increment's table re-read: its own count and checksum (every column), the count and wrapping sum of its live
    rows in canonical form (what it adds to the resolved state) and the users it holds (rows or tombstones)."""
    rows: int
    checksum: str
    state_rows: int
    state_sum: int
    users: pa.Array


def _facts(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        for uri in batch.column(0).to_pylist():
            rows = total = state_rows = state_total = 0
            users: list[pa.Array] = []
            for part in _file_batches(uri, _columns(True)):
                rows, total = rows + part.num_rows, (total + int(row_hashes(part).sum(dtype=np.uint64))) % _MOD64
                live = part.filter(pc.invert(pc.fill_null(part[DELETED], False))).select(list(CANONICAL))
                if live.num_rows:
                    state_rows += live.num_rows
                    state_total = (state_total + int(row_hashes(live).sum(dtype=np.uint64))) % _MOD64
                users.append(pc.unique(part["user_id"].combine_chunks()))
            found = pc.unique(pa.concat_arrays(users)) if users else pa.array([], pa.string())
            yield pa.RecordBatch.from_pydict({
                "rows": [rows], "hash_sum": [_signed(total)], "state_rows": [state_rows],
                "state_hash_sum": [_signed(state_total)], "users": pa.array([found.to_pylist()], pa.list_(pa.string()))})


def increment_facts(spark: SparkSession, files: StateFiles) -> IncrementFacts:
    if not files.files:
        return IncrementFacts(0, combine_checksum([]), 0, 0, pa.array([], pa.string()))
    found = _positioned_frame(spark, [(0, files)], _facts, _FACTS_DDL).toArrow()
    rows = combine_checksum(zip(found["rows"].to_pylist(), found["hash_sum"].to_pylist()))
    state = combine_checksum(zip(found["state_rows"].to_pylist(), found["state_hash_sum"].to_pylist()))
    _, count, total = state.split(":")
    users = pc.unique(pc.list_flatten(found["users"]).combine_chunks())
    return IncrementFacts(int(rows.split(":")[1]), rows, int(count), int(total, 16), users)


def _old_rows(users: Any) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow function: (uri, pos, increment) -> per user of `users` (a broadcast) in the file: its live rows'
    count and wrapping hash sum, or a tombstone."""

    def old(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        wanted = users.value
        for batch in batches:
            for uri, pos, increment in zip(*(batch.column(i).to_pylist() for i in range(3))):
                for part in _file_batches(uri, _columns(increment)):
                    hit = part.filter(pc.is_in(part["user_id"], value_set=wanted))
                    if not hit.num_rows:
                        continue
                    deleted = pc.fill_null(hit[DELETED], False) if increment else pa.array([False] * hit.num_rows)
                    gone = hit.filter(deleted)["user_id"].to_pylist()
                    live = hit.filter(pc.invert(deleted))
                    codes, uniques = pd.factorize(live["user_id"].to_numpy(zero_copy_only=False))
                    sums = np.zeros(len(uniques), np.uint64)
                    if live.num_rows:
                        np.add.at(sums, codes, row_hashes(live.select(list(CANONICAL))).astype(np.uint64))
                    counts = np.bincount(codes, minlength=len(uniques)) if live.num_rows else np.zeros(0, np.int64)
                    yield pa.RecordBatch.from_pydict({
                        "user_id": list(uniques) + gone, "pos": [pos] * (len(uniques) + len(gone)),
                        "rows": [int(c) for c in counts] + [0] * len(gone),
                        "hash_sum": [_signed(int(v)) for v in sums] + [0] * len(gone),
                        "tombstone": [False] * len(uniques) + [True] * len(gone)},
                        schema=pa.schema([("user_id", pa.string()), ("pos", pa.int32()), ("rows", pa.int64()),
                                          ("hash_sum", pa.int64()), ("tombstone", pa.bool_())]))

    return old


def old_contribution(spark: SparkSession, store: SavepointStore, members: list[str], users: pa.Array
                     ) -> tuple[int, int]:
    """(rows, wrapping uint64 sum) of what `users` held in the state the chain `members` resolves to."""
    tables = [(pos, files) for pos, files in enumerate(store.data_files(m) for m in members) if files.files]
    if not len(users) or not tables:
        return 0, 0
    wanted = spark.sparkContext.broadcast(users)
    try:
        found = _positioned_frame(spark, tables, _old_rows(wanted), _OLD_DDL).toArrow()
    finally:
        wanted.unpersist()
    if not found.num_rows:
        return 0, 0
    frame = found.to_pandas()
    # per user the newest table holding it (its partial rows may be spread over several files of that table)
    frame = frame[frame["pos"] == frame.groupby("user_id")["pos"].transform("max")]
    frame = frame[~frame["tombstone"]]
    total = int(frame["hash_sum"].to_numpy().astype(np.int64).view(np.uint64).sum(dtype=np.uint64)) % _MOD64
    return int(frame["rows"].sum()), total
