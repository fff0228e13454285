"""A running stream's rescale prepared beside it: the stream stops only for a file copy.

Rescaling moves every key to its new partition, which costs what the state costs (a savepoint, Spark's repartition
or a restore, a check: tens of seconds at a million open users). Done between two batches, all of it is downtime.
Prepared here instead, while the stream goes on: the pre-rescale savepoint of its last committed batch; that
savepoint restored at the new partition count into a side checkpoint and checked there against it; the side
checkpoint's files kept as the savepoint's native copy (state_store.savepoint.native; its manifest says the new
count). The side checkpoint writes nothing to the output tables: its query stops after the bootstrap batch, which
closes no session, so a session the savepoint holds as due is closed by the stream's first batch after the swap. The stream is then asked to restore that savepoint at the new count between two batches: a file copy, the
outputs it wrote since the savepoint rolled back, and its first batch after replays the events since -- exactly once,
as any restore. The side checkpoint is deleted; one left by a killed preparation is a failed restore's
(state_store.lifecycle.replaced_checkpoints).

RocksDB's side checkpoint holds a snapshot (a canonical restore commits its bootstrap batch as one: state_store.restore),
which the stream loads as it is instead of replaying every key from a changelog in its first batch after."""
from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field, replace

from pyspark.sql import SparkSession

from pipelines.config import SessionsConfig
from pipelines.coordination import kill_point
from pipelines.coordination.job_leases import LIFECYCLE, job_lock
from pipelines.errors import SessionsError
from pipelines.job.checkpoint import inspect_checkpoint
from pipelines.job.runtime import error_line, spark_failures, stop_state_stores
from pipelines.locations import remove_tree
from state_store.restore import FAILED_SUFFIX, restore_unlocked
from state_store.results import SavepointInfo
from state_store.savepoint import native
from state_store.savepoint.catalog import SavepointStore
from state_store.savepoint.take import savepoint_last_batch

__all__ = ["PreparedRescale", "RescaleNotPrepared", "prepare_rescale"]

NATIVE_COLUMNS = ("native_files", "native_bytes", "native_checksum")


class RescaleNotPrepared(SessionsError):
    """The side checkpoint could not be built or copied (the stream was not disturbed)."""


@dataclass(frozen=True)
class PreparedRescale:
    savepoint: SavepointInfo  # the pre-rescale savepoint, with its native copy at the new partition count
    partitions_before: int | None
    phases: dict[str, float] = field(default_factory=dict)


def side_config(config: SessionsConfig, stamp: str) -> SessionsConfig:
    """Where the side checkpoint is built: beside the checkpoint, named as a failed restore's until it is deleted (a
    killed preparation leaves one a later `compact` or an operator finds)."""
    parent = config.checkpoint.parent
    return config.with_(checkpoint_uri=str(parent / f"{config.checkpoint.name}{FAILED_SUFFIX}prepared-{stamp}"))


def prepare_rescale(config: SessionsConfig, partitions: int, *, spark: SparkSession) -> PreparedRescale:
    """The pre-rescale savepoint of the running stream's last committed batch, with a native copy at `partitions`
    built and checked beside the stream, which goes on undisturbed (under the lifecycle lease, not the job lease:
    the stream holds that). RescaleNotPrepared (one line) when the side checkpoint cannot be built or copied."""
    phases: dict[str, float] = {}
    mark = [time.monotonic()]

    def phase(name: str) -> None:
        now = time.monotonic()
        phases[name], mark[0] = round(now - mark[0], 3), now

    store = SavepointStore.of(config)
    with job_lock(config, "rescale", name=LIFECYCLE), spark_failures(config):
        before = inspect_checkpoint(config.checkpoint).partitions
        saved = savepoint_last_batch(config, "pre-rescale", spark, native_copy=False, beside=True)  # batch pinned
        phase("pre_rescale_savepoint")
        kill_point("rescale:saved")
        side = side_config(config, dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%f"))
        try:
            restore_unlocked(side, saved.savepoint_id, partitions=partitions, migrate=False, spark=spark,
                             canonical=True, side=True)
            stop_state_stores(spark)  # its stores upload nothing more into the side checkpoint
            phase("side_checkpoint_built")  # the savepoint verified, the bootstrap batch, the state checked
            info = inspect_checkpoint(side.checkpoint)
            copy = native.copy_out(side.checkpoint, int(info.last_committed_batch or 0), partitions=partitions,
                                   provider=str(info.provider), store_uri=store.uri, savepoint_id=saved.savepoint_id)
            saved = replace(saved, native_files=len(copy.files), native_bytes=copy.bytes,
                            native_checksum=copy.checksum)
            store.update_rows([saved], NATIVE_COLUMNS)
            phase("native_copied")
        except (SessionsError, native.NativeUnavailable) as error:
            raise RescaleNotPrepared(f"the rescale could not be prepared beside the stream ({error_line(error)}); "
                                     f"the stream goes on as it was") from None
        finally:  # (a failed restore stopped its stores itself)
            remove_tree(side.checkpoint.parent)
        kill_point("rescale:prepared")
    return PreparedRescale(saved, before, phases)
