"""Savepoints as Delta tables (delta-rs) on a local path or S3: canonical state rows + a catalog.

Layout under SESSIONS_SAVEPOINT_URI:
  catalog/          one row per savepoint attempt (status complete | failed); the only index
  state/<id>/       the open state in canonical form (pipelines.state_format.CANONICAL_SCHEMA, schema id
                    in the catalog row; v1 savepoints -- one row per open event -- still restore)
A savepoint is listed as complete only after its state table was written, re-read and its count and
checksum matched the live state; a half-written state table is never referenced by a complete row. The executors
write, re-read and checksum the state table (state_store.savepoint_io); this process handles its metadata only.
"""
from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from pipelines import state_format
from pipelines.config import SessionsConfig
from pipelines.errors import SavepointNotFound
from pipelines.storage import join, s3_errors, storage_options
from state_store.results import SavepointInfo

CATALOG_SCHEMA = pa.schema([
    ("savepoint_id", pa.string()),
    ("status", pa.string()),            # complete | failed
    ("trigger", pa.string()),           # manual | scheduled | sensor | pre-rescale | stop
    ("created_at", pa.timestamp("us", tz="UTC")),
    ("batch_id", pa.int64()),
    ("source_seq", pa.int64()),         # raw_events ingest sequence the state has consumed
    ("watermark_ms", pa.int64()),       # the watermark the next batch would have run with
    ("gap_ms", pa.int64()),
    ("lateness_ms", pa.int64()),
    ("buckets", pa.int64()),
    ("provider", pa.string()),
    ("partitions", pa.int64()),
    ("state_schema", pa.string()),
    ("rows", pa.int64()),
    ("checksum", pa.string()),
    ("sessions_version", pa.int64()),
    ("quarantine_version", pa.int64()),
    ("incarnation", pa.string()),
    ("state_uri", pa.string()),
    ("bytes", pa.int64()),
    ("seconds", pa.float64()),
    ("error", pa.string()),
])


def new_savepoint_id(batch_id: int, now: dt.datetime) -> str:
    return f"sp-{now.strftime('%Y%m%dT%H%M%S')}-b{batch_id}-{os.urandom(2).hex()}"


_NULL_TOKEN = {"event_type": "\x00"}  # v1 checksums used "" for other nulls; kept so v1 savepoints verify


CHECKSUM_ALGORITHM = "siphash64"
_MOD64 = 1 << 64


def row_hashes(rows: pa.Table | pa.RecordBatch) -> np.ndarray:
    """Per-row 64-bit SipHash values (pandas' deterministic `hash_array`, fixed key) of all fields, in the rows'
    column order, joined by \\x1f: integers and timestamps as their int64 text (epoch microseconds), nulls as ""
    (event_type: \\x00). What state_checksum sums; the executors hash their share with it too
    (state_store.savepoint_io)."""
    parts = []
    for column_field in rows.schema:
        column = rows[column_field.name]
        if pa.types.is_timestamp(column_field.type) or pa.types.is_integer(column_field.type):
            column = pc.cast(pc.cast(column, pa.int64()), pa.string())
        parts.append(pc.fill_null(column, _NULL_TOKEN.get(column_field.name, "")))
    keys = pc.binary_join_element_wise(*parts, "\x1f")
    return pd.util.hash_array(keys.to_numpy(zero_copy_only=False), categorize=False)


def partial_checksum(rows: pa.Table | pa.RecordBatch) -> tuple[int, int]:
    """(row count, wrapping uint64 sum of row_hashes): a share of a checksum, combined with combine_checksum."""
    if not rows.num_rows:
        return 0, 0
    return rows.num_rows, int(row_hashes(rows).sum(dtype=np.uint64))


def combine_checksum(parts: Iterable[tuple[int, int]]) -> str:
    """The checksum of all rows from the partial checksums of any split of them (order-independent: a count and a
    sum modulo 2^64), in state_checksum's form."""
    rows = total = 0
    for count, hash_sum in parts:
        rows += int(count)
        total = (total + int(hash_sum)) % _MOD64
    return f"{CHECKSUM_ALGORITHM}:{rows}:{total:016x}"


def state_checksum(table: pa.Table) -> str:
    """Order-independent checksum of state rows (canonical v2 or v1): the count and the wrapping sum of
    per-row 64-bit SipHash values (row_hashes), labelled with the algorithm."""
    return combine_checksum([partial_checksum(table)])


@dataclass(frozen=True)
class StateFiles:
    """A savepoint state table as its Delta log lists it: what the executors read (state_store.savepoint_io)."""

    uri: str
    columns: tuple[str, ...]  # the table's schema, in order (a checksum joins fields in this order)
    files: tuple[str, ...]    # absolute URIs of the data files (file:// or s3://)
    sizes: tuple[int, ...]

    @property
    def bytes(self) -> int:
        return sum(self.sizes)


