"""The sessionization core: pure pandas/numpy, no Spark.

One call advances the open sessions of a group of users (one user, or a hash bucket of many) by a
micro-batch of new events at the batch's watermark. Every stateful operator and the state lifecycle
library share it, so there is one definition of a session.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

# What the state keeps per open event: enough to re-walk the session and to drop duplicates.
STATE_FIELDS = ["user_id", "event_id", "event_time_ms", "event_type"]
SESSION_FIELDS = [
    "session_id", "user_id", "session_start_ms", "session_end_ms",
    "event_count", "page_views", "end_reason",
]
LOGOUT = "logout"
PAGE_VIEW = "page_view"


def session_id(user_id: str, session_start_ms: int) -> str:
    """Deterministic id: the same session gets the same id on every replay, restore and rescale."""
    return hashlib.sha256(f"{user_id}\x1f{session_start_ms}".encode()).hexdigest()[:32]


def empty_state() -> pd.DataFrame:
    return pd.DataFrame({
        "user_id": pd.Series([], dtype=object), "event_id": pd.Series([], dtype=object),
        "event_time_ms": pd.Series([], dtype="int64"), "event_type": pd.Series([], dtype=object),
    })


def empty_sessions() -> pd.DataFrame:
    return pd.DataFrame({
        "session_id": pd.Series([], dtype=object), "user_id": pd.Series([], dtype=object),
        "session_start_ms": pd.Series([], dtype="int64"), "session_end_ms": pd.Series([], dtype="int64"),
        "event_count": pd.Series([], dtype="int64"), "page_views": pd.Series([], dtype="int64"),
        "end_reason": pd.Series([], dtype=object),
    })


def _column(frame, name: str) -> np.ndarray:
    """A column as a numpy array, from a DataFrame or a plain dict of arrays (the operator's state)."""
    values = frame[name]
    return values.to_numpy() if hasattr(values, "to_numpy") else np.asarray(values)


def _dedup_and_order(users, ids, times, types):
    """Drop repeated (user_id, event_id) -- the first row wins, and state rows come first -- and order
    by (user, event_time, event_id). Users only need to be contiguous, not sorted, so users and ids are
    hashed to integer codes (pd.factorize) and sorted as integers; event_id strings are compared only
    to break ties of the same user and millisecond. Plain numpy arrays throughout: this runs once per
    state bucket per micro-batch, where pandas' per-call overhead would dominate."""
    user_codes, _ = pd.factorize(users)
    id_codes, distinct_ids = pd.factorize(ids)
    pair = user_codes.astype("int64") * (len(distinct_ids) + 1) + id_codes
    _, first = np.unique(pair, return_index=True)
    duplicates = len(users) - len(first)
    if duplicates:
        first.sort()
        users, ids, times, types, user_codes = users[first], ids[first], times[first], types[first], user_codes[first]
    order = np.lexsort((times, user_codes))
    same = (user_codes[order][1:] == user_codes[order][:-1]) & (times[order][1:] == times[order][:-1])
    if same.any():
        edges = np.diff(np.concatenate(([0], same.astype("int8"), [0])))
        for lo, hi in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) + 1):  # equal (user, ms): by event_id
            run = order[lo:hi]
            order[lo:hi] = run[np.argsort(ids[run], kind="stable")]
    return users[order], ids[order], times[order], types[order], duplicates


@dataclass(frozen=True)
class Advance:
    closed: pd.DataFrame       # SESSION_FIELDS, sessions the watermark has closed
    open_events: pd.DataFrame  # STATE_FIELDS, what stays in the state store
    late: pd.DataFrame         # the new events at or below the watermark, all their columns
    duplicates: int            # new events whose (user_id, event_id) was already seen
    next_close_ms: int | None  # when the earliest open session will close (the timer)


def advance(open_events, new_events: pd.DataFrame, watermark_ms: int, gap_ms: int) -> Advance:
    """Merge new events into open sessions and close those the watermark has passed.

    Sessions are re-derived from all open events on every call, so the result does not depend on
    arrival order or micro-batch split: an early event that arrives late (but above the watermark)
    simply lands in its place in the walk.
    """
    new_times = _column(new_events, "event_time_ms").astype("int64", copy=False)
    is_late = new_times <= watermark_ms
    late = new_events[is_late] if is_late.any() else new_events.iloc[:0]
    fresh = ~is_late
    users, ids, times, types = (
        np.concatenate([_column(open_events, name).astype(dtype, copy=False),
                        _column(new_events, name).astype(dtype, copy=False)[fresh]])
        for name, dtype in (("user_id", object), ("event_id", object), ("event_time_ms", "int64"),
                            ("event_type", object)))
    if not len(users):
        return Advance(empty_sessions(), empty_state(), late, 0, None)
    users, ids, times, types, duplicates = _dedup_and_order(users, ids, times, types)

    n = len(users)
    starts = np.ones(n, dtype=bool)
    if n > 1:
        starts[1:] = (users[1:] != users[:-1]) | (types[:-1] == LOGOUT) | (times[1:] - times[:-1] >= gap_ms)
    first = np.flatnonzero(starts)
    last = np.append(first[1:] - 1, n - 1)
    ends_in_logout = types[last] == LOGOUT
    close_at = np.where(ends_in_logout, times[last], times[last] + gap_ms)
    is_closed = close_at <= watermark_ms

    closed_first, closed_last = first[is_closed], last[is_closed]
    page_views = np.add.reduceat((types == PAGE_VIEW).astype("int64"), first)[is_closed]
    closed_users = users[closed_first]
    closed_starts = times[closed_first]
    closed = pd.DataFrame({
        "session_id": [session_id(u, s) for u, s in zip(closed_users, closed_starts.tolist())],
        "user_id": closed_users,
        "session_start_ms": closed_starts,
        "session_end_ms": times[closed_last],
        "event_count": (closed_last - closed_first + 1).astype("int64"),
        "page_views": page_views,
        "end_reason": np.where(ends_in_logout[is_closed], "logout", "inactivity").astype(object),
    }) if is_closed.any() else empty_sessions()

    session_of_event = np.cumsum(starts) - 1
    still_open = ~is_closed
    keep = still_open[session_of_event]
    open_rows = pd.DataFrame({"user_id": users[keep], "event_id": ids[keep], "event_time_ms": times[keep],
                              "event_type": types[keep]})
    next_close = int(close_at[still_open].min()) if still_open.any() else None
    return Advance(closed, open_rows, late, duplicates, next_close)
