"""The stateful operator: Spark's applyInPandasWithState around the pure core.

State is keyed by a hash bucket of user_id (SESSIONS_STATE_BUCKETS), so one Python call advances the
sessions of many users with vectorised pandas instead of one call per user. applyInPandasWithState
runs on both the RocksDB and the HDFS-backed state store providers.

Only what sessionization needs crosses the shuffle and the JVM/Python boundary: rejected lines and the
restore's watermark marker are dropped right after the watermark node (which has already counted
them), and a late event travels as (ingest_seq, line_no) -- the sink fetches the rest from raw_events.
"""
from __future__ import annotations

import json
import warnings
from typing import Iterator

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from pipelines.sessionize import STATE_FIELDS, advance, empty_state

# One JSON column of parallel arrays: PySpark 4.2 cannot hand array-typed state to Python workers
# (KeyError 'elementType' in the worker), and JSON stays readable through the state data source.
STATE_SCHEMA = "open_events string"
STATE_JSON_SCHEMA = "user_ids array<string>, event_ids array<string>, event_times array<long>, event_types array<string>"
OUTPUT_COLUMNS = [
    ("kind", "string"), ("session_id", "string"), ("user_id", "string"),
    ("session_start_ms", "long"), ("session_end_ms", "long"), ("event_count", "long"),
    ("page_views", "long"), ("end_reason", "string"),
    ("event_id", "string"), ("event_time_ms", "long"), ("event_type", "string"),
    ("ingest_seq", "long"), ("line_no", "long"),
]
OUTPUT_SCHEMA = ", ".join(f"{name} {kind}" for name, kind in OUTPUT_COLUMNS)
_INT_COLUMNS = {name for name, kind in OUTPUT_COLUMNS if kind == "long"}
FROM_STATE = 1  # `from_state` column: a savepoint row being restored, not an event
# PySpark's own serializer concatenates our frames with all-null columns; pandas 2.x warns about a
# future change on every task. The output schema is fixed, so the warning is noise in worker logs.
warnings.filterwarnings("ignore", category=FutureWarning, module="pyspark.sql.pandas.serializers")


def bucket_column(buckets: int):
    return F.pmod(F.xxhash64("user_id"), F.lit(buckets)).cast("int")


def _output(frame: pd.DataFrame, kind: str) -> pd.DataFrame:
    n = len(frame)
    columns = {}
    for name, _ in OUTPUT_COLUMNS:
        if name == "kind":
            columns[name] = np.full(n, kind, dtype=object)
        elif name in frame.columns:
            values = frame[name].to_numpy()
            columns[name] = pd.array(values, dtype="Int64") if name in _INT_COLUMNS else values
        else:
            columns[name] = pd.array([None] * n, dtype="Int64" if name in _INT_COLUMNS else object)
    return pd.DataFrame(columns)


def _state_frame(state: GroupState) -> pd.DataFrame:
    if not state.exists:
        return empty_state()
    stored = json.loads(state.get[0])
    return pd.DataFrame({"user_id": stored["user_ids"], "event_id": stored["event_ids"],
                         "event_time_ms": pd.array(stored["event_times"], dtype="int64"),
                         "event_type": stored["event_types"]})


def _state_json(open_events: pd.DataFrame) -> str:
    return json.dumps({
        "user_ids": open_events["user_id"].tolist(), "event_ids": open_events["event_id"].tolist(),
        "event_times": open_events["event_time_ms"].astype("int64").tolist(),
        "event_types": open_events["event_type"].tolist(),
    }, separators=(",", ":"))


def make_session_function(gap_ms: int):
    def sessions_for_bucket(key, frames: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
        stored = _state_frame(state)
        events = empty_state()
        if not state.hasTimedOut:
            batch = pd.concat(list(frames), ignore_index=True)
            from_state = batch["from_state"].to_numpy() == FROM_STATE
            if from_state.any():
                restored = batch.loc[from_state, STATE_FIELDS]
                stored = pd.concat([stored, restored], ignore_index=True) if len(stored) else restored
            events = batch[~from_state]
        step = advance(stored, events, state.getCurrentWatermarkMs(), gap_ms)
        if len(step.open_events):
            state.update((_state_json(step.open_events),))
            state.setTimeoutTimestamp(step.next_close_ms - 1)  # Spark fires when timeout < watermark
        elif state.exists:
            state.remove()
        if len(step.closed):
            yield _output(step.closed, "session")
        if len(step.late):
            yield _output(step.late, "late")

    return sessions_for_bucket


def sessionize(events: DataFrame, gap_ms: int, lateness_ms: int, buckets: int) -> DataFrame:
    """Source rows -> rows of kind `session` (closed sessions) and `late` (events below the watermark)."""
    with_watermark = events.withWatermark("event_time", f"{lateness_ms} milliseconds")
    stateful = with_watermark.where(
        (F.col("origin") == "state") | ((F.col("origin") == "event") & F.col("reject_reason").isNull()))
    keyed = stateful.select(
        bucket_column(buckets).alias("bucket"),
        "user_id", "event_id",
        F.unix_millis("event_time").alias("event_time_ms"),
        # The operator needs a column marked with the watermark (else no event-time timers and no
        # GroupState watermark), but with an event-time timeout Spark also drops input rows at or below
        # the *previous* batch's watermark before Python sees them -- those late events would vanish
        # instead of reaching quarantine. A null timestamp carrying the mark gives the one without the other.
        F.lit(None).cast("timestamp").alias("event_time", metadata={"spark.watermarkDelayMs": lateness_ms}),
        "event_type", "ingest_seq", "line_no",
        F.when(F.col("origin") == "state", F.lit(FROM_STATE)).otherwise(F.lit(0)).alias("from_state"),
    )
    return keyed.groupBy("bucket").applyInPandasWithState(
        make_session_function(gap_ms), OUTPUT_SCHEMA, STATE_SCHEMA, "append", GroupStateTimeout.EventTimeTimeout,
    )
