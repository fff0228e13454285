"""The stateful operator: Spark's applyInPandasWithState around the pure core.

State is keyed by a hash bucket of user_id (SESSIONS_STATE_BUCKETS), so one Python call advances the
sessions of many users with vectorised pandas instead of one call per user. applyInPandasWithState
runs on both the RocksDB and the HDFS-backed state store providers.

Only what sessionization needs crosses the shuffle and the JVM/Python boundary: rejected lines and the
restore's watermark marker are dropped right after the watermark node (which has already counted
them), and a late event travels as (ingest_seq, line_no) -- the sink fetches the rest from raw_events.
"""
from __future__ import annotations

import warnings
from typing import Iterator

import numpy as np
import orjson
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
        elif name in _INT_COLUMNS:  # nullable longs, built from their buffers (no per-value conversion)
            if name in frame.columns and frame[name].dtype.kind in "iu":
                columns[name] = pd.arrays.IntegerArray(frame[name].to_numpy(dtype="int64"), np.zeros(n, dtype=bool))
            elif name in frame.columns:  # Spark hands a long column with nulls over as floats
                columns[name] = pd.array(frame[name].to_numpy(), dtype="Int64")
            else:
                columns[name] = pd.arrays.IntegerArray(np.zeros(n, dtype="int64"), np.ones(n, dtype=bool))
        else:
            columns[name] = frame[name].to_numpy() if name in frame.columns else np.full(n, None, dtype=object)
    return pd.DataFrame(columns)


def _state_arrays(state: GroupState) -> dict:
    """The bucket's open events as plain arrays (the core takes them as they are)."""
    if not state.exists:
        return {name: np.empty(0, dtype="int64" if name == "event_time_ms" else object) for name in STATE_FIELDS}
    stored = orjson.loads(state.get[0])
    return {"user_id": np.array(stored["user_ids"], dtype=object),
            "event_id": np.array(stored["event_ids"], dtype=object),
            "event_time_ms": np.array(stored["event_times"], dtype="int64"),
            "event_type": np.array(stored["event_types"], dtype=object)}


def _state_json(open_events: pd.DataFrame) -> str:
    # orjson: compact JSON like json.dumps(separators=(",", ":")) (UTF-8 rather than escapes), several times faster.
    return orjson.dumps({
        "user_ids": open_events["user_id"].tolist(), "event_ids": open_events["event_id"].tolist(),
        "event_times": open_events["event_time_ms"].astype("int64").tolist(),
        "event_types": open_events["event_type"].tolist(),
    }).decode()


def make_session_function(gap_ms: int):
    def sessions_for_bucket(key, frames: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
        stored = _state_arrays(state)
        if state.hasTimedOut:
            events = empty_state()
        else:
            chunks = list(frames)
            batch = chunks[0] if len(chunks) == 1 else pd.concat(chunks, ignore_index=True)
            from_state = batch["from_state"].to_numpy() == FROM_STATE
            if from_state.any():  # the restore's bootstrap batch: savepoint rows join the stored state
                restored = batch[from_state]
                stored = {name: np.concatenate([stored[name], restored[name].to_numpy().astype(stored[name].dtype)])
                          for name in STATE_FIELDS}
                events = batch[~from_state]
            else:
                events = batch
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
