"""Adapter from the lifecycle tests' micro-batches (event dicts with ISO event_time) to the oracle, and the live
state of a checkpoint as one canonical table (for tests and benchmarks only: it collects the whole state into the
driver, which no product path does)."""
from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from pipelines.core import state_format
from pipelines.job.operators.seam import StateOperator
from pipelines.locations import CheckpointPath
from state_store.state import read_state
from testkit.oracle import SessionRow, run_oracle


def _ms(text: str) -> int:
    return int(dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def expected_closed_sessions(chunks: list[list[dict[str, Any]]], gap_ms: int, lateness_ms: int) -> list[SessionRow]:
    batches = [[{**event, "event_time_ms": _ms(event["event_time"])} for event in chunk] for chunk in chunks]
    result = run_oracle(batches, gap_ms, lateness_ms)
    assert not result.late, "these tests use data with no late event"
    return sorted(result.closed)


def live_state(spark: SparkSession, checkpoint: CheckpointPath, *, batch_id: int | None,
               op: StateOperator | None = None) -> pa.Table:
    """Canonical Arrow table of the state at a committed batch (Spark's state data source), collected."""
    return state_format.canonical(read_state(spark, checkpoint, batch_id=batch_id, op=op).toArrow())
