"""The stateful operator: Spark's applyInPandasWithState around the pure core.

State is keyed by a hash bucket of user_id (SESSIONS_STATE_BUCKETS), so one Python call advances the
sessions of many users with vectorised numpy instead of one call per user. A bucket's value is its users'
rows in pipelines.state_format (compressed Arrow IPC in a binary column, frozen prefixes for what the
watermark has passed); each call walks only the users with events in the batch or due, and carries every
other row over untouched. applyInPandasWithState runs on both the RocksDB and HDFS-backed providers.

Only what sessionization needs crosses the shuffle and the JVM/Python boundary: rejected lines never
reach the watermark node or the shuffle (the sink reads them from raw_events), and a late event travels
as (ingest_seq, line_key) -- unique per landed line -- from which the sink fetches the rest from raw_events.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from pipelines import state_format
from pipelines.config import REPO_ROOT
from pipelines.errors import ConfigError
from pipelines.sessionize import advance, no_events, rows_table

OUTPUT_COLUMNS = [
    ("kind", "string"), ("session_id", "string"), ("user_id", "string"),
    ("session_start_ms", "long"), ("session_end_ms", "long"), ("event_count", "long"),
    ("page_views", "long"), ("end_reason", "string"),
    ("event_id", "string"), ("event_time_ms", "long"), ("event_type", "string"),
    ("ingest_seq", "long"), ("line_key", "long"),
]
OUTPUT_SCHEMA = ", ".join(f"{name} {kind}" for name, kind in OUTPUT_COLUMNS)
_INT_COLUMNS = {name for name, kind in OUTPUT_COLUMNS if kind == "long"}
FROM_STATE = 1  # `from_state` column: a savepoint row being restored, not an event
# PySpark's own serializer concatenates our frames with all-null columns; pandas 2.x warns about a
# future change on every task. The output schema is fixed, so the warning is noise in worker logs.
warnings.filterwarnings("ignore", category=FutureWarning, module="pyspark.sql.pandas.serializers")


def bucket_column(buckets: int) -> Column:
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


def _restored_rows(restored: pd.DataFrame) -> pa.Table:
    """Savepoint rows of the restore's bootstrap batch -> stored rows (due now: they are walked at once)."""
    rows = {name: restored[name].to_numpy() for name in state_format.ROW_FIELDS}
    return rows_table({**rows, "due_ms": np.full(len(restored), np.iinfo(np.int64).min)})


def make_session_function(gap_ms: int) -> Callable[..., Iterator[pd.DataFrame]]:
    def sessions_for_bucket(key: tuple[Any, ...], frames: Iterator[pd.DataFrame],
                            state: GroupState) -> Iterator[pd.DataFrame]:
        store = state_format.BucketStore.load(state.get[0] if state.exists else None)
        watermark = state.getCurrentWatermarkMs()
        if state.hasTimedOut:
            events = no_events()
        else:
            chunks = list(frames)
            events = chunks[0] if len(chunks) == 1 else pd.concat(chunks, ignore_index=True)
            from_state = events["from_state"].to_numpy() == FROM_STATE
            if from_state.any():  # the restore's bootstrap batch: savepoint rows join the stored state
                store.hot = pa.concat_tables([store.hot, _restored_rows(events[from_state])])
                events = events[~from_state]
        # Touch only what must be touched: users with events in this batch or due (a session to close,
        # events to freeze); every other user's rows stay where they are (see state_format.BucketStore).
        walk = store.take(pd.unique(events["user_id"].to_numpy()), watermark)
        step = advance(walk, events, watermark, gap_ms)
        value = store.save(rows_table(step.open_rows))
        if value is None:
            if state.exists:
                state.remove()
        else:
            state.update((value,))
            due = store.next_due()
            if due is not None:  # a stored bucket always has a due row; the guard is for the type
                state.setTimeoutTimestamp(due - 1)  # Spark fires when timeout < watermark
        if len(step.closed):
            yield _output(step.closed, "session")
        if len(step.late):
            yield _output(step.late, "late")

    return sessions_for_bucket


JVM_STATE_LAYOUT = "open_sessions_by_user/jvm-v1"  # per-user keys, not buckets; values carry their own version
# byte (StateCodec.java: v2 written, v1 read), so a checkpoint holding both needs no new layout id
JVM_JAR = REPO_ROOT / "build" / "jvm" / "sessions-operator.jar"  # built by `make setup` (the Makefile's jvm target)


def state_layout(operator: str) -> str:
    """The state layout a checkpoint made by `operator` holds (JobMetadata.state_layout)."""
    return JVM_STATE_LAYOUT if operator == "jvm" else state_format.SCHEMA_ID


def sessionize(events: DataFrame, gap_ms: int, lateness_ms: int, buckets: int, layout: str = state_format.SCHEMA_ID
               ) -> DataFrame:
    """Source rows -> rows of kind `session` (closed sessions) and `late` (events below the watermark), by the
    operator that owns `layout`: the Python one (buckets of users) or the JVM one (per user; the default)."""
    # Valid events, a restore's state rows and its watermark marker: the source never hands over a rejected line
    # (pipelines.source), so a quarantined far-future event cannot move the watermark.
    with_watermark = events.withWatermark("event_time", f"{lateness_ms} milliseconds")
    # The marker must reach EventTimeWatermark (it carries the savepoint's watermark when no open row does) and
    # stop there. This filter names event_time so that it stays above the watermark node, not pushed below it.
    with_watermark = with_watermark.where((F.col("origin") != "marker") | F.col("event_time").isNull())
    jvm_operator = layout == JVM_STATE_LAYOUT
    keyed = with_watermark.select(
        # The Python operator groups by bucket; the JVM one by (xxhash64(user_id), user_id) and reads its columns by
        # name, so it is not given a column it would only carry through the shuffle (8 bytes and a hash per event).
        *([] if jvm_operator else [bucket_column(buckets).alias("bucket")]),
        "user_id", "event_id",
        F.unix_millis("event_time").alias("event_time_ms"),
        # The operator needs a column marked with the watermark (else no event-time timers and no
        # GroupState watermark), but with an event-time timeout Spark also drops input rows at or below
        # the *previous* batch's watermark before Python sees them -- those late events would vanish
        # instead of reaching quarantine. A null timestamp carrying the mark gives the one without the other.
        F.lit(None).cast("timestamp").alias("event_time", metadata={"spark.watermarkDelayMs": lateness_ms}),
        "event_type", "ingest_seq", "line_key",
        # state rows of a restore (null for events): see pipelines.state_format
        F.unix_millis("session_start").alias("session_start_ms"), "event_count", "page_views",
        F.when(F.col("origin") == "state", F.lit(FROM_STATE)).otherwise(F.lit(0)).alias("from_state"),
    )
    if jvm_operator:
        if not JVM_JAR.exists():
            raise ConfigError(f"the JVM operator (SESSIONS_OPERATOR=jvm) needs {JVM_JAR}: run `make setup` to build it")
        jvm = keyed.sparkSession._jvm
        assert jvm is not None  # a classic (py4j) session
        return DataFrame(jvm.sessions.SessionsOperator.sessionize(keyed._jdf, gap_ms), keyed.sparkSession)
    return keyed.groupBy("bucket").applyInPandasWithState(
        make_session_function(gap_ms), OUTPUT_SCHEMA, state_format.SPARK_STATE_SCHEMA, "append", GroupStateTimeout.EventTimeTimeout,
    )
