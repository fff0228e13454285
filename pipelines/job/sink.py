"""The output Delta tables and the exactly-once micro-batch sink that writes them. The rows are written by the Spark
tasks (pipelines.job.task_files) and each table gets one commit per batch from the driver: no row crosses it."""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.schema import Field, PrimitiveType
from pyspark.sql import DataFrame

from pipelines.arrow_types import plain_field
from pipelines.config import SessionsConfig
from pipelines.coordination import kill_point
from pipelines.coordination.fencing import committing, fence, fenced_delete
from pipelines.coordination.leases import Lease
from pipelines.core.spec import Attribute
from pipelines.core.state_format import ms_to_ts, spark_ddl
from pipelines.data_files import row_count
from pipelines.errors import LeaseLost, StorageUnavailable
from pipelines.job.quarantine import QUARANTINE_SCHEMA, LateRows, quarantine_frame, quarantine_rows
from pipelines.job.task_files import FILE_ROW, TaskFile, commit_task_files, task_file, write_file, write_task_files
from pipelines.storage import (
    is_object_store_failure,
    is_s3,
    read_rows,
    s3_failure,
    sql_literal,
    storage_options,
    table_exists,
)

__all__ = ["QUARANTINE_SCHEMA", "SESSIONS_SCHEMA", "MicroBatchSink", "add_attribute_columns", "sessions_schema", "ensure_table", "idempotent_append", "table_rows", "version_after_batch"]

SESSIONS_SCHEMA = pa.schema([
    ("session_id", pa.string()),
    ("user_id", pa.string()),
    ("session_start", pa.timestamp("us", tz="UTC")),
    ("session_end", pa.timestamp("us", tz="UTC")),
    ("event_count", pa.int64()),
    ("page_views", pa.int64()),
    ("end_reason", pa.string()),
    ("batch_id", pa.int64()),
    ("incarnation", pa.string()),
    # Predicted table version of the write: monotone, so a restore can remove what came after a savepoint.
    ("written_version", pa.int64()),
])


_DELTA_TYPES = {"string": "string", "long": "long", "double": "double", "boolean": "boolean"}


def add_attribute_columns(uri: str, attributes: Sequence[Attribute], storage_options: dict[str, str] | None = None
                          ) -> None:
    """The sessions table gets a nullable column per attribute it does not have yet (Delta schema evolution, one
    commit; rows written before read null there). A removed attribute's column stays: later rows carry null."""
    table = DeltaTable(uri, storage_options=storage_options)
    present = {name.lower() for name in pa.schema(table.schema().to_arrow()).names}
    missing = [a for a in attributes if a.name.lower() not in present]
    if missing:
        table.alter.add_columns([Field(a.name, PrimitiveType(_DELTA_TYPES[a.result_type]), nullable=True)
                                 for a in missing])


def sessions_schema(uri: str, storage_options: dict[str, str] | None = None) -> pa.Schema:
    """The sessions table's columns now: SESSIONS_SCHEMA, then its attribute columns (plain Arrow types)."""
    table = DeltaTable(uri, storage_options=storage_options)
    return pa.schema([plain_field(f) for f in pa.schema(table.schema().to_arrow())])


def ensure_table(uri: str, schema: pa.Schema, storage_options: dict[str, str] | None = None) -> None:
    if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
        write_deltalake(uri, schema.empty_table(), mode="append", storage_options=storage_options)


def table_rows(uri: str, storage_options: dict[str, str] | None = None) -> int:
    if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
        return 0
    return row_count(DeltaTable(uri, storage_options=storage_options))


def version_after_batch(uri: str, incarnation: str, batch_id: int,
                        storage_options: dict[str, str] | None = None) -> int:
    """The table version that holds the writes of every batch up to `batch_id` of this checkpoint incarnation and
    none after it: one before the first later batch's write (written_version is monotone in batch order), or the
    current version when the stream has written nothing since. A restore removes `written_version` above it."""
    if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
        return 0
    table = DeltaTable(uri, storage_options=storage_options)
    current = table.version()
    later = read_rows(table, columns=["written_version"], where=f"incarnation = {sql_literal(incarnation)} AND batch_id > {int(batch_id)}")
    if later.num_rows == 0:
        return current
    return min(current, int(pc.min(later["written_version"]).as_py()) - 1)


