"""Reading live state through Spark's state data source, in the canonical form (pipelines.core.state_format). Each
reader takes the checkpoint's operator (pipelines.job.operators.seam), which owns how its stored values decode."""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.config import SessionsConfig
from pipelines.core import state_format
from pipelines.core.attributes import partials_from_json
from pipelines.core.rules import SessionRules
from pipelines.core.sessionize import open_sessions
from pipelines.errors import NoCommittedBatch
from pipelines.job.checkpoint import CheckpointInfo, JobMetadata, inspect_checkpoint, read_job_metadata
from pipelines.job.operators import for_layout, of_checkpoint
from pipelines.job.operators.seam import StateOperator, StoredChunk, register_coordinator
from pipelines.locations import CheckpointPath

__all__ = ["READ_ATTEMPTS", "at_newest_batch", "lookup_user", "open_events_of", "read_state", "repartition_state", "session_json", "state_summary", "top_sessions"]


def repartition_state(spark: SparkSession, checkpoint: CheckpointPath, partitions: int) -> None:
    """Spark's offline repartition of a stopped query's state (RocksDB) to `partitions`."""
    register_coordinator(spark)
    spark._streamingCheckpointManager.repartition(str(checkpoint), partitions)


def read_state(spark: SparkSession, checkpoint: CheckpointPath, *, batch_id: int | None = None,
               op: StateOperator | None = None) -> DataFrame:
    """The state's rows in canonical form: per open session at most one frozen prefix (event_id null) and
    its events above the watermark, each row with its session's start."""
    return (op or of_checkpoint(checkpoint)).canonical_rows(spark, checkpoint, batch_id)


_SUMMARY_DDL = "keys long, users long, sessions long, events long, rows long, prefixes long, bytes long"


