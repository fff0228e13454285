"""A micro-batch's quarantine rows, built by the Spark tasks: the rejected lines of its source range, and its late
events with the provenance (file, line) of their very line.

Rejected lines never enter the stateful operator: the tasks read them from the raw_events data files of the batch's
ingest_seq range, the files the stream's source reads the events from. The driver only picks those files
from the Delta log (their statistics: the ingest_seq range, and whether any row of the file was rejected); a late
event is joined to its line in Spark, on (ingest_seq, line_key) plus its own ids.
"""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from pipelines.core.state_format import ms_to_ts, spark_ddl
from pipelines.data_files import DataFile, data_files, read_data_file

__all__ = ["QUARANTINE_SCHEMA", "LateRows", "late_key", "quarantine_frame", "quarantine_rows"]

QUARANTINE_SCHEMA = pa.schema([
    ("reason", pa.string()),
    ("raw", pa.string()),
    ("source_file", pa.string()),
    ("line_no", pa.int64()),
    ("ingest_seq", pa.int64()),
    ("event_id", pa.string()),
    ("user_id", pa.string()),
    ("event_time", pa.timestamp("us", tz="UTC")),
    ("event_type", pa.string()),
    ("batch_id", pa.int64()),
    ("incarnation", pa.string()),
    ("written_version", pa.int64()),
    ("quarantined_at", pa.timestamp("us", tz="UTC")),
])
LINE_COLUMNS = QUARANTINE_SCHEMA.names[:9]  # what a quarantined line carries; the rest says when it was written
_LINES = pa.schema([QUARANTINE_SCHEMA.field(name) for name in LINE_COLUMNS])
# A late event's line: what the join needs of raw_events.
_PROVENANCE = pa.schema([("ingest_seq", pa.int64()), ("line_key", pa.int64()), ("event_id", pa.string()),
                         ("user_id", pa.string()), ("line_no", pa.int64()), ("source_file", pa.string()),
                         ("page", pa.string())])
_JOIN_KEYS = ["ingest_seq", "line_key", "event_id", "user_id"]


def late_key(raw: pa.Table) -> pa.ChunkedArray:
    """The key a late event carries (pipelines.job.operators.seam): line_key, or -line_no for rows written before it."""
    fallback = pc.negate(raw["line_no"])
    return pc.coalesce(raw["line_key"], fallback) if "line_key" in raw.column_names else fallback


def _raw_files(table: DeltaTable, low: int, high: int, *, rejected: bool) -> list[DataFile]:
    """The raw_events data files that may hold rows with ingest_seq in (low, high] (and, with `rejected`, a rejected
    one): from the Delta log's statistics, on the driver."""
    files = []
    for file in data_files(table, stats_of=("ingest_seq", "reject_reason")):
        if not file.may_hold("ingest_seq", low, high):
            continue
        rows, valid = file.rows, file.nulls("reject_reason")
        if rejected and rows is not None and valid is not None and valid >= rows:
            continue  # every row of it valid: no rejected line there
        files.append(file)
    return files