def roll_back(config: SessionsConfig, *, sessions_version: int, quarantine_version: int, leases: Sequence[Lease]
              ) -> dict[str, int]:
    """The output rows written after these versions removed (a restore's, before its replay writes them again,
    exactly once); rows removed per table that exists. Fenced by `leases`: a stream that lost the job lease to the
    restore can no longer commit to these tables."""
    removed = {}
    for name, uri, version in (("sessions", config.sessions_table, sessions_version),
                               ("quarantine", config.quarantine_table, quarantine_version)):
        if table_exists(config, uri):
            removed[name] = fenced_delete(uri, f"written_version > {int(version)}", leases,
                                          storage_options(config, uri))
    return removed


def idempotent_append(uri: str, rows: pa.Table, app_id: str, batch_id: int,
                      *, storage_options: dict[str, str] | None = None, leases: Sequence[Lease] = ()) -> bool:
    """Append rows at most once per (app_id, batch_id) using Delta's transaction identifiers. With `leases`, fenced
    (pipelines.coordination.fencing): refused with LeaseLost once a newer holder of one of them took over or committed here."""
    def attempt() -> bool:
        table = DeltaTable(uri, storage_options=storage_options)
        done = table.transaction_version(app_id)
        if done is not None and done >= batch_id:
            return False
        out = rows.set_column(rows.schema.get_field_index("written_version"), "written_version",
                              pa.array([table.version() + 1] * rows.num_rows, pa.int64()))
        transactions, metadata = fence(table, leases, uri)
        write_deltalake(table, out, mode="append", commit_properties=CommitProperties(
            app_transactions=[Transaction(app_id, batch_id), *transactions], custom_metadata=metadata or None,
            max_commit_retries=0))  # the version it loaded, or again from a fresh load (fencing.committing)
        return True

    return committing(attempt, uri)


