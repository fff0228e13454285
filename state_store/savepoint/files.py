"""Savepoint state tables written, verified and read by Spark's executors; the driver handles metadata only.

Write: the tasks that read the state (a DataFrame of canonical rows, state_store.state.read_state) write their share
as Parquet files into the savepoint's table directory (pyarrow, local path or S3 through pipelines.storage) and
yield one row per file: its name, size, row count, Delta statistics and the partial checksum of its rows (count,
wrapping uint64 sum of state_store.savepoint.checksum.row_hashes). The driver collects those rows and commits them in
one Delta transaction (delta-rs `create_table_with_add_actions`); the checksum is combined from the partial ones and
equals state_checksum of the same rows. Only rows of task attempts that succeeded reach the driver, so a file of a
failed attempt (or of a failed job) is never in the log: it is an unreferenced file the table's VACUUM, or
compaction's removal of failed and orphaned savepoints, deletes.

Verify / read: the driver lists the committed files from the Delta log (metadata only); a DataFrame of their URIs,
one task per file, re-reads them in the executors: (count, partial checksum) per file for verification, or the
rows themselves for a restore (savepoint_rows).
"""
from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import Schema
from deltalake.transaction import AddAction, CommitProperties, create_table_with_add_actions
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession

from pipelines.arrow_types import plain_types
from pipelines.core import state_format
from pipelines.errors import UNREADABLE_SAVEPOINT_FILE, SavepointDamaged
from pipelines.job.task_files import share_aws_env
from pipelines.storage import filesystem, is_object_store_failure, s3_errors
from state_store.savepoint.catalog import DELETED, SavepointStore, StateFiles
from state_store.savepoint.checksum import (
    MOD64,
    checksum_parts,
    combine_checksum,
    frame_checksum,
    partial_checksum,
    signed,
)
from state_store.savepoint.stats import FileStats

__all__ = ["CANONICAL_DDL", "WrittenFiles", "commit_state_files", "file_batches", "files_checksum", "table_rows",
           "table_rows_by_spark", "table_rows_placed", "verify_state_files", "write_state_files"]

FILE_ROWS = 2_000_000      # rows per data file at most: a task's share beyond it goes on in a new file
ROW_GROUP_ROWS = 131_072   # rows buffered per Parquet row group (a task holds about this many rows at a time)
READ_BATCH_ROWS = 65_536   # rows per batch when the executors read a savepoint's files back
# zstd: a quarter smaller than snappy and no slower to write on rows shaped like the lifecycle benchmark's (200k users
# hash-partitioned into 4 files: 3.7 vs 5.0 MB, pyarrow alone); every Parquet reader here (pyarrow, delta-rs, Spark)
# reads it.
COMPRESSION = "zstd"

CANONICAL_DDL = state_format.CANONICAL_DDL
_FILE_SCHEMA = pa.schema([("path", pa.string()), ("size", pa.int64()), ("num_records", pa.int64()),
                          ("stats", pa.string()), ("hash_sum", pa.int64())])
# An increment's file also says what its live rows add to the resolved state, and which users it holds.
_INCREMENT_FILE_SCHEMA = pa.schema([*_FILE_SCHEMA, ("state_records", pa.int64()), ("state_hash_sum", pa.int64()),
                                    ("users", pa.list_(pa.string()))])
_PARTIAL_SCHEMA = pa.schema([("path", pa.string()), ("rows", pa.int64()), ("hash_sum", pa.int64())])
_FILE_DDL, _INCREMENT_FILE_DDL, _PARTIAL_DDL = map(state_format.spark_ddl, (_FILE_SCHEMA, _INCREMENT_FILE_SCHEMA,
                                                                        _PARTIAL_SCHEMA))


@dataclass(frozen=True)
class WrittenFiles:
    """What the executors wrote for one savepoint, not yet committed: one entry per file."""

    uri: str
    files: tuple[dict[str, Any], ...]  # path (relative to uri), size, num_records, stats (JSON), hash_sum
    rows: int
    checksum: str
    schema: pa.Schema = state_format.SAVED_SCHEMA  # the table's: canonical, or an increment's (with tombstones)
    # an increment's: count and wrapping sum of its live rows in canonical form, the users it holds
    state_rows: int = 0
    state_sum: int = 0
    users: pa.Array | None = None

    @property
    def bytes(self) -> int:
        return sum(int(f["size"]) for f in self.files)


# ---- executor side -------------------------------------------------------------------------------