def _summarise_partition(gap_ms: int, decode: Callable[[pa.RecordBatch], Iterator[StoredChunk]]
                         ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def summarise(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        totals = dict.fromkeys(_SUMMARY_DDL.replace(" long", "").split(", "), 0)
        for batch in batches:
            for chunk in decode(batch):
                rows = chunk.rows
                totals["keys"] += chunk.keys
                totals["bytes"] += chunk.value_bytes
                totals["rows"] += rows.num_rows
                totals["prefixes"] += rows["event_id"].null_count
                totals["events"] += int(pc.sum(rows["event_count"]).as_py() or 0)
                totals["users"] += len(pc.unique(rows["user_id"]))  # a user lives under one key only
                totals["sessions"] += len(open_sessions(rows, gap_ms))
        yield pa.RecordBatch.from_pylist([totals])
    return summarise


def state_summary(spark: SparkSession, checkpoint: CheckpointPath, rules: SessionRules, *, batch_id: int | None = None,
                  op: StateOperator | None = None) -> dict[str, int]:
    """What the state holds, in one pass over it: keys (hash buckets), open users, open sessions, open
    events (frozen ones counted), stored rows, frozen prefixes and the stored value bytes."""
    op = op or of_checkpoint(checkpoint)
    parts = op.stored_values(spark, checkpoint, batch_id).mapInArrow(_summarise_partition(rules.gap_ms, op.decode),
                                                                       _SUMMARY_DDL)
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


def session_json(row: dict[str, Any], watermark_ms: int | None) -> dict[str, Any]:
    return {"session_id": row["session_id"], "session_start": _iso(row["session_start_ms"]),
            "last_event": _iso(row["last_event_ms"]), "last_event_type": row["last_event_type"],
            "events": int(row["event_count"]), "page_views": int(row["page_views"]),
            "closes_at": _iso(row["closes_at_ms"]),
            "closes_in_watermark_ms": None if watermark_ms is None else int(row["closes_at_ms"]) - watermark_ms}


def _plain(value: Any) -> Any:
    """A value out of pandas as JSON takes it (numpy scalars as Python's)."""
    return value.item() if hasattr(value, "item") else value


def _job(config: SessionsConfig) -> tuple[CheckpointInfo, JobMetadata, int | None]:
    info = inspect_checkpoint(config.checkpoint)
    meta = read_job_metadata(config.checkpoint)
    if info.last_committed_batch is None or meta is None:
        raise NoCommittedBatch(f"no state yet: no committed batch in {config.checkpoint}")
    watermark = info.next_watermark_ms if info.next_watermark_ms is not None else info.batch_watermark_ms
    return info, meta, watermark


READ_ATTEMPTS = 3  # a live read whose batch a running stream's retention removed: the newest batch, this many times
T = TypeVar("T")


def at_newest_batch(config: SessionsConfig, read: Callable[[CheckpointInfo, JobMetadata, int | None], T]) -> T:
    """`read` of the last committed batch (its info, the job's metadata, the watermark). These reads are short and
    hold no lease, so they pin nothing (state_store.savepoint.pin is for the long reads of a savepoint): when one
    fails after a running stream committed past its batch -- whose retention may have removed the batch's files
    during the read --, the newest committed batch is read instead, READ_ATTEMPTS times in all. A failure with no
    newer batch is raised at once."""
    for attempt in range(1, READ_ATTEMPTS + 1):
        info, meta, watermark = _job(config)
        try:
            return read(info, meta, watermark)
        except (PySparkException, Py4JError):
            newest = inspect_checkpoint(config.checkpoint).last_committed_batch
            if attempt == READ_ATTEMPTS or newest is None or newest <= (info.last_committed_batch or 0):
                raise
    raise AssertionError("unreachable")  # the loop returns or raises


def lookup_user(spark: SparkSession, config: SessionsConfig, user_id: str) -> dict[str, Any]:
    """One user's open session(s) at the last committed batch: only the key(s) that can hold the user are decoded."""
    def read(info: CheckpointInfo, meta: JobMetadata, watermark: int | None) -> dict[str, Any]:
        op = for_layout(meta.state_layout)
        assert info.last_committed_batch is not None  # at_newest_batch reads committed batches only
        rows = op.users_rows(spark, config.checkpoint, info.last_committed_batch, [user_id], meta.buckets)
        return {"user_id": user_id, "batch_id": info.last_committed_batch, "watermark": _iso(watermark),
                "open_sessions": open_sessions_json({name: rows[name] for name in rows.column_names}, meta.rules,
                                                    watermark)}
    return at_newest_batch(config, read)


def open_events_of(spark: SparkSession, config: SessionsConfig, user_ids: Sequence[str]) -> dict[str, int]:
    """Open events (frozen ones counted) of each of `user_ids` at the last committed batch (lookup_user's session
    events, summed), read by point lookups: the state partitions that hold them; 0 for a user with none."""
    found = dict.fromkeys(user_ids, 0)
    if not found:
        return found
    info, meta, _ = _job(config)
    assert info.last_committed_batch is not None  # _job refuses a checkpoint without one
    rows = for_layout(meta.state_layout).users_rows(spark, config.checkpoint, info.last_committed_batch, list(found),
                                                    meta.buckets)
    for user_id, events in zip(rows["user_id"].to_pylist(), rows["event_count"].to_pylist()):
        found[user_id] += int(events or 0)
    return found


def open_sessions_json(rows: Mapping[str, Any], rules: SessionRules, watermark_ms: int | None
                       ) -> list[dict[str, Any]]:
    """State rows (the core's columns, times in ms; with `attributes` text when the rows carry it) -> their open
    sessions as `state --user` prints them; with the spec's `attributes`, each session's values as they stand now
    (its rows' partials merged in walk order; null where part of the session predates the attribute)."""
    columns = {name: rows[name] for name in state_format.ROW_FIELDS}
    gap_ms, attributes = rules.gap_ms, rules.attributes
    if not attributes:
        return [session_json(s, watermark_ms) for s in open_sessions(columns, gap_ms).to_dict("records")]
    texts = rows["attributes"] if "attributes" in rows else [None] * len(rows["user_id"])
    texts = texts.to_pylist() if hasattr(texts, "to_pylist") else list(texts)
    found = open_sessions({**columns, "partials": [partials_from_json(attributes, t) for t in texts]}, gap_ms,
                          attributes=attributes).to_dict("records")
    return [{**session_json(s, watermark_ms), "attributes": {a.name: _plain(s[a.name]) for a in attributes}}
            for s in found]


def top_sessions(spark: SparkSession, config: SessionsConfig, n: int) -> dict[str, Any]:
    """The n largest open sessions by events (a hot-key view), decoded in the executors."""
    def read(info: CheckpointInfo, meta: JobMetadata, watermark: int | None) -> dict[str, Any]:
        gap_ms = meta.rules.gap_ms
        op = for_layout(meta.state_layout)
        decode = op.decode

        def sessions_of(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                for chunk in decode(batch):
                    found = open_sessions(chunk.rows, gap_ms)
                    if len(found):
                        yield pa.RecordBatch.from_pandas(found, preserve_index=False)

        values = op.stored_values(spark, config.checkpoint, info.last_committed_batch)
        top = (values.mapInArrow(sessions_of, _SESSION_DDL).orderBy(F.desc("event_count"), "user_id").limit(n)
               .collect())
        return {"batch_id": info.last_committed_batch, "watermark": _iso(watermark),
                "top": [{"user_id": r["user_id"], **session_json(r.asDict(), watermark)} for r in top]}
    return at_newest_batch(config, read)
