"""The output Delta tables and the exactly-once micro-batch sink that writes them: the sessions by the Spark tasks
(pipelines.job.task_files), committed once per batch by the driver."""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from pyspark.sql import DataFrame

from pipelines.coordination.fencing import committing, fence
from pipelines.coordination.kill_points import kill_point
from pipelines.coordination.leases import Lease
from pipelines.errors import LeaseLost, StorageUnavailable
from pipelines.job.task_files import commit_task_files, write_task_files
from pipelines.storage import is_object_store_failure, is_s3, read_rows, s3_failure, sql_literal

__all__ = ["QUARANTINE_SCHEMA", "SESSIONS_SCHEMA", "MicroBatchSink", "ensure_table", "idempotent_append", "table_rows", "version_after_batch"]

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


def ensure_table(uri: str, schema: pa.Schema, storage_options: dict[str, str] | None = None) -> None:
    if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
        write_deltalake(uri, schema.empty_table(), mode="append", storage_options=storage_options)


def table_rows(uri: str, storage_options: dict[str, str] | None = None) -> int:
    if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
        return 0
    return int(DeltaTable(uri, storage_options=storage_options).count())


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


def _millis_to_ts(column: Any) -> pa.Array:
    return pc.multiply(column.cast(pa.int64()), 1000).cast(pa.timestamp("us", tz="UTC"))


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


def _late_raw(rows: pa.Table) -> list[str]:
    """A late event's line as landed is not carried through the stream; rebuild it as JSON."""
    times = rows["event_time"].to_pylist()
    return [json.dumps({"event_id": e, "user_id": u, "event_time": t.isoformat().replace("+00:00", "Z") if t else None,
                        "event_type": k, "page": p})
            for e, u, t, k, p in zip(rows["event_id"].to_pylist(), rows["user_id"].to_pylist(), times,
                                     rows["event_type"].to_pylist(), rows["page"].to_pylist())]


def _seq_between(low: int, high: int) -> ds.Expression:
    return (ds.field("ingest_seq") > low) & (ds.field("ingest_seq") <= high)


def late_key(raw: pa.Table) -> pa.ChunkedArray:
    """The key a late event carries (pipelines.job.operators.seam): line_key, or -line_no for rows written before it."""
    fallback = pc.negate(raw["line_no"])
    return pc.coalesce(raw["line_key"], fallback) if "line_key" in raw.column_names else fallback


def _late_rows(late: pa.Table, raw: ds.Dataset) -> pa.Table:
    """Late events (operator rows) -> quarantine rows with the source_file and line_no of their very line.

    Joined on (ingest_seq, line_key): one row per landed line. For rows written before line_key the key is
    -line_no, which repeats across the files of one ingest commit: the event's own ids join too, and each late
    event keeps one match."""
    low, high = int(pc.min(late["ingest_seq"]).as_py()), int(pc.max(late["ingest_seq"]).as_py())
    columns = [c for c in ("ingest_seq", "line_key", "line_no", "source_file", "page", "event_id", "user_id")
               if c in raw.schema.names]  # line_key: not in a table that no ingest wrote to since it came
    provenance = raw.to_table(columns=columns,
                              filter=_seq_between(low - 1, high) & ds.field("reject_reason").is_null())
    key_types = {"ingest_seq": pa.int64(), "line_key": pa.int64(), "event_id": pa.string(), "user_id": pa.string()}
    provenance = pa.table({"ingest_seq": provenance["ingest_seq"], "line_key": late_key(provenance),
                           "event_id": provenance["event_id"], "user_id": provenance["user_id"],
                           "line_no": provenance["line_no"], "source_file": provenance["source_file"],
                           "page": provenance["page"]})
    provenance = provenance.cast(pa.schema([(f.name, key_types.get(f.name, f.type)) for f in provenance.schema]))
    keys = list(key_types)
    events = late.select([*keys, "event_time_ms", "event_type"])
    events = events.cast(pa.schema([(f.name, key_types.get(f.name, f.type)) for f in events.schema]))
    events = events.append_column("late_row", pa.array(range(events.num_rows), pa.int64()))
    joined = events.join(provenance, keys, join_type="left outer").sort_by("late_row")
    order = joined["late_row"].to_numpy()
    first = np.ones(len(order), dtype=bool)
    first[1:] = order[1:] != order[:-1]
    joined = joined.filter(pa.array(first))
    return pa.table({
        "reason": pa.array(["late"] * joined.num_rows, pa.string()), "raw": _late_raw(joined.append_column(
            "event_time", _millis_to_ts(joined["event_time_ms"]))),
        "source_file": joined["source_file"], "line_no": joined["line_no"],
        "ingest_seq": joined["ingest_seq"], "event_id": joined["event_id"], "user_id": joined["user_id"],
        "event_time": _millis_to_ts(joined["event_time_ms"]), "event_type": joined["event_type"]})