class _DataFile:
    """One Parquet data file being written by a task: rows, partial checksum and statistics as they go in."""

    def __init__(self, fs: Any, root: str, partition: int, schema: pa.Schema) -> None:
        self.name = f"part-{partition:05d}-{uuid.uuid4()}.zstd.parquet"  # unique per task attempt (_PLACED_NAME)
        self.stream = fs.open_output_stream(f"{root}/{self.name}")
        self.writer = pq.ParquetWriter(self.stream, schema, compression=COMPRESSION)
        self.rows, self.hash_sum, self.stats = 0, 0, FileStats(schema)
        self.increment = DELETED in schema.names
        self.state_rows, self.state_sum = 0, 0
        self.users: list[pa.Array] = []

    def write(self, rows: pa.Table) -> None:
        self.writer.write_table(rows, row_group_size=rows.num_rows)
        count, hash_sum = partial_checksum(rows)
        self.rows, self.hash_sum = self.rows + count, (self.hash_sum + hash_sum) % MOD64
        self.stats.update(rows)
        if self.increment:
            live = rows.filter(pc.invert(pc.fill_null(rows[DELETED], False)))
            count, hash_sum = partial_checksum(live.drop_columns([DELETED]))
            self.state_rows, self.state_sum = self.state_rows + count, (self.state_sum + hash_sum) % MOD64
            self.users.append(pc.unique(rows["user_id"].combine_chunks()))

    def close(self) -> dict[str, Any]:
        self.writer.close()
        size = self.stream.tell()
        self.stream.close()  # on S3: completes the upload; an error here fails the task
        done = {"path": self.name, "size": size, "num_records": self.rows, "stats": self.stats.to_json(self.rows),
                "hash_sum": signed(self.hash_sum)}
        if self.increment:
            done.update(state_records=self.state_rows, state_hash_sum=signed(self.state_sum),
                        users=pc.unique(pa.concat_arrays(self.users)).to_pylist() if self.users else [])
        return done


def _schema_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.Table:
    return pa.Table.from_batches([batch]).select(schema.names).cast(schema)


Prepare = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def _write_partition(table_uri: str, file_rows: int, group_rows: int, schema: pa.Schema, prepare: Prepare | None
                     ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow function: a task's state rows (`schema`'s columns; or what `prepare` makes them from, in the same
    Python worker) -> Parquet files under table_uri, one metadata row per file."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        if prepare is not None:
            batches = prepare(batches)
        fs, root = filesystem(table_uri)
        if isinstance(fs, pafs.LocalFileSystem):
            fs.create_dir(root, recursive=True)  # (on S3 a prefix is no object: nothing to create)
        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        done: list[dict[str, Any]] = []
        current: _DataFile | None = None
        pending: list[pa.Table] = []
        pending_rows = 0

        def flush() -> None:
            nonlocal current, pending, pending_rows
            if not pending_rows:
                return
            if current is None:
                current = _DataFile(fs, root, partition, schema)
            current.write(pa.concat_tables(pending).combine_chunks())
            pending, pending_rows = [], 0
            if current.rows >= file_rows:
                done.append(current.close())
                current = None

        for batch in batches:
            if batch.num_rows:
                pending.append(_schema_batch(batch, schema))
                pending_rows += batch.num_rows
                if pending_rows >= min(group_rows, file_rows - (current.rows if current else 0)):
                    flush()
        flush()
        if current is not None:
            done.append(current.close())
        if done:
            yield pa.RecordBatch.from_pylist(done, schema=_INCREMENT_FILE_SCHEMA if DELETED in schema.names
                                             else _FILE_SCHEMA)

    return write


def _conform(batch: pa.RecordBatch, columns: tuple[str, ...]) -> pa.Table:
    """A batch read back from a data file, as the Delta reader presents it: the table's columns in its schema's order,
    timestamps in microseconds (the unit the checksum hashes), other types plain (files delta-rs rewrote -- a DELETE:
    `sessionctl forget` -- hold string views)."""
    table = plain_types(pa.Table.from_batches([batch]).select(list(columns)))
    for index, column_field in enumerate(table.schema):
        if pa.types.is_timestamp(column_field.type) and column_field.type.unit != "us":
            table = table.set_column(index, column_field.name,
                                     pc.cast(table[column_field.name], pa.timestamp("us", tz="UTC")))
    return table


