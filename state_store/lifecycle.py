"""The lifecycle operations `sessionctl` and Dagster call, under their leases: savepoint (of a stopped or a running
stream; state_store.savepoint.take), restore (state_store.restore, after state_store.preflight's checks) and rescale
(of the stopped job, or by the running stream between two batches). Running and stopping the stream: state_store.stream_control."""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyspark.sql import SparkSession

from pipelines.config import SessionsConfig
from pipelines.coordination import kill_point
from pipelines.coordination.job_leases import JOB, LIFECYCLE, job_lock, running_stream
from pipelines.coordination.leases import Lease, LeaseInfo
from pipelines.coordination.liveness import identity
from pipelines.coordination.requests import (
    ResumedAnswer,
    StateChange,
    await_answer,
    request_rescale,
    request_restore,
)
from pipelines.errors import (
    NoCommittedBatch,
    RescaleRefused,
    StateMismatch,
    StopIncomplete,
)
from pipelines.job.checkpoint import (
    inspect_checkpoint,
    read_job_metadata,
    read_restore_marker,
)
from pipelines.job.operators import for_layout, for_new_checkpoint
from pipelines.job.operators.seam import StateOperator
from pipelines.job.runtime import get_spark, spark_failures, stop_state_stores, yield_cpu
from pipelines.locations import CheckpointPath
from pipelines.storage import s3_limits
from state_store.preflight import refusals
from state_store.prepared_rescale import RescaleNotPrepared, prepare_rescale
from state_store.restore import FAILED_SUFFIX, REPLACED_SUFFIX, restore_unlocked, verified_savepoint
from state_store.results import RescaleMethod, RescaleResult, RestoreResult, SavepointInfo, Trigger
from state_store.savepoint.catalog import SavepointStore
from state_store.savepoint.checksum import frame_checksum
from state_store.savepoint.take import savepoint_last_batch
from state_store.state import read_state, repartition_state

__all__ = ["give_way_to_stream", "lifecycle_locks", "replaced_checkpoints", "rescale", "rescale_unlocked", "restore",
           "take_savepoint", "validate_savepoint"]

log = logging.getLogger(__name__)

RUNNING_CHANGE_WAIT_S = 3600.0  # how long a rescale or restore waits, beyond the stop timeout, for a running stream


@contextmanager
def lifecycle_locks(config: SessionsConfig, what: str) -> Iterator[Lease]:
    """Restore, rescale, erasure: no other lifecycle operation, and the stream stopped (they replace its checkpoint
    and rewrite its tables); the job lease, which their writes are fenced by. Inside, this process's own S3 requests
    wait and retry as SESSIONS_S3_TIMEOUT / SESSIONS_S3_MAX_RETRIES say (s3_limits)."""
    with job_lock(config, what, name=LIFECYCLE), job_lock(config, what, name=JOB) as held, s3_limits(config):
        yield held


def _spark(config: SessionsConfig, spark: SparkSession | None) -> SparkSession:
    return spark or get_spark(config)


def give_way_to_stream(config: SessionsConfig) -> bool:
    """Beside a stream running on this host, this process lowers its CPU priority before its JVM starts
    (SESSIONS_BESIDE_STREAM_NICE): its work takes longer when the cores are short, the stream's batches keep their
    pace. Whether it did (not when the stream runs elsewhere, or this process's JVM is already up)."""
    stream = running_stream(config)
    if stream is None or stream.what != "run" or stream.host != identity().host:
        return False
    return yield_cpu(config.beside_stream_nice)


# ---- savepoint ---------------------------------------------------------------------------------

def _take_savepoint(config: SessionsConfig, trigger: Trigger, spark: SparkSession | None, full: bool = False,
                    native_copy: bool | None = None, beside: bool = False) -> SavepointInfo:
    """The savepoint of the last committed batch (state_store.savepoint.take: written and verified by the executors;
    incremental where state_store.savepoint.policy allows and not `full`; with the checkpoint's own files beside it
    when `native_copy`; `beside` a stream that may be running: its batch pinned first)."""
    return savepoint_last_batch(config, trigger, _spark(config, spark), full=full, native_copy=native_copy,
                                beside=beside)


