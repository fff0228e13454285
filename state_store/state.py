"""Reading live state through Spark's state data source, in the canonical form (pipelines.state_format)."""
from __future__ import annotations

from pathlib import Path

from pyspark.sql import functions as F

from pipelines import state_format

_CANONICAL_DDL = ("user_id string, session_start timestamp, event_id string, event_time timestamp, "
                  "event_type string, event_count long, page_views long")


def _decode_partition(batches):
    """Stored bucket values -> canonical rows, in the executors (the driver never holds all state)."""
    for batch in batches:
        for value in batch.column(0).to_pylist():
            yield from state_format.to_canonical(state_format.decode(value)).to_batches()


def state_values(spark, checkpoint: Path, batch_id: int | None = None):
    """One row per state store key (hash bucket): its binary value."""
    # The RocksDB provider calls the driver's StateStoreCoordinator, which Spark registers only when
    # the streaming query manager is first used; a fresh process (sessionctl) must touch it first.
    spark.streams.active
    reader = spark.read.format("statestore")
    if batch_id is not None:
        reader = reader.option("batchId", batch_id)
    return reader.load(str(checkpoint)).select(F.col(f"value.groupState.{state_format.STATE_COLUMN}").alias("v")) \
        .where(F.col("v").isNotNull())


def read_state(spark, checkpoint: Path, batch_id: int | None = None):
    """The state's rows in canonical form: per open session at most one frozen prefix (event_id null) and
    its events above the watermark, each row with its session's start."""
    return state_values(spark, checkpoint, batch_id).mapInArrow(_decode_partition, _CANONICAL_DDL)


_SUMMARY_DDL = "keys long, users long, sessions long, events long, rows long, prefixes long, bytes long"


def _summarise_partition(gap_ms: int):
    def summarise(batches):
        import pyarrow as pa
        import pyarrow.compute as pc

        from pipelines.sessionize import open_sessions

        totals = dict.fromkeys(_SUMMARY_DDL.replace(" long", "").split(", "), 0)
        for batch in batches:
            for value in batch.column(0).to_pylist():
                rows = state_format.decode(value)
                totals["keys"] += 1
                totals["bytes"] += len(value)
                totals["rows"] += rows.num_rows
                totals["prefixes"] += rows["event_id"].null_count
                totals["events"] += int(pc.sum(rows["event_count"]).as_py() or 0)
                totals["users"] += len(pc.unique(rows["user_id"]))  # a user lives in one bucket only
                totals["sessions"] += len(open_sessions(rows, gap_ms))
        yield pa.RecordBatch.from_pylist([totals])
    return summarise


def state_summary(spark, checkpoint: Path, gap_ms: int, batch_id: int | None = None) -> dict:
    """What the state holds, in one pass over it: keys (hash buckets), open users, open sessions, open
    events (frozen ones counted), stored rows, frozen prefixes and the stored value bytes."""
    parts = state_values(spark, checkpoint, batch_id).mapInArrow(_summarise_partition(gap_ms), _SUMMARY_DDL)
    total = parts.agg(*[F.coalesce(F.sum(c), F.lit(0)).alias(c) for c in parts.columns]).collect()[0]
    return {"state_keys": int(total["keys"]), "open_users": int(total["users"]),
            "open_sessions": int(total["sessions"]), "open_events": int(total["events"]),
            "state_rows": int(total["rows"]), "frozen_prefixes": int(total["prefixes"]),
            "state_value_bytes": int(total["bytes"])}
