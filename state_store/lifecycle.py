"""The lifecycle operations on savepoints that `sessionctl` and Dagster call, under their leases (state_store.kernel):
savepoint (of a stopped or a running stream; the step state_store.savepoint.take), validate, and restore (the step
state_store.restore, after state_store.preflight's checks; a running stream is asked to do it between two batches).
Their peers: rescale (state_store.rescale), erasure, compaction (state_store.maintenance), run and stop
(state_store.stream_control)."""
from __future__ import annotations

from pyspark.sql import SparkSession

from pipelines.config import SessionsConfig
from pipelines.coordination.job_leases import running_stream
from pipelines.coordination.leases import LeaseInfo
from pipelines.coordination.requests import request_restore
from pipelines.job.operators import for_new_checkpoint
from pipelines.job.runtime import spark_failures
from state_store.kernel import await_change, beside_stream, check_partitions, exclusive, session
from state_store.preflight import refusals
from state_store.restore import restore_unlocked, verified_savepoint
from state_store.results import RestoreResult, SavepointInfo, Trigger
from state_store.savepoint.catalog import SavepointStore
from state_store.savepoint.take import savepoint_last_batch

__all__ = ["restore", "take_savepoint", "validate_savepoint"]


def take_savepoint(config: SessionsConfig, *, trigger: Trigger = "manual", spark: SparkSession | None = None,
                   full: bool = False, native_copy: bool | None = None) -> SavepointInfo:
    """Savepoint at the last committed batch, of a stopped job or beside the running stream (which keeps
    committing): state + source position + watermark + output table versions, all of that one batch. Incremental
    (only the users changed since the previous savepoint of the lineage) unless `full` or the policy says full. With
    `native_copy` (None: SESSIONS_SAVEPOINT_NATIVE), also the checkpoint's own files of that batch
    (state_store.savepoint.native): a restore to the same provider, partitions and operator is then a file copy. Beside a running stream the batch's files are pinned first
    (state_store.savepoint.pin): Spark's retention cannot remove them while they are read."""
    with beside_stream(config, "savepoint"):
        return savepoint_last_batch(config, trigger, session(config, spark), full=full, native_copy=native_copy,
                                    beside=True)


def validate_savepoint(config: SessionsConfig, savepoint: str = "latest", *, migrate: bool = False,
                       spark: SparkSession | None = None) -> SavepointInfo:
    """Exists, complete, its files re-read in the executors match the catalog's count and checksum, and the current
    settings can restore it (the pre-flight's refusals, the job's state aside)."""
    store = SavepointStore.of(config)
    refused = refusals(config, store.get(savepoint), partitions=None, migrate=migrate, store=store)
    if refused:
        raise refused[0]
    with spark_failures(config):
        return verified_savepoint(config, session(config, spark), savepoint=savepoint)


def restore(config: SessionsConfig, savepoint: str = "latest", *, partitions: int | None = None,
            migrate: bool = False, spark: SparkSession | None = None, online: bool = False,
            timeout_s: float | None = None, canonical: bool = False) -> RestoreResult:
    """Put state, source position and outputs back to a savepoint, into a fresh checkpoint (the old checkpoint is
    kept aside, not deleted): the savepoint's native copy when it has one this restore can use and not `canonical`
    (same provider, partitions and operator: a file copy), else built from the canonical Delta form. With `online`,
    a running stream (any host) is asked to do it between two batches and goes on from the savepoint (`timeout_s`:
    how long to wait for its answer); without, a running stream is a refusal (JobRunning)."""
    if partitions is not None:
        check_partitions(partitions, for_new_checkpoint(), config.state_buckets)
    stream = running_stream(config) if online else None
    if stream is not None and stream.what == "run":
        return _restore_running(config, savepoint, partitions, migrate, stream, timeout_s, canonical)
    with exclusive(config, "restore") as held:
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
    done, answer = await_change(config, request, stream, timeout_s, what="restore", again=again)
    return RestoreResult(**{**done, "phases": done.get("phases", {}), "downtime_seconds": answer.downtime_s,
                            "resumed_seconds": answer.resumed_s, "stream": stream.describe()})
