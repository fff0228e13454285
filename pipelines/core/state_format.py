"""The open-session state format: its one owner (fields, Arrow schemas, codec, schema id).

A user's open state is a list of rows. A row is either
  * an **event** above the watermark at the time it was last walked (`event_id` set, count 1), or
  * a **frozen prefix** (`event_id` null): the summary of the events of one session that are at or below the
    watermark. Such events can never be reordered, split or duplicated any more -- an event arriving at or
    below the watermark is late by definition -- so the walk only needs where the session started
    (`session_start`), its last frozen event (`event_time`, `event_type`) and the counts.
Every row carries the `session_start` of the open session it belongs to, so an open session is
`(user_id, session_start)` and a reader needs no walk to list open sessions.

Three forms, one set of fields:
  * STORE_SCHEMA (ms integers + `due_ms`): the pure core's rows (pipelines.core.sessionize) and what the state readers
    decode stored values into. `due_ms` is per user: the earliest watermark at which the user must be re-walked
    without new events (a session closes, or an event can be frozen). How an operator stores them is its own
    (pipelines.job.operators.seam: the JVM operator's StateCodec; the retired bucket layout in pipelines.job.operators.buckets).
  * CANONICAL_SCHEMA (timestamps): savepoints and state reads; readable by any Delta/Arrow reader.
  * V1_SCHEMA: savepoints written before frozen prefixes (one row per open event); upgraded on restore.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["CANONICAL_DDL", "CANONICAL_SCHEMA", "CANONICAL_SORT", "DECODED_ROW_SCHEMA", "LOGOUT", "PAGE_VIEW", "ROW_FIELDS", "SAVED_DDL", "SAVED_SCHEMA", "SCHEMA_ID", "STORE_SCHEMA", "V1_SCHEMA", "V1_SCHEMA_ID", "canonical", "canonical_rows_ms", "conform", "empty_store", "ms_to_ts", "spark_ddl", "spark_type", "to_canonical", "upgrade_v1"]

LOGOUT = "logout"
PAGE_VIEW = "page_view"

STORE_SCHEMA = pa.schema([
    ("user_id", pa.string()),
    ("session_start_ms", pa.int64()),
    ("event_id", pa.string()),        # null: a frozen prefix
    ("event_time_ms", pa.int64()),    # the event's time; for a frozen prefix its last event's
    ("event_type", pa.string()),      # likewise
    ("event_count", pa.int64()),      # 1 for an event; events summarised for a frozen prefix
    ("page_views", pa.int64()),
    ("due_ms", pa.int64()),           # per user: re-walk when the watermark reaches it
])
ROW_FIELDS = [name for name in STORE_SCHEMA.names if name != "due_ms"]
# One stored row as a state value decodes to, per user (the JVM operator's DecodeState, SessionsOperator.STATE_ROW:
# a test holds the two equal): the row fields without the key, then the row's attribute partials as text (null for
# a job without attributes).
DECODED_ROW_SCHEMA = pa.schema([STORE_SCHEMA.field(name) for name in ROW_FIELDS if name != "user_id"]
                               ).append(pa.field("attributes", pa.string()))

_TS = pa.timestamp("us", tz="UTC")
CANONICAL_SCHEMA = pa.schema([
    ("user_id", pa.string()),
    ("session_start", _TS),
    ("event_id", pa.string()),
    ("event_time", _TS),
    ("event_type", pa.string()),
    ("event_count", pa.int64()),
    ("page_views", pa.int64()),
])
# Canonical rows as state reads and savepoints carry them: CANONICAL_SCHEMA, then the session spec's attributes -- the
# row's partials as JSON (pipelines.core.attributes.partials_to_json), null for a job without attributes. Optional: a
# table written before it existed reads null there (`conform`), and the checksum skips a null one, so SCHEMA_ID names
# the same form with or without it.
SAVED_SCHEMA = CANONICAL_SCHEMA.append(pa.field("attributes", pa.string()))
SCHEMA_ID = ("open_sessions/v2:user_id string,session_start timestamp,event_id string (null = frozen prefix),"
             "event_time timestamp,event_type string,event_count long,page_views long")
V1_SCHEMA = pa.schema([("user_id", pa.string()), ("event_id", pa.string()), ("event_time", _TS),
                       ("event_type", pa.string())])
V1_SCHEMA_ID = "open_events/v1:user_id string,event_id string,event_time timestamp,event_type string"


def spark_ddl(schema: pa.Schema) -> str:
    """Spark's DDL for an Arrow schema, so a schema is typed once (here, in Arrow) and Spark reads it from that."""
    return ", ".join(f"{field.name} {spark_type(field.type)}" for field in schema)


