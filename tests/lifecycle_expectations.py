"""Expected sessions for the lifecycle tests: the contract's rules walked in plain Python.

Written from CONTRACT.md alone (no import of the job's code). Inputs are micro-batches of event
dicts in arrival order; the watermark of batch k is max(event_time of batches < k) - lateness."""
from __future__ import annotations

import datetime as dt
import hashlib


def _ms(text: str) -> int:
    return int(dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def expected_closed_sessions(chunks: list[list[dict]], gap_ms: int, lateness_ms: int) -> list[tuple]:
    seen, kept, max_time, watermark = set(), {}, None, 0
    for chunk in chunks:
        for event in chunk:
            t = _ms(event["event_time"])
            assert t > watermark, "these tests use data with no late event"
            key = (event["user_id"], event["event_id"])
            if key not in seen:
                seen.add(key)
                kept.setdefault(event["user_id"], []).append((t, event["event_id"], event["event_type"]))
            max_time = t if max_time is None else max(max_time, t)
        watermark = max(watermark, max_time - lateness_ms)
    sessions = []
    for user, events in kept.items():
        current = []
        for t, event_id, kind in sorted(events):
            if current and (current[-1][2] == "logout" or t - current[-1][0] >= gap_ms):
                sessions.append((user, current))
                current = []
            current.append((t, event_id, kind))
        sessions.append((user, current))
    closed = []
    for user, events in sessions:
        start, end, last_kind = events[0][0], events[-1][0], events[-1][2]
        closes_at = end if last_kind == "logout" else end + gap_ms
        if closes_at <= watermark:
            session_id = hashlib.sha256(f"{user}\x1f{start}".encode()).hexdigest()[:32]
            closed.append((session_id, user, start, end, len(events),
                           sum(1 for e in events if e[2] == "page_view"),
                           "logout" if last_kind == "logout" else "inactivity"))
    return closed
