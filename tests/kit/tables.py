"""The one reader of each output the tests compare with the oracle: the sessions table, the quarantine, the open
sessions in the state store, the late keys; and `iso_ms` for the oracle's timestamps.

``read_sessions(config, *, missing_ok=False) -> list[tuple]``  the sessions table as (session_id, user_id, start_ms,
    end_ms, event_count, page_views, end_reason) tuples, sorted (``missing_ok``: [] before a run created it).
``read_quarantine(config) -> pandas.DataFrame``  the quarantine table (event_time as epoch ms in ``event_time_ms``).
``read_open_sessions(spark, config) -> list[tuple]``  the open sessions in the state store, in the oracle's tuple
    shape (compare with ``sorted(run_oracle(...).open_sessions)``).
"""
from __future__ import annotations

import datetime as dt


def iso_ms(text: str) -> int:
    """'2026-10-05T12:00:00.123Z' (or '+00:00', any offset) -> epoch milliseconds."""
    return int(dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def _ms(column) -> list:
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.divide(column.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()), 1000).to_pylist()


def read_sessions(config, *, missing_ok: bool = False) -> list[tuple]:
    from deltalake import DeltaTable

    from pipelines.storage import open_table, read_rows

    if missing_ok and not DeltaTable.is_deltatable(str(config.sessions_table)):
        return []  # before the job's first run created it
    # read_rows: as the Delta log says, deletion vectors included (a table Delta Spark rewrote).
    table = read_rows(open_table(config, config.sessions_table))
    rows = zip(table["session_id"].to_pylist(), table["user_id"].to_pylist(), _ms(table["session_start"]),
               _ms(table["session_end"]), table["event_count"].to_pylist(), table["page_views"].to_pylist(),
               table["end_reason"].to_pylist())
    return sorted(tuple(r) for r in rows)


def read_quarantine(config):
    import pyarrow as pa

    from pipelines.storage import open_table, read_rows

    table = read_rows(open_table(config, config.quarantine_table))
    frame = table.drop_columns(["event_time", "quarantined_at"]).to_pandas()
    frame["event_time_ms"] = pa.array(_ms(table["event_time"]), pa.int64()).to_pandas(integer_object_nulls=True)
    return frame


def read_open_sessions(spark, config) -> list[tuple]:
    """The open sessions the state store holds, in the oracle's tuple shape (open_sessions_of)."""
    from state_store.state import read_state

    return open_sessions_of(read_state(spark, config.checkpoint).collect())


def open_sessions_of(rows) -> list[tuple]:
    """Canonical state rows -> open sessions in the oracle's tuple shape (session_id, user_id, start_ms,
    last_event_ms, event_count, page_views, "logout" | "inactivity" by the last event), sorted. Plain Python: rows of
    one (user, session_start) in time order, a new session after a logout (two sessions may share a start ms)."""
    from testkit.oracle import oracle_session_id

    ms = lambda ts: int(ts.timestamp() * 1000) if ts is not None else None  # noqa: E731
    rows = sorted(rows, key=lambda r: (r["user_id"], ms(r["session_start"]), ms(r["event_time"]), r["event_id"] or ""))
    sessions, current, key = [], None, None
    for r in rows:
        row_key = (r["user_id"], ms(r["session_start"]))
        if current is None or row_key != key or current["last_type"] == "logout":
            current = {"user": r["user_id"], "start": row_key[1], "count": 0, "views": 0}
            sessions.append(current)
            key = row_key
        current.update(last=ms(r["event_time"]), last_type=r["event_type"])
        current["count"] += r["event_count"]
        current["views"] += r["page_views"]
    return sorted((oracle_session_id(s["user"], s["start"]), s["user"], s["start"], s["last"], s["count"], s["views"],
                   "logout" if s["last_type"] == "logout" else "inactivity") for s in sessions)


def assert_late_keys(config, expected) -> None:
    """The quarantine's `late` rows are exactly the oracle's late events (user, event id, event time)."""
    late = read_quarantine(config)
    late = late[late["reason"] == "late"]
    assert sorted(zip(late["user_id"], late["event_id"], late["event_time_ms"].astype(int))) == \
        sorted(expected.late_keys)
