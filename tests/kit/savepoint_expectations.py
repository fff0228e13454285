"""What a savepoint and a restore must hold, by the oracle (testkit/oracle.py) rather than by the product's own
report: the oracle at a savepoint's batch, the open sessions canonical state rows hold (a savepoint's Delta table, read
with plain Python), and the sessions after a restore under a new gap (--migrate), by docs/operations.md's rule ("Savepoints")."""
from __future__ import annotations

from typing import Any

import pyarrow as pa

from testkit.oracle import LOGOUT, PAGE_VIEW, OracleResult, SessionRow, oracle_session_id, run_oracle
from tests.kit.tables import iso_ms

# (user_id, session_start_ms, event_id (None: a frozen prefix), event_time_ms, event_type, event_count, page_views)
StateRow = tuple[str, int, "str | None", int, "str | None", int, int]


def oracle_of(chunks: list[list[dict[str, Any]]], gap_ms: int, lateness_ms: int) -> OracleResult:
    """The oracle over these micro-batches (one chunk of ISO-timed events each); over chunks[:n], what a savepoint at
    batch n holds: `open_sessions` in its state, `closed` in the sessions table."""
    batches = [[{**event, "event_time_ms": iso_ms(event["event_time"])} for event in chunk] for chunk in chunks]
    result = run_oracle(batches, gap_ms, lateness_ms)
    assert not result.late, "these tests use data with no late event"
    return result


def state_rows(state: pa.Table) -> list[StateRow]:
    """Canonical state rows (docs/operations.md "Savepoints": a savepoint's Delta table) as tuples, timestamps as integer ms."""
    def ms(name: str) -> list[int]:
        return [v // 1000 for v in state[name].cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist()]

    return list(zip(state["user_id"].to_pylist(), ms("session_start"), state["event_id"].to_pylist(),
                    ms("event_time"), state["event_type"].to_pylist(), state["event_count"].to_pylist(),
                    state["page_views"].to_pylist()))


def state_sessions(state: pa.Table) -> list[SessionRow]:
    """The open sessions canonical state rows hold, in the oracle's tuple shape, sorted: the rows of one (user,
    session_start) in time order (a frozen prefix first), a new session after a logout."""
    sessions: list[dict[str, Any]] = []
    for user, start, _, at, kind, count, views in sorted(state_rows(state), key=lambda r: (r[0], r[1], r[3], r[2] or "")):
        last = sessions[-1] if sessions else None
        if last is None or (last["user"], last["start"]) != (user, start) or last["kind"] == LOGOUT:
            last = {"user": user, "start": start, "count": 0, "views": 0}
            sessions.append(last)
        last.update(end=at, kind=kind, count=last["count"] + count, views=last["views"] + views)
    return sorted((oracle_session_id(s["user"], s["start"]), s["user"], s["start"], s["end"], s["count"], s["views"],
                   "logout" if s["kind"] == LOGOUT else "inactivity") for s in sessions)


def state_event_keys(state: pa.Table) -> set[tuple[str, str]]:
    """(user_id, event_id) of the rows that are events, not frozen prefixes."""
    return {(row[0], row[2]) for row in state_rows(state) if row[2] is not None}


def after_migration(state: pa.Table, chunks: list[list[dict[str, Any]]], cut: int, gap_ms: int, lateness_ms: int,
                    new_gap_ms: int) -> tuple[list[SessionRow], list[SessionRow]]:
    """(closed, open) sessions once a savepoint of chunks[:cut] (its canonical rows: `state`) was restored with
    --migrate under new_gap_ms and chunks[cut:] were processed, by docs/operations.md's rule ("Savepoints"): a frozen prefix
    stays one piece (its events are gone), the new gap applies from its last event on; the sessions closed before the
    savepoint stay as written. The lateness is unchanged, and what is late or a duplicate does not depend on the gap:
    the events accepted after the savepoint and the final watermark are the oracle's over all chunks."""
    before, whole = oracle_of(chunks[:cut], gap_ms, lateness_ms), oracle_of(chunks, gap_ms, lateness_ms)
    # per user: pieces (start_ms, tie, end_ms, last event_type, events, page views): a frozen prefix, or one event
    pieces: dict[str, list[tuple[int, str, int, str | None, int, int]]] = {}
    for user, start, event_id, at, kind, count, views in state_rows(state):
        pieces.setdefault(user, []).append((start if event_id is None else at, event_id or "", at, kind, count, views))
    seen = {(e["user_id"], e["event_id"]) for chunk in chunks[:cut] for e in chunk}
    for e in (e for chunk in chunks[cut:] for e in chunk):
        if (e["user_id"], e["event_id"]) not in seen:  # a later copy is a duplicate
            seen.add((e["user_id"], e["event_id"]))
            at, kind = iso_ms(e["event_time"]), e.get("event_type")
            pieces.setdefault(e["user_id"], []).append((at, e["event_id"], at, kind, 1, int(kind == PAGE_VIEW)))
    closed, still_open = set(before.closed), []
    for user, walk in pieces.items():
        sessions: list[list[tuple[int, str, int, str | None, int, int]]] = []
        for piece in sorted(walk):
            last = sessions[-1][-1] if sessions else None
            if last is None or last[3] == LOGOUT or piece[0] - last[2] >= new_gap_ms:
                sessions.append([])
            sessions[-1].append(piece)
        for session in sessions:
            first, last = session[0], session[-1]
            row = (oracle_session_id(user, first[0]), user, first[0], last[2], sum(p[4] for p in session),
                   sum(p[5] for p in session), "logout" if last[3] == LOGOUT else "inactivity")
            if (last[2] if last[3] == LOGOUT else last[2] + new_gap_ms) <= whole.final_watermark_ms:
                closed.add(row)
            else:
                still_open.append(row)
    return sorted(closed), sorted(still_open)
