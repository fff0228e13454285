"""A streaming source over the raw_events Delta table, built on Spark 4's Python Data Source API.

Offsets are `{"seq": N, "boot": bool, "settled": bool}`: N is the raw table's ingest sequence number; rows with
ingest_seq in (start, end] make a micro-batch. A checkpoint made by a restore starts with
`boot: false`: its first micro-batch carries only one watermark marker (origin "marker") at the savepoint's
watermark, and the savepoint's state is written for that batch by the state writer
(pipelines.job.operators.state_writer), so no event is judged late or on time before both are in place. Events after
the savepoint's source position follow from the next batch on.
An idle-close clock row of raw_events is read as a marker too (README "Idle close").
"""
from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxFiles, SupportsTriggerAvailableNow

from pipelines.core.spec import FieldSpec
from pipelines.data_files import DataFile, data_files, read_data_file
from pipelines.ingest import latest_ingest_seq
from pipelines.ingest.table import CLOCK_KIND
from pipelines.storage import filesystem, s3_options

__all__ = ["SOURCE_NAME", "SPLIT_FILE_ROWS", "fields_option", "RawEventsSource", "RawEventsStreamReader"]

SOURCE_NAME = "sessions_raw"
SOURCE_SCHEMA = (
    # Only what the operator reads: a rejected line never reaches the stream (the sink reads it, and a late
    # event's provenance, from raw_events), so the reader drops those rows and the page/provenance columns.
    "event_id string, user_id string, event_time timestamp, event_type string, ingest_seq long, line_key long, "
    "origin string"
)


ARROW_BATCH_ROWS = 65_536  # rows per Arrow batch a read hands Spark: large enough to amortise, small for memory
# A data file with more rows than this is read by one task per Parquet row group: a catch-up over one large
# landing file would otherwise read, convert and shuffle it on one core while the others wait.
SPLIT_FILE_ROWS = 262_144
# raw_events columns a read needs (the operator's, line_no for line_key's fallback, row_kind for clock rows).
READ_COLUMNS = ("event_id", "user_id", "event_time", "event_type", "ingest_seq", "line_key", "line_no",
                "reject_reason", "row_kind")


class _Range(InputPartition):
    """What one read task reads: `events` of a raw_events data file (`payload` = its URI; all its row groups or
    `row_groups`) with ingest_seq in (low, high], or a restore's watermark `marker` (`payload` = the bootstrap
    JSON)."""

    def __init__(self, kind: Literal["events", "marker"], payload: str, low: int = 0, high: int = 0, row_groups: list[int] | None = None,
                 file: DataFile | None = None):
        super().__init__(kind)
        self.kind, self.payload, self.low, self.high = kind, payload, low, high
        self.row_groups = row_groups  # events: these row groups of the file only (None: the whole file)
        self.file = file  # events: the data file (with the rows a deletion vector removes)


_TYPES = {"string": pa.string(), "long": pa.int64(), "double": pa.float64(), "boolean": pa.bool_(),
          "timestamp": pa.timestamp("us", tz="UTC")}


def fields_option(fields: Sequence[FieldSpec]) -> str:
    """The `fields` option: the typed input fields (raw_events' field_<name> columns) the stream carries to the
    operator, for the session spec's attributes; empty: none (the default spec)."""
    return json.dumps([[f.column, f.type] for f in fields]) if fields else ""


def _field_columns(option: str | None) -> list[tuple[str, str]]:
    return [(str(name), str(kind)) for name, kind in json.loads(option)] if option else []


def _schema_text(fields: Sequence[tuple[str, str]]) -> str:
    return SOURCE_SCHEMA + "".join(f", {name} {kind}" for name, kind in fields)


def _arrow_schema(fields: Sequence[tuple[str, str]] = ()) -> pa.Schema:
    return pa.schema([(name, _TYPES[kind]) for name, kind in
                      (field.strip().split(" ") for field in _schema_text(fields).split(","))])


