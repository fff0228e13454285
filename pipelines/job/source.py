"""The stream's source over the raw_events Delta table: `sessions.RawEvents` in the operator's jar
(jvm/operator/src/main/java/sessions/RawEvents.java): each batch planned from raw_events' Delta log in the driver,
its files read by Spark's Parquet reader in the executors (Delta Spark where a file has a deletion vector).

Offsets are `{"seq": N, "boot": bool, "settled": bool}`: N is the raw table's ingest sequence number; rows with
ingest_seq in (start, end] make a micro-batch. A checkpoint made by a restore resumes after its batch 0, which the
restore wrote at the savepoint's source position and watermark (pipelines.job.operators.state_writer).
An idle-close clock row of raw_events is read as a marker too (README "Idle close").
"""
from __future__ import annotations

import json
from collections.abc import Sequence

from pipelines.core.spec import FieldSpec

__all__ = ["SOURCE_NAME", "fields_option"]

SOURCE_NAME = "sessions_raw"


def fields_option(fields: Sequence[FieldSpec]) -> str:
    """The `fields` option: the typed input fields (raw_events' field_<name> columns) the stream carries to the
    operator, for the session spec's attributes; empty: none (the default spec)."""
    return json.dumps([[f.column, f.type] for f in fields]) if fields else ""
