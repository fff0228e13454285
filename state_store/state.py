"""Reading live state through Spark's state data source, in the canonical per-event form."""
from __future__ import annotations

from pathlib import Path


def read_state(spark, checkpoint: Path, batch_id: int | None = None):
    """Open events of all open sessions: user_id, event_id, event_time, event_type (one row each)."""
    from pyspark.sql import functions as F

    # The RocksDB provider calls the driver's StateStoreCoordinator, which Spark registers only when
    # the streaming query manager is first used; a fresh process (sessionctl) must touch it first.
    spark.streams.active
    reader = spark.read.format("statestore")
    if batch_id is not None:
        reader = reader.option("batchId", batch_id)
    from pipelines.operator import STATE_JSON_SCHEMA

    raw = reader.load(str(checkpoint))
    state = raw.select(F.from_json("value.groupState.open_events", STATE_JSON_SCHEMA).alias("s")) \
        .where(F.col("s").isNotNull())
    zipped = state.select(F.explode(F.arrays_zip("s.user_ids", "s.event_ids", "s.event_times", "s.event_types")).alias("e"))
    return zipped.select(
        F.col("e.user_ids").alias("user_id"),
        F.col("e.event_ids").alias("event_id"),
        F.timestamp_millis(F.col("e.event_times")).alias("event_time"),
        F.col("e.event_types").alias("event_type"),
    )


def state_summary(spark, checkpoint: Path, batch_id: int | None = None) -> dict:
    from pyspark.sql import functions as F

    rows = read_state(spark, checkpoint, batch_id)
    agg = rows.agg(F.countDistinct("user_id").alias("users"), F.count("*").alias("events")).collect()[0]
    buckets = spark.read.format("statestore").load(str(checkpoint)) if batch_id is None else \
        spark.read.format("statestore").option("batchId", batch_id).load(str(checkpoint))
    return {"state_keys": int(agg["users"]), "open_events": int(agg["events"]), "state_buckets": buckets.count()}
