"""The sessionization core: pure numpy/pyarrow, no Spark.

One call advances the open sessions of a group of users (one user, or a hash bucket of many) by a
micro-batch of new events at the batch's watermark. It is the specification of a session: the JVM operator
(jvm/src/sessions/SessionsOperator.java) runs the same rules, and the tests hold both to the oracle; the lifecycle
library uses it where state is walked again (a restore with --migrate) or read as sessions (state, history).

State rows are those of `pipelines.core.state_format`: events above the watermark one by one, and per open
session at most one *frozen prefix* summarising its events at or below the watermark (they can no longer
be reordered, split or duplicated: anything arriving at or below the watermark is late). So a sleeping
user costs one small row, not all of their events, and the walk over a frozen prefix is one step.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from pipelines.core.attributes import UNKNOWN, event_partial, fold, result
from pipelines.core.spec import FIELD_COLUMN_PREFIX, Attribute
from pipelines.core.state_format import LOGOUT, PAGE_VIEW, ROW_FIELDS, STORE_SCHEMA

__all__ = ["advance", "empty_rows", "open_sessions", "rewalk", "rows_table", "session_id"]

SESSION_FIELDS = [
    "session_id", "user_id", "session_start_ms", "session_end_ms",
    "event_count", "page_views", "end_reason",
]
NEVER = np.iinfo(np.int64).max
_OBJECT_FIELDS = {"user_id", "event_id", "event_type"}


def session_id(user_id: str, session_start_ms: int) -> str:
    """Deterministic id: the same session gets the same id on every replay, restore and rescale."""
    return hashlib.sha256(f"{user_id}\x1f{session_start_ms}".encode()).hexdigest()[:32]


def empty_rows() -> dict[str, np.ndarray]:
    """No open state, as the arrays `advance` takes and returns."""
    return {name: np.empty(0, dtype=object if name in _OBJECT_FIELDS else "int64") for name in STORE_SCHEMA.names}


_SESSION_DTYPES = {"session_id": object, "user_id": object, "session_start_ms": "int64", "session_end_ms": "int64",
                   "event_count": "int64", "page_views": "int64", "end_reason": object}
_EVENT_DTYPES = {"user_id": object, "event_id": object, "event_time_ms": "int64", "event_type": object}


_EMPTY: dict[str, pd.DataFrame] = {}


def _empty_frame(dtypes: dict[str, Any]) -> pd.DataFrame:
    # Built once per process and copied: the operator needs one per bucket call, and building a DataFrame
    # costs ~0.3 ms -- a tenth of a small bucket's whole call.
    key = ",".join(dtypes)
    if key not in _EMPTY:
        _EMPTY[key] = pd.DataFrame({name: np.empty(0, dtype=dtype) for name, dtype in dtypes.items()})
    return _EMPTY[key].copy()


def empty_sessions() -> pd.DataFrame:
    return _empty_frame(_SESSION_DTYPES)


def _column(frame: pd.DataFrame | dict[str, np.ndarray], name: str) -> np.ndarray:
    """A column as a numpy array, from a DataFrame, an Arrow table or a plain dict of arrays."""
    values = frame[name]
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values.to_numpy(zero_copy_only=False)
    return values.to_numpy() if hasattr(values, "to_numpy") else np.asarray(values)


def _dedup_and_order(user_codes: np.ndarray, ids: np.ndarray, times: np.ndarray,
                     is_prefix: np.ndarray) -> tuple[np.ndarray, int]:
    """Indices of the rows to walk: repeated (user, event_id) dropped -- the first row wins, and state rows
    come first -- ordered by (user, event_time, event_id). Users only need to be contiguous, so they are
    integer codes; event_id strings are compared only to break ties of one user and millisecond. A frozen
    prefix has no event_id and is never a duplicate (it is also never tied: it lies at or below the
    watermark, everything else above)."""
    id_codes, distinct_ids = pd.factorize(ids)
    pair = user_codes.astype("int64") * (len(distinct_ids) + 1) + id_codes
    pair[is_prefix] = -1 - np.flatnonzero(is_prefix)
    _, keep = np.unique(pair, return_index=True)
    keep.sort()
    order = keep[np.lexsort((times[keep], user_codes[keep]))]
    same = (user_codes[order][1:] == user_codes[order][:-1]) & (times[order][1:] == times[order][:-1])
    if same.any():
        edges = np.diff(np.concatenate(([0], same.astype("int8"), [0])))
        for lo, hi in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) + 1):  # equal (user, ms): by id
            run = order[lo:hi]
            tie_ids = np.array(["" if x is None else x for x in ids[run]], dtype=object)
            order[lo:hi] = run[np.argsort(tie_ids, kind="stable")]
    return order, len(ids) - len(keep)


@dataclass(frozen=True)
class Advance:
    closed: pd.DataFrame             # SESSION_FIELDS, sessions the watermark has closed
    open_rows: dict[str, np.ndarray]  # state_format.STORE_SCHEMA columns: what stays in the state store
    late: pd.DataFrame               # the new events at or below the watermark, all their columns
    duplicates: int                  # new events whose (user_id, event_id) was already seen
    next_due_ms: int | None          # the earliest due_ms left (the group's timer)


def advance(state: pa.Table | dict[str, np.ndarray], new_events: pd.DataFrame, watermark_ms: int,
            gap_ms: int, *, attributes: Sequence[Attribute] = ()) -> Advance:
    """Merge new events into the open sessions of `state` (state_format rows), close those the watermark has
    passed and freeze what it has passed in those that stay open.

    Sessions are re-derived from the rows on every call, so the result does not depend on arrival order or
    micro-batch split: an early event that arrives late (but above the watermark) lands in its place in the
    walk. Only the users in `state` and `new_events` are walked; pass every row of a user, or none.

    With `attributes`: `new_events` may carry a `field_<name>` column per input field they read (missing: all null),
    and `state` a `partials` column (each entry a list of partials in `attributes` order; None, or no column at all:
    every attribute UNKNOWN, a row stored before them). Closed sessions get one column per attribute name, open rows
    a `partials` column (always lists).
    """
    new_times = _column(new_events, "event_time_ms").astype("int64", copy=False)
    is_late = new_times <= watermark_ms
    late = new_events[is_late] if is_late.any() else new_events.iloc[:0]
    fresh = ~is_late
    new_types = _column(new_events, "event_type").astype(object, copy=False)[fresh]
    n_fresh = int(fresh.sum())
    ids = np.concatenate([_column(state, "event_id").astype(object, copy=False),
                          _column(new_events, "event_id").astype(object, copy=False)[fresh]])
    if not len(ids):
        return Advance(_no_sessions(attributes), _open_rows(empty_rows(), attributes), late, 0, None)
    users = np.concatenate([_column(state, "user_id").astype(object, copy=False),
                            _column(new_events, "user_id").astype(object, copy=False)[fresh]])
    times = np.concatenate([_column(state, "event_time_ms").astype("int64", copy=False), new_times[fresh]])
    types = np.concatenate([_column(state, "event_type").astype(object, copy=False), new_types])
    starts_ms = np.concatenate([_column(state, "session_start_ms").astype("int64", copy=False), new_times[fresh]])
    counts = np.concatenate([_column(state, "event_count").astype("int64", copy=False), np.ones(n_fresh, "int64")])
    views = np.concatenate([_column(state, "page_views").astype("int64", copy=False),
                            (new_types == PAGE_VIEW).astype("int64")])
    is_prefix = pd.isna(ids)
    user_codes, _ = pd.factorize(users)
    partials = _row_partials(state, new_events, fresh, new_types, attributes) if attributes else None

    order, duplicates = _dedup_and_order(user_codes, ids, times, is_prefix)
    if partials is not None:
        partials = partials[order]
    users, user_codes, ids, times, types = users[order], user_codes[order], ids[order], times[order], types[order]
    starts_ms, counts, views, is_prefix = starts_ms[order], counts[order], views[order], is_prefix[order]

    # The walk: a row starts a session when the user changes, the previous row ended in a logout, or the gap
    # to the previous row (a frozen prefix counts as its last event) reaches the inactivity gap.
    n = len(users)
    starts = np.ones(n, dtype=bool)
    if n > 1:
        starts[1:] = ((user_codes[1:] != user_codes[:-1]) | (types[:-1] == LOGOUT)
                      | (times[1:] - times[:-1] >= gap_ms))
    first = np.flatnonzero(starts)
    last = np.append(first[1:] - 1, n - 1)
    session_start = np.where(is_prefix, starts_ms, times)[first]
    session_count = np.add.reduceat(counts, first)
    session_views = np.add.reduceat(views, first)
    ends_in_logout = types[last] == LOGOUT
    close_at = np.where(ends_in_logout, times[last], times[last] + gap_ms)
    is_closed = close_at <= watermark_ms

    if is_closed.any():
        closed_users, closed_starts = users[first[is_closed]], session_start[is_closed]
        closed = pd.DataFrame({
            "session_id": [session_id(u, s) for u, s in zip(closed_users, closed_starts.tolist())],
            "user_id": closed_users,
            "session_start_ms": closed_starts,
            "session_end_ms": times[last[is_closed]],
            "event_count": session_count[is_closed],
            "page_views": session_views[is_closed],
            "end_reason": np.where(ends_in_logout[is_closed], "logout", "inactivity").astype(object),
            **(_attribute_values(attributes, partials, first[is_closed], last[is_closed])
               if partials is not None else {}),
        })
    else:
        closed = _no_sessions(attributes)

    session_of_row = np.cumsum(starts) - 1
    kept = np.flatnonzero(~is_closed[session_of_row])
    if not len(kept):
        return Advance(closed, _open_rows(empty_rows(), attributes), late, duplicates, None)
    open_rows = _freeze(kept, session_of_row, session_start, close_at, user_codes, ids, users, times, types,
                        counts, views, watermark_ms)
    if partials is not None:
        open_rows["partials"] = _freeze_partials(attributes, partials, kept, session_of_row, times, watermark_ms)
    return Advance(closed, open_rows, late, duplicates, int(open_rows["due_ms"].min()))


def _freeze(kept: np.ndarray, session_of_row: np.ndarray, session_start: np.ndarray, close_at: np.ndarray,
            user_codes: np.ndarray, ids: np.ndarray, users: np.ndarray, times: np.ndarray, types: np.ndarray,
            counts: np.ndarray, views: np.ndarray, watermark_ms: int) -> dict[str, np.ndarray]:
    """The open sessions' rows, each session's rows at or below the watermark (a prefix of it, since rows
    are in time order and everything after is above) collapsed into one frozen prefix row."""
    sessions = session_of_row[kept]
    ids, counts, views = ids[kept], counts[kept], views[kept]  # fancy indexing: copies, safe to write
    was_prefix = pd.isna(ids)  # a prefix restored under a lower watermark is still frozen
    frozen = times[kept] <= watermark_ms
    next_frozen_same = np.zeros(len(kept), dtype=bool)
    next_frozen_same[:-1] = frozen[1:] & (sessions[1:] == sessions[:-1])
    emit = ~frozen | ~next_frozen_same  # unfrozen rows, and the last frozen row of each session
    frozen_at = np.flatnonzero(frozen)
    if len(frozen_at):
        group_first = np.flatnonzero(np.concatenate(([True], sessions[frozen_at][1:] != sessions[frozen_at][:-1])))
        group_last = frozen_at[np.append(group_first[1:] - 1, len(frozen_at) - 1)]
        counts[group_last] = np.add.reduceat(counts[frozen_at], group_first)
        views[group_last] = np.add.reduceat(views[frozen_at], group_first)
        ids[group_last] = None
    rows = kept[emit]
    sessions, frozen = sessions[emit], (frozen | was_prefix)[emit]
    # due: the earliest watermark at which this user must be walked again without new events -- a session
    # closes, or an event can be frozen.
    row_due = np.minimum(close_at[sessions], np.where(frozen, NEVER, times[rows]))
    codes = user_codes[rows]
    user_first = np.flatnonzero(np.concatenate(([True], codes[1:] != codes[:-1])))
    user_due = np.minimum.reduceat(row_due, user_first)
    due = np.repeat(user_due, np.diff(np.append(user_first, len(rows))))
    return {"user_id": users[rows], "session_start_ms": session_start[sessions], "event_id": ids[emit],
            "event_time_ms": times[rows], "event_type": types[rows], "event_count": counts[emit],
            "page_views": views[emit], "due_ms": due}


# ---- session attributes: only reached with attributes ------------------------------------------------

def _has(frame: pa.Table | pd.DataFrame | dict[str, np.ndarray], name: str) -> bool:
    return name in (frame.column_names if isinstance(frame, pa.Table) else frame)


def _object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-d object array of `values` (np.asarray would make lists of one length a 2-d array)."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def _stored_partials(attributes: Sequence[Attribute], values: Any, n: int) -> list[list[Any]]:
    """State rows' partials column (or None: no column) -> one list per row; None: every attribute UNKNOWN."""
    unknown = [UNKNOWN] * len(attributes)
    if values is None:
        return [list(unknown) for _ in range(n)]
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        values = values.to_pylist()
    out = []
    for value in values:
        if value is None:
            out.append(list(unknown))
        else:
            row = list(value)
            if len(row) != len(attributes):
                raise ValueError(f"a state row holds {len(row)} partials for {len(attributes)} attributes")
            out.append(row)
    return out


