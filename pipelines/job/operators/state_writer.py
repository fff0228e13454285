"""The canonical restore's state writer (jvm/operator/src/main/java/sessions/StateWriter.java): a restored
checkpoint's state written straight into its state store by the executors, one task per state partition, with no
batch loading it and no per-key operator call.

The checkpoint's batch 0 -- the query id, its offset and commit log entries, the operator's metadata and state
schema -- is written with Spark's own log classes as the stream's query would leave it (write_restored_batch,
RestoredBatch.java), with no query run. Its state (store version 1 of every partition) is what the operator leaves
for a user whose stored rows it walks with no event at watermark 0 (SessionsOperator.restored), keyed
(xxhash64(user_id), user_id) and placed by Spark's hash partitioning of those columns, in flatMapGroupsWithState's
own state format. Any partition count and either provider (RocksDB, HDFS-backed)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.config import SessionsConfig
from pipelines.core.rules import SessionRules
from pipelines.job.operators.jvm import _jvm, rules_json
from pipelines.job.operators.seam import register_coordinator
from pipelines.job.runtime import prepare_session
from pipelines.locations import CheckpointPath

__all__ = ["STAGED_STATE", "PartitionErased", "StateWritten", "erase_state", "install_state", "purge_erased",
           "write_placed_state", "write_restored_batch", "write_state"]


def _in_ms(canonical: DataFrame) -> DataFrame:
    """Canonical rows -> the writer's input: user_id and SessionsOperator.STATE_ROW's columns, times in ms."""
    attributes = ["attributes"] if "attributes" in canonical.columns else []
    return canonical.select("user_id", F.unix_millis("session_start").alias("session_start_ms"), "event_id",
                            F.unix_millis("event_time").alias("event_time_ms"), "event_type", "event_count",
                            "page_views", *attributes)


@dataclass(frozen=True)
class StateWritten:
    """What write_state wrote: keys (users) and rows, the keys whose event-time timer fires in the first batch at the
    watermark it was given (the sessions that batch closes), and the state read back from the committed stores by
    fresh providers in the same tasks: its canonical rows' count and the savepoint checksum's wrapping sum of them
    (a signed long)."""
    keys: int
    rows: int
    due: int
    read_rows: int
    read_sum: int


STAGED_STATE = "state-restored"  # beside the checkpoint's `state`: where a staged write puts its stores


def write_state(rows: DataFrame, checkpoint: CheckpointPath, *, partitions: int, rules: SessionRules,
                watermark_ms: int, staged: bool = False) -> StateWritten:
    """Writes batch 0's state (store version 1 of operator 0, each of `partitions`) of `checkpoint` from canonical
    `rows` under `rules`, replacing what the batch left there; counts the keys due at `watermark_ms`. The checkpoint's
    query must be stopped and this JVM's providers of it unloaded (pipelines.job.runtime.stop_state_stores). With
    `staged`, the stores go to the checkpoint's staging directory instead, while batch 0 may still run; install_state
    then puts them in place."""
    register_coordinator(rows.sparkSession)  # the RocksDB provider reports to it
    writer = _jvm(rows.sparkSession).sessions.StateWriter  # type: ignore[attr-defined]
    done = writer.write(_in_ms(rows)._jdf, str(checkpoint), STAGED_STATE if staged else "state", partitions,
                        rules_json(rules), watermark_ms)
    return StateWritten(*(int(value) for value in done))


def write_placed_state(parts: Sequence[DataFrame], checkpoint: CheckpointPath, *, rules: SessionRules,
                       watermark_ms: int) -> StateWritten | None:
    """write_state (staged) from canonical rows already in the state's placement -- `parts[i]` holds the users of
    state partition i, each user's rows together -- with no shuffle and no sort (StateWriter.writePlaced). None when
    the rows were not so placed (each task checks every row; nothing of such an attempt stays staged once write_state
    runs): the caller then writes with write_state."""
    spark = parts[0].sparkSession
    register_coordinator(spark)
    done = _jvm(spark).sessions.StateWriter.writePlaced(  # type: ignore[attr-defined]
        [_in_ms(part)._jdf for part in parts], str(checkpoint), STAGED_STATE, rules_json(rules), watermark_ms)
    return None if done is None else StateWritten(*(int(value) for value in done))


def write_restored_batch(spark: SparkSession, config: SessionsConfig, *, source_seq: int, watermark_ms: int) -> None:
    """Batch 0 of `config`'s new checkpoint as the stream's query would leave it after a restore's marker batch (the
    source at `source_seq`, `watermark_ms` the next batch's watermark), its settings the session's as a query of
    `config` records them (RestoredBatch.write): the stream that resumes from it runs batch 1 at that watermark."""
    prepare_session(spark, config)  # what the query would set before recording the session's settings
    _jvm(spark).sessions.RestoredBatch.write(  # type: ignore[attr-defined]
        spark._jsparkSession, str(config.checkpoint), source_seq, watermark_ms, config.state_partitions)


def install_state(spark: SparkSession, checkpoint: CheckpointPath, *, partitions: int) -> int:
    """The stores a staged write_state wrote, moved into `checkpoint`'s state (StateWriter.install); this JVM's
    providers of the checkpoint unloaded. Returns the files moved."""
    return int(_jvm(spark).sessions.StateWriter.install(  # type: ignore[attr-defined]
        spark._jsparkSession, str(checkpoint), STAGED_STATE, partitions))


@dataclass(frozen=True)
class PartitionErased:
    """One state partition the erasure rewrote: keys kept and removed, the files its version is now made of."""
    partition: int
    kept: int
    removed: int
    files: tuple[str, ...]


def erase_state(spark: SparkSession, checkpoint: CheckpointPath, user_ids: Sequence[str], *, partitions: int,
                version: int, provider_class: str) -> list[PartitionErased]:
    """Rewrites store `version` of each state partition of `checkpoint` that holds one of `user_ids`, without them
    (StateEraser.rewrite: the partition read at that version, its other keys put into a fresh store, installed as
    that version). The partitions no user is placed in are not read. The checkpoint's query must be stopped and this
    JVM's providers of it unloaded (pipelines.job.runtime.stop_state_stores); purge_erased removes what the
    partitions held before."""
    register_coordinator(spark)  # the RocksDB provider reports to it
    users = spark.createDataFrame([(user_id,) for user_id in user_ids], "user_id string")
    rows = _jvm(spark).sessions.StateEraser.rewrite(  # type: ignore[attr-defined]
        users._jdf, str(checkpoint), partitions, version, provider_class)
    done = [PartitionErased(int(r.getInt(0)), int(r.getLong(1)), int(r.getLong(2)),
                            tuple(str(r.getString(3)).split("\n"))) for r in rows]
    return sorted(done, key=lambda p: p.partition)


def purge_erased(spark: SparkSession, checkpoint: CheckpointPath, rewritten: Sequence[PartitionErased]) -> int:
    """Every file of each rewritten partition but its new version's (and the partition's `_metadata`), removed: the
    older versions, changelogs and SSTs that held the users. Returns the files removed."""
    jvm = _jvm(spark)
    removed = 0
    for part in rewritten:
        keep = jvm.java.util.ArrayList()  # type: ignore[attr-defined]
        for name in part.files:
            keep.add(name)
        removed += int(jvm.sessions.StateEraser.purge(  # type: ignore[attr-defined]
            spark._jsparkSession, str(checkpoint), part.partition, keep))
    return removed
