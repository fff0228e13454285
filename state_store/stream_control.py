"""The stream as operators control it: `run_stream` (pipelines.job.stream's run loop, honouring `sessionctl stop
--savepoint` by taking that last batch's savepoint before it lets go of the job lease, and `forget`, `rescale` and
`restore --online` between two batches) and `stop_stream` (asks the
stream that holds the job lease -- this process or another, any host sharing the lease store -- to stop)."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from pyspark.sql import SparkSession

from pipelines.config import SessionsConfig
from pipelines.coordination.job_leases import running_stream
from pipelines.coordination.lease_stores import store_for
from pipelines.coordination.leases import Lease
from pipelines.coordination.requests import (
    ErasureRequest,
    RescaleRequest,
    StateChange,
    StopRequest,
    await_answer,
    request_stop,
)
from pipelines.errors import JobRunning, NotRunning, StopIncomplete
from pipelines.job.checkpoint import inspect_checkpoint
from pipelines.job.run_summary import RunSummary
from pipelines.job.sink import MicroBatchSink
from pipelines.job.stream import run_continuously
from state_store.erasure import forget_unlocked
from state_store.kernel import beside_stream
from state_store.rescale import rescale_unlocked
from state_store.restore import restore_unlocked
from state_store.results import SavepointInfo, StopResult
from state_store.savepoint.take import savepoint_last_batch

__all__ = ["run_stream", "stop_stream"]


def run_stream(config: SessionsConfig, *, spark: SparkSession | None = None, stop: threading.Event | None = None,
               poll_seconds: float = 5.0,
               on_progress: Callable[[RunSummary, MicroBatchSink], None] | None = None) -> RunSummary:
    """The stream (pipelines.job.stream.run_continuously) that honours `sessionctl stop --savepoint`: after its last
    batch it takes that batch's savepoint itself, before it releases the job lease (nothing can start between)."""

    def savepoint_at_stop(request: StopRequest, running: SparkSession) -> dict[str, Any]:
        # A compaction or another savepoint may hold the lifecycle lease: wait for it rather than fail the stop.
        with beside_stream(config, "stop --savepoint", wait_s=config.stop_timeout_s):
            return savepoint_last_batch(config, "stop", running, native_copy=request.native).to_dict()

    def erase_between_batches(request: ErasureRequest, running: SparkSession, lease: Lease) -> dict[str, Any]:

        with beside_stream(config, "forget", wait_s=config.stop_timeout_s):
            return forget_unlocked(config, running, request.user_ids, lease=lease).to_dict()

    def change_between_batches(request: StateChange, running: SparkSession, lease: Lease) -> dict[str, Any]:

        what = "rescale" if isinstance(request, RescaleRequest) else "restore"
        with beside_stream(config, what, wait_s=config.stop_timeout_s):
            if isinstance(request, RescaleRequest):
                return rescale_unlocked(config, request.partitions, spark=running, lease=lease).to_dict()
            return restore_unlocked(config, request.savepoint, partitions=request.partitions,
                                    migrate=request.migrate, spark=running, lease=lease,
                                    canonical=request.canonical).to_dict()

    return run_continuously(config, spark=spark, stop=stop, poll_seconds=poll_seconds, on_progress=on_progress,
                            on_stop_request=savepoint_at_stop, on_erasure=erase_between_batches,
                            on_state_change=change_between_batches)


def stop_stream(config: SessionsConfig, *, savepoint: bool = False, timeout_s: float | None = None,
                native_copy: bool | None = None) -> StopResult:
    """Stop the running stream (this or another process, any host sharing the checkpoint path) after its current
    batch; with `savepoint`, the savepoint of that last batch is taken as part of the stop (with its native copy when
    `native_copy`). Waits for the answer."""
    started = time.monotonic()
    stream = running_stream(config)
    job_lease = store_for(config.lease_uri).where("job.lease")  # a path, s3:// or hdfs:// as given
    if stream is None:
        raise NotRunning(f"no stream is running: nothing holds {job_lease}"
                         + ("; `sessionctl savepoint` takes a savepoint of the stopped job" if savepoint else ""))
    if stream.what != "run":
        raise JobRunning(f"{stream.describe()} holds the job lease and is not a stream: it stops by itself; wait for "
                         f"it", stream.describe(), job_lease)
    native = config.savepoint_native if native_copy is None else native_copy
    request = request_stop(config, stream=stream, savepoint=savepoint, native=savepoint and native)
    patience = timeout_s if timeout_s is not None else config.stop_timeout_s * 2
    answer = await_answer(config, stream=stream, request=request, patience_s=patience, withdraw_on_timeout=False)
    if answer is None:  # the stream went away without answering
        last = inspect_checkpoint(config.checkpoint).last_committed_batch
        if request.savepoint:
            raise StopIncomplete(f"the stream ({stream.describe()}) went away without answering (killed?); it is "
                                 f"stopped at committed batch {last} without a savepoint: take it with "
                                 f"`sessionctl savepoint`", next_step="sessionctl savepoint")
        return StopResult(True, stream.describe(), last, round(time.monotonic() - started, 3))
    seconds = round(time.monotonic() - started, 3)
    if answer.error:
        raise StopIncomplete(f"the stream stopped at committed batch {answer.last_committed_batch} but its "
                             f"savepoint failed ({answer.error}): take it with `sessionctl savepoint`",
                             next_step="sessionctl savepoint")
    taken = answer.savepoint
    if savepoint and not taken:  # joined a stop someone else asked for without a savepoint
        raise StopIncomplete(f"the stream stopped at committed batch {answer.last_committed_batch} for an earlier "
                             f"stop request without a savepoint ({request.requested_by}): take it with "
                             f"`sessionctl savepoint`", next_step="sessionctl savepoint")
    return StopResult(True, stream.describe(), answer.last_committed_batch, seconds,
                      SavepointInfo.from_row(taken) if taken else None)


