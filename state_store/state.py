"""Reading live state through Spark's state data source, in the canonical form (pipelines.state_format)."""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines import state_format
from pipelines.checkpoint import CheckpointInfo, JobMetadata, inspect_checkpoint, read_job_metadata
from pipelines.config import SessionsConfig
from pipelines.errors import NoCommittedBatch
from pipelines.operator import JVM_STATE_LAYOUT
from pipelines.sessionize import open_sessions

_CANONICAL_DDL = ("user_id string, session_start timestamp, event_id string, event_time timestamp, "
                  "event_type string, event_count long, page_views long")


def _decode_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Stored bucket values -> canonical rows, in the executors (the driver never holds all state)."""
    for batch in batches:
        for value in batch.column(0).to_pylist():
            yield from state_format.to_canonical(state_format.decode(value)).to_batches()


def _register_coordinator(spark: SparkSession) -> None:
    # The RocksDB provider calls the driver's StateStoreCoordinator, which Spark registers only when
    # the streaming query manager is first used; a fresh process (sessionctl) must touch it first.
    spark.streams.active  # noqa: B018 -- the access itself registers the coordinator


def repartition_state(spark: SparkSession, checkpoint: Path, partitions: int) -> None:
    """Spark's offline repartition of a stopped query's state (RocksDB) to `partitions`."""
    _register_coordinator(spark)
    spark._streamingCheckpointManager.repartition(str(checkpoint), partitions)


def state_values(spark: SparkSession, checkpoint: Path, batch_id: int | None = None,
                 with_key: bool = False) -> DataFrame:
    """One row per state store key (hash bucket): its binary value `v` (and `bucket` if asked)."""
    _register_coordinator(spark)
    reader = spark.read.format("statestore")
    if batch_id is not None:
        reader = reader.option("batchId", batch_id)
    columns = [F.col(f"value.groupState.{state_format.STATE_COLUMN}").alias("v")]
    if with_key:
        columns.append(F.col("key.bucket").alias("bucket"))
    return reader.load(str(checkpoint)).select(*columns).where(F.col("v").isNotNull())


_DECODE_JVM_STATE = "sessions_jvm_state_rows"
_JVM_ROWS_DDL = ("array<struct<session_start_ms: bigint, event_id: string, event_time_ms: bigint, event_type: string, "
                 "event_count: bigint, page_views: bigint>>")


def _per_user(checkpoint: Path) -> bool:
    """Whether the checkpoint holds the JVM operator's per-user state (SESSIONS_OPERATOR=jvm), not buckets."""
    meta = read_job_metadata(checkpoint)
    return meta is not None and meta.state_layout == JVM_STATE_LAYOUT


def _user_values(spark: SparkSession, checkpoint: Path, batch_id: int | None = None) -> DataFrame:
    """The JVM operator's state: one row per user, `user_id` and `rows` (array of its open rows, decoded by the
    format's owner, jvm/src/sessions/StateCodec.java, through its SQL function)."""
    _register_coordinator(spark)
    spark.udf.registerJavaFunction(_DECODE_JVM_STATE, "sessions.DecodeState", _JVM_ROWS_DDL)
    reader = spark.read.format("statestore")
    if batch_id is not None:
        reader = reader.option("batchId", batch_id)
    return reader.load(str(checkpoint)).select(
        F.col("key.user_id").alias("user_id"),
        F.call_function(_DECODE_JVM_STATE, F.col("value.groupState.value")).alias("rows"),
        F.length("value.groupState.value").alias("bytes"))


def _user_rows(batch: pa.RecordBatch) -> pa.Table:
    """A batch of _user_values -> stored rows (state_format.ROW_FIELDS, times in ms), each user's together."""
    rows = batch.column(1)
    flat = pc.list_flatten(rows)
    users = pc.take(batch.column(0), pc.list_parent_indices(rows))
    return pa.table({"user_id": users, **{name: flat.field(name) for name in state_format.ROW_FIELDS[1:]}})


def read_state(spark: SparkSession, checkpoint: Path, batch_id: int | None = None) -> DataFrame:
    """The state's rows in canonical form: per open session at most one frozen prefix (event_id null) and
    its events above the watermark, each row with its session's start."""
    if _per_user(checkpoint):
        row = F.explode("rows").alias("r")
        return _user_values(spark, checkpoint, batch_id).select("user_id", row).select(
            "user_id", F.timestamp_millis("r.session_start_ms").alias("session_start"), "r.event_id",
            F.timestamp_millis("r.event_time_ms").alias("event_time"), "r.event_type", "r.event_count",
            "r.page_views")
    return state_values(spark, checkpoint, batch_id).mapInArrow(_decode_partition, _CANONICAL_DDL)


_SUMMARY_DDL = "keys long, users long, sessions long, events long, rows long, prefixes long, bytes long"


