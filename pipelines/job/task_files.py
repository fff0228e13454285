"""A Delta append whose data the Spark tasks write and whose commit the driver makes: Flink's two-phase-commit sink.

Each task writes its partition's rows as one Parquet file into the table's directory (a local path or S3, through
pyarrow's filesystem in the executor) and returns one small row: the file's path, size and Delta statistics. The
driver gathers those rows -- never the data -- and makes the one commit: a delta-rs commit of the files' add
actions, idempotent by its application transaction and fenced (pipelines.coordination.fencing) like every other
writer's.

Why delta-rs commits and not Delta Spark: every other writer of these tables (ingest, erasure, restore, compaction)
commits with delta-rs, which on S3 makes a commit with a conditional put; Delta Spark's S3 log store guarantees one
writer per commit only inside one Spark driver, so a mix of the two could let two commits take the same version.
One commit protocol for every writer keeps every table safe on a local path and on S3 alike.

A file written by a task whose commit never came (a crash, a refused commit) is in no table version: readers never
see it, the batch's retry writes its own files, and VACUUM removes it after the retention period.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction
from pyspark.sql import DataFrame, SparkSession

from pipelines.coordination.fencing import committing, fence
from pipelines.coordination.leases import Lease
from pipelines.core.state_format import spark_ddl
from pipelines.errors import LeaseLost
from pipelines.storage import aws_env, filesystem, is_s3, join

__all__ = ["FILE_ROW", "TaskFile", "commit_task_files", "file_stats", "remove_files", "share_aws_env", "task_file", "write_file", "write_task_files"]

# The row each task returns per file it wrote.
FILE_ROW = pa.schema([("path", pa.string()), ("size", pa.int64()), ("rows", pa.int64()), ("stats", pa.string())])
STRING_STATS_MAX = 32  # string min/max are kept only when every value is this short (Delta's prefix length): exact


@dataclass(frozen=True)
class TaskFile:
    """One data file a task wrote: its path relative to the table, size in bytes, rows, Delta statistics (JSON)."""
    path: str
    size: int
    rows: int
    stats: str


def _ms_iso(us: int, *, up: bool) -> str:
    ms = math.ceil(us / 1000) if up else us // 1000  # a max rounded up, a min down: never narrower than the data
    moment = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(milliseconds=ms)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def file_stats(table: pa.Table) -> str:
    """Delta's per-file statistics (numRecords, minValues, maxValues, nullCount) as delta-rs writes them: integers
    as numbers, timestamps as ISO 8601 in milliseconds (min down, max up), strings only where exact."""
    minimum: dict[str, Any] = {}
    maximum: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for field in table.schema:
        column = table[field.name]
        nulls[field.name] = column.null_count
        if column.null_count == len(column):
            continue
        low, high = pc.min_max(column).values()
        if pa.types.is_integer(field.type):
            minimum[field.name], maximum[field.name] = low.as_py(), high.as_py()
        elif pa.types.is_timestamp(field.type):
            low_us, high_us = pc.min_max(column.cast(pa.timestamp("us", tz=field.type.tz)).cast(pa.int64())).values()
            minimum[field.name] = _ms_iso(low_us.as_py(), up=False)
            maximum[field.name] = _ms_iso(high_us.as_py(), up=True)
        elif pa.types.is_string(field.type) and pc.max(pc.utf8_length(column)).as_py() <= STRING_STATS_MAX:
            minimum[field.name], maximum[field.name] = low.as_py(), high.as_py()
    return json.dumps({"numRecords": table.num_rows, "minValues": minimum, "maxValues": maximum,
                       "nullCount": nulls}, separators=(",", ":"))


def write_file(rows: pa.Table, *, uri: str, schema: pa.Schema, prefix: str) -> dict[str, Any]:
    """`rows` (in a task) as one Parquet file in the table at `uri`, cast to `schema`; its FILE_ROW."""
    rows = rows.cast(schema)
    name = f"{prefix}-{uuid.uuid4()}-c000.snappy.parquet"
    fs, root = filesystem(uri)
    path = join(root, name)
    with fs.open_output_stream(path) as out:
        pq.write_table(rows, out, compression="snappy")
    return {"path": name, "size": fs.get_file_info(path).size, "rows": rows.num_rows, "stats": file_stats(rows)}


def task_file(row: Any) -> TaskFile:
    """A FILE_ROW collected on the driver -> TaskFile."""
    return TaskFile(row["path"], int(row["size"]), int(row["rows"]), row["stats"])


def _partition_writer(uri: str, schema: pa.Schema, shape: Callable[[pa.Table], pa.Table], prefix: str
                      ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function each task runs (mapInArrow): its rows shaped to the table's schema, one Parquet file, one row."""
    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        parts = [shape(pa.Table.from_batches([batch])) for batch in batches if batch.num_rows]
        if parts:
            yield pa.RecordBatch.from_pylist([write_file(pa.concat_tables(parts), uri=uri, schema=schema,
                                                         prefix=prefix)], schema=FILE_ROW)
    return write


