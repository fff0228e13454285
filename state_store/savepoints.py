"""Savepoints as Delta tables (delta-rs) on a local path or S3: canonical state rows + a catalog.

Layout under SESSIONS_SAVEPOINT_URI:
  catalog/          one row per savepoint attempt (status complete | failed); the only index
  state/<id>/       the open state in canonical form (pipelines.state_format.CANONICAL_SCHEMA, schema id
                    in the catalog row; v1 savepoints -- one row per open event -- still restore)
A savepoint is listed as complete only after its state table was written, re-read and its count and
checksum matched the live state; a half-written state table is never referenced by a complete row.
"""
from __future__ import annotations

import datetime as dt
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from pipelines import state_format
from pipelines.errors import SavepointNotFound

CATALOG_SCHEMA = pa.schema([
    ("savepoint_id", pa.string()),
    ("status", pa.string()),            # complete | failed
    ("trigger", pa.string()),           # manual | scheduled | pre-rescale | sensor
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


def storage_options(uri: str) -> dict | None:
    """delta-rs options for S3 from the standard AWS_* variables (never logged)."""
    if not uri.startswith("s3://"):
        return None
    options = {k: v for k, v in os.environ.items() if k.startswith("AWS_") and v}
    endpoint = options.get("AWS_ENDPOINT_URL", "")
    if endpoint.startswith("http://"):
        options.setdefault("AWS_ALLOW_HTTP", "true")
    options.setdefault("AWS_CONDITIONAL_PUT", "etag")  # safe concurrent commits on S3
    options.setdefault("AWS_REGION", os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
    # Fail in seconds, not after object_store's default 10 retries over 3 minutes: an operator
    # waiting on a savepoint wants the error.
    options.setdefault("max_retries", os.environ.get("SESSIONS_S3_MAX_RETRIES", "3"))
    options.setdefault("retry_timeout", os.environ.get("SESSIONS_S3_RETRY_TIMEOUT", "15s"))
    options.setdefault("connect_timeout", "5s")
    options.setdefault("timeout", os.environ.get("SESSIONS_S3_TIMEOUT", "30s"))
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # else delta-rs probes instance metadata
    return options


def _join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *parts])


def catalog_uri(uri: str) -> str:
    return _join(uri, "catalog")


def state_uri(uri: str, savepoint_id: str) -> str:
    return _join(uri, "state", savepoint_id)


def new_savepoint_id(batch_id: int, now: dt.datetime) -> str:
    return f"sp-{now.strftime('%Y%m%dT%H%M%S')}-b{batch_id}-{os.urandom(2).hex()}"


_NULL_TOKEN = {"event_type": "\x00"}  # v1 checksums used "" for other nulls; kept so v1 savepoints verify


def state_checksum(table: pa.Table) -> str:
    """Order-independent checksum of state rows (canonical v2 or v1): the count and the wrapping sum of
    per-row 64-bit SipHash values (pandas' deterministic `hash_array`, fixed key) of all fields joined,
    labelled with the algorithm."""
    parts = []
    for field in table.schema:
        column = table[field.name]
        if pa.types.is_timestamp(field.type) or pa.types.is_integer(field.type):
            column = pc.cast(pc.cast(column, pa.int64()), pa.string())
        parts.append(pc.fill_null(column, _NULL_TOKEN.get(field.name, "")))
    keys = pc.binary_join_element_wise(*parts, "\x1f")
    hashes = pd.util.hash_array(keys.to_numpy(zero_copy_only=False), categorize=False)
    return f"siphash64:{table.num_rows}:{int(hashes.sum(dtype=np.uint64)):016x}"


def write_state(uri: str, savepoint_id: str, table: pa.Table) -> str:
    """Write canonical rows (state_format.canonical: sorted once by the caller, schema pinned here)."""
    target = state_uri(uri, savepoint_id)
    rows = table.select(state_format.CANONICAL_SCHEMA.names).cast(state_format.CANONICAL_SCHEMA)
    write_deltalake(target, rows, mode="error", storage_options=storage_options(target))
    return target


def read_savepoint_state(uri: str, savepoint_id: str) -> pa.Table:
    target = state_uri(uri, savepoint_id)
    return DeltaTable(target, storage_options=storage_options(target)).to_pyarrow_table()


def table_bytes(uri: str) -> int:
    table = DeltaTable(uri, storage_options=storage_options(uri))
    adds = pa.table(table.get_add_actions(flatten=True))
    return int(pc.sum(adds["size_bytes"]).as_py() or 0)


def record(uri: str, row: dict) -> None:
    target = catalog_uri(uri)
    full = {name: row.get(name) for name in CATALOG_SCHEMA.names}
    write_deltalake(target, pa.Table.from_pylist([full], schema=CATALOG_SCHEMA), mode="append",
                    storage_options=storage_options(target))


def list_savepoints(uri: str) -> list[dict]:
    """The catalog, newest first (failed attempts included, with status and error)."""
    target = catalog_uri(uri)
    options = storage_options(target)
    if not DeltaTable.is_deltatable(target, storage_options=options):
        return []
    rows = DeltaTable(target, storage_options=options).to_pyarrow_table().to_pylist()
    for row in rows:
        row["uri"] = row["state_uri"]
        row["created_at"] = row["created_at"].isoformat() if row["created_at"] else None
    return sorted(rows, key=lambda r: (r["created_at"] or "", r["savepoint_id"]), reverse=True)


def get_savepoint(uri: str, savepoint: str = "latest") -> dict:
    rows = list_savepoints(uri)
    if savepoint == "latest":
        complete = [r for r in rows if r["status"] == "complete"]
        if not complete:
            raise SavepointNotFound(f"no complete savepoint in {uri}")
        return complete[0]
    for row in rows:
        if row["savepoint_id"] == savepoint:
            if row["status"] != "complete":
                raise SavepointNotFound(f"savepoint {savepoint} is {row['status']} ({row.get('error')}); it cannot be restored")
            return row
    raise SavepointNotFound(f"no such savepoint: {savepoint} in {uri}")
