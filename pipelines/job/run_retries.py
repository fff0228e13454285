"""How `sessionctl run` rides out what passes: a source that cannot be read (the broker, the S3 landing), lost
messages until an operator accepts the loss, and the warehouse's object store (S3) not answering -- to ingest or to
the query. Each failure is one line on the logger `pipelines.job.stream` (sessionctl run prints it on stderr), counted in
the run's summary, and the next attempt waits twice as long as the last, up to SOURCE_RETRY_CAP_S."""
from __future__ import annotations

import logging
import threading
import time
from contextlib import suppress
from typing import Protocol

from pipelines.config import SessionsConfig
from pipelines.coordination.leases import Lease
from pipelines.coordination.requests import StreamRequest, pending_request
from pipelines.errors import SourceDataLost, SourceUnavailable, StorageUnavailable
from pipelines.ingest import IngestResult, LargeInput, ingest
from pipelines.storage import S3_ADVICE, object_store_errors

__all__ = ["RetryCounts", "RetryingIngest", "ride_out"]

log = logging.getLogger("pipelines.job.stream")  # the run loop's logger: its one lines


# What a run retries rather than dies of: the source cannot be read now (the broker or the S3 landing down), or it
# lost messages until an operator accepts the loss (`sessionctl accept-loss`, beside the running stream); and the
# warehouse's object store (S3) not answering, in ingest (raw_events) or in the query (its source and its sink).
RETRIED_SOURCE_ERRORS = (SourceUnavailable, SourceDataLost, StorageUnavailable)
SOURCE_RETRY_CAP_S = 60.0  # the longest wait between two attempts while the source (or the warehouse) fails


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0].removesuffix(S3_ADVICE) if text else type(error).__name__


class RetryCounts(Protocol):
    """What RetryingIngest counts in: the run's summary (pipelines.job.run_summary.RunSummary), of which it needs
    only these."""

    source_errors: int
    last_source_error: str | None
    storage_errors: int
    last_storage_error: str | None

    def add_ingest(self, result: IngestResult) -> None: ...


class RetryingIngest:
    """run's ingest: a source error is logged as its one line and counted in the summary, and the next attempt waits
    twice as long as the last (from the poll interval up to SOURCE_RETRY_CAP_S); a success resets it. The stream
    goes on with what raw_events holds meanwhile.

    It keeps the query's failures of storage too (`query_failed`): the same backoff, counted apart, until a batch
    commits again (`query_progressed`)."""

    def __init__(self, config: SessionsConfig, summary: RetryCounts, poll_seconds: float, lease: Lease,
                 *, large: LargeInput = "read") -> None:
        self.config, self.summary, self.poll_seconds = config, summary, poll_seconds
        self.large = large  # the run's Spark tasks, for large landed files
        self.lease = lease  # the run's job lease: its ingest commits are fenced by it too
        self.failures = 0
        self.query_failures = 0  # queries in a row that storage failed

    def _delay(self, failures: int) -> float:
        return min(self.poll_seconds * 2 ** failures, max(SOURCE_RETRY_CAP_S, self.poll_seconds))

    def __call__(self) -> float:
        """One ingest; the seconds to wait until the next one."""
        try:
            with object_store_errors(self.config.raw_events_table):  # raw_events' (the landing's are the source's)
                result = ingest(self.config, fenced_by=(self.lease,), large=self.large)
        except RETRIED_SOURCE_ERRORS as error:
            self.failures += 1
            delay = self._delay(self.failures)
            line = _first_line(error)
            self.summary.source_errors += 1
            self.summary.last_source_error = line
            log.warning("%s [run retries by itself: %d failed ingest(s) in a row, next attempt in %.0f s; the stream "
                        "goes on with what raw_events holds]", line, self.failures, delay)
            return delay
        if self.failures:
            log.warning("the source answers again after %d failed ingest(s)", self.failures)
        self.failures = 0
        self.summary.add_ingest(result)
        return self.poll_seconds

    def query_failed(self, error: StorageUnavailable) -> float:
        """Count and log (one line) a query that storage failed; the seconds to wait before it starts again."""
        self.query_failures += 1
        delay = self._delay(self.query_failures)
        line = _first_line(error)
        self.summary.storage_errors += 1
        self.summary.last_storage_error = line
        log.warning("%s [run restarts the stream from its checkpoint by itself: %d failed start(s) in a row, next in "
                    "%.0f s; nothing committed is lost or written twice]", line, self.query_failures, delay)
        return delay

    def query_progressed(self) -> None:
        """A batch committed: the warehouse answers again."""
        if self.query_failures:
            log.warning("the warehouse answers again: the stream committed a batch after %d failed start(s)",
                        self.query_failures)
        self.query_failures = 0


def ride_out(config: SessionsConfig, lease: Lease, stop: threading.Event, tick: float,
             delay: float) -> StreamRequest | None:
    """Wait `delay` seconds with the query stopped (storage failed it), the job lease still checked; a stop or erasure
    request that arrives meanwhile is returned at once, None when the wait ran out or the caller stopped."""
    deadline = time.monotonic() + delay
    while not stop.is_set() and time.monotonic() < deadline:
        lease.check()
        with suppress(StorageUnavailable):  # an S3 lease store that does not answer now: asked again next tick
            request = pending_request(config, lease)
            if request is not None:
                return request
        stop.wait(min(tick, max(0.0, deadline - time.monotonic())))
    return None
