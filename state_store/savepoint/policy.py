"""Whether a savepoint is full or incremental (state_store.savepoint.catalog, "Incremental savepoints").

Incremental -- only the users whose state changed since the previous savepoint, read from Spark's state change feed --
when all of these hold, else full (the reason is said):
  * not forced full (`sessionctl savepoint --full`);
  * the checkpoint runs the JVM operator (one state key per user) and its provider offers a change feed: the
    HDFS-backed one always, RocksDB with changelog checkpointing (SESSIONS_ROCKSDB_CHANGELOG, on by default);
  * an earlier complete savepoint of the same checkpoint lineage exists (JobMetadata.incarnation: a restore starts a
    new one), of the same state schema, gap, provider and partitions, at or before this batch, whose chain is whole
    and readable (state_store.savepoint.damage; else the result's `note` says which savepoint is damaged);
  * the change feed still reaches back to it: it is fewer than SESSIONS_MIN_BATCHES_TO_RETAIN - 1 batches behind the
    newest committed one, and every batch in between ran with the same state partitions (a repartition starts over);
  * its chain is shorter than SessionsConfig.savepoint_full_every (SESSIONS_SAVEPOINT_FULL_EVERY, default 10: every
    10th savepoint of a lineage is full; 1 = never incremental);
  * its chain's increments hold no more rows than savepoint_chain_share (SESSIONS_SAVEPOINT_CHAIN_SHARE, default 0.5)
    of its full one's.
If the change feed read fails all the same (a version Spark's retention removed meanwhile, a checkpoint written with
changelog checkpointing off), the savepoint is written full in the same run.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from pipelines.config import SessionsConfig
from pipelines.core import state_format
from pipelines.errors import SavepointDamaged
from pipelines.job.checkpoint import CommittedBatch, inspect_checkpoint
from pipelines.job.operators.jvm import STATE_LAYOUT
from pipelines.locations import CheckpointPath
from pipelines.settings import env_name
from state_store.results import SavepointInfo, SavepointKind
from state_store.savepoint.catalog import FULL, INCREMENTAL, SavepointStore
from state_store.savepoint.damage import damaged_members

__all__ = ["SavepointPlan", "damaged_chain", "plan_savepoint"]

FULL_EVERY_ENV, CHAIN_SHARE_ENV = env_name("savepoint_full_every"), env_name("savepoint_chain_share")


@dataclass(frozen=True)
class SavepointPlan:
    kind: SavepointKind
    reason: str                        # why this kind
    tip: SavepointInfo | None = None   # incremental: the savepoint it follows (the newest of its chain)
    note: str | None = None            # what the savepoint's result says about its kind (a damaged chain avoided)



def _partitions_of(checkpoint: CheckpointPath, batch_id: int) -> int | None:
    try:
        lines = [line for line in (checkpoint / "offsets" / str(batch_id)).read_text().splitlines() if line.strip()]
        count = json.loads(lines[1]).get("conf", {}).get("spark.sql.shuffle.partitions")
    except (OSError, IndexError, ValueError):
        return None
    return int(count) if count else None


def _full(reason: str) -> SavepointPlan:
    return SavepointPlan(FULL, reason)


def plan_savepoint(config: SessionsConfig, store: SavepointStore, catalog: list[SavepointInfo],
                   committed: CommittedBatch, *, full: bool = False) -> SavepointPlan:
    """Full or incremental for a savepoint of `committed` (see the module docstring)."""
    info, meta, batch_id = committed.info, committed.meta, committed.batch_id
    every, share = config.savepoint_full_every, config.savepoint_chain_share
    if full:
        return _full("asked for (--full)")
    if meta.state_layout != STATE_LAYOUT:
        return _full(f"the state layout {meta.state_layout} has no per-user change feed")
    if info.provider == "rocksdb" and not config.rocksdb_changelog:
        return _full("RocksDB offers a change feed only with changelog checkpointing (SESSIONS_ROCKSDB_CHANGELOG)")
    if every <= 1:
        return _full(f"{FULL_EVERY_ENV}={every}")
    lineage = [s for s in catalog if s.status == "complete" and s.incarnation == meta.incarnation
               and s.batch_id <= batch_id]
    if not lineage:
        return _full("no earlier savepoint of this checkpoint lineage")
    tip = lineage[0]  # the catalog is newest first
    if (tip.state_schema, tip.gap_ms, tip.provider, tip.partitions) != \
            (state_format.SCHEMA_ID, meta.rules.gap_ms, info.provider, info.partitions):
        return _full(f"the previous savepoint {tip.savepoint_id} has another state schema, gap, provider or "
                     "partition count")
    try:
        chain = store.chain(tip, catalog)
    except SavepointDamaged as damaged:
        return SavepointPlan(FULL, str(damaged), note=f"full, not incremental: {damaged}")
    if len(chain) >= every:
        return _full(f"its chain would grow to {len(chain) + 1} ({FULL_EVERY_ENV}={every})")
    increments = sum(int(s.table_rows or 0) for s in chain[1:])
    if increments > share * max(1, int(chain[0].rows)):
        return _full(f"the chain's increments hold {increments} rows, over {share:g} of its full savepoint's "
                     f"{chain[0].rows} ({CHAIN_SHARE_ENV})")
    newest = inspect_checkpoint(config.checkpoint).last_committed_batch or batch_id
    if newest - tip.batch_id >= config.min_batches_to_retain - 1:
        return _full(f"the change feed no longer reaches back to batch {tip.batch_id} of the previous savepoint "
                     f"(SESSIONS_MIN_BATCHES_TO_RETAIN={config.min_batches_to_retain})")
    if any(_partitions_of(config.checkpoint, b) != tip.partitions for b in range(tip.batch_id + 1, batch_id + 1)):
        return _full(f"the state was repartitioned (or a batch's offsets are gone) since batch {tip.batch_id}")
    # Last (it reads Delta logs and lists files): an increment on a damaged chain could never be restored, and its
    # check re-reads that chain -- a new chain starts here instead, and the result says why.
    broken = damaged_members(store, tip, catalog=catalog)
    if broken:
        return damaged_chain(next(iter(broken.items())))
    return SavepointPlan(INCREMENTAL, f"changes since {tip.savepoint_id} (batch {tip.batch_id})", tip)


def damaged_chain(damage: tuple[str, str]) -> SavepointPlan:
    """A full savepoint instead of an increment on a chain that holds the damaged savepoint (id, why)."""
    reason = (f"full, not incremental: savepoint {damage[0]} of the previous savepoint's chain is damaged ({damage[1]}); "
              "a new chain starts here")
    return SavepointPlan(FULL, reason, note=reason)