_COERCE: dict[str, Any] = {"double": float, "long": int, "boolean": bool, "string": lambda value: value}


def _field_values(new_events: pd.DataFrame, attribute: Attribute, fresh: np.ndarray) -> list[Any]:
    """The fresh events' values of the field `attribute` reads, as Python values of its declared type (None: null;
    a missing column is all null)."""
    assert attribute.field is not None
    column = FIELD_COLUMN_PREFIX + attribute.field
    if not _has(new_events, column):
        return [None] * int(fresh.sum())
    values = new_events[column]
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        raw = np.array(values.to_pylist(), dtype=object)[fresh]
    else:
        raw = (values.to_numpy(dtype=object) if hasattr(values, "to_numpy")
               else np.asarray(values, dtype=object))[fresh]
    coerce = _COERCE.get(attribute.field_type or "", lambda value: value)
    out: list[Any] = []
    for value in raw.tolist():
        if value is None or (not isinstance(value, (str, bytes, list, tuple, dict)) and pd.isna(value)):
            out.append(None)
        else:
            out.append(coerce(value.item() if isinstance(value, np.generic) else value))
    return out


def _row_partials(state: pa.Table | dict[str, np.ndarray], new_events: pd.DataFrame, fresh: np.ndarray,
                  new_types: np.ndarray, attributes: Sequence[Attribute]) -> np.ndarray:
    """Every row's partials, state rows then fresh events (the order `advance` concatenates them in)."""
    n_state = len(_column(state, "event_id"))
    rows = _stored_partials(attributes, state["partials"] if _has(state, "partials") else None, n_state)
    fields: dict[str, list[Any]] = {}
    for attribute in attributes:
        if attribute.field is not None and attribute.field not in fields:
            fields[attribute.field] = _field_values(new_events, attribute, fresh)
    for i, event_type in enumerate(new_types.tolist()):
        values = {name: column[i] for name, column in fields.items()}
        rows.append([event_partial(attribute, event_type=event_type, fields=values) for attribute in attributes])
    return _object_array(rows)


