"""The stateful operator: Spark's applyInPandasWithState around the pure core.

State is keyed by a hash bucket of user_id (SESSIONS_STATE_BUCKETS), so one Python call advances the
sessions of many users with vectorised pandas instead of one call per user. applyInPandasWithState
runs on both the RocksDB and the HDFS-backed state store providers. Bucket -1 carries rows that need
no state: rejected input lines (to quarantine) and the restore's watermark marker.
"""
from __future__ import annotations

import json
import warnings
from typing import Iterator

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
    ("page_views", "long"), ("end_reason", "string"), ("reason", "string"),
    ("event_id", "string"), ("event_time_ms", "long"), ("event_type", "string"), ("page", "string"),
    ("source_file", "string"), ("line_no", "long"), ("ingest_seq", "long"), ("raw", "string"),
]
OUTPUT_SCHEMA = ", ".join(f"{name} {kind}" for name, kind in OUTPUT_COLUMNS)
_INT_COLUMNS = {name for name, kind in OUTPUT_COLUMNS if kind == "long"}
NO_STATE_BUCKET = -1
# PySpark's own serializer concatenates our frames with all-null columns; pandas 2.x warns about a
# future change on every task. The output schema is fixed, so the warning is noise in worker logs.
warnings.filterwarnings("ignore", category=FutureWarning, module="pyspark.sql.pandas.serializers")


def bucket_column(buckets: int):
    return F.pmod(F.xxhash64("user_id"), F.lit(buckets)).cast("int")


def _output(frame: pd.DataFrame, kind: str) -> pd.DataFrame:
    out = pd.DataFrame(index=range(len(frame)))
    for name, _ in OUTPUT_COLUMNS:
        if name == "kind":
            out[name] = kind
        elif name in frame.columns:
            values = frame[name].to_numpy()
            out[name] = pd.array(values, dtype="Int64") if name in _INT_COLUMNS else values
        else:
            out[name] = pd.array([None] * len(frame), dtype="Int64" if name in _INT_COLUMNS else object)
    return out


def _state_frame(state: GroupState) -> pd.DataFrame:
    if not state.exists:
        return empty_state()
    stored = json.loads(state.get[0])
    return pd.DataFrame({"user_id": stored["user_ids"], "event_id": stored["event_ids"],
                         "event_time_ms": pd.array(stored["event_times"], dtype="int64"),
                         "event_type": stored["event_types"]})


def make_session_function(gap_ms: int):
    def sessions_for_bucket(key, frames: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
        batch = pd.concat(list(frames), ignore_index=True) if not state.hasTimedOut else None
        if key[0] == NO_STATE_BUCKET:
            rejected = batch[batch["origin"] == "event"].rename(columns={"reject_reason": "reason"})
            if len(rejected):
                yield _output(rejected, "quarantine")
            return
        stored = _state_frame(state)
        if batch is not None and len(batch):
            restored = batch.loc[batch["origin"] == "state", STATE_FIELDS]
            if len(restored):
                stored = pd.concat([stored, restored], ignore_index=True) if len(stored) else restored
            events = batch[batch["origin"] == "event"]
        else:
            events = batch.iloc[:0] if batch is not None else pd.DataFrame(columns=STATE_FIELDS)
        step = advance(stored, events, state.getCurrentWatermarkMs(), gap_ms)
        if len(step.open_events):
            open_events = step.open_events
            state.update((json.dumps({
                "user_ids": open_events["user_id"].tolist(), "event_ids": open_events["event_id"].tolist(),
                "event_times": open_events["event_time_ms"].astype("int64").tolist(),
                "event_types": open_events["event_type"].tolist(),
            }, separators=(",", ":")),))
            state.setTimeoutTimestamp(step.next_close_ms - 1)  # Spark fires when timeout < watermark
        elif state.exists:
            state.remove()
        if len(step.closed):
            yield _output(step.closed, "session")
        if len(step.late):
            late = step.late
            raw = [json.dumps({"event_id": e, "user_id": u, "event_time": t.isoformat(), "event_type": k, "page": p})
                   for e, u, t, k, p in zip(late["event_id"], late["user_id"], late["event_time"],
                                            late["event_type"], late["page"])]
            yield _output(late.assign(reason="late", raw=raw), "quarantine")

    return sessions_for_bucket


def sessionize(events: DataFrame, gap_ms: int, lateness_ms: int, buckets: int) -> DataFrame:
    """Raw source rows -> session rows and quarantine rows (column `kind`)."""
    with_watermark = events.withWatermark("event_time", f"{lateness_ms} milliseconds")
    stateful = (F.col("origin") == "state") | ((F.col("origin") == "event") & F.col("reject_reason").isNull())
    keyed = with_watermark.select(
        "*",  # keeps event_time, and with it the watermark the state functions read
        F.unix_millis("event_time").alias("event_time_ms"),
        F.when(stateful, bucket_column(buckets)).otherwise(F.lit(NO_STATE_BUCKET)).alias("bucket"),
    )
    return keyed.groupBy("bucket").applyInPandasWithState(
        make_session_function(gap_ms), OUTPUT_SCHEMA, STATE_SCHEMA, "append", GroupStateTimeout.EventTimeTimeout,
    )