def _summarise_partition(gap_ms: int, per_user: bool = False
                         ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def summarise(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        totals = dict.fromkeys(_SUMMARY_DDL.replace(" long", "").split(", "), 0)
        for batch in batches:
            if per_user:  # the JVM operator's state: a key per user
                rows = _user_rows(batch)
                totals["bytes"] += int(pc.sum(batch.column(2)).as_py() or 0)
                totals["keys"] += batch.num_rows
                totals["users"] += batch.num_rows
                totals["rows"] += rows.num_rows
                totals["prefixes"] += rows["event_id"].null_count
                totals["events"] += int(pc.sum(rows["event_count"]).as_py() or 0)
                totals["sessions"] += len(open_sessions(rows, gap_ms))
                continue
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


def state_summary(spark: SparkSession, checkpoint: Path, gap_ms: int, batch_id: int | None = None) -> dict[str, int]:
    """What the state holds, in one pass over it: keys (hash buckets), open users, open sessions, open
    events (frozen ones counted), stored rows, frozen prefixes and the stored value bytes."""
    per_user = _per_user(checkpoint)
    values = _user_values(spark, checkpoint, batch_id) if per_user else state_values(spark, checkpoint, batch_id)
    parts = values.mapInArrow(_summarise_partition(gap_ms, per_user), _SUMMARY_DDL)
    total = parts.agg(*[F.coalesce(F.sum(c), F.lit(0)).alias(c) for c in parts.columns]).collect()[0]
    return {"state_keys": int(total["keys"]), "open_users": int(total["users"]),
            "open_sessions": int(total["sessions"]), "open_events": int(total["events"]),
            "state_rows": int(total["rows"]), "frozen_prefixes": int(total["prefixes"]),
            "state_value_bytes": int(total["bytes"])}


# ---- live lookups (Flink's queryable state, read from the committed state: the job may be running) ----------

_SESSION_DDL = ("user_id string, session_id string, session_start_ms long, last_event_ms long, "
                "last_event_type string, event_count long, page_views long, closes_at_ms long")


def _iso(ms: int | None) -> str | None:
    return None if ms is None else dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


def _session_json(row: dict[str, Any], watermark_ms: int | None) -> dict[str, Any]:
    return {"session_id": row["session_id"], "session_start": _iso(row["session_start_ms"]),
            "last_event": _iso(row["last_event_ms"]), "last_event_type": row["last_event_type"],
            "events": int(row["event_count"]), "page_views": int(row["page_views"]),
            "closes_at": _iso(row["closes_at_ms"]),
            "closes_in_watermark_ms": None if watermark_ms is None else int(row["closes_at_ms"]) - watermark_ms}


def _job(config: SessionsConfig) -> tuple[CheckpointInfo, JobMetadata, int | None]:
    info = inspect_checkpoint(config.checkpoint)
    meta = read_job_metadata(config.checkpoint)
    if info.last_committed_batch is None or meta is None:
        raise NoCommittedBatch(f"no state yet: no committed batch in {config.checkpoint}")
    watermark = info.next_watermark_ms if info.next_watermark_ms is not None else info.batch_watermark_ms
    return info, meta, watermark


def lookup_user(spark: SparkSession, config: SessionsConfig, user_id: str) -> dict[str, Any]:
    """One user's open session(s) at the last committed batch: only the user's bucket is read and decoded."""
    info, meta, watermark = _job(config)
    if _per_user(config.checkpoint):
        users = _user_values(spark, config.checkpoint, info.last_committed_batch)
        found = users.where(F.col("user_id") == user_id).toArrow()
        rows = _user_rows(found.combine_chunks().to_batches()[0]) if found.num_rows else state_format.empty_store()
    else:
        values = state_values(spark, config.checkpoint, info.last_committed_batch, with_key=True)
        bucket = F.pmod(F.xxhash64(F.lit(user_id)), F.lit(meta.buckets)).cast("int")  # = operator.bucket_column
        stored = values.where(F.col("bucket") == bucket).select("v").collect()
        rows = state_format.decode(stored[0]["v"]) if stored else state_format.empty_store()
    rows = rows.filter(pc.equal(rows["user_id"], user_id))
    sessions = open_sessions(rows, meta.gap_ms).to_dict("records")
    return {"user_id": user_id, "batch_id": info.last_committed_batch, "watermark": _iso(watermark),
            "open_sessions": [_session_json(s, watermark) for s in sessions]}


def top_sessions(spark: SparkSession, config: SessionsConfig, n: int) -> dict[str, Any]:
    """The n largest open sessions by events (a hot-key view), decoded in the executors."""
    info, meta, watermark = _job(config)
    gap_ms = meta.gap_ms

    per_user = _per_user(config.checkpoint)

    def sessions_of(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for rows in [_user_rows(batch)] if per_user else map(state_format.decode, batch.column(0).to_pylist()):
                found = open_sessions(rows, gap_ms)
                if len(found):
                    yield pa.RecordBatch.from_pandas(found, preserve_index=False)

    values = (_user_values(spark, config.checkpoint, info.last_committed_batch) if per_user
              else state_values(spark, config.checkpoint, info.last_committed_batch))
    top = values.mapInArrow(sessions_of, _SESSION_DDL).orderBy(F.desc("event_count"), "user_id").limit(n).collect()
    return {"batch_id": info.last_committed_batch, "watermark": _iso(watermark),
            "top": [{"user_id": r["user_id"], **_session_json(r.asDict(), watermark)} for r in top]}
