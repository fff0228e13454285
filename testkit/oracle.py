"""An independent batch sessionizer: the contract's "Session semantics (the oracle)" walked in plain Python.

Written from those rules alone (README.md, "Session semantics (the oracle)") -- it imports nothing from
`pipelines` -- so the job can be checked against it rather than against itself.

Input: the valid events as they arrive, split into micro-batches (a list of batches, each a list of event
dicts in arrival order), plus gap and lateness in milliseconds. An event dict has at least ``user_id``,
``event_id``, ``event_time_ms`` (int, epoch milliseconds, already truncated to ms) and ``event_type``
(str or None).

The watermark rule simulated (Spark's): the watermark of micro-batch k is
``max(event_time over every row of batches < k) - lateness`` (0 before any data; it never decreases).
A new event is late when ``event_time <= watermark`` of its batch: it is quarantined, not sessionized.
A non-late event whose (user_id, event_id) was accepted before is a duplicate and is dropped (first arrival
wins). After the data, one empty batch runs at the final watermark ``max event_time overall - lateness``,
so the sessions closable by then are closed.
Idle-close clock rows (README "Idle close"): a batch item ``{"clock_ms": T}`` is a clock row ingest appended. It is
never late, never a duplicate, never sessionized; it counts only towards the max event_time above, exactly as an
event at T would (so the watermark of the next batch is at least T - lateness).
Sessions: per user, the accepted events ordered by (event_time, event_id); an event starts a new session
when there is no current one, the previous event was a logout, or it is >= gap after the previous event.
A session is closed when the watermark reaches session_end + gap, or, when it ends with a logout, that
logout's event_time. (Once closed, no later non-late event can join it, so the final walk over all accepted
events gives exactly the sessions the stream writes.)
Attributes (the contract's "Session spec"), when asked for in its own words -- ``{"landing_page": {"first": "page"},
"purchases": {"count_if": {"event_type": ["purchase"]}}, "revenue": {"sum": "revenue"}}`` -- are computed per
session over its events in the order above (duplicates and late events excluded), from each event dict's
``fields`` (name -> value, typed already): ``first``/``last`` the first/last non-null value (null if none),
``count_if`` how many events have one of the types, ``sum``/``min``/``max`` over the non-null values (null if none;
a sum is the exact sum rounded once, so it does not depend on the order of addition). The sum of a ``long`` field is
a ``long``: the exact sum when it fits in a signed 64-bit long, null when it does not (an overflow), whatever it went
through on the way (+MAX, +1, -1 is MAX).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, TypeVar

LOGOUT = "logout"
PAGE_VIEW = "page_view"

Event = tuple[int, str, str | None]  # (event_time_ms, event_id, event_type) of one accepted event
# A session's row: (session_id, user_id, start_ms, end_ms, count, page_views, end_reason)
SessionRow = tuple[str, str, int, int, int, int, str]
T = TypeVar("T")


def oracle_session_id(user_id: str, session_start_ms: int) -> str:
    return hashlib.sha256(f"{user_id}\x1f{session_start_ms}".encode()).hexdigest()[:32]


@dataclass
class OracleResult:
    closed: set[SessionRow] = field(default_factory=set)             # the closed sessions' rows
    open_events: set[tuple[str, str]] = field(default_factory=set)   # {(user_id, event_id)} still in the state store
    late: list[Any] = field(default_factory=list)  # event_ids judged late, in arrival order (copies included)
    late_keys: list[tuple[str, str, int]] = field(default_factory=list)  # (user_id, event_id, event_time_ms) each
    # the late event dicts themselves (extra keys kept), in arrival order
    late_rows: list[dict[str, Any]] = field(default_factory=list)
    # late rows at or below the watermark of the batch before theirs ("very late"): still late, still
    # quarantined per the contract; listed apart because Spark's own late-row filter is a batch behind
    very_late: list[Any] = field(default_factory=list)
    duplicates: int = 0                             # non-late rows dropped as duplicates
    accepted: int = 0                               # distinct events sessionized (closed + open)
    watermarks: list[int] = field(default_factory=list)  # the watermark each batch ran with, then the final one
    final_watermark_ms: int = 0
    open_sessions: list[SessionRow] = field(default_factory=list)  # same shape as closed, the sessions still open
    # with attributes asked for: session_id -> attribute name -> value, for closed and open sessions alike
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_tuple(self) -> tuple[set[SessionRow], set[tuple[str, str]], list[Any]]:
        return self.closed, self.open_events, self.late


def sessionize_user(events: list[Event], gap_ms: int) -> list[list[Event]]:
    """events: (event_time_ms, event_id, event_type) of one user -> list of sessions (lists of events)."""
    sessions: list[list[Event]] = []
    current: list[Event] = []
    for event in sorted(events, key=lambda e: (e[0], e[1])):
        if current:
            previous = current[-1]
            if previous[2] == LOGOUT or event[0] - previous[0] >= gap_ms:
                sessions.append(current)
                current = []
        current.append(event)
    if current:
        sessions.append(current)
    return sessions


def session_row(user_id: str, session: list[Event]) -> SessionRow:
    start, end = session[0][0], session[-1][0]
    ends_in_logout = session[-1][2] == LOGOUT
    return (oracle_session_id(user_id, start), user_id, start, end, len(session),
            sum(1 for e in session if e[2] == PAGE_VIEW), "logout" if ends_in_logout else "inactivity")


def session_attributes(values: list[tuple[str | None, dict[str, Any]]],
                       attributes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A session's attributes from its events' (event_type, fields), in the session's order, by the contract's words."""
    out: dict[str, Any] = {}
    for name, definition in attributes.items():
        ((kind, argument),) = definition.items()
        if kind == "count_if":
            types = argument["event_type"]
            types = [types] if isinstance(types, str) else types
            out[name] = sum(1 for event_type, _ in values if event_type in types)
            continue
        present = [fields[argument] for _, fields in values if fields.get(argument) is not None]
        if not present:
            out[name] = None
        elif kind == "first":
            out[name] = present[0]
        elif kind == "last":
            out[name] = present[-1]
        elif kind == "sum":  # the exact sum, rounded once (a double's); a long's when it fits in 64 bits, else null
            if isinstance(present[0], float):
                out[name] = math.fsum(present)
            else:
                total = sum(present)
                out[name] = total if -(2**63) <= total < 2**63 else None
        elif kind == "min":
            out[name] = min(present)
        else:
            assert kind == "max", kind
            out[name] = max(present)
    return out


