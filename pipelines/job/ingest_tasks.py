"""A large landed file read and parsed by Spark tasks where the file is: ingest's work costs what the cluster has,
not what one process has (pipelines.ingest.table.IngestTasks).

The file's new complete lines (a Span, planned by pipelines.ingest.local from the file's end only) are cut into
ranges of RANGE_BYTES. A line belongs to the range holding its first byte. Two Spark jobs of one task per range:
1. each task counts the lines that begin in its range -- a newline count, nothing parsed -- so that
2. each task knows the number of its first line, reads its lines (the last one past the range's end to its
   newline), parses them with line_rows' rules (the columnar path and the per-line rules, the standing erasure),
   writes them as one raw_events Parquet file and returns the file's add action and its counts.
The driver only adds the ranges' counts and the files' rows; the one ingest commit that adds the files is the
Appender's (fenced, idempotent by its ingest_seq, with the file's position in its metadata). A task that finds
another number of lines than the count (the file was rewritten meanwhile) fails the ingest: its files are removed
and the next ingest plans again from the recorded position.

A Kafka backlog takes one job: a task per partition range reads it with the ingest's own reader
(pipelines.ingest.kafka.read_range) and writes its rows the same way; the commit records every partition's next
offset. On one host the ingesting process is the cheaper reader (benchmarks/README.md): pipelines.job.stream uses
these tasks as SESSIONS_INGEST_BY_TASKS says.
"""
from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake.transaction import AddAction
from pyspark.sql import SparkSession

from pipelines.config import SessionsConfig
from pipelines.core.spec import DEFAULT_INPUT, InputSpec
from pipelines.core.state_format import spark_ddl
from pipelines.errors import ConcurrentIngest, SourceDataLost, SourceUnavailable
from pipelines.ingest.erased import ErasedUsers
from pipelines.ingest.lines import split_lines
from pipelines.ingest.table import (
    RAW_SCHEMA,
    KafkaRange,
    ParsedSpan,
    RowSource,
    Span,
    line_rows,
    standing_erasure,
    table_schema,
)
from pipelines.job.task_files import remove_files, share_aws_env, write_file
from pipelines.storage import filesystem, is_s3, object_store_errors

__all__ = ["RANGE_BYTES", "SparkIngestTasks"]

RANGE_BYTES = 32 * 1024 * 1024  # one task's bytes: parsed in one piece, its memory a few times this
LINE_END_STEP = 1 << 20          # a range's last line is read on past the range in steps of this

_COUNT = pa.schema([("range", pa.int64()), ("lines", pa.int64())])
_FILE = [("path", pa.string()), ("size", pa.int64()), ("rows", pa.int64()), ("stats", pa.string()),
         ("rejected", pa.int64()), ("newest_us", pa.int64()), ("dropped", pa.string())]
_WRITTEN = pa.schema([("range", pa.int64()), ("lines", pa.int64()), *_FILE])
_KAFKA_WRITTEN = pa.schema([("range", pa.int64()), ("next", pa.int64()), *_FILE, ("error", pa.string()),
                            ("error_kind", pa.string()), ("lost_first", pa.int64()), ("lost_last", pa.int64())])


def _ranges(span: Span, range_bytes: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + range_bytes, span.end)) for lo in range(span.start, span.end, range_bytes)]


UNREADABLE = "landed file not readable where this Spark task runs"  # the driver's SourceUnavailable, recognised


def _read(span: Span, offset: int, size: int) -> bytes:
    fs, path = filesystem(span.uri)
    try:
        handle = fs.open_input_file(path)
    except FileNotFoundError:  # a landing directory on the driver's host only, executors elsewhere
        raise FileNotFoundError(f"{UNREADABLE}: {span.uri}") from None
    with handle:
        return bytes(handle.read_at(size, offset))