def file_batches(uri: str, columns: tuple[str, ...]) -> Iterator[pa.Table]:
    """A data file's rows (runs in the executors). A file that is gone, truncated or not Parquet fails with a text
    that names it (UNREADABLE_SAVEPOINT_FILE: the driver makes it SavepointDamaged naming the savepoint); an object
    store that does not answer fails as it is (retried, or StorageUnavailable)."""
    fs, path = filesystem(uri)
    try:
        with fs.open_input_file(path) as handle:
            data = pq.ParquetFile(handle)
            # A table written before an optional column existed (the canonical rows' `attributes`) lacks it here:
            # the readers above fill it (pipelines.core.state_format.conform).
            present = tuple(name for name in columns if name in data.schema_arrow.names)
            for batch in data.iter_batches(batch_size=READ_BATCH_ROWS, columns=list(present)):
                yield _conform(batch, present)
    except (OSError, pa.ArrowException) as error:
        if is_object_store_failure(error):
            raise
        cause = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"
        raise OSError(UNREADABLE_SAVEPOINT_FILE.format(uri=uri, cause=cause)) from error


def _checksum_files(columns: tuple[str, ...]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow function: file URIs -> (uri, rows, partial checksum) of each file, read in the executor."""

    def checksum(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for uri in batch.column(0).to_pylist():
                rows = total = 0
                for part in file_batches(uri, columns):
                    count, hash_sum = partial_checksum(part)
                    rows, total = rows + count, (total + hash_sum) % MOD64
                yield pa.RecordBatch.from_pylist([{"path": uri, "rows": rows, "hash_sum": signed(total)}],
                                                 schema=_PARTIAL_SCHEMA)

    return checksum


def _read_files(columns: tuple[str, ...]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow function: file URIs -> their rows in the current canonical form (a v1 table upgraded row by row)."""
    v1 = "session_start" not in columns

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for uri in batch.column(0).to_pylist():
                for part in file_batches(uri, columns):
                    rows = state_format.conform(state_format.upgrade_v1(part) if v1 else part, state_format.SAVED_SCHEMA)
                    yield from rows.to_batches()

    return read


# ---- driver side ---------------------------------------------------------------------------------

def write_state_files(spark: SparkSession, rows: DataFrame, uri: str, *, file_rows: int | None = None,
                      group_rows: int | None = None, schema: pa.Schema | None = None,
                      prepare: Prepare | None = None) -> WrittenFiles:
    """State rows (a DataFrame: canonical, or an increment's with `schema` savepoints.INCREMENT_SCHEMA; or what
    `prepare`, a mapInArrow function, makes of its rows in the writing task) written as Parquet files under `uri` by
    the tasks that compute them (at most `file_rows` rows per file, FILE_ROWS by default); returns the files'
    metadata and the rows' checksum. Nothing is committed: commit_state_files makes them a Delta table."""
    if schema is None:  # canonical rows: with `attributes` when the frame carries them (a job with attributes)
        schema = state_format.SAVED_SCHEMA if "attributes" in rows.columns else state_format.CANONICAL_SCHEMA
    increment = DELETED in schema.names
    write = _write_partition(uri, file_rows or FILE_ROWS, group_rows or ROW_GROUP_ROWS, schema, prepare)
    share_aws_env(spark, uri)
    files = rows.mapInArrow(write, _INCREMENT_FILE_DDL if increment else _FILE_DDL)
    if not increment:
        written = tuple(row.asDict() for row in files.collect())
        checksum = combine_checksum((f["num_records"], f["hash_sum"]) for f in written)
        return WrittenFiles(uri, written, sum(int(f["num_records"]) for f in written), checksum, schema)
    found = files.toArrow()  # the users stay in Arrow
    written = tuple(found.drop_columns(["users"]).to_pylist())
    checksum = combine_checksum((f["num_records"], f["hash_sum"]) for f in written)
    state_rows, state_sum = checksum_parts(combine_checksum((f["state_records"], f["state_hash_sum"]) for f in written))
    users = pc.unique(pc.list_flatten(found["users"]).combine_chunks()) if found.num_rows else pa.array([], pa.string())
    return WrittenFiles(uri, written, sum(int(f["num_records"]) for f in written), checksum, schema,
                        state_rows, state_sum, users.cast(pa.string()))


def commit_state_files(written: WrittenFiles, storage_options: dict[str, str] | None) -> None:
    """One Delta transaction that creates the savepoint's table with exactly the written files (fails if a table is
    there already)."""
    now_ms = int(time.time() * 1000)
    adds = [AddAction(f["path"], int(f["size"]), {}, now_ms, True, f["stats"]) for f in written.files]
    with s3_errors(written.uri):
        create_table_with_add_actions(
            written.uri, Schema.from_arrow(written.schema), adds, mode="error",
            storage_options=storage_options,
            commit_properties=CommitProperties(custom_metadata={"sessions.rows": written.rows,
                                                                "sessions.checksum": written.checksum}))


def _files_frame(spark: SparkSession, files: StateFiles, function: Callable[..., Any], ddl: str) -> DataFrame:
    """One task per data file, running `function` (a mapInArrow function over the files' URIs)."""
    uris = spark.sparkContext.parallelize([(uri,) for uri in files.files], max(1, len(files.files)))
    share_aws_env(spark, files.uri)
    return spark.createDataFrame(uris, "uri string").mapInArrow(function, ddl)


def files_checksum(spark: SparkSession, files: StateFiles) -> tuple[int, str]:
    """(rows, checksum) of a state table's files, read in the executors: equal to state_checksum of the table's rows
    as a Delta reader returns them."""
    if not files.files:
        return 0, combine_checksum([])
    by_spark = table_rows_by_spark(spark, files)
    if by_spark is not None:  # no Python worker: Spark's reader and the JVM's checksum
        try:
            return frame_checksum(by_spark)
        except Exception:  # noqa: BLE001 -- a file that reader refuses: the reader below reads it or names the damage
            pass
    parts = _files_frame(spark, files, _checksum_files(files.columns), _PARTIAL_DDL).collect()
    return sum(int(p["rows"]) for p in parts), combine_checksum((p["rows"], p["hash_sum"]) for p in parts)


def verify_state_files(spark: SparkSession, store: SavepointStore, savepoint_id: str, rows: int,
                       checksum: str) -> StateFiles:
    """Re-read the committed table in the executors; SavepointDamaged unless its count and checksum are the ones the
    write pass computed. Returns the table's files (their sizes make the savepoint's bytes)."""
    files = store.data_files(savepoint_id)
    got_rows, got = files_checksum(spark, files)
    if (got_rows, got) != (rows, checksum):
        raise SavepointDamaged(f"re-read of {files.uri} does not match the live state: {got_rows} rows / {got} in "
                               f"{len(files.files)} files, written {rows} / {checksum}")
    return files


def table_rows_by_spark(spark: SparkSession, files: StateFiles) -> DataFrame | None:
    """A full state table's rows read by Spark's own Parquet reader (no Python worker), in CANONICAL_DDL with
    `attributes` (null where a file predates it): for a table of the current canonical columns whose files Spark's
    filesystems reach without this process's object-store credentials (local, HDFS). None for any other table. A file
    this reader refuses (a unit it does not read, damage) fails the job: the caller then reads with table_rows, which
    reads what the Delta engines write and names a damaged file."""
    if not _spark_reads(files):
        return None
    if not files.files:
        return spark.createDataFrame([], state_format.SAVED_DDL)
    return spark.read.schema(state_format.SAVED_DDL).parquet(*files.files)


def _spark_reads(files: StateFiles) -> bool:
    """Whether table_rows_by_spark reads the table: its current canonical columns, its files off S3."""
    return "session_start" in files.columns and not any(uri.startswith("s3") for uri in files.files)


# A data file's name as _DataFile writes it: the partition of the task that wrote it (for a savepoint, the state
# partition it read) -- not a Delta engine's rewrite of it.
_PLACED_NAME = re.compile(r"/part-(\d{5})-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.zstd\.parquet$")


def table_rows_placed(spark: SparkSession, files: StateFiles, partitions: int) -> list[DataFrame] | None:
    """table_rows_by_spark in the state's own placement: frame i reads the files the savepoint's task of state
    partition i wrote (their names say which), so a checkpoint of `partitions` partitions takes them with no shuffle
    (the state writer's writePlaced, which checks every row). None when a file's name does not say (a table rewritten
    by a Delta engine), a partition has no file, or table_rows_by_spark reads none."""
    if not files.files or not _spark_reads(files):
        return None
    groups: list[list[str]] = [[] for _ in range(partitions)]
    for uri in files.files:
        named = _PLACED_NAME.search(uri)
        if named is None or int(named.group(1)) >= partitions:
            return None
        groups[int(named.group(1))].append(uri)
    if not all(groups):
        return None
    return [spark.read.schema(state_format.SAVED_DDL).parquet(*group) for group in groups]


def table_rows(spark: SparkSession, files: StateFiles) -> DataFrame:
    """A full state table's rows in the current canonical form (CANONICAL_DDL; v1 rows upgraded as
    state_format.upgrade_v1 does), read by the executors from the files its Delta log lists."""
    if not files.files:
        return spark.createDataFrame([], state_format.SAVED_DDL)
    return _files_frame(spark, files, _read_files(files.columns), state_format.SAVED_DDL)
