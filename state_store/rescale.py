"""Rescale: change the state partitions, keeping all state -- of the stopped job here, or of a running stream, prepared
beside it and swapped in between two batches.

Rescaling moves every key to its new partition, which costs what the state costs (a savepoint, Spark's repartition
or a restore, a check: tens of seconds at a million open users). Done between two batches, all of it is downtime.
Prepared here instead, while the stream goes on: the pre-rescale savepoint of its last committed batch; that
savepoint restored at the new partition count into a side checkpoint and checked there against it; the side
checkpoint's files kept as the savepoint's native copy (state_store.savepoint.native; its manifest says the new
count). The side checkpoint writes nothing to the output tables: its query stops after the bootstrap batch, which
closes no session, so a session the savepoint holds as due is closed by the stream's first batch after the swap. The
stream is then asked to restore that savepoint at the new count between two batches: a file copy, the outputs it
wrote since the savepoint rolled back, and its first batch after replays the events since -- exactly once, as any
restore. The side checkpoint is deleted; one left by a killed preparation is removed with the checkpoints restores
set aside (state_store.kernel.replaced_checkpoints).

RocksDB's side checkpoint holds a snapshot (a canonical restore commits its bootstrap batch as one:
state_store.restore), which the stream loads as it is instead of replaying every key from a changelog in its first
batch after. Where no native copy can be kept, the stream does the whole rescale between two batches."""
from __future__ import annotations

import datetime as dt
import logging
import os
import time
from dataclasses import dataclass, field, replace

from pyspark.sql import SparkSession

from pipelines.config import SessionsConfig
from pipelines.coordination import kill_point
from pipelines.coordination.job_leases import running_stream
from pipelines.coordination.leases import Lease, LeaseInfo
from pipelines.coordination.liveness import identity
from pipelines.coordination.requests import request_rescale, request_restore
from pipelines.errors import NoCommittedBatch, SessionsError, StateMismatch
from pipelines.job.checkpoint import inspect_checkpoint, read_job_metadata, read_restore_marker
from pipelines.job.operators import for_layout, for_new_checkpoint
from pipelines.job.runtime import error_line, stop_state_stores
from pipelines.locations import remove_tree
from state_store.kernel import SIDE_SUFFIX, await_change, beside_stream, check_partitions, exclusive, session
from state_store.restore import restore_unlocked
from state_store.results import Phases, RescaleMethod, RescaleResult, SavepointInfo
from state_store.savepoint import native
from state_store.savepoint.catalog import SavepointStore
from state_store.savepoint.checksum import frame_checksum
from state_store.savepoint.take import savepoint_last_batch
from state_store.state import read_state, repartition_state

__all__ = ["PreparedRescale", "RescaleNotPrepared", "prepare_rescale", "rescale", "rescale_unlocked"]

log = logging.getLogger(__name__)

NATIVE_COLUMNS = ("native_files", "native_bytes", "native_checksum")


class RescaleNotPrepared(SessionsError):
    """The side checkpoint could not be built or copied (the stream was not disturbed)."""


@dataclass(frozen=True)
class PreparedRescale:
    savepoint: SavepointInfo  # the pre-rescale savepoint, with its native copy at the new partition count
    partitions_before: int | None
    phases: dict[str, float] = field(default_factory=dict)


def side_config(config: SessionsConfig, stamp: str) -> SessionsConfig:
    """Where the side checkpoint is built: beside the checkpoint, as `<checkpoint>.rescale-side-<time>` until it is
    deleted (a killed preparation leaves one that the next `compact` or `forget` removes)."""
    parent = config.checkpoint.parent
    return config.with_(checkpoint_uri=str(parent / f"{config.checkpoint.name}{SIDE_SUFFIX}{stamp}"))


def prepare_rescale(config: SessionsConfig, partitions: int, *, spark: SparkSession) -> PreparedRescale:
    """The pre-rescale savepoint of the running stream's last committed batch, with a native copy at `partitions`
    built and checked beside the stream, which goes on undisturbed (under the lifecycle lease, not the job lease:
    the stream holds that). RescaleNotPrepared (one line) when the side checkpoint cannot be built or copied."""
    phase = Phases()

    store = SavepointStore.of(config)
    with beside_stream(config, "rescale"):
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
    return PreparedRescale(saved, before, phase.seconds)


