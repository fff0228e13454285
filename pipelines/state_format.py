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
  * STORE_SCHEMA (ms integers + `due_ms`): what the operator keeps per hash bucket of users, as Arrow IPC
    (zstd-compressed from ZSTD_MIN_ROWS rows) in a `binary` state column (works on both state store providers).
    `due_ms` is per user: the earliest watermark at which the user must be re-walked without new events
    (a session closes, or an event can be frozen). Users neither in the batch nor due are carried over
    untouched -- the batch costs what it touches.
  * CANONICAL_SCHEMA (timestamps): savepoints and state reads; readable by any Delta/Arrow reader.
  * V1_SCHEMA: savepoints written before frozen prefixes (one row per open event); upgraded on restore.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

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
SCHEMA_ID = ("open_sessions/v2:user_id string,session_start timestamp,event_id string (null = frozen prefix),"
             "event_time timestamp,event_type string,event_count long,page_views long")
V1_SCHEMA = pa.schema([("user_id", pa.string()), ("event_id", pa.string()), ("event_time", _TS),
                       ("event_type", pa.string())])
V1_SCHEMA_ID = "open_events/v1:user_id string,event_id string,event_time timestamp,event_type string"
CANONICAL_SORT = [("user_id", "ascending"), ("session_start", "ascending"), ("event_time", "ascending"),
                  ("event_id", "ascending")]

# Spark schema of the operator's state value: one binary column (array-typed state does not reach
# PySpark 4.2's Python workers; binary does, on both providers).
SPARK_STATE_SCHEMA = "state binary"
STATE_COLUMN = "state"
ZSTD_LEVEL = 1  # state is rewritten every time a bucket is touched: favour speed over ratio
# Below this many rows a bucket is written uncompressed: zstd's per-buffer setup costs 15x the encode of a small
# table and saves nothing on it. The reader needs no flag (Arrow IPC records the codec per message).
ZSTD_MIN_ROWS = 256


def empty_store() -> pa.Table:
    return STORE_SCHEMA.empty_table()


def _ipc(table: pa.Table) -> bytes:
    """Rows -> one Arrow IPC stream, its buffers zstd-compressed from ZSTD_MIN_ROWS rows on."""
    # Built here, not at import: IpcWriteOptions does not pickle into Spark's Python workers.
    options = (pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=ZSTD_LEVEL))
               if table.num_rows >= ZSTD_MIN_ROWS else pa.ipc.IpcWriteOptions())
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, STORE_SCHEMA, options=options) as writer:
        writer.write_table(table.combine_chunks(), max_chunksize=max(table.num_rows, 1))
    return sink.getvalue().to_pybytes()


def _from_ipc(data: bytes | memoryview) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all() if len(data) else empty_store()


def _hash32(users: Any) -> np.ndarray:
    """Stable 32-bit hashes of user ids (SipHash, fixed key): a membership pre-check, never trusted alone."""
    values = users.to_numpy(zero_copy_only=False) if hasattr(users, "to_numpy") else np.asarray(users, dtype=object)
    return pd.util.hash_array(values.astype(object), categorize=False).astype(np.uint32)


NEVER = np.iinfo(np.int64).max
_MAGIC = b"SES2"
_HEADER = struct.Struct("<4sqqIII")  # magic, cold min due, stale cold rows, cold bytes, hash bytes, dead bytes