def write_task_files(frame: DataFrame, *, uri: str, schema: pa.Schema, shape: Callable[[pa.Table], pa.Table],
                     prefix: str) -> list[TaskFile]:
    """Have the tasks of `frame` write its rows into the table at `uri` (one file per non-empty partition, each
    shaped by `shape` -- a picklable function of an Arrow table -- and cast to `schema`); the files, for the commit.
    Only the files' rows reach the driver."""
    written = frame.mapInArrow(_partition_writer(uri, schema, shape, prefix), spark_ddl(FILE_ROW)).collect()
    return [task_file(row) for row in written]


def commit_task_files(uri: str, files: Sequence[TaskFile], *, schema: pa.Schema, app_id: str, version: int,
                      storage_options: dict[str, str] | None = None, leases: Sequence[Lease] = ()) -> bool:
    """One Delta commit adding `files`, at most once per (app_id, version) -- Delta's application transaction -- and
    fenced by `leases`; False when that transaction had already committed (the files are then removed: in no
    version, read by nobody)."""
    now_ms = int(time.time() * 1000)
    actions: list[AddAction | RemoveAction] = [AddAction(f.path, f.size, {}, now_ms, True, f.stats) for f in files]

    def attempt() -> bool:
        table = DeltaTable(uri, storage_options=storage_options)
        done = table.transaction_version(app_id)
        if done is not None and done >= version:
            return False
        transactions, metadata = fence(table, leases, uri)
        table.create_write_transaction(actions, "append", schema, commit_properties=CommitProperties(
            app_transactions=[Transaction(app_id, version), *transactions], custom_metadata=metadata or None,
            max_commit_retries=0))  # the version it loaded, or again from a fresh load (fencing.committing)
        return True

    try:
        committed = committing(attempt, uri)
    except (LeaseLost, CommitFailedError):
        _remove(uri, files)  # refused before, or lost the race for every version tried: surely in no version
        raise
    # Any other failure (S3 did not answer) may have committed all the same: the files stay.
    if not committed:
        _remove(uri, files)
    return committed


def _remove(uri: str, files: Sequence[TaskFile]) -> None:
    remove_files(uri, [f.path for f in files])


def remove_files(uri: str, paths: Iterable[str]) -> None:
    """Best effort: a file in no version is harmless (VACUUM removes it later), but need not wait for that."""
    fs, root = filesystem(uri)
    for path in paths:
        with suppress(OSError):
            fs.delete_file(join(root, path))


def share_aws_env(spark: SparkSession, uri: str) -> None:
    """When `uri` is on S3: the Python functions Spark wraps from now on (mapInArrow) run with
    this process's AWS_* variables, as spark.executorEnv passes them on a cluster (pipelines.job.shipping). In local
    mode the Python workers inherit the JVM's environment, fixed when it started: in a long-lived process maybe before
    the variables were set. Spark hands a wrapped function the SparkContext's environment of that moment."""
    if is_s3(uri):
        spark.sparkContext.environment.update(aws_env())
