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


def _dedup_and_order(events: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Drop repeated (user_id, event_id) -- the first row wins, and state rows come first -- and order
    by (user, event_time, event_id). Users only need to be contiguous, not sorted, so users and ids are
    hashed to integer codes (pd.factorize) and sorted as integers; event_id strings are compared only
    to break ties of the same user and millisecond."""
    user_codes, _ = pd.factorize(events["user_id"])
    id_codes, ids = pd.factorize(events["event_id"])
    pair = user_codes.astype("int64") * (len(ids) + 1) + id_codes
    _, first = np.unique(pair, return_index=True)
    duplicates = len(events) - len(first)
    if duplicates:
        first.sort()
        events, user_codes = events.iloc[first], user_codes[first]
    times = events["event_time_ms"].to_numpy(dtype="int64")
    order = np.lexsort((times, user_codes))
    same = (user_codes[order][1:] == user_codes[order][:-1]) & (times[order][1:] == times[order][:-1])
    if same.any():
        event_ids = events["event_id"].to_numpy()
        starts = np.flatnonzero(np.diff(np.concatenate(([0], same.astype("int8"), [0]))) == 1)
        ends = np.flatnonzero(np.diff(np.concatenate(([0], same.astype("int8"), [0]))) == -1)
        for lo, hi in zip(starts, ends + 1):  # runs of equal (user, ms): order by event_id
            run = order[lo:hi + 0]
            order[lo:hi] = run[np.argsort(event_ids[run], kind="stable")]
    return events.iloc[order].reset_index(drop=True), duplicates


@dataclass(frozen=True)
class Advance:
    closed: pd.DataFrame       # SESSION_FIELDS, sessions the watermark has closed
    open_events: pd.DataFrame  # STATE_FIELDS, what stays in the state store
    late: pd.DataFrame         # the new events at or below the watermark, all their columns
    duplicates: int            # new events whose (user_id, event_id) was already seen
    next_close_ms: int | None  # when the earliest open session will close (the timer)


def advance(open_events: pd.DataFrame, new_events: pd.DataFrame, watermark_ms: int, gap_ms: int) -> Advance:
    """Merge new events into open sessions and close those the watermark has passed.

    Sessions are re-derived from all open events on every call, so the result does not depend on
    arrival order or micro-batch split: an early event that arrives late (but above the watermark)
    simply lands in its place in the walk.
    """
    is_late = new_events["event_time_ms"].to_numpy() <= watermark_ms
    late = new_events[is_late]
    fresh = new_events.loc[~is_late, STATE_FIELDS]
    parts = [df for df in (open_events[STATE_FIELDS], fresh) if len(df)]
    if not parts:
        return Advance(empty_sessions(), empty_state(), late, 0, None)
    events = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0].reset_index(drop=True)
    events, duplicates = _dedup_and_order(events)

    users = events["user_id"].to_numpy()
    times = events["event_time_ms"].to_numpy(dtype="int64")
    types = events["event_type"].to_numpy()
    n = len(events)
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
    open_rows = events[still_open[session_of_event]].reset_index(drop=True)
    next_close = int(close_at[still_open].min()) if still_open.any() else None
    return Advance(closed, open_rows, late, duplicates, next_close)
