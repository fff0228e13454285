"""Adapter from the lifecycle tests' data (micro-batch chunks of event dicts) to the oracle."""
from __future__ import annotations




def expected_closed_sessions(chunks: list[list[dict]], gap_ms: int, lateness_ms: int) -> list[tuple]:
    raise NotImplementedError