def _fold_rows(attributes: Sequence[Attribute], rows: np.ndarray) -> list[Any]:
    """Consecutive rows' partials (walk order) folded into one row's."""
    return [fold(attribute, (row[k] for row in rows)) for k, attribute in enumerate(attributes)]


def _attribute_values(attributes: Sequence[Attribute], partials: np.ndarray, first: np.ndarray,
                      last: np.ndarray) -> dict[str, np.ndarray]:
    """Per session (rows first..last of `partials`, walk order): one value per attribute, by name."""
    columns = {attribute.name: np.empty(len(first), dtype=object) for attribute in attributes}
    for s, (lo, hi) in enumerate(zip(first.tolist(), last.tolist())):
        for attribute, partial in zip(attributes, _fold_rows(attributes, partials[lo:hi + 1])):
            columns[attribute.name][s] = result(partial)
    return columns


def _no_sessions(attributes: Sequence[Attribute]) -> pd.DataFrame:
    """No closed sessions: SESSION_FIELDS and one column per attribute."""
    if not attributes:
        return empty_sessions()
    return _empty_frame({**_SESSION_DTYPES, **{attribute.name: object for attribute in attributes}})


def _open_rows(rows: dict[str, np.ndarray], attributes: Sequence[Attribute]) -> dict[str, np.ndarray]:
    if attributes:
        rows["partials"] = np.empty(len(rows["user_id"]), dtype=object)
    return rows