def close_time(session: list[Event], gap_ms: int) -> int:
    last_time, _, last_type = session[-1]
    return last_time if last_type == LOGOUT else last_time + gap_ms


def run_oracle(batches: list[list[dict[str, Any]]], gap_ms: int, lateness_ms: int,
               attributes: dict[str, dict[str, Any]] | None = None) -> OracleResult:
    result = OracleResult()
    accepted: dict[str, dict[str, Event]] = {}  # user -> event_id -> (time, event_id, type)
    fields_of: dict[tuple[str, str], dict[str, Any]] = {}  # (user, event_id) -> the accepted copy's fields
    watermark = 0
    max_time: int | None = None
    previous_watermark = None
    for batch in batches:
        result.watermarks.append(watermark)
        for event in batch:
            if "clock_ms" in event:
                max_time = int(event["clock_ms"]) if max_time is None else max(max_time, int(event["clock_ms"]))
                continue
            user, event_id, t = event["user_id"], event["event_id"], int(event["event_time_ms"])
            if t <= watermark:
                result.late.append(event_id)
                result.late_keys.append((user, event_id, t))
                result.late_rows.append(event)
                if previous_watermark is not None and t <= previous_watermark:
                    result.very_late.append(event_id)
            elif event_id in accepted.get(user, {}):
                result.duplicates += 1
            else:
                accepted.setdefault(user, {})[event_id] = (t, event_id, event.get("event_type"))
                fields_of[(user, event_id)] = dict(event.get("fields") or {})
            max_time = t if max_time is None else max(max_time, t)
        previous_watermark = watermark
        if max_time is not None:
            watermark = max(watermark, max_time - lateness_ms)
    result.final_watermark_ms = watermark
    result.watermarks.append(watermark)
    for user, events in accepted.items():
        result.accepted += len(events)
        for session in sessionize_user(list(events.values()), gap_ms):
            if attributes:
                result.attributes[oracle_session_id(user, session[0][0])] = session_attributes(
                    [(e[2], fields_of[(user, e[1])]) for e in session], attributes)
            if close_time(session, gap_ms) <= watermark:
                result.closed.add(session_row(user, session))
            else:
                result.open_sessions.append(session_row(user, session))
                result.open_events.update((user, e[1]) for e in session)
    return result


def oracle(events: list[dict[str, Any]], split: list[int], gap_ms: int,
           lateness_ms: int) -> tuple[set[SessionRow], set[tuple[str, str]], list[Any]]:
    """Convenience form: events in arrival order and the sizes of the micro-batches (must sum to len(events)).

    Returns (closed sessions set, open (user_id, event_id) set, late event_ids list).
    """
    return run_oracle(split_events(events, split), gap_ms, lateness_ms).as_tuple()


def split_events(events: list[T], split: list[int]) -> list[list[T]]:
    assert sum(split) == len(events), (split, len(events))
    out: list[list[T]] = []
    i = 0
    for size in split:
        out.append(list(events[i:i + size]))
        i += size
    return out
