"""The canonical restore's state writer (jvm/operator/src/main/java/sessions/StateWriter.java): a restored
checkpoint's state written straight into its state store by the executors, one task per state partition, with no
batch loading it as an initial state and no per-key operator call.

The checkpoint's batch 0 is run first by the stream itself with no state (its source's watermark marker only):
Spark writes the offset, commit and metadata logs and the operator's state schema as for any first batch. The writer
then replaces that batch's empty state (store version 1 of every partition) with what the operator would have left
after loading the rows as its initial state: each user's rows walked once at watermark 0 (SessionsOperator.restored),
keyed (xxhash64(user_id), user_id) and placed by Spark's hash partitioning of those columns, in
flatMapGroupsWithState's own state format. Any partition count and either provider (RocksDB, HDFS-backed)."""
from __future__ import annotations

from pyspark.sql import DataFrame

from pipelines.core.rules import SessionRules
from pipelines.job.operators.jvm import _in_ms, _jvm, rules_json
from pipelines.job.operators.seam import register_coordinator
from pipelines.locations import CheckpointPath

__all__ = ["write_state"]


def write_state(rows: DataFrame, checkpoint: CheckpointPath, *, partitions: int, rules: SessionRules) -> tuple[int, int]:
    """Writes batch 0's state (store version 1 of operator 0, each of `partitions`) of `checkpoint` from canonical
    `rows` under `rules`, replacing what the batch left there. Returns the (keys, rows) written. The checkpoint's
    query must be stopped and this JVM's providers of it unloaded (pipelines.job.runtime.stop_state_stores)."""
    register_coordinator(rows.sparkSession)  # the RocksDB provider reports to it
    writer = _jvm(rows.sparkSession).sessions.StateWriter  # type: ignore[attr-defined]
    keys, written = writer.write(_in_ms(rows)._jdf, str(checkpoint), partitions, rules_json(rules))
    return int(keys), int(written)
