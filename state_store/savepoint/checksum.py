"""The savepoint checksum, its one owner: a row count and the wrapping sum of per-row 64-bit SipHash values.

Order-independent, so any split of the rows -- per executor task, per file, per user -- is checksummed where it is
and combined anywhere (`combine_checksum`); a sum taken out (negative rows) removes rows. Spark carries a partial
sum as a signed long (`signed`).

Exactly what is hashed -- enough to recompute a checksum without this module; catalog rows keep checksums, so it
never changes:

  * A row's text: its fields in the rows' column order, each as text, joined by U+001F (nothing is escaped).
    `attributes` (JSON) as its JSON re-written with sorted keys, no blanks and Python's spelling of numbers, and an
    empty object as null.
    A string as it is; an integer, boolean or timestamp as the decimal text of its int64 value (a timestamp: its
    count of the column's unit since the epoch -- microseconds in the savepoint schemas, negative before 1970; a
    boolean "0"/"1"); a null as "", except a null `event_type` as U+0000, and a null `attributes` (the last column,
    added later) not at all: neither it nor its separator.
  * A row's hash: SipHash-2-4 (the reference algorithm, its 8 output bytes read as a little-endian uint64) of the
    text's UTF-8 bytes, keyed with the 16 ASCII bytes "0123456789123456", then mixed by the splitmix64 finalizer
    (all modulo 2^64): h ^= h >> 30; h *= 0xBF58476D1CE4E5B9; h ^= h >> 27; h *= 0x94D049BB133111EB; h ^= h >> 31.
    That is pandas' `hash_array` with its default key and utf8 (what computes it here).
  * The checksum: "siphash64:<rows>:<sum>", the row count in decimal and the sum of the row hashes modulo 2^64 as
    16 lower-case hex digits; no rows: "siphash64:0:0000000000000000"."""
from __future__ import annotations

import json
from collections.abc import Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

__all__ = ["CHECKSUM_ALGORITHM", "MOD64", "checksum_parts", "combine_checksum", "frame_checksum", "partial_checksum",
           "row_hashes", "signed", "state_checksum"]

_NULL_TOKEN = {"event_type": "\x00"}  # v1 checksums used "" for other nulls; kept so v1 savepoints verify
# The canonical rows' `attributes` (a session spec's partials, pipelines.core.state_format): hashed only when set, so
# a row without attributes hashes as rows did before the column existed and older savepoints still verify.
_OPTIONAL = "attributes"


CHECKSUM_ALGORITHM = "siphash64"
MOD64 = 1 << 64  # checksums are sums of 64-bit hashes, wrapping


def _attributes_text(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The partials' text as hashed: its JSON re-written with sorted keys and no blanks (the JVM and Python spell a
    double differently), and null for no partials at all (null, or an empty object: a row whose attributes are all
    unknown hashes as a row without attributes)."""
    def text(value: str | None) -> str | None:
        if value is None:
            return None
        parsed = json.loads(value)
        return json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False) if parsed else None

    if column.null_count == len(column):  # a job without attributes: nothing to parse
        return pa.nulls(len(column), pa.string())
    return pa.array([text(value) for value in column.to_pylist()], pa.string())


def row_hashes(rows: pa.Table | pa.RecordBatch) -> np.ndarray:
    """Per-row 64-bit SipHash values (pandas' deterministic `hash_array`, fixed key) of all fields, in the rows'
    column order, joined by \\x1f: integers and timestamps as their int64 text (epoch microseconds), nulls as ""
    (event_type: \\x00) -- the framing the module's docstring spells out. What state_checksum sums; the executors
    hash their share with it too (state_store.savepoint.files)."""
    parts = []
    for column_field in rows.schema:
        column = rows[column_field.name]
        if pa.types.is_timestamp(column_field.type) or pa.types.is_integer(column_field.type) or \
                pa.types.is_boolean(column_field.type):  # (a boolean: "0" / "1")
            column = pc.cast(pc.cast(column, pa.int64()), pa.string())
        if column_field.name == _OPTIONAL:
            parts.append(_attributes_text(column))  # null: nothing joined, not even the separator
        else:
            parts.append(pc.fill_null(column, _NULL_TOKEN.get(column_field.name, "")))
    keys = pc.binary_join_element_wise(*parts, "\x1f", null_handling="skip")
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
        total = (total + int(hash_sum)) % MOD64
    return f"{CHECKSUM_ALGORITHM}:{rows}:{total:016x}"


def checksum_parts(checksum: str) -> tuple[int, int]:
    """A checksum back into its (rows, uint64 sum): combine_checksum of it and other parts (negative ones take rows
    out) gives the checksum of the rows together."""
    algorithm, rows, total = checksum.split(":")
    if algorithm != CHECKSUM_ALGORITHM:
        raise ValueError(f"not a {CHECKSUM_ALGORITHM} checksum: {checksum!r}")
    return int(rows), int(total, 16)


def state_checksum(table: pa.Table) -> str:
    """Order-independent checksum of state rows (canonical v2 or v1): the count and the wrapping sum of
    per-row 64-bit SipHash values (row_hashes), labelled with the algorithm."""
    return combine_checksum([partial_checksum(table)])


def signed(value: int) -> int:
    """A uint64 as Spark's signed long (two's complement); combine_checksum takes it back modulo 2^64."""
    value %= MOD64
    return value - MOD64 if value >= 1 << 63 else value


def frame_checksum(rows: DataFrame) -> tuple[int, str]:
    """(rows, checksum) of rows where they are, computed by the frame's tasks in the JVM (the operator jar's
    sessions.Checksum: this module's algorithm, held to row_hashes by tests) with no Python worker: equal to
    state_checksum of the same rows collected (the frame's columns, in order, are what is hashed)."""
    jvm = rows.sparkSession._jvm
    assert jvm is not None  # a classic (py4j) session
    count, hash_sum = jvm.sessions.Checksum.frame(rows._jdf)
    return int(count), combine_checksum([(int(count), int(hash_sum))])