def take_savepoint(config: SessionsConfig, *, trigger: Trigger = "manual", spark: SparkSession | None = None,
                   full: bool = False, native_copy: bool | None = None) -> SavepointInfo:
    """Savepoint at the last committed batch, of a stopped job or beside the running stream (which keeps
    committing): state + source position + watermark + output table versions, all of that one batch. Incremental
    (only the users changed since the previous savepoint of the lineage) unless `full` or the policy says full. With
    `native_copy` (None: SESSIONS_SAVEPOINT_NATIVE), also the checkpoint's own files of that batch (state_store.savepoint.native): a restore to the same
    provider, partitions and operator is then a file copy. Beside a running stream the batch's files are pinned first
    (state_store.savepoint.pin): Spark's retention cannot remove them while they are read."""
    # s3_limits: this process's own S3 requests (the native copy, the cleanup of a failed attempt) wait and retry as
    # SESSIONS_S3_TIMEOUT / SESSIONS_S3_MAX_RETRIES say, as delta-rs's do -- not pyarrow's 90 s per request (so do
    # those of the operations under lifecycle_locks, and compaction's).
    with job_lock(config, "savepoint", name=LIFECYCLE), spark_failures(config), s3_limits(config):
        if spark is None:
            give_way_to_stream(config)
        return _take_savepoint(config, trigger, spark, full, native_copy, beside=True)


# ---- validate / restore ------------------------------------------------------------------------

def validate_savepoint(config: SessionsConfig, savepoint: str = "latest", *, migrate: bool = False,
                       spark: SparkSession | None = None) -> SavepointInfo:
    """Exists, complete, its files re-read in the executors match the catalog's count and checksum, and the current
    settings can restore it (the pre-flight's refusals, the job's state aside)."""
    store = SavepointStore.of(config)
    refused = refusals(config, store.get(savepoint), partitions=None, migrate=migrate, store=store)
    if refused:
        raise refused[0]
    with spark_failures(config):
        return verified_savepoint(config, _spark(config, spark), savepoint=savepoint)


def _check_partitions(partitions: int, operator: StateOperator, buckets: int) -> None:
    if partitions < 1:
        raise RescaleRefused(f"--partitions must be at least 1, got {partitions}")
    bound = operator.max_partitions(buckets)
    if bound is not None and partitions > bound:
        # More partitions than the state has keys (or than MAX_PARTITIONS) would hold nothing but cost a task, a state
        # store instance and its files each, every batch.
        raise RescaleRefused(f"--partitions must be between 1 and {bound}, got {partitions}")


def restore(config: SessionsConfig, savepoint: str = "latest", *, partitions: int | None = None,
            migrate: bool = False, spark: SparkSession | None = None, online: bool = False,
            timeout_s: float | None = None, canonical: bool = False) -> RestoreResult:
    """Put state, source position and outputs back to a savepoint, into a fresh checkpoint (the old checkpoint is
    kept aside, not deleted): the savepoint's native copy when it has one this restore can use and not `canonical`
    (same provider, partitions and operator: a file copy), else built from the canonical Delta form. With `online`,
    a running stream (any host) is asked to do it between two batches and goes on from the savepoint (`timeout_s`:
    how long to wait for its answer); without, a running stream is a refusal (JobRunning)."""
    if partitions is not None:
        _check_partitions(partitions, for_new_checkpoint(), config.state_buckets)
    stream = running_stream(config) if online else None
    if stream is not None and stream.what == "run":
        return _restore_running(config, savepoint, partitions, migrate, stream, timeout_s, canonical)
    with lifecycle_locks(config, "restore") as held, spark_failures(config):
        return restore_unlocked(config, savepoint, partitions=partitions, migrate=migrate, spark=spark, lease=held,
                                canonical=canonical)


def _restore_running(config: SessionsConfig, savepoint: str, partitions: int | None, migrate: bool,
                     stream: LeaseInfo, timeout_s: float | None, canonical: bool) -> RestoreResult:
    store = SavepointStore.of(config)
    saved = store.get(savepoint)  # `latest` resolved here: the stream restores the savepoint the operator saw
    refused = refusals(config, saved, partitions=partitions, migrate=migrate, store=store)
    if refused:  # refused in one line before the stream is disturbed
        raise refused[0]
    again = f"sessionctl restore --online --savepoint {saved.savepoint_id}"
    request = request_restore(config, stream=stream, savepoint=saved.savepoint_id, partitions=partitions,
                              migrate=migrate, canonical=canonical)
    done, answer = _await_change(config, request, stream, timeout_s, "restore", again)
    return RestoreResult(**{**done, "phases": done.get("phases", {}), "downtime_seconds": answer.downtime_s,
                            "resumed_seconds": answer.resumed_s, "stream": stream.describe()})