def spark_type(kind: pa.DataType) -> str:
    """Spark's DDL for an Arrow type (a list or a struct of the types below, nested as deep as need be)."""
    if pa.types.is_list(kind):
        return f"array<{spark_type(kind.value_type)}>"
    if pa.types.is_struct(kind):
        return f"struct<{', '.join(f'{field.name}: {spark_type(field.type)}' for field in kind)}>"
    for test, name in ((pa.types.is_string, "string"), (pa.types.is_int64, "long"), (pa.types.is_int32, "int"),
                       (pa.types.is_boolean, "boolean"), (pa.types.is_timestamp, "timestamp"),
                       (pa.types.is_float64, "double")):
        if test(kind):
            return name
    raise TypeError(f"no Spark DDL for Arrow type {kind}")


CANONICAL_DDL = spark_ddl(CANONICAL_SCHEMA)
SAVED_DDL = spark_ddl(SAVED_SCHEMA)
CANONICAL_SORT = [("user_id", "ascending"), ("session_start", "ascending"), ("event_time", "ascending"),
                  ("event_id", "ascending")]

def empty_store() -> pa.Table:
    return STORE_SCHEMA.empty_table()


def ms_to_ts(column: Any) -> pa.ChunkedArray:
    """Epoch milliseconds (any integer type) -> UTC timestamps in microseconds, the tables' time type."""
    return pc.multiply(column.cast(pa.int64()), 1000).cast(_TS)


def _ts_to_ms(column: Any) -> pa.ChunkedArray:
    return pc.divide(column.cast(_TS).cast(pa.int64()), 1000)


def to_canonical(store: pa.Table) -> pa.Table:
    """Stored rows -> canonical rows (timestamps, no due_ms; `attributes` when the rows carry it)."""
    return pa.table({
        "user_id": store["user_id"], "session_start": ms_to_ts(store["session_start_ms"]),
        "event_id": store["event_id"], "event_time": ms_to_ts(store["event_time_ms"]),
        "event_type": store["event_type"], "event_count": store["event_count"], "page_views": store["page_views"],
        "attributes": _attributes(store),
    }, schema=SAVED_SCHEMA)


def _attributes(rows: pa.Table) -> pa.Array | pa.ChunkedArray:
    if "attributes" in rows.column_names:
        return rows["attributes"]
    return pa.nulls(rows.num_rows, pa.string())


def conform(rows: pa.Table | pa.RecordBatch, schema: pa.Schema | None = None) -> pa.Table:
    """Canonical rows (or rows of a schema that extends them) as read from a table of any age: `schema`'s columns in
    order and type, `attributes` null where the table has none. Without `schema`: SAVED_SCHEMA when the rows carry
    `attributes`, else CANONICAL_SCHEMA (a job without attributes reads the rows it always read)."""
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_batches([rows])
    if schema is None:
        schema = SAVED_SCHEMA if "attributes" in table.column_names else CANONICAL_SCHEMA
    if "attributes" not in table.column_names:
        table = table.append_column("attributes", pa.nulls(table.num_rows, pa.string()))
    return table.select(schema.names).cast(schema)


def canonical_rows_ms(canonical: pa.Table) -> dict[str, np.ndarray]:
    """Canonical rows -> the core's row arrays (ms integers), as restore hands them to the operator."""
    return {
        "user_id": canonical["user_id"], "session_start_ms": _ts_to_ms(canonical["session_start"]),
        "event_id": canonical["event_id"], "event_time_ms": _ts_to_ms(canonical["event_time"]),
        "event_type": canonical["event_type"], "event_count": canonical["event_count"],
        "page_views": canonical["page_views"], "attributes": _attributes(canonical),
    }


def canonical(table: pa.Table) -> pa.Table:
    """Canonical form: schema pinned, rows sorted (user, session, time, event id)."""
    return conform(table).sort_by(CANONICAL_SORT)


def upgrade_v1(rows: pa.Table) -> pa.Table:
    """v1 savepoint rows (one per open event) -> v2 rows, one event each. `session_start` is provisional
    (the event's own time): restore re-walks every restored user before storing it."""
    rows = rows.select(V1_SCHEMA.names).cast(V1_SCHEMA)
    return pa.table({
        "user_id": rows["user_id"], "session_start": rows["event_time"], "event_id": rows["event_id"],
        "event_time": rows["event_time"], "event_type": rows["event_type"],
        "event_count": pa.array([1] * rows.num_rows, pa.int64()),
        "page_views": pc.cast(pc.fill_null(pc.equal(rows["event_type"], PAGE_VIEW), False), pa.int64()),
        "attributes": pa.nulls(rows.num_rows, pa.string()),
    }, schema=SAVED_SCHEMA)