@dataclass
class BucketStore:
    """A bucket's stored value, split so a batch costs what it touches (an LSM in miniature):

      * cold: rows of users nobody touched since the last compaction, kept as their compressed bytes, with
        a sorted array of their users' 32-bit hashes and the earliest due among them. A call decodes cold
        only when a batch user's hash is in it or a cold user is due; otherwise the bytes are copied as
        they are.
      * hot: rows of users walked since the last compaction (decoded and re-encoded every call).
      * dead: users whose cold rows are superseded (they were pulled into hot, or closed since).
    A compaction, when stale cold rows or idle hot rows outgrow a quarter of cold, rewrites cold from its live
    rows and the hot users this call did not walk; the users it walked stay hot (active users stay out of cold).
    """

    cold_bytes: bytes = b""
    cold_hashes: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint32))
    cold_min_due: int = NEVER
    dead: set[str] = field(default_factory=set)  # user ids
    hot: pa.Table = field(default_factory=empty_store)
    stale_rows: int = 0  # cold rows of dead users, dropped at the next compaction
    compact_min_rows: int = 4096
    _live_cold: pa.Table | None = None  # decoded cold minus dead, once this call needed it

    @classmethod
    def load(cls, value: bytes | None, compact_min_rows: int = 4096) -> BucketStore:
        if not value:
            return cls(compact_min_rows=compact_min_rows)
        data = memoryview(value)
        magic, min_due, stale, n_cold, n_hash, n_dead = _HEADER.unpack_from(data)
        if magic != _MAGIC:
            raise ValueError("not a bucket value of state layout open_sessions/v2")
        at = _HEADER.size
        cold = bytes(data[at:at + n_cold])
        at += n_cold
        hashes = np.frombuffer(data[at:at + n_hash], dtype=np.uint32)
        at += n_hash
        dead = set(json.loads(bytes(data[at:at + n_dead]))) if n_dead else set()
        at += n_dead
        return cls(cold, hashes, min_due, dead, _from_ipc(data[at:]), stale, compact_min_rows)

    def _cold(self) -> pa.Table:
        if self._live_cold is None:
            cold = _from_ipc(self.cold_bytes)
            if self.dead and cold.num_rows:
                cold = cold.filter(pc.invert(pc.is_in(cold["user_id"], value_set=pa.array(sorted(self.dead)))))
            self._live_cold = cold
        return self._live_cold

    def rows(self) -> pa.Table:
        """Every live row (readers: state data source, savepoints, status)."""
        return pa.concat_tables([self._cold(), self.hot])

    def take(self, users: Any, watermark_ms: int) -> pa.Table:
        """The rows of `users` and of every user due at the watermark, removed from the store (the caller walks
        them and hands back what stays open to `save`)."""
        users = pa.array(list(users), pa.string())
        hot_mask = pc.less_equal(self.hot["due_ms"], watermark_ms)
        if len(users):
            hot_mask = pc.or_(hot_mask, pc.is_in(self.hot["user_id"], value_set=users))
        taken = [self.hot.filter(hot_mask)]
        self.hot = self.hot.filter(pc.invert(hot_mask))
        maybe_cold = np.empty(0, dtype=object)
        if len(users) and len(self.cold_hashes):
            candidates = users.to_numpy(zero_copy_only=False)
            candidates = candidates[np.isin(_hash32(candidates), self.cold_hashes)]
            maybe_cold = np.array([u for u in candidates if u not in self.dead], dtype=object)
        if len(maybe_cold) or self.cold_min_due <= watermark_ms:
            cold = self._cold()
            mask = pc.less_equal(cold["due_ms"], watermark_ms)
            if len(maybe_cold):
                mask = pc.or_(mask, pc.is_in(cold["user_id"], value_set=pa.array(maybe_cold, pa.string())))
            pulled = cold.filter(mask)
            if pulled.num_rows:
                self.dead.update(pulled["user_id"].to_pylist())
                self.stale_rows += pulled.num_rows
                cold = self._live_cold = cold.filter(pc.invert(mask))
                taken.append(pulled)
            rest_due = pc.min(cold["due_ms"]).as_py()
            self.cold_min_due = NEVER if rest_due is None else int(rest_due)
        return pa.concat_tables(taken)

    def save(self, walked: pa.Table) -> bytes | None:
        """The walked users' open rows back in; the value to store (None: nothing left)."""
        share = max(self.compact_min_rows, len(self.cold_hashes) // 4)
        if self.stale_rows > share or self.hot.num_rows > share:
            self._compact()
        self.hot = pa.concat_tables([self.hot, walked])
        if not len(self.cold_hashes) and not self.hot.num_rows:
            return None
        dead = json.dumps(sorted(self.dead)).encode() if self.dead else b""
        hashes = self.cold_hashes.astype(np.uint32).tobytes()
        header = _HEADER.pack(_MAGIC, self.cold_min_due, self.stale_rows, len(self.cold_bytes), len(hashes), len(dead))
        return b"".join([header, self.cold_bytes, hashes, dead, _ipc(self.hot)])

    def _compact(self) -> None:
        """Cold := its live rows + the hot rows nobody walked this call (self.hot holds exactly those)."""
        cold = pa.concat_tables([self._cold(), self.hot]).combine_chunks()
        self.cold_bytes = _ipc(cold) if cold.num_rows else b""
        self.cold_hashes = np.unique(_hash32(cold["user_id"])) if cold.num_rows else np.empty(0, np.uint32)
        rest_due = pc.min(cold["due_ms"]).as_py() if cold.num_rows else None
        self.cold_min_due = NEVER if rest_due is None else int(rest_due)
        self.dead, self.hot, self._live_cold, self.stale_rows = set(), empty_store(), cold, 0

    def next_due(self) -> int | None:
        hot_due = pc.min(self.hot["due_ms"]).as_py() if self.hot.num_rows else None
        due = min(self.cold_min_due, NEVER if hot_due is None else int(hot_due))
        return None if due == NEVER else due


def encode(table: pa.Table) -> bytes:
    """Rows -> a stored bucket value, all of them cold (b"" for none)."""
    store = BucketStore(hot=table)
    store._compact()
    return store.save(empty_store()) or b""


def decode(value: bytes) -> pa.Table:
    """A stored bucket value -> its live rows (STORE_SCHEMA)."""
    return BucketStore.load(value).rows()


def _ms_to_ts(column: Any) -> pa.ChunkedArray:
    return pc.multiply(column, 1000).cast(_TS)


def _ts_to_ms(column: Any) -> pa.ChunkedArray:
    return pc.divide(column.cast(_TS).cast(pa.int64()), 1000)


def to_canonical(store: pa.Table) -> pa.Table:
    """Stored rows -> canonical rows (timestamps, no due_ms)."""
    return pa.table({
        "user_id": store["user_id"], "session_start": _ms_to_ts(store["session_start_ms"]),
        "event_id": store["event_id"], "event_time": _ms_to_ts(store["event_time_ms"]),
        "event_type": store["event_type"], "event_count": store["event_count"], "page_views": store["page_views"],
    }, schema=CANONICAL_SCHEMA)


def canonical_rows_ms(canonical: pa.Table) -> dict[str, np.ndarray]:
    """Canonical rows -> the core's row arrays (ms integers), as restore hands them to the operator."""
    return {
        "user_id": canonical["user_id"], "session_start_ms": _ts_to_ms(canonical["session_start"]),
        "event_id": canonical["event_id"], "event_time_ms": _ts_to_ms(canonical["event_time"]),
        "event_type": canonical["event_type"], "event_count": canonical["event_count"],
        "page_views": canonical["page_views"],
    }


def canonical(table: pa.Table) -> pa.Table:
    """Canonical form: schema pinned, rows sorted (user, session, time, event id)."""
    return table.select(CANONICAL_SCHEMA.names).cast(CANONICAL_SCHEMA).sort_by(CANONICAL_SORT)


def upgrade_v1(rows: pa.Table) -> pa.Table:
    """v1 savepoint rows (one per open event) -> v2 rows, one event each. `session_start` is provisional
    (the event's own time): restore re-walks every restored user before storing it."""
    rows = rows.select(V1_SCHEMA.names).cast(V1_SCHEMA)
    return pa.table({
        "user_id": rows["user_id"], "session_start": rows["event_time"], "event_id": rows["event_id"],
        "event_time": rows["event_time"], "event_type": rows["event_type"],
        "event_count": pa.array([1] * rows.num_rows, pa.int64()),
        "page_views": pc.cast(pc.fill_null(pc.equal(rows["event_type"], PAGE_VIEW), False), pa.int64()),
    }, schema=CANONICAL_SCHEMA)