class MicroBatchSink:
    """foreachBatch target: sessions -> sessions; late events and rejected lines -> quarantine; each
    exactly once per (checkpoint incarnation, batch id).

    Rejected lines never enter the stateful operator: the sink reads them, and the provenance of late
    events, from raw_events for the batch's source range (from the checkpoint's offset log).

    With `lease` (the job lease of the stream's process), every batch first checks it and every commit is fenced by
    it (pipelines.coordination.fencing): a stream whose lease was taken over fails its batch with LeaseLost (kept in `lost`).

    A warehouse on S3 that does not answer (or refuses) fails the batch with StorageUnavailable, naming the table it
    was at (kept in `unavailable`): the run loop restarts the query from its checkpoint once S3 answers, and the
    batch's appends that did commit are not made again (their transaction identifiers)."""

    def __init__(self, sessions_uri: str, quarantine_uri: str, raw_uri: str, incarnation: str,
                 seq_range: Callable[[int], tuple[int, int]],
                 storage_options: dict[str, str] | None = None, lease: Lease | None = None):
        self.sessions_uri, self.quarantine_uri, self.raw_uri = sessions_uri, quarantine_uri, raw_uri
        self.storage_options = storage_options  # the warehouse's (all three tables live there)
        self.incarnation, self.seq_range = incarnation, seq_range
        self.leases: tuple[Lease, ...] = (lease,) if lease is not None else ()
        self.lost: LeaseLost | None = None
        self.unavailable: StorageUnavailable | None = None
        self._at = sessions_uri  # where the batch is: the table it reads or writes now (for `unavailable`'s line)
        self.sessions_written = 0
        self.quarantined = 0

    def _quarantine_rows(self, batch_id: int, late: pa.Table) -> pa.Table | None:
        low, high = self.seq_range(batch_id)
        if high <= low and not late.num_rows:
            return None
        # One snapshot of raw_events per batch.
        self._at = self.raw_uri
        raw = DeltaTable(self.raw_uri, storage_options=self.storage_options).to_pyarrow_dataset()
        parts = []
        if high > low:
            rejected = raw.to_table(columns=["reject_reason", "raw", "source_file", "line_no", "ingest_seq", "event_id",
                                             "user_id", "event_time", "event_type"],
                                    filter=_seq_between(low, high) & ds.field("reject_reason").is_valid())
            if rejected.num_rows:
                parts.append(rejected.rename_columns(["reason", *rejected.column_names[1:]]))
        if late.num_rows:
            parts.append(_late_rows(late, raw))
        if not parts:
            return None
        rows = pa.concat_tables([p.select(parts[0].column_names).cast(parts[0].schema) for p in parts])
        m = rows.num_rows
        now = dt.datetime.now(dt.timezone.utc)
        return pa.table({
            **{name: rows[name] for name in ("reason", "raw", "source_file", "line_no", "ingest_seq",
                                             "event_id", "user_id", "event_time", "event_type")},
            "batch_id": pa.array([batch_id] * m, pa.int64()),
            "incarnation": pa.array([self.incarnation] * m, pa.string()),
            "written_version": pa.nulls(m, pa.int64()),
            "quarantined_at": pa.array([now] * m, pa.timestamp("us", tz="UTC")),
        }, schema=QUARANTINE_SCHEMA)

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
        self._at = self.raw_uri  # the batch's rows are read from raw_events (by the source's tasks)
        batch_df.persist()  # two reads of the batch (its sessions, its late events): the operator runs once
        try:
            self._write_sessions(batch_df, batch_id)
            self._at = self.raw_uri
            late = batch_df.where("kind = 'late'").select(*_LATE_COLUMNS).toArrow()
        finally:
            batch_df.unpersist()
        quarantine = self._quarantine_rows(batch_id, late)
        self._at = self.quarantine_uri
        if quarantine is not None and idempotent_append(self.quarantine_uri, quarantine,
                                                        f"quarantine-{self.incarnation}", batch_id,
                                                        storage_options=self.storage_options, leases=self.leases):
            self.quarantined += quarantine.num_rows

    def _write_sessions(self, batch_df: DataFrame, batch_id: int) -> None:
        """The batch's closed sessions, written by the tasks and committed once (unless this batch's already was)."""
        app_id = f"sessions-{self.incarnation}"
        self._at = self.sessions_uri
        table = DeltaTable(self.sessions_uri, storage_options=self.storage_options)
        done = table.transaction_version(app_id)
        if done is not None and done >= batch_id:
            return
        shape = partial(session_rows, batch_id=batch_id, incarnation=self.incarnation,
                        written_version=table.version() + 1)
        self._at = self.raw_uri
        files = write_task_files(batch_df.where("kind = 'session'").select(*_SESSION_COLUMNS), uri=self.sessions_uri,
                                 schema=SESSIONS_SCHEMA, shape=shape, prefix=f"part-b{batch_id}")
        self._at = self.sessions_uri
        if files:
            kill_point("sink:files-written")
        if files and commit_task_files(self.sessions_uri, files, schema=SESSIONS_SCHEMA, app_id=app_id,
                                       version=batch_id, storage_options=self.storage_options, leases=self.leases):
            self.sessions_written += sum(f.rows for f in files)


_SESSION_COLUMNS = ("session_id", "user_id", "session_start_ms", "session_end_ms", "event_count", "page_views",
                    "end_reason")
_LATE_COLUMNS = ("ingest_seq", "line_key", "event_id", "user_id", "event_time_ms", "event_type")


def session_rows(sessions: pa.Table, *, batch_id: int, incarnation: str, written_version: int) -> pa.Table:
    """Operator rows of closed sessions -> sessions table rows (in the tasks; written_version: the table version the
    commit is predicted at -- at most the one it lands on, so still monotone in batch order)."""
    n = sessions.num_rows
    return pa.table({
        "session_id": sessions["session_id"], "user_id": sessions["user_id"],
        "session_start": _millis_to_ts(sessions["session_start_ms"]),
        "session_end": _millis_to_ts(sessions["session_end_ms"]),
        "event_count": sessions["event_count"], "page_views": sessions["page_views"],
        "end_reason": sessions["end_reason"],
        "batch_id": pa.array([batch_id] * n, pa.int64()),
        "incarnation": pa.array([incarnation] * n, pa.string()),
        "written_version": pa.array([written_version] * n, pa.int64()),
    }, schema=SESSIONS_SCHEMA)