class MicroBatchSink:
    """foreachBatch target: sessions -> sessions; late events and rejected lines -> quarantine; each
    exactly once per (checkpoint incarnation, batch id).

    Rejected lines never enter the stateful operator: the sink's tasks read them, and the provenance of late
    events, from raw_events for the batch's source range (from the checkpoint's offset log; pipelines.job.quarantine).

    With `lease` (the job lease of the stream's process), every batch first checks it and every commit is fenced by
    it (pipelines.coordination.fencing): a stream whose lease was taken over fails its batch with LeaseLost (kept in `lost`).

    A warehouse on S3 that does not answer (or refuses) fails the batch with StorageUnavailable, naming the table it
    was at (kept in `unavailable`): the run loop restarts the query from its checkpoint once S3 answers, and the
    batch's appends that did commit are not made again (their transaction identifiers)."""

    def __init__(self, sessions_uri: str, quarantine_uri: str, raw_uri: str, incarnation: str,
                 seq_range: Callable[[int], tuple[int, int]],
                 storage_options: dict[str, str] | None = None, lease: Lease | None = None,
                 attributes: Sequence[Attribute] = ()):
        self.sessions_uri, self.quarantine_uri, self.raw_uri = sessions_uri, quarantine_uri, raw_uri
        # The operator's attribute columns (Attribute.column) -> the table's (Attribute.name); the table's schema as
        # the stream starts (startup added the spec's columns): a removed attribute's column is written null.
        self.attributes = tuple(attributes)
        self.sessions_schema = sessions_schema(sessions_uri, storage_options) if attributes else SESSIONS_SCHEMA
        self.storage_options = storage_options  # the warehouse's (all three tables live there)
        self.incarnation, self.seq_range = incarnation, seq_range
        self.leases: tuple[Lease, ...] = (lease,) if lease is not None else ()
        self.lost: LeaseLost | None = None
        self.unavailable: StorageUnavailable | None = None
        self._at = sessions_uri  # where the batch is: the table it reads or writes now (for `unavailable`'s line)
        self.sessions_written = 0
        self.quarantined = 0

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        try:
            for held in self.leases:
                held.check()  # before the batch's work: a fenced stream does not even read it
            self._write(batch_df, batch_id)
        except LeaseLost as lost:
            self.lost = lost
            raise
        except StorageUnavailable as unavailable:
            self.unavailable = unavailable
            raise
        except Exception as error:
            if not (is_s3(self.sessions_uri) and is_object_store_failure(error)):
                raise
            self.unavailable = s3_failure(error, self._at)
            raise self.unavailable from None

    def _write(self, batch_df: DataFrame, batch_id: int) -> None:
        # One Spark job in the common batch: the tasks write the closed sessions and count the late rows; the
        # quarantine's jobs run only for a batch with late rows or rejected lines. Persisted: the late rows are read
        # again then, and the stateful operator must run once.
        batch_df.persist()
        try:
            late = self._sessions(batch_df, batch_id)
            write, version = self._pending(self.quarantine_uri, "quarantine", batch_id)
            if not write:
                return
            self._at = self.raw_uri  # the tasks read the batch (the source's and raw_events' files)
            low, high = self.seq_range(batch_id)  # the batch's source range, from the checkpoint's offset log
            lines = quarantine_frame(batch_df, raw_uri=self.raw_uri, storage_options=self.storage_options, low=low,
                                     high=high, late=late)
            if lines is None:
                return
            files = write_task_files(lines, uri=self.quarantine_uri, schema=QUARANTINE_SCHEMA,
                                     prefix=f"part-b{batch_id}", shape=partial(
                                         quarantine_rows, batch_id=batch_id, incarnation=self.incarnation,
                                         written_version=version, quarantined_at=dt.datetime.now(dt.timezone.utc)))
            self.quarantined += self._commit(self.quarantine_uri, files, schema=QUARANTINE_SCHEMA, app="quarantine",
                                             batch_id=batch_id)
        finally:
            batch_df.unpersist()

    def _sessions(self, batch_df: DataFrame, batch_id: int) -> LateRows:
        """The batch's closed sessions written by the tasks and committed once (not written again when this batch's
        commit is there already), in the job that also counts its late rows; the late rows' tally."""
        write, version = self._pending(self.sessions_uri, "sessions", batch_id)
        self._at = self.raw_uri  # the tasks read the batch (the source's files)
        results = batch_df.mapInArrow(_output_writer(
            self.sessions_uri, write=write, prefix=f"part-b{batch_id}", schema=self.sessions_schema,
            columns=(*_SESSION_COLUMNS, *(a.column for a in self.attributes)),
            shape=partial(session_rows, batch_id=batch_id, incarnation=self.incarnation, written_version=version,
                          schema=self.sessions_schema, attributes=self.attributes)),
            spark_ddl(_OUTPUT_ROW)).collect()
        files = [task_file(row) for row in results if row["path"] is not None]
        self.sessions_written += self._commit(self.sessions_uri, files, schema=self.sessions_schema, app="sessions",
                                              batch_id=batch_id)
        late = [row for row in results if row["late"]]
        return LateRows(count=sum(row["late"] for row in late), low=min((row["late_low"] for row in late), default=0),
                        high=max((row["late_high"] for row in late), default=0))

    def _pending(self, uri: str, app: str, batch_id: int) -> tuple[bool, int]:
        """Whether this batch's commit to the table at `uri` is still to be made, and the version it is predicted at
        (`written_version`)."""
        self._at = uri
        table = DeltaTable(uri, storage_options=self.storage_options)
        done = table.transaction_version(f"{app}-{self.incarnation}")
        return (done is None or done < batch_id), table.version() + 1

    def _commit(self, uri: str, files: Sequence[TaskFile], *, schema: pa.Schema, app: str, batch_id: int) -> int:
        """The tasks' `files` committed once to the table at `uri` as this batch's; the rows committed."""
        self._at = uri
        if not files:
            return 0
        kill_point("sink:files-written")
        committed = commit_task_files(uri, files, schema=schema, app_id=f"{app}-{self.incarnation}", version=batch_id,
                                      storage_options=self.storage_options, leases=self.leases)
        return sum(f.rows for f in files) if committed else 0