def _with_origin(batch: pa.RecordBatch, origin: str | pa.Array,
                 fields: Sequence[tuple[str, str]] = ()) -> pa.RecordBatch:
    """Conform a batch to the source schema: missing columns become nulls (a field's column in files written before
    the field was declared), origin is set."""
    schema = _arrow_schema(fields)
    arrays = []
    for field in schema:
        if field.name == "origin":
            arrays.append(origin if isinstance(origin, pa.Array) else pa.array([origin] * batch.num_rows, pa.string()))
        elif field.name in batch.schema.names:
            arrays.append(batch.column(field.name).cast(field.type))
        else:
            arrays.append(pa.nulls(batch.num_rows, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _with_line_key(table: pa.Table) -> pa.Table:
    """Rows written before line_key existed (a missing column, or nulls after OPTIMIZE merged old and new files)
    get -line_no: the sink builds the same key from raw_events (pipelines.job.quarantine.late_key)."""
    fallback = pc.negate(table["line_no"])
    if "line_key" not in table.column_names:
        return table.append_column("line_key", fallback)
    index = table.schema.get_field_index("line_key")
    return table.set_column(index, "line_key", pc.coalesce(table["line_key"], fallback))


def _event_origins(batch: pa.RecordBatch) -> str | pa.Array:
    """raw_events rows are events, except an idle-close clock row (row_kind "clock"): a watermark `marker`, which
    moves the watermark as an event at its time would and does nothing else (pipelines.job.operators.seam.sessionize)."""
    if "row_kind" not in batch.schema.names or batch.column("row_kind").null_count == batch.num_rows:
        return "event"
    clock = pc.fill_null(pc.equal(batch.column("row_kind"), CLOCK_KIND), False)
    return pc.if_else(clock, "marker", "event")


def _row_groups(uri: str, low: int, high: int) -> list[int]:
    """The row groups of a raw_events data file that may hold ingest_seq in (low, high] (by their statistics)."""
    fs, path = filesystem(uri)
    with fs.open_input_file(path) as handle:
        meta = pq.ParquetFile(handle).metadata
    column = meta.schema.to_arrow_schema().get_field_index("ingest_seq")
    groups = []
    for index in range(meta.num_row_groups):
        stats = meta.row_group(index).column(column).statistics
        if stats is not None and stats.has_min_max and not (stats.max > low and stats.min <= high):
            continue
        groups.append(index)
    return groups


class RawEventsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]):
        self.table = options["path"]
        # A restore's bootstrap (pipelines.job.checkpoint.read_bootstrap), read by the driver from the checkpoint --
        # which may be on HDFS or S3, out of this process's reach -- and handed over whole; empty: none.
        self.bootstrap = options.get("bootstrap") or ""
        max_versions = options.get("maxVersionsPerTrigger")
        self.max_versions = int(max_versions) if max_versions else None
        # Trigger.AvailableNow sets it; a restore caps it at the savepoint (its marker-only first batch).
        self.target_seq: int | None = int(options["targetSeq"]) if options.get("targetSeq") else None
        # "false": no empty batch after data (a restore's side checkpoint stops after its marker batch, which closes
        # nothing: the stream that resumes from it runs the next batch with the savepoint's watermark).
        self.settle = options.get("settle", "true") != "false"
        self.fields = _field_columns(options.get("fields"))

    def _bootstrap(self) -> dict[str, Any] | None:
        return dict(json.loads(self.bootstrap)) if self.bootstrap else None

    def _latest_seq(self) -> int:
        return latest_ingest_seq(self.table, s3_options(self.table))

    def initialOffset(self) -> dict[str, Any]:
        boot = self._bootstrap()
        if boot is not None:
            return {"seq": int(boot["source_seq"]), "boot": False, "settled": True}
        return {"seq": 0, "boot": True, "settled": True}

    def prepareForTriggerAvailableNow(self) -> None:
        latest = self._latest_seq()
        self.target_seq = latest if self.target_seq is None else min(self.target_seq, latest)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxFiles(self.max_versions) if self.max_versions else ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        if not start["boot"]:
            return {"seq": start["seq"], "boot": True, "settled": False}  # the restore's marker-only batch
        latest = self._latest_seq()
        if self.target_seq is not None:
            latest = min(latest, self.target_seq)
        if isinstance(limit, ReadMaxFiles):
            latest = min(latest, start["seq"] + limit.max_files)
        if latest > start["seq"]:
            return {"seq": latest, "boot": True, "settled": False}
        if not start.get("settled", True) and self.settle:
            # One empty batch after data: it runs with the watermark the data advanced, so sessions
            # it closes are written now, not when the next event happens to arrive.
            return {"seq": start["seq"], "boot": True, "settled": True}
        return start

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        if not start["boot"] and end["boot"]:
            boot = self._bootstrap()
            return [_Range("marker", json.dumps(boot))]
        if end["seq"] <= start["seq"]:
            return []
        table = DeltaTable(self.table, storage_options=s3_options(self.table))
        low, high = start["seq"], end["seq"]
        ranges: list[InputPartition] = []
        for file in data_files(table, stats_of=("ingest_seq",)):
            if not file.may_hold("ingest_seq", low, high):
                continue
            if file.rows is not None and file.rows > SPLIT_FILE_ROWS:
                ranges += [_Range("events", file.uri, low, high, [group], file)
                           for group in _row_groups(file.uri, low, high)]
            else:
                ranges.append(_Range("events", file.uri, low, high, None, file))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Range)  # partitions() makes no other kind
        if partition.kind == "events":
            # On the executor, straight from the table's storage (S3 credentials from its AWS_* variables). Files
            # written before line_key or row_kind existed lack them: _with_origin fills nulls.
            wanted = (*READ_COLUMNS, *(name for name, _ in self.fields))
            table = read_data_file(partition.file or DataFile(partition.payload), columns=wanted,
                                   row_groups=partition.row_groups)
            seq = table["ingest_seq"]
            in_range = pc.and_(pc.greater(seq, partition.low), pc.less_equal(seq, partition.high))
            table = table.filter(pc.and_(in_range, pc.is_null(table["reject_reason"])))
            for batch in _with_line_key(table).to_batches(max_chunksize=ARROW_BATCH_ROWS):
                yield _with_origin(batch, _event_origins(batch), self.fields)
        elif partition.kind == "marker":
            # Carries the savepoint's max event time so the restored watermark equals the original.
            boot = json.loads(partition.payload)
            marker_us = (int(boot["watermark_ms"]) + int(boot["lateness_ms"])) * 1000
            yield _with_origin(pa.RecordBatch.from_pydict(
                {"event_time": pa.array([marker_us], pa.timestamp("us", tz="UTC"))}), "marker", self.fields)

    def commit(self, end: dict[str, Any]) -> None:
        pass


class RawEventsSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return _schema_text(_field_columns(self.options.get("fields")))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return RawEventsStreamReader(self.options)