def rescale(config: SessionsConfig, partitions: int, *, spark: SparkSession | None = None,
            timeout_s: float | None = None) -> RescaleResult:
    """Change the state partitions, keeping all state. A pre-rescale savepoint is taken first; RocksDB uses Spark's
    offline repartition, the HDFS-backed provider savepoint+restore. A running stream (any host) is asked to do it
    between two batches and goes on (`timeout_s`: how long to wait for its answer); otherwise it is done here."""
    _check_rescale(config, partitions)
    stream = running_stream(config)
    if stream is not None and stream.what == "run":
        return _rescale_running(config, partitions, stream, timeout_s, spark)
    with exclusive(config, "rescale") as held:
        return rescale_unlocked(config, partitions, spark=spark, lease=held)


def _check_rescale(config: SessionsConfig, partitions: int) -> None:
    meta = read_job_metadata(config.checkpoint)  # the operator the checkpoint was made with bounds its partitions
    if meta is not None:
        check_partitions(partitions, for_layout(meta.state_layout), meta.buckets)
    else:
        check_partitions(partitions, for_new_checkpoint(), config.state_buckets)


def _rescale_running(config: SessionsConfig, partitions: int, stream: LeaseInfo, timeout_s: float | None,
                     spark: SparkSession | None) -> RescaleResult:
    """Prepared beside the stream (state_store.prepared_rescale), then swapped in by the stream between two batches
    as a restore of the pre-rescale savepoint from its native copy at the new count. Where no native copy can be
    kept (the storage refused it), the stream does the whole rescale between two batches."""
    started = time.monotonic()
    if inspect_checkpoint(config.checkpoint).partitions == partitions:
        return RescaleResult(partitions_before=partitions, partitions_after=partitions, method="none",
                             savepoint_id=None, rows=None, seconds=0.0, stream=stream.describe())
    here = identity()
    if (stream.host, stream.pid, stream.pid_ns) == (here.host, os.getpid(), here.pid_ns):
        # The stream runs in this process (a Dagster run beside it in process): its JVM is this one, whose state
        # stores a side checkpoint's restore would stop under it. The stream does it between two batches.
        return _rescale_between_batches(config, partitions, stream, timeout_s)
    try:
        prepared = prepare_rescale(config, partitions, spark=session(config, spark))
    except RescaleNotPrepared as why:
        log.warning("%s: the stream rescales between two batches instead", why)
        return _rescale_between_batches(config, partitions, stream, timeout_s)
    saved = prepared.savepoint
    request = request_restore(config, stream=stream, savepoint=saved.savepoint_id, partitions=partitions,
                              migrate=False, canonical=False)
    # Killed inside the swap, the stream leaves a restore half done: the rescale run again here finishes it.
    done, answer = await_change(config, request, stream, timeout_s, what="rescale",
                                again=f"sessionctl rescale --partitions {partitions}")
    swapped = {f"swap_{name}": seconds for name, seconds in done.get("phases", {}).items()}
    return RescaleResult(partitions_before=prepared.partitions_before, partitions_after=done["partitions"],
                         method="prepared" if done.get("method") == "native" else "savepoint-restore",
                         savepoint_id=saved.savepoint_id, rows=saved.rows,
                         seconds=round(time.monotonic() - started, 3), phases={**prepared.phases, **swapped},
                         downtime_seconds=answer.downtime_s, resumed_seconds=answer.resumed_s,
                         stream=stream.describe())