# What each task of the sessions' job returns: its file (path null when it wrote none) and its late rows' tally.
_OUTPUT_ROW = pa.schema([*FILE_ROW, ("late", pa.int64()), ("late_low", pa.int64()), ("late_high", pa.int64())])


def _output_writer(uri: str, *, write: bool, prefix: str, shape: Callable[[pa.Table], pa.Table],
                   schema: pa.Schema = SESSIONS_SCHEMA, columns: Sequence[str] = ()
                   ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function each task of the sessions' job runs (mapInArrow over the operator's output): its closed sessions
    as one file of the sessions table (when `write`), and the count and ingest_seq bounds of its late rows."""
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        sessions, late, low, high = [], 0, None, None
        for batch in batches:
            kind = batch.column("kind")
            if write:
                closed = batch.filter(pc.equal(kind, "session"))
                if closed.num_rows:
                    sessions.append(shape(pa.Table.from_batches([closed]).select(list(columns or _SESSION_COLUMNS))))
            seqs = batch.column("ingest_seq").filter(pc.equal(kind, "late"))
            if len(seqs):
                late += len(seqs)
                lo, hi = pc.min_max(seqs).values()
                low = lo.as_py() if low is None else min(low, lo.as_py())
                high = hi.as_py() if high is None else max(high, hi.as_py())
        row: dict[str, Any] = {"path": None, "size": None, "rows": None, "stats": None}
        if sessions:
            row = write_file(pa.concat_tables(sessions), uri=uri, schema=schema, prefix=prefix)
        if sessions or late:
            yield pa.RecordBatch.from_pylist([{**row, "late": late, "late_low": low, "late_high": high}],
                                             schema=_OUTPUT_ROW)
    return run


_SESSION_COLUMNS = ("session_id", "user_id", "session_start_ms", "session_end_ms", "event_count", "page_views",
                    "end_reason")


def session_rows(sessions: pa.Table, *, batch_id: int, incarnation: str, written_version: int,
                 schema: pa.Schema = SESSIONS_SCHEMA, attributes: Sequence[Attribute] = ()) -> pa.Table:
    """Operator rows of closed sessions -> sessions table rows (in the tasks; written_version: the table version the
    commit is predicted at -- at most the one it lands on, so still monotone in batch order). With attributes, the
    table's `schema`: each attribute's value under its name, every other attribute column of the table null."""
    n = sessions.num_rows
    rows = pa.table({
        "session_id": sessions["session_id"], "user_id": sessions["user_id"],
        "session_start": ms_to_ts(sessions["session_start_ms"]),
        "session_end": ms_to_ts(sessions["session_end_ms"]),
        "event_count": sessions["event_count"], "page_views": sessions["page_views"],
        "end_reason": sessions["end_reason"],
        "batch_id": pa.array([batch_id] * n, pa.int64()),
        "incarnation": pa.array([incarnation] * n, pa.string()),
        "written_version": pa.array([written_version] * n, pa.int64()),
    }, schema=SESSIONS_SCHEMA)
    if schema is SESSIONS_SCHEMA:
        return rows
    values = {a.name.lower(): sessions[a.column] for a in attributes}
    for field in schema:
        if field.name not in rows.column_names:
            value = values.get(field.name.lower())
            rows = rows.append_column(field, pa.nulls(n, field.type) if value is None else value.cast(field.type))
    return rows