def _counter(span: Span, ranges: list[tuple[int, int]]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Task k counts the newlines q with lo_k <= q + 1 < hi_k: the lines that begin in its range, but for the span's
    first line (which begins at its start, after no newline of the span)."""
    def count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for k in batch.column("id").to_pylist():
                lo, hi = ranges[k]
                first = lo if k == 0 else lo - 1
                lines = _read(span, first, hi - 1 - first).count(b"\n") if hi - 1 > first else 0
                yield pa.RecordBatch.from_pylist([{"range": k, "lines": lines}], schema=_COUNT)
    return count


def _range_lines(span: Span, ranges: list[tuple[int, int]], k: int) -> tuple[bytes, int]:
    """(the bytes of the lines that begin in range k, through the last one's newline; the offset of the first) --
    b"" when none begins there."""
    lo, hi = ranges[k]
    start = lo if k == 0 else lo - 1
    data = _read(span, start, hi - start)
    if k > 0:
        at = data.find(b"\n")
        if at < 0 or start + at + 1 >= hi:
            return b"", hi
        data, start = data[at + 1:], start + at + 1
    end = hi
    while not data.endswith(b"\n") and end < span.end:  # the last line, on to its newline (or the span's end)
        more = _read(span, end, min(LINE_END_STEP, span.end - end))
        at = more.find(b"\n")
        data += more if at < 0 else more[:at + 1]
        end += len(more) if at < 0 else at + 1
    return data, start


def _parser(span: Span, ranges: list[tuple[int, int]], first_numbers: list[int], *, table_uri: str, seq: int,
            ingested_at: dt.datetime, max_future: dt.timedelta, erased: ErasedUsers, spec: InputSpec
            ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Task k parses the lines that begin in its range, numbered from first_numbers[k], into one raw_events file."""
    def parse(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for k in batch.column("id").to_pylist():
                data, _ = _range_lines(span, ranges, k)
                if k == 0:
                    lines, _, _ = split_lines(data, span.lines_before, span.open_before)
                else:
                    lines, _, _ = split_lines(data, first_numbers[k] - 1, False)
                rows = line_rows([RowSource(span.name, lines)], seq, ingested_at, max_future, keyed_by_line_no=True,
                                 spec=spec)
                out = _written(rows, erased, table_uri=table_uri, prefix=f"part-i{seq}-{k:05d}", spec=spec)
                yield pa.RecordBatch.from_pylist([{"range": k, "lines": len(lines), **out}], schema=_WRITTEN)
    return parse


def _written(rows: pa.Table, erased: ErasedUsers, *, table_uri: str, prefix: str, spec: InputSpec) -> dict[str, Any]:
    """A task's rows after the standing erasure, written as one raw_events file (none when no row is left): the
    file's FILE_ROW fields and the counts the commit needs."""
    rows, dropped = standing_erasure(erased, rows)
    rows = rows.add_column(len(RAW_SCHEMA), "row_kind", pa.nulls(rows.num_rows, pa.string()))  # table_schema's order
    valid = rows.filter(pc.is_null(rows["reject_reason"]))
    newest = int(pc.max(valid["event_time"].cast(pa.int64())).as_py()) if valid.num_rows else None
    out = {"path": None, "size": 0, "rows": rows.num_rows, "stats": None, "rejected": rows.num_rows - valid.num_rows,
           "newest_us": newest, "dropped": json.dumps(dropped)}
    if rows.num_rows:
        out.update(write_file(rows, uri=table_uri, schema=table_schema(spec), prefix=prefix))
    return out


def _kafka_reader(config: SessionsConfig, ranges: Sequence[KafkaRange], *, table_uri: str, seq: int,
                  ingested_at: dt.datetime, max_future: dt.timedelta, erased: ErasedUsers, spec: InputSpec
                  ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Task k reads ranges[k] of its partition (pipelines.ingest.kafka.read_range) into one raw_events file; a loss
    or an unreachable broker is its row's `error`, for the driver to raise."""
    from pipelines.ingest.kafka import read_range  # confluent_kafka: only where Kafka is the source

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for k in batch.column("id").to_pylist():
                part = ranges[k]
                out: dict[str, Any] = {"range": k, "next": part.start}
                try:
                    sources, out["next"] = read_range(config, part.partition, part.start, part.end)
                except SourceDataLost as error:
                    out.update(error=str(error), error_kind="lost", lost_first=error.first, lost_last=error.last)
                except SourceUnavailable as error:
                    out.update(error=str(error), error_kind="unavailable")
                else:
                    rows = line_rows(sources, seq, ingested_at, max_future, spec=spec)
                    rows = rows.set_column(rows.schema.get_field_index("line_key"), "line_key",
                                           pc.add(rows["line_key"], part.key_base))
                    out.update(_written(rows, erased, table_uri=table_uri, prefix=f"part-i{seq}-{k:05d}", spec=spec))
                yield pa.RecordBatch.from_pylist([out], schema=_KAFKA_WRITTEN)
    return read


class SparkIngestTasks:
    """IngestTasks on a Spark session: a landed file of at least `min_bytes` new bytes is read and parsed by its
    tasks, RANGE_BYTES each (the module docstring); Kafka ranges one task each, reading with the ingest's own reader
    (pipelines.ingest.kafka.read_range)."""

    def __init__(self, spark: SparkSession, *, min_bytes: int, range_bytes: int = RANGE_BYTES) -> None:
        self.spark, self.min_bytes, self.range_bytes = spark, min_bytes, range_bytes

    def _run(self, function: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]], schema: pa.Schema,
             tasks: int, *, uris: tuple[str, ...]) -> list[dict[str, Any]]:
        """`function` in one task per range; its rows in range order. `uris`: what the tasks read and write (an S3 one
        passes this process's AWS_* variables on to them)."""
        frame = self.spark.range(0, tasks, 1, tasks)  # task k handles range k
        s3_uri = next((uri for uri in uris if is_s3(uri)), "")
        try:
            # S3 failing in a task is StorageUnavailable, as it is in an ingest here: `run` rides it out.
            share_aws_env(self.spark, s3_uri)
            with object_store_errors(s3_uri):
                rows = frame.mapInArrow(function, spark_ddl(schema)).collect()
        except Exception as error:
            if UNREADABLE not in str(error):
                raise
            raise SourceUnavailable(
                f"Spark's executors cannot read landed file {uris[0]}: the landing directory must be on a path every "
                "executor sees (a shared mount) or on S3 -- or set SESSIONS_INGEST_BY_TASKS=never to read large files "
                "in the ingesting process") from None
        return sorted((row.asDict() for row in rows), key=lambda row: int(row["range"]))

    def __call__(self, span: Span, *, table_uri: str, seq: int, ingested_at: dt.datetime,
                 max_future: dt.timedelta, erased: ErasedUsers, spec: InputSpec = DEFAULT_INPUT) -> ParsedSpan:
        ranges = _ranges(span, self.range_bytes)
        counts = [int(row["lines"]) for row in self._run(_counter(span, ranges), _COUNT, len(ranges),
                                                                 uris=(span.uri,))]
        counts[0] += 1  # the span's first line
        first_numbers = (span.first_line + np.concatenate([[0], np.cumsum(counts)[:-1]])).tolist()
        written = self._run(_parser(span, ranges, first_numbers, table_uri=table_uri, seq=seq,
                                    ingested_at=ingested_at, max_future=max_future, erased=erased, spec=spec),
                            _WRITTEN, len(ranges), uris=(span.uri, table_uri))
        found = [int(row["lines"]) for row in written]
        if found != counts:
            remove_files(table_uri, [str(row["path"]) for row in written if row["path"] is not None])
            raise ConcurrentIngest(f"landed file {span.name} changed while Spark tasks read it ({sum(found)} lines "
                                   f"where {sum(counts)} were counted): ingest again")
        return _parsed(written, table_uri, lines=span.first_line + sum(counts) - 1)

    def messages(self, config: SessionsConfig, ranges: Sequence[KafkaRange], *, table_uri: str, seq: int,
                 ingested_at: dt.datetime, max_future: dt.timedelta, erased: ErasedUsers,
                 spec: InputSpec = DEFAULT_INPUT) -> ParsedSpan:
        """Kafka ranges, one task each (IngestTasks.messages)."""
        written = self._run(_kafka_reader(config, ranges, table_uri=table_uri, seq=seq, ingested_at=ingested_at,
                                          max_future=max_future, erased=erased, spec=spec),
                            _KAFKA_WRITTEN, len(ranges), uris=(table_uri,))
        failed = next((row for row in written if row["error"] is not None), None)
        if failed is not None:  # nothing of the round is committed: the next ingest plans again
            remove_files(table_uri, [str(row["path"]) for row in written if row["path"] is not None])
            if failed["error_kind"] == "lost":
                raise SourceDataLost(str(failed["error"]), config.kafka_topic, ranges[int(failed["range"])].partition,
                                     int(failed["lost_first"]), int(failed["lost_last"]))
            raise SourceUnavailable(str(failed["error"]))
        return replace(_parsed(written, table_uri),
                       next_offsets={ranges[int(row["range"])].partition: int(row["next"]) for row in written})


def _parsed(written: list[dict[str, Any]], table_uri: str, *, lines: int = 0) -> ParsedSpan:
    """The tasks' rows (one per task, _written's fields) as what the ingest commit needs."""
    paths = [str(row["path"]) for row in written if row["path"] is not None]
    now_ms = int(time.time() * 1000)
    dropped: dict[str, int] = {}
    for row in written:
        for user, events in json.loads(str(row["dropped"])).items():
            dropped[user] = dropped.get(user, 0) + int(events)
    newest = [int(row["newest_us"]) for row in written if row["newest_us"] is not None]
    return ParsedSpan(
        actions=[AddAction(str(row["path"]), int(row["size"]), {}, now_ms, True, str(row["stats"]))
                 for row in written if row["path"] is not None],
        rows=sum(int(row["rows"]) for row in written), rejected=sum(int(row["rejected"]) for row in written),
        newest_us=max(newest) if newest else None, lines=lines, dropped=dropped,
        discard=partial(remove_files, table_uri, paths))
