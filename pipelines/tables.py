"""The output Delta tables (delta-rs) and the exactly-once micro-batch sink that writes them."""
from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

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


def ensure_table(uri: str, schema: pa.Schema, storage_options: dict | None = None) -> None:
    if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
        write_deltalake(uri, schema.empty_table(), mode="append", storage_options=storage_options)


def table_rows(uri: str) -> int:
    if not DeltaTable.is_deltatable(uri):
        return 0
    return DeltaTable(uri).count()


def _millis_to_ts(column) -> pa.Array:
    return pc.multiply(column.cast(pa.int64()), 1000).cast(pa.timestamp("us", tz="UTC"))


def idempotent_append(uri: str, rows: pa.Table, app_id: str, batch_id: int) -> bool:
    """Append rows at most once per (app_id, batch_id) using Delta's transaction identifiers."""
    table = DeltaTable(uri)
    done = table.transaction_version(app_id)
    if done is not None and done >= batch_id:
        return False
    rows = rows.set_column(rows.schema.get_field_index("written_version"), "written_version",
                           pa.array([table.version() + 1] * rows.num_rows, pa.int64()))
    write_deltalake(table, rows, mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction(app_id, batch_id)]))
    return True


class MicroBatchSink:
    """foreachBatch target: session rows -> sessions, quarantine rows -> quarantine, each exactly once."""

    def __init__(self, sessions_uri: str, quarantine_uri: str, incarnation: str):
        self.sessions_uri, self.quarantine_uri, self.incarnation = sessions_uri, quarantine_uri, incarnation
        self.sessions_written = 0
        self.quarantined = 0

    def __call__(self, batch_df, batch_id: int) -> None:
        rows = batch_df.toArrow()
        kind = rows["kind"]
        sessions = rows.filter(pc.equal(kind, "session"))
        quarantine = rows.filter(pc.equal(kind, "quarantine"))
        n = sessions.num_rows
        if n:
            out = pa.table({
                "session_id": sessions["session_id"], "user_id": sessions["user_id"],
                "session_start": _millis_to_ts(sessions["session_start_ms"]),
                "session_end": _millis_to_ts(sessions["session_end_ms"]),
                "event_count": sessions["event_count"], "page_views": sessions["page_views"],
                "end_reason": sessions["end_reason"],
                "batch_id": pa.array([batch_id] * n, pa.int64()),
                "incarnation": pa.array([self.incarnation] * n, pa.string()),
                "written_version": pa.nulls(n, pa.int64()),
            }, schema=SESSIONS_SCHEMA)
            if idempotent_append(self.sessions_uri, out, f"sessions-{self.incarnation}", batch_id):
                self.sessions_written += n
        m = quarantine.num_rows
        if m:
            now = dt.datetime.now(dt.timezone.utc)
            out = pa.table({
                "reason": quarantine["reason"], "raw": quarantine["raw"],
                "source_file": quarantine["source_file"], "line_no": quarantine["line_no"],
                "ingest_seq": quarantine["ingest_seq"], "event_id": quarantine["event_id"],
                "user_id": quarantine["user_id"], "event_time": _millis_to_ts(quarantine["event_time_ms"]),
                "event_type": quarantine["event_type"],
                "batch_id": pa.array([batch_id] * m, pa.int64()),
                "incarnation": pa.array([self.incarnation] * m, pa.string()),
                "written_version": pa.nulls(m, pa.int64()),
                "quarantined_at": pa.array([now] * m, pa.timestamp("us", tz="UTC")),
            }, schema=QUARANTINE_SCHEMA)
            if idempotent_append(self.quarantine_uri, out, f"quarantine-{self.incarnation}", batch_id):
                self.quarantined += m