def _rescale_between_batches(config: SessionsConfig, partitions: int, stream: LeaseInfo,
                             timeout_s: float | None) -> RescaleResult:
    request = request_rescale(config, stream=stream, partitions=partitions)
    done, answer = await_change(config, request, stream, timeout_s, what="rescale",
                                again=f"sessionctl rescale --partitions {partitions}")
    return RescaleResult(partitions_before=done["partitions_before"], partitions_after=done["partitions_after"],
                         method=done["method"], savepoint_id=done["savepoint_id"], rows=done.get("rows"),
                         seconds=done["seconds"], phases=done.get("phases", {}), downtime_seconds=answer.downtime_s,
                         resumed_seconds=answer.resumed_s, stream=stream.describe())


def rescale_unlocked(config: SessionsConfig, partitions: int, *, spark: SparkSession | None, lease: Lease
                     ) -> RescaleResult:
    """The rescale itself, under the job lease `lease` (this command's, or the running stream's) and the lifecycle
    lease, the query stopped."""
    started = time.monotonic()
    info = inspect_checkpoint(config.checkpoint)
    before = info.partitions
    marker = read_restore_marker(config.checkpoint)
    if marker is not None:
        # A restore left half done (a running stream's rescale killed inside its swap): the checkpoint is unusable
        # until it is finished, so it is finished first, at the count it was asked for; then on to the count asked.
        # (A marker written before it recorded its count restores at the savepoint's; the rescale goes on from there.)
        finished = restore_unlocked(config, str(marker["savepoint_id"]), partitions=marker.get("partitions"),  # an int or None
                                    migrate=False, spark=spark, lease=lease)
        if finished.partitions == partitions:
            return RescaleResult(partitions_before=before, partitions_after=partitions,
                                 method="prepared" if finished.method == "native" else "savepoint-restore",
                                 savepoint_id=finished.savepoint_id, rows=finished.rows,
                                 seconds=round(time.monotonic() - started, 3),
                                 phases={f"restore_{k}": v for k, v in finished.phases.items()})
        info = inspect_checkpoint(config.checkpoint)
    if info.last_committed_batch is None:
        raise NoCommittedBatch(f"nothing to rescale: no committed batch in {config.checkpoint}")
    if info.unfinished_rescale is not None:
        # Spark repartitions only to the interrupted attempt's count until that one is finished: finish it
        # (the state it starts from is the last committed batch's, untouched), then go on to the count asked.
        repartition_state(session(config, spark), config.checkpoint, info.unfinished_rescale)
        info = inspect_checkpoint(config.checkpoint)
    if info.partitions == partitions:
        return RescaleResult(partitions_before=before, partitions_after=partitions,
                             method="none" if before == partitions else "repartition",
                             savepoint_id=None, rows=None, seconds=0.0)
    spark = session(config, spark)
    phase = Phases()

    saved = savepoint_last_batch(config, "pre-rescale", spark)
    phase("pre_rescale_savepoint")
    kill_point("rescale:saved")
    method: RescaleMethod = "savepoint-restore"
    if info.provider == "rocksdb":
        stop_state_stores(spark)  # a running stream's stopped query: its stores upload nothing during the repartition
        repartition_state(spark, config.checkpoint, partitions)
        phase("repartition")
        method = "repartition"
        after = inspect_checkpoint(config.checkpoint)
        state = frame_checksum(read_state(spark, config.checkpoint, batch_id=after.last_committed_batch))
        phase("state_checked")
        if state != (saved.rows, saved.checksum):
            raise StateMismatch(f"repartitioned state does not match the pre-rescale savepoint "
                                f"{saved.savepoint_id}; restore it with `sessionctl restore --savepoint "
                                f"{saved.savepoint_id} --partitions {partitions}`")
    else:
        restored = restore_unlocked(config.with_(state_store=info.provider), saved.savepoint_id,
                                    partitions=partitions, migrate=False, spark=spark, lease=lease)
        phase.seconds.update({f"restore_{name}": seconds for name, seconds in restored.phases.items()})
    kill_point("rescale:moved")
    return RescaleResult(partitions_before=before,
                         partitions_after=inspect_checkpoint(config.checkpoint).partitions,
                         method=method, savepoint_id=saved.savepoint_id, rows=saved.rows,
                         seconds=round(time.monotonic() - started, 3), phases=phase.seconds)