def _await_change(config: SessionsConfig, request: StateChange, stream: LeaseInfo, timeout_s: float | None,
                  what: str, again: str) -> tuple[dict[str, Any], ResumedAnswer]:
    """The running stream's answer to a rescale or restore request: its result and the answer (downtime)."""
    # The stream's change reads and writes its whole state (a savepoint and a repartition, or a restore): minutes at
    # millions of open sessions, so the wait is long by default.
    patience = timeout_s if timeout_s is not None else config.stop_timeout_s * 2 + RUNNING_CHANGE_WAIT_S
    answer = await_answer(config, stream=stream, request=request, patience_s=patience, withdraw_on_timeout=False)
    if answer is None:
        raise StopIncomplete(f"the stream ({stream.describe()}) went away before it answered the {what} (killed?): "
                             f"run the same {what} again (with the stream stopped, it runs here)", next_step=again)
    if answer.error or not answer.result:
        raise StopIncomplete(f"the stream could not {what} ({answer.error}): run the same {what} again",
                             next_step=again)
    return answer.result, answer


# ---- rescale -----------------------------------------------------------------------------------

def rescale(config: SessionsConfig, partitions: int, *, spark: SparkSession | None = None,
            timeout_s: float | None = None) -> RescaleResult:
    """Change the state partitions, keeping all state. A pre-rescale savepoint is taken first; RocksDB uses Spark's
    offline repartition, the HDFS-backed provider savepoint+restore. A running stream (any host) is asked to do it
    between two batches and goes on (`timeout_s`: how long to wait for its answer); otherwise it is done here."""
    _check_rescale(config, partitions)
    stream = running_stream(config)
    if stream is not None and stream.what == "run":
        return _rescale_running(config, partitions, stream, timeout_s, spark)
    with lifecycle_locks(config, "rescale") as held, spark_failures(config):
        return rescale_unlocked(config, partitions, spark=spark, lease=held)


def _check_rescale(config: SessionsConfig, partitions: int) -> None:
    meta = read_job_metadata(config.checkpoint)  # the operator the checkpoint was made with bounds its partitions
    if meta is not None:
        _check_partitions(partitions, for_layout(meta.state_layout), meta.buckets)
    else:
        _check_partitions(partitions, for_new_checkpoint(), config.state_buckets)


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
    if spark is None:
        give_way_to_stream(config)
    try:
        prepared = prepare_rescale(config, partitions, spark=_spark(config, spark))
    except RescaleNotPrepared as why:
        log.warning("%s: the stream rescales between two batches instead", why)
        return _rescale_between_batches(config, partitions, stream, timeout_s)
    saved = prepared.savepoint
    request = request_restore(config, stream=stream, savepoint=saved.savepoint_id, partitions=partitions,
                              migrate=False, canonical=False)
    # Killed inside the swap, the stream leaves a restore half done: the rescale run again here finishes it.
    done, answer = _await_change(config, request, stream, timeout_s, "rescale",
                                 f"sessionctl rescale --partitions {partitions}")
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
    done, answer = _await_change(config, request, stream, timeout_s, "rescale",
                                 f"sessionctl rescale --partitions {partitions}")
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
        repartition_state(_spark(config, spark), config.checkpoint, info.unfinished_rescale)
        info = inspect_checkpoint(config.checkpoint)
    if info.partitions == partitions:
        return RescaleResult(partitions_before=before, partitions_after=partitions,
                             method="none" if before == partitions else "repartition",
                             savepoint_id=None, rows=None, seconds=0.0)
    spark = _spark(config, spark)
    phases: dict[str, float] = {}
    mark = [time.monotonic()]

    def phase(name: str) -> None:
        now = time.monotonic()
        phases[name], mark[0] = round(now - mark[0], 3), now

    saved = _take_savepoint(config, "pre-rescale", spark)
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
        phases.update({f"restore_{name}": seconds for name, seconds in restored.phases.items()})
    kill_point("rescale:moved")
    return RescaleResult(partitions_before=before,
                         partitions_after=inspect_checkpoint(config.checkpoint).partitions,
                         method=method, savepoint_id=saved.savepoint_id, rows=saved.rows,
                         seconds=round(time.monotonic() - started, 3), phases=phases)


def replaced_checkpoints(config: SessionsConfig) -> list[CheckpointPath]:
    """Checkpoints restores set aside (replaced, or half-built by a failed restore), oldest first."""
    parent = config.checkpoint.parent
    if not parent.exists():
        return []
    prefixes = (config.checkpoint.name + REPLACED_SUFFIX, config.checkpoint.name + FAILED_SUFFIX)
    return sorted((p for p in parent.iterdir() if p.name.startswith(prefixes)), key=lambda p: p.name)
