"""Adapter from the lifecycle tests' micro-batches (event dicts with ISO event_time) to the oracle."""
from __future__ import annotations

import datetime as dt
from typing import Any

from testkit.oracle import SessionRow, run_oracle


def _ms(text: str) -> int:
    return int(dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def expected_closed_sessions(chunks: list[list[dict[str, Any]]], gap_ms: int, lateness_ms: int) -> list[SessionRow]:
    batches = [[{**event, "event_time_ms": _ms(event["event_time"])} for event in chunk] for chunk in chunks]
    result = run_oracle(batches, gap_ms, lateness_ms)
    assert not result.late, "these tests use data with no late event"
    return sorted(result.closed)