@dataclass(frozen=True)
class SavepointStore:
    """The savepoint store under SESSIONS_SAVEPOINT_URI: the catalog and one state table per savepoint."""

    uri: str
    options: dict[str, str] | None = field(default=None, repr=False)  # S3 credentials: never printed
    # Failed attempts the catalog could not take when they happened (the store was down): recorded on the next
    # catalog access that works.
    pending: Path | None = None

    @classmethod
    def of(cls, config: SessionsConfig) -> SavepointStore:
        return cls(config.savepoint_uri, storage_options(config, config.savepoint_uri),
                   config.home / "pending-savepoint-failures.jsonl")

    def defer(self, row: dict[str, Any]) -> None:
        """Keep a failed attempt's row locally until the catalog is reachable again."""
        if self.pending is not None:
            self.pending.parent.mkdir(parents=True, exist_ok=True)
            with open(self.pending, "a") as handle:
                handle.write(json.dumps({k: (v.isoformat() if isinstance(v, dt.datetime) else v)
                                         for k, v in row.items()}) + "\n")

    def _flush_pending(self) -> None:
        if self.pending is None or not self.pending.exists():
            return
        rows = [json.loads(line) for line in self.pending.read_text().splitlines() if line.strip()]
        for row in rows:
            row["created_at"] = dt.datetime.fromisoformat(row["created_at"]) if row.get("created_at") else None
            self._append(row)
        self.pending.unlink()

    @property
    def catalog_uri(self) -> str:
        return join(self.uri, "catalog")

    def state_uri(self, savepoint_id: str) -> str:
        return join(self.uri, "state", savepoint_id)

    def write_state(self, savepoint_id: str, table: pa.Table) -> str:
        """Write canonical rows (state_format.canonical: sorted once by the caller, schema pinned here)."""
        target = self.state_uri(savepoint_id)
        rows = table.select(state_format.CANONICAL_SCHEMA.names).cast(state_format.CANONICAL_SCHEMA)
        with s3_errors(target):
            write_deltalake(target, rows, mode="error", storage_options=self.options)
        return target

    def read_state(self, savepoint_id: str) -> pa.Table:
        """The whole state table in this process (small savepoints, tests); state_store.savepoint_io reads it in
        the executors."""
        with s3_errors(self.uri):
            return DeltaTable(self.state_uri(savepoint_id), storage_options=self.options).to_pyarrow_table()

    def exists(self, savepoint_id: str) -> bool:
        """Whether the savepoint's state table exists (a committed Delta table; half-written files are not one)."""
        uri = self.state_uri(savepoint_id)
        with s3_errors(uri):
            return bool(DeltaTable.is_deltatable(uri, storage_options=self.options))

    def data_files(self, savepoint_id: str) -> StateFiles:
        """The state table's current data files and column names, from its Delta log alone (no row is read)."""
        uri = self.state_uri(savepoint_id)
        with s3_errors(uri):
            table = DeltaTable(uri, storage_options=self.options)
            adds = pa.table(table.get_add_actions(flatten=True))
            columns = tuple(column.name for column in table.schema().fields)
            root = table.table_uri.rstrip("/")
        return StateFiles(uri, columns, tuple(f"{root}/{path}" for path in adds["path"].to_pylist()),
                          tuple(int(size) for size in adds["size_bytes"].to_pylist()))

    def table_bytes(self, uri: str) -> int:
        with s3_errors(uri):
            table = DeltaTable(uri, storage_options=self.options)
            adds = pa.table(table.get_add_actions(flatten=True))
        return int(pc.sum(adds["size_bytes"]).as_py() or 0)

    def _append(self, row: dict[str, Any]) -> None:
        full = {name: row.get(name) for name in CATALOG_SCHEMA.names}
        write_deltalake(self.catalog_uri, pa.Table.from_pylist([full], schema=CATALOG_SCHEMA), mode="append",
                        storage_options=self.options)

    def record(self, row: dict[str, Any]) -> None:
        with s3_errors(self.catalog_uri):
            self._flush_pending()
            self._append(row)

    def forget(self, savepoint_id: str) -> None:
        """Remove a savepoint's catalog row (its state table is deleted by the caller first)."""
        with s3_errors(self.catalog_uri):
            DeltaTable(self.catalog_uri, storage_options=self.options).delete(f"savepoint_id = '{savepoint_id}'")

    def list(self) -> list[SavepointInfo]:
        """The catalog, newest first (failed attempts included, with status and error)."""
        with s3_errors(self.catalog_uri):
            self._flush_pending()
            if not DeltaTable.is_deltatable(self.catalog_uri, storage_options=self.options):
                return []
            rows = DeltaTable(self.catalog_uri, storage_options=self.options).to_pyarrow_table().to_pylist()
        saved = [SavepointInfo.from_row(row) for row in rows]
        return sorted(saved, key=lambda s: (s.created_at or "", s.savepoint_id), reverse=True)

    def get(self, savepoint: str = "latest") -> SavepointInfo:
        """A complete savepoint by id, or the newest complete one ("latest")."""
        saved = self.list()
        if savepoint == "latest":
            complete = [s for s in saved if s.status == "complete"]
            if not complete:
                raise SavepointNotFound(f"no complete savepoint in {self.uri}")
            return complete[0]
        for info in saved:
            if info.savepoint_id == savepoint:
                if info.status != "complete":
                    raise SavepointNotFound(f"savepoint {savepoint} is {info.status} ({info.error}); "
                                            "it cannot be restored")
                return info
        raise SavepointNotFound(f"no such savepoint: {savepoint} in {self.uri}")