def _freeze_partials(attributes: Sequence[Attribute], partials: np.ndarray, kept: np.ndarray,
                     session_of_row: np.ndarray, times: np.ndarray, watermark_ms: int) -> np.ndarray:
    """The partials of `_freeze`'s rows, row for row: a row above the watermark keeps its own, a session's run of
    rows at or below it (a frozen prefix and the events after it) becomes one row with their fold."""
    sessions, frozen = session_of_row[kept].tolist(), (times[kept] <= watermark_ms).tolist()
    out: list[list[Any]] = []
    i, n = 0, len(kept)
    while i < n:
        j = i
        if frozen[i]:
            while j + 1 < n and frozen[j + 1] and sessions[j + 1] == sessions[i]:
                j += 1
            out.append(_fold_rows(attributes, partials[kept[i:j + 1]]) if j > i else list(partials[kept[i]]))
        else:
            out.append(list(partials[kept[i]]))
        i = j + 1
    return _object_array(out)


# ---- helpers for the operator and the lifecycle library ---------------------------------------------

def rows_table(rows: dict[str, np.ndarray]) -> pa.Table:
    """advance's open rows -> an Arrow table of state_format.STORE_SCHEMA."""
    return pa.table({name: pa.array(rows[name], type=STORE_SCHEMA.field(name).type) for name in STORE_SCHEMA.names},
                    schema=STORE_SCHEMA)


