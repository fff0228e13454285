"""Delta per-file statistics of the savepoint files the executors write (state_store.savepoint.files): what
delta-rs would have written for them, so that readers can skip files by min/max."""
from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.core import state_format

__all__ = ["STATS_STRING_BYTES", "FileStats"]

STATS_STRING_BYTES = 64    # string min/max in the Delta statistics: at most this long (parquet-rs' truncation)


def _timestamp_text(micros: int, round_up: bool) -> str:
    """Delta's statistics text for a timestamp: UTC, milliseconds (a max is rounded up: still an upper bound)."""
    millis = -(-micros // 1000) if round_up else micros // 1000
    moment = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(milliseconds=millis)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class FileStats:
    """Delta per-file statistics of state rows, accumulated over the row groups of one file."""

    def __init__(self, schema: pa.Schema = state_format.CANONICAL_SCHEMA) -> None:
        self.schema = schema
        self.nulls = dict.fromkeys(schema.names, 0)
        self.low: dict[str, Any] = {}
        self.high: dict[str, Any] = {}

    def update(self, rows: pa.Table) -> None:
        for column_field in rows.schema:
            name, column = column_field.name, rows[column_field.name]
            self.nulls[name] += column.null_count
            if column.null_count == len(column):
                continue
            if pa.types.is_timestamp(column_field.type):
                column = pc.cast(column, pa.int64())
            bounds = pc.min_max(column)
            low, high = bounds["min"].as_py(), bounds["max"].as_py()
            self.low[name] = low if name not in self.low else min(self.low[name], low)
            self.high[name] = high if name not in self.high else max(self.high[name], high)

    def to_json(self, num_records: int) -> str:
        low, high = {}, {}
        for column_field in self.schema:
            name = column_field.name
            if name not in self.low:
                continue
            if pa.types.is_timestamp(column_field.type):
                low[name], high[name] = _timestamp_text(self.low[name], False), _timestamp_text(self.high[name], True)
            elif pa.types.is_string(column_field.type):
                # A longer min is cut to a prefix (still a lower bound); a longer max is left out (unknown).
                low[name] = self.low[name].encode()[:STATS_STRING_BYTES].decode("utf-8", "ignore")
                if len(self.high[name].encode()) <= STATS_STRING_BYTES:
                    high[name] = self.high[name]
            else:
                low[name], high[name] = self.low[name], self.high[name]
        return json.dumps({"numRecords": num_records, "minValues": low, "maxValues": high, "nullCount": self.nulls})
