"""How state changed: what differs between two savepoints (`sessionctl savepoints diff A B`), and one user's open
sessions at each retained savepoint (`sessionctl state --user U --history`). Both read savepoint files in the
executors (state_store.savepoint.chain.savepoint_rows); the driver gets per-user summaries' counts and a sample."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipelines.config import SessionsConfig
from pipelines.core import state_format
from pipelines.core.sessionize import open_sessions
from pipelines.errors import Result
from state_store.results import SavepointInfo
from state_store.savepoint.catalog import SavepointStore
from state_store.savepoint.chain import savepoint_rows
from state_store.savepoint.checksum import row_hashes, signed
from state_store.savepoint.damage import check_readable, savepoint_damage
from state_store.state import open_sessions_json

__all__ = ["diff_savepoints", "user_history"]

_SUMMARY_DDL = "user_id string, sessions long, fingerprint long"


@dataclass(frozen=True)
class SavepointDiff(Result):
    """What `sessionctl savepoints diff A B` prints: users whose open state B has and A has not (added), A has and B
    has not (removed), both have but differently (changed); open sessions in each; a sample of user ids of each."""
    savepoint_a: str
    savepoint_b: str
    batch_a: int
    batch_b: int
    users_a: int
    users_b: int
    users_added: int
    users_removed: int
    users_changed: int
    users_unchanged: int
    open_sessions_a: int
    open_sessions_b: int
    sample: dict[str, list[str]]


def _per_user(gap_ms: int) -> Any:
    """A partition of canonical rows (every row of a user in one partition) -> per user: open sessions and an
    order-independent fingerprint of the user's rows (the wrapping sum of the savepoint checksum's row hashes)."""
    def summarise(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
        if not tables:
            return
        rows = state_format.conform(pa.concat_tables(tables))
        frame = pd.DataFrame({"user_id": rows["user_id"].to_numpy(zero_copy_only=False),
                              "hash": row_hashes(rows).astype(np.uint64)})
        sums = frame.groupby("user_id", sort=False)["hash"].agg(lambda h: int(h.to_numpy().sum(dtype=np.uint64)))
        sessions = open_sessions(state_format.canonical_rows_ms(rows), gap_ms).groupby("user_id").size()
        users = list(sums.index)
        yield pa.RecordBatch.from_pydict({
            "user_id": users,
            "sessions": [int(sessions.get(u, 0)) for u in users],
            "fingerprint": [signed(int(sums[u])) for u in users],
        })
    return summarise


def _summary(spark: SparkSession, store: SavepointStore, saved: SavepointInfo) -> DataFrame:
    rows = savepoint_rows(spark, store, saved.savepoint_id)
    partitions = max(1, int(spark.conf.get("spark.sql.shuffle.partitions") or 1))
    return rows.repartition(partitions, "user_id").mapInArrow(_per_user(saved.gap_ms), _SUMMARY_DDL)


def diff_savepoints(config: SessionsConfig, spark: SparkSession, a: str, b: str, *, sample: int = 5) -> SavepointDiff:
    store = SavepointStore.of(config)
    saved_a, saved_b = store.get(a), store.get(b)
    catalog = store.list()
    for saved in (saved_a, saved_b):  # a damaged one in one line, before any executor reads it
        check_readable(store, saved, catalog=catalog)
    left = _summary(spark, store, saved_a).select(F.col("user_id"), F.col("sessions").alias("sa"),
                                                   F.col("fingerprint").alias("fa"))
    right = _summary(spark, store, saved_b).select(F.col("user_id"), F.col("sessions").alias("sb"),
                                                    F.col("fingerprint").alias("fb"))
    joined = left.join(right, "user_id", "full_outer").withColumn(
        "kind", F.when(F.col("fa").isNull(), "added").when(F.col("fb").isNull(), "removed")
        .when(F.col("fa") != F.col("fb"), "changed").otherwise("unchanged")).cache()
    try:
        totals = joined.agg(
            *[F.sum(F.when(F.col("kind") == kind, 1).otherwise(0)).alias(kind)
              for kind in ("added", "removed", "changed", "unchanged")],
            F.count("fa").alias("users_a"), F.count("fb").alias("users_b"),
            F.coalesce(F.sum("sa"), F.lit(0)).alias("sessions_a"),
            F.coalesce(F.sum("sb"), F.lit(0)).alias("sessions_b")).collect()[0]
        examples: dict[str, list[str]] = {kind: [] for kind in ("added", "removed", "changed")}
        for row in (joined.where(F.col("kind") != "unchanged")
                    .withColumn("n", F.row_number().over(_by_kind())).where(F.col("n") <= sample)
                    .select("kind", "user_id").collect()):
            examples[row["kind"]].append(row["user_id"])
    finally:
        joined.unpersist()
    return SavepointDiff(
        savepoint_a=saved_a.savepoint_id, savepoint_b=saved_b.savepoint_id, batch_a=saved_a.batch_id,
        batch_b=saved_b.batch_id, users_a=int(totals["users_a"]), users_b=int(totals["users_b"]),
        users_added=int(totals["added"] or 0), users_removed=int(totals["removed"] or 0),
        users_changed=int(totals["changed"] or 0), users_unchanged=int(totals["unchanged"] or 0),
        open_sessions_a=int(totals["sessions_a"]), open_sessions_b=int(totals["sessions_b"]),
        sample={kind: sorted(users) for kind, users in examples.items()})


def _by_kind() -> Any:

    return Window.partitionBy("kind").orderBy("user_id")


def user_history(config: SessionsConfig, spark: SparkSession, user_id: str) -> list[dict[str, Any]]:
    """The user's open sessions at each complete savepoint, oldest first: one pass over all of them."""
    store = SavepointStore.of(config)
    listed = store.list()
    catalog = [s for s in reversed(listed) if s.status == "complete"]
    if not catalog:
        return []
    # A damaged savepoint is said as such in its entry (no sessions): it never stops the others being read.
    checked: dict[str, tuple[str | None, bool]] = {}
    damaged = {s.savepoint_id: str(d) for s in catalog
               if (d := savepoint_damage(store, s, catalog=listed, checked=checked)) is not None}
    readable = [s for s in catalog if s.savepoint_id not in damaged]
    frames = [savepoint_rows(spark, store, s.savepoint_id).where(F.col("user_id") == user_id)
              .withColumn("savepoint_id", F.lit(s.savepoint_id)) for s in readable]
    found = None
    if frames:
        union = frames[0]
        for frame in frames[1:]:
            union = union.unionByName(frame)
        found = union.toArrow()
    out = []
    for saved in catalog:
        if found is None or saved.savepoint_id in damaged:
            out.append({"savepoint_id": saved.savepoint_id, "batch_id": saved.batch_id,
                        "created_at": saved.created_at, "watermark_ms": saved.watermark_ms,
                        "damaged": damaged[saved.savepoint_id], "sessions": []})
            continue
        rows = found.filter(pc.equal(found["savepoint_id"], saved.savepoint_id))
        rows = state_format.conform(rows)
        sessions = open_sessions_json(state_format.canonical_rows_ms(rows), saved.rules,
                                      saved.watermark_ms)
        out.append({"savepoint_id": saved.savepoint_id, "batch_id": saved.batch_id, "created_at": saved.created_at,
                    "watermark_ms": saved.watermark_ms, "sessions": sessions})
    return out
