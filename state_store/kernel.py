"""What every lifecycle operation stands on: its leases, its Spark session, the names of the checkpoints restores set
aside, and a running stream's answer to a request.

The operations -- savepoint, validate and restore (state_store.lifecycle), rescale (state_store.rescale), erasure
(state_store.erasure), compaction (state_store.maintenance), run and stop (state_store.stream_control) -- are peers
over this kernel, the savepoint catalog (state_store.savepoint.catalog) and storage (pipelines.storage). Where one
operation's work is part of another's (an erasure and a rescale take a savepoint and restore it), it calls one of two
steps, never the other operation: the savepoint of the last committed batch (state_store.savepoint.take) and the
restore of a savepoint into a fresh checkpoint (state_store.restore)."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyspark.sql import SparkSession

from pipelines.config import SessionsConfig
from pipelines.coordination.job_leases import JOB, LIFECYCLE, job_lock, running_stream
from pipelines.coordination.leases import Lease, LeaseInfo
from pipelines.coordination.liveness import identity
from pipelines.coordination.requests import ResumedAnswer, StateChange, await_answer
from pipelines.errors import RescaleRefused, StopIncomplete
from pipelines.job.operators.seam import StateOperator
from pipelines.job.runtime import get_spark, spark_failures, yield_cpu
from pipelines.locations import CheckpointPath
from pipelines.storage import s3_limits

__all__ = ["FAILED_SUFFIX", "PINNED_SUFFIX", "REPLACED_SUFFIX", "SIDE_SUFFIX", "await_change", "beside_stream", "check_partitions", "exclusive", "give_way_to_stream",
           "replaced_checkpoints", "session"]

# Checkpoints kept beside the checkpoint, as `<checkpoint><suffix><UTC time>`; compaction and erasure remove them.
REPLACED_SUFFIX = ".replaced-"  # a checkpoint a restore replaced
FAILED_SUFFIX = ".failed-restore-"  # a half-built checkpoint a failed restore left, kept for a post-mortem
SIDE_SUFFIX = ".rescale-side-"  # a running stream's rescale, built beside it (state_store.rescale) until deleted
PINNED_SUFFIX = ".pinned-"  # a committed batch a savepoint reads beside a running stream (state_store.savepoint.pin)
RUNNING_CHANGE_WAIT_S = 3600.0  # how long a rescale or restore waits, beyond the stop timeout, for a running stream


@contextmanager
def exclusive(config: SessionsConfig, what: str) -> Iterator[Lease]:
    """Restore, rescale, erasure: no other lifecycle operation, and the stream stopped (they replace its checkpoint
    and rewrite its tables); the job lease, which their writes are fenced by."""
    with job_lock(config, what, name=LIFECYCLE), job_lock(config, what, name=JOB) as held, _limits(config):
        yield held


@contextmanager
def beside_stream(config: SessionsConfig, what: str, *, wait_s: float = 0.0) -> Iterator[Lease]:
    """Savepoint, compaction, a rescale prepared beside the stream, and whatever the running stream does between two
    batches (it holds the job lease itself): no other lifecycle operation (`wait_s`: how long to wait for one)."""
    with job_lock(config, what, name=LIFECYCLE, wait_s=wait_s) as held, _limits(config):
        yield held


@contextmanager
def _limits(config: SessionsConfig) -> Iterator[None]:
    """Spark's own failures in the block become one typed line; this process's own S3 requests (native copies, the
    cleanup of a failed attempt) wait and retry as SESSIONS_S3_TIMEOUT / SESSIONS_S3_MAX_RETRIES say, as delta-rs's
    do -- not pyarrow's 90 s per request."""
    with spark_failures(config), s3_limits(config):
        yield


def give_way_to_stream(config: SessionsConfig) -> bool:
    """Beside a stream running on this host, this process lowers its CPU priority before its JVM starts
    (SESSIONS_BESIDE_STREAM_NICE; the JVM and its Python workers inherit it): its work takes longer when the cores are
    short, the stream's batches keep their pace. Whether it did (not when the stream runs elsewhere, or this process's
    JVM is already up)."""
    stream = running_stream(config)
    if stream is None or stream.what != "run" or stream.host != identity().host:
        return False
    return yield_cpu(config.beside_stream_nice)


def session(config: SessionsConfig, spark: SparkSession | None) -> SparkSession:
    """The caller's Spark session, or this process's, started after it gave way to a stream on this host."""
    if spark is not None:
        return spark
    give_way_to_stream(config)
    return get_spark(config)


def check_partitions(partitions: int, operator: StateOperator, buckets: int) -> None:
    if partitions < 1:
        raise RescaleRefused(f"--partitions must be at least 1, got {partitions}")
    bound = operator.max_partitions(buckets)
    if bound is not None and partitions > bound:
        # More partitions than the state has keys (or than MAX_PARTITIONS) would hold nothing but cost a task, a state
        # store instance and its files each, every batch.
        raise RescaleRefused(f"--partitions must be between 1 and {bound}, got {partitions}")


def replaced_checkpoints(config: SessionsConfig) -> list[CheckpointPath]:
    """Checkpoints kept beside the checkpoint (replaced by a restore, half-built by a failed one, a rescale's side
    checkpoint, a savepoint's pinned batch -- one a killed command left), oldest first."""
    parent = config.checkpoint.parent
    if not parent.exists():
        return []
    prefixes = tuple(config.checkpoint.name + suffix for suffix in (REPLACED_SUFFIX, FAILED_SUFFIX, SIDE_SUFFIX,
                                                                     PINNED_SUFFIX))
    return sorted((p for p in parent.iterdir() if p.name.startswith(prefixes)), key=lambda p: p.name)


def await_change(config: SessionsConfig, request: StateChange, stream: LeaseInfo, timeout_s: float | None, *,
                 what: str, again: str) -> tuple[dict[str, Any], ResumedAnswer]:
    """The running stream's answer to a rescale or restore request: its result and the answer
    (downtime). StopIncomplete, naming `again`, when the stream went away or could not do it."""
    # A rescale or restore reads and writes the whole state (minutes at millions of open sessions): a long default.
    patience = timeout_s if timeout_s is not None else config.stop_timeout_s * 2 + RUNNING_CHANGE_WAIT_S
    answer = await_answer(config, stream=stream, request=request, patience_s=patience, withdraw_on_timeout=False)
    if answer is None:
        raise StopIncomplete(f"the stream ({stream.describe()}) went away before it answered the {what} (killed?): "
                             f"run the same {what} again (with the stream stopped, it runs here)", next_step=again)
    if answer.error or not answer.result:
        raise StopIncomplete(f"the stream could not {what} ({answer.error}): run the same {what} again",
                             next_step=again)
    return answer.result, answer
