"""The canonical restore's state writer (jvm/operator/src/main/java/sessions/StateWriter.java): a restored
checkpoint's state written straight into its state store by the executors, one task per state partition, with no
batch loading it and no per-key operator call.

The checkpoint's batch 0 is run first by the stream itself with no state (its source's watermark marker only):
Spark writes the offset, commit and metadata logs and the operator's state schema as for any first batch. The writer
then replaces that batch's empty state (store version 1 of every partition) with what the operator leaves for a user
whose stored rows it walks with no event at watermark 0 (SessionsOperator.restored), keyed (xxhash64(user_id),
user_id) and placed by Spark's hash partitioning of those columns, in flatMapGroupsWithState's own state format. Any
partition count and either provider (RocksDB, HDFS-backed)."""
from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.core.rules import SessionRules
from pipelines.job.operators.jvm import _jvm, rules_json
from pipelines.job.operators.seam import register_coordinator
from pipelines.locations import CheckpointPath

__all__ = ["write_state"]


def _in_ms(canonical: DataFrame) -> DataFrame:
    """Canonical rows -> the writer's input: user_id and SessionsOperator.STATE_ROW's columns, times in ms."""
    attributes = ["attributes"] if "attributes" in canonical.columns else []
    return canonical.select("user_id", F.unix_millis("session_start").alias("session_start_ms"), "event_id",
                            F.unix_millis("event_time").alias("event_time_ms"), "event_type", "event_count",
                            "page_views", *attributes)


def write_state(rows: DataFrame, checkpoint: CheckpointPath, *, partitions: int, rules: SessionRules) -> tuple[int, int]:
    """Writes batch 0's state (store version 1 of operator 0, each of `partitions`) of `checkpoint` from canonical
    `rows` under `rules`, replacing what the batch left there. Returns the (keys, rows) written. The checkpoint's
    query must be stopped and this JVM's providers of it unloaded (pipelines.job.runtime.stop_state_stores)."""
    register_coordinator(rows.sparkSession)  # the RocksDB provider reports to it
    writer = _jvm(rows.sparkSession).sessions.StateWriter  # type: ignore[attr-defined]
    keys, written = writer.write(_in_ms(rows)._jdf, str(checkpoint), partitions, rules_json(rules))
    return int(keys), int(written)
