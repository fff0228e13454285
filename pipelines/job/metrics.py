"""Daily session metrics derived from the sessions table (delta-rs + pandas; no Spark needed)."""
from __future__ import annotations

import datetime as dt
from typing import Any

import pandas as pd
import pyarrow as pa
from deltalake import write_deltalake

from pipelines.config import SessionsConfig
from pipelines.storage import open_table, read_rows, storage_options, table_exists

__all__ = ["daily_metrics", "metrics_table"]

METRICS_SCHEMA = pa.schema([
    ("day", pa.string()), ("sessions", pa.int64()), ("users", pa.int64()),
    ("median_duration_s", pa.float64()), ("page_views", pa.int64()), ("logout_sessions", pa.int64()),
    ("computed_at", pa.timestamp("us", tz="UTC")),
])


def metrics_table(config: SessionsConfig) -> str:
    return config.table_uri("daily_session_metrics")


def daily_metrics(config: SessionsConfig, day: str) -> dict[str, Any]:
    """Metrics of sessions that started on `day` (UTC), written as that day's slice of the metrics table
    (replacing it, so a backfill can run any day any number of times)."""
    start = dt.datetime.fromisoformat(day).replace(tzinfo=dt.timezone.utc)
    end = start + dt.timedelta(days=1)
    sessions = read_rows(open_table(config, config.sessions_table),
                         columns=["user_id", "session_start", "session_end", "page_views", "end_reason"],
                         where=f"session_start >= '{start.isoformat()}' AND session_start < '{end.isoformat()}'",
                         ).to_pandas()
    durations = (sessions["session_end"] - sessions["session_start"]).dt.total_seconds()
    row = {
        "day": day, "sessions": int(len(sessions)), "users": int(sessions["user_id"].nunique()),
        "median_duration_s": float(durations.median()) if len(sessions) else 0.0,
        "page_views": int(sessions["page_views"].sum()), "logout_sessions": int((sessions["end_reason"] == "logout").sum()),
        "computed_at": pd.Timestamp.now(tz="UTC").to_pydatetime(),
    }
    table = pa.Table.from_pylist([row], schema=METRICS_SCHEMA)
    uri = metrics_table(config)
    options = storage_options(config, uri)
    if table_exists(config, uri):
        write_deltalake(uri, table, mode="overwrite", predicate=f"day = '{day}'", storage_options=options)
    else:
        write_deltalake(uri, table, mode="append", storage_options=options)
    return {k: v for k, v in row.items() if k != "computed_at"}