def rewalk(rows: pa.Table | dict[str, np.ndarray], watermark_ms: int, gap_ms: int, *,
           attributes: Sequence[Attribute] = ()) -> dict[str, np.ndarray]:
    """Open rows re-derived from rows without new events (restore uses it to settle restored state); with
    `attributes`, their partials too (as `advance`)."""
    return advance(rows, no_events(), watermark_ms, gap_ms, attributes=attributes).open_rows


def no_events() -> pd.DataFrame:
    return _empty_frame(_EVENT_DTYPES)


# ---- reading open sessions out of state rows (status, live lookup) ----------------------------------

def open_sessions(rows: pa.Table | dict[str, np.ndarray], gap_ms: int, *,
                  attributes: Sequence[Attribute] = ()) -> pd.DataFrame:
    """One row per open session of state rows (any order): user_id, session_id, session_start_ms,
    last_event_ms, last_event_type, event_count, page_views, closes_at_ms (the watermark that closes it); with
    `attributes`, one column per attribute name: the session's value so far (from the rows' `partials`, as `advance`
    takes them)."""
    columns = ["user_id", "session_id", "session_start_ms", "last_event_ms", "last_event_type", "event_count",
               "page_views", "closes_at_ms", *(attribute.name for attribute in attributes)]
    frame = pd.DataFrame({name: _column(rows, name) for name in ROW_FIELDS})
    if frame.empty:
        return pd.DataFrame(columns=columns)
    if attributes:
        frame["partials"] = _object_array(_stored_partials(
            attributes, rows["partials"] if _has(rows, "partials") else None, len(frame)))
    frame["tie"] = frame["event_id"].fillna("")
    frame = frame.sort_values(["user_id", "session_start_ms", "event_time_ms", "tie"], kind="stable")
    # Two open sessions can share a start ms (a logout, then a tie sorting after it): split after logouts.
    key = ["user_id", "session_start_ms"]
    after_logout = (frame["event_type"] == LOGOUT).groupby([frame[k] for k in key], sort=False).shift(fill_value=False)
    frame["part"] = after_logout.astype("int64").groupby([frame[k] for k in key], sort=False).cumsum()
    grouped = frame.groupby([*key, "part"], sort=False)
    out = grouped.agg(last_event_ms=("event_time_ms", "last"), last_event_type=("event_type", "last"),
                      event_count=("event_count", "sum"), page_views=("page_views", "sum")).reset_index()
    out["session_id"] = [session_id(u, int(s)) for u, s in zip(out["user_id"], out["session_start_ms"])]
    out["closes_at_ms"] = np.where(out["last_event_type"] == LOGOUT, out["last_event_ms"], out["last_event_ms"] + gap_ms)
    if attributes:
        # Rows are in walk order within a session (sorted by time, then event_id); groups numbered as `out` lists them.
        group = grouped.ngroup().to_numpy()
        by_group = np.argsort(group, kind="stable")
        bounds = np.flatnonzero(np.diff(group[by_group])) + 1
        first, last = np.append(0, bounds), np.append(bounds - 1, len(group) - 1)
        values = _attribute_values(attributes, frame["partials"].to_numpy()[by_group], first, last)
        for name, column in values.items():
            out[name] = column
    return out[columns].reset_index(drop=True)