def _file_reader(files: Sequence[DataFile], low: int, high: int, *,
                 rejected: bool) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The tasks' read of raw_events files (rows of URIs, among `files`): their rejected lines, or the valid lines'
    provenance, with ingest_seq in (low, high]."""
    # Only the files a deletion vector cuts travel with the function: the others are their URI.
    cut = {file.uri: file for file in files if file.deleted is not None}
    wanted = (("reject_reason", "raw", *LINE_COLUMNS[2:]) if rejected
              else ("ingest_seq", "line_key", "line_no", "source_file", "page", "event_id", "user_id", "reject_reason"))

    def read(uris: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in uris:
            for uri in batch.column("uri").to_pylist():
                rows = read_data_file(cut.get(uri) or DataFile(uri), columns=wanted)
                seq = rows["ingest_seq"]
                keep = pc.and_(pc.greater(seq, low), pc.less_equal(seq, high))
                reason = pc.is_valid(rows["reject_reason"]) if rejected else pc.is_null(rows["reject_reason"])
                rows = rows.filter(pc.and_(keep, reason))
                if rejected:
                    out = pa.table({name: rows["reject_reason" if name == "reason" else name]
                                    for name in LINE_COLUMNS}).cast(_LINES)
                else:
                    out = pa.table({name: late_key(rows) if name == "line_key" else rows[name]
                                    for name in _PROVENANCE.names}).cast(_PROVENANCE)
                yield from out.to_batches()
    return read


def _late_lines(rows: pa.Table) -> pa.Table:
    """Late events joined to their lines -> quarantine lines (in the tasks). A late event's line as landed is not
    carried through the stream: `raw` is rebuilt as JSON."""
    times = (dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(milliseconds=ms)
             if ms is not None else None for ms in rows["event_time_ms"].to_pylist())
    raw = [json.dumps({"event_id": e, "user_id": u, "event_time": t.isoformat().replace("+00:00", "Z") if t else None,
                       "event_type": k, "page": p})
           for e, u, t, k, p in zip(rows["event_id"].to_pylist(), rows["user_id"].to_pylist(), times,
                                    rows["event_type"].to_pylist(), rows["page"].to_pylist())]
    event_time = ms_to_ts(rows["event_time_ms"])
    return pa.table({"reason": pa.array(["late"] * rows.num_rows, pa.string()), "raw": pa.array(raw, pa.string()),
                     "source_file": rows["source_file"], "line_no": rows["line_no"],
                     "ingest_seq": rows["ingest_seq"], "event_id": rows["event_id"], "user_id": rows["user_id"],
                     "event_time": event_time, "event_type": rows["event_type"]}, schema=_LINES)


def _late_frame(late: DataFrame, provenance: DataFrame) -> DataFrame:
    """Late events (operator rows) with the provenance of their very line: joined on (ingest_seq, line_key), one row
    per landed line. For rows written before line_key the key is -line_no, which repeats across the files of one
    ingest commit: the event's own ids join too, and each late event keeps one match."""
    numbered = late.withColumn("late_row", F.monotonically_increasing_id())
    joined = numbered.join(provenance, _JOIN_KEYS, "left")
    first = Window.partitionBy("late_row").orderBy(F.col("source_file").asc_nulls_last(), "line_no")
    joined = joined.withColumn("match", F.row_number().over(first)).where("match = 1")
    columns = ["ingest_seq", "event_id", "user_id", "event_time_ms", "event_type", "line_no", "source_file", "page"]

    def lines(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield from _late_lines(pa.Table.from_batches([batch])).to_batches()
    return joined.select(*columns).mapInArrow(lines, spark_ddl(_LINES))


@dataclass(frozen=True)
class LateRows:
    """A micro-batch's late rows as its sessions' job counted them: how many, and their ingest_seq bounds."""
    count: int
    low: int
    high: int


def quarantine_frame(batch: DataFrame, *, raw_uri: str, storage_options: dict[str, str] | None, low: int, high: int,
                     late: LateRows) -> DataFrame | None:
    """The quarantine lines of a micro-batch whose source range is (low, high] (`batch`: the operator's output,
    persisted by the caller; `late`: its late rows' tally): rejected lines and late events, or None when it has
    neither. Only the raw files' URIs are handled here; the rows stay in the executors."""
    spark = batch.sparkSession
    parts = []
    raw: list[DeltaTable] = []  # raw_events, loaded once for both reads (and not at all when neither needs it)

    def raw_files(seq_low: int, seq_high: int, *, rejected: bool) -> list[DataFile]:
        if not raw:
            raw.append(DeltaTable(raw_uri, storage_options=storage_options))
        return _raw_files(raw[0], seq_low, seq_high, rejected=rejected)

    if high > low:
        files = raw_files(low, high, rejected=True)
        if files:
            uris = spark.createDataFrame([(f.uri,) for f in files], "uri string").repartition(len(files))
            parts.append(uris.mapInArrow(_file_reader(files, low, high, rejected=True), spark_ddl(_LINES)))
    if late.count:
        # The lines of the late events (their ingest_seq is in the batch's range; the bounds are widened to theirs
        # all the same).
        seq_low, seq_high = min(low, late.low - 1), max(high, late.high)
        files = raw_files(seq_low, seq_high, rejected=False)
        uris = spark.createDataFrame([(f.uri,) for f in files], "uri string").repartition(max(1, len(files)))
        provenance = uris.mapInArrow(_file_reader(files, seq_low, seq_high, rejected=False), spark_ddl(_PROVENANCE))
        events = batch.where("kind = 'late'").select("ingest_seq", "line_key", "event_id", "user_id", "event_time_ms",
                                                     "event_type")
        parts.append(_late_frame(events, provenance))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])


def quarantine_rows(lines: pa.Table, *, batch_id: int, incarnation: str, written_version: int,
                    quarantined_at: dt.datetime) -> pa.Table:
    """Quarantine lines -> quarantine table rows (in the tasks; written_version as in pipelines.job.sink)."""
    n = lines.num_rows
    return pa.table({
        **{name: lines[name] for name in LINE_COLUMNS},
        "batch_id": pa.array([batch_id] * n, pa.int64()),
        "incarnation": pa.array([incarnation] * n, pa.string()),
        "written_version": pa.array([written_version] * n, pa.int64()),
        "quarantined_at": pa.array([quarantined_at] * n, pa.timestamp("us", tz="UTC")),
    }, schema=QUARANTINE_SCHEMA)
