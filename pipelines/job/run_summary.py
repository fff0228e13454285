"""What a catch-up or a run did: `RunSummary`, the counts both run loops (pipelines.job.stream) keep and the CLI prints
as one JSON line -- ingest's, the query's batches (read from Spark's progress), the failures a run rode out
(pipelines.job.run_retries) and where the seconds went. One owner for the result's shape, apart from the loops."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from pyspark.sql.streaming import StreamingQuery

from pipelines.ingest import IngestResult

__all__ = ["RunSummary"]


@dataclass
class RunSummary:
    """What a catch-up or a run did (the CLI prints it as one JSON line)."""
    ingested_files: int = 0
    ingested_rows: int = 0
    rejected_lines: int = 0
    batches: int = 0
    input_rows: int = 0
    sessions_written: int = 0
    quarantined: int = 0
    last_committed_batch: int | None = None
    seconds: float = 0.0
    refused_files: int = 0  # symlinks and special files moved to landing/_refused/ (a quarantine row each)
    waiting_files: int = 0  # files left in landing at the last ingest: still being written
    files_read_by_tasks: int = 0  # large landed files whose lines Spark tasks read and parsed where they are
    stopped_by: str | None = None  # run only: "caller" (event, Ctrl-C) or "stop request" (sessionctl stop)
    lease_epoch: int | None = None  # the epoch of the job lease it ran under (its commits record it)
    savepoint: dict[str, Any] | None = None  # the savepoint a stop request asked for, when taken
    clock_rows: int = 0     # idle-close clock rows ingest appended (README "Idle close")
    last_clock: str | None = None  # the newest one's event time
    source_errors: int = 0  # run only: ingests that failed because the source could not be read (then retried)
    last_source_error: str | None = None  # the newest one's line
    # run only: queries that failed because the warehouse's object store (S3) did not answer, each then restarted
    # from the checkpoint once it waited (exactly once: the sink's appends are idempotent per batch id)
    storage_errors: int = 0
    last_storage_error: str | None = None  # the newest one's line
    # Where the seconds went, for the operator who asks why a catch-up took long: `spark` (the JVM start, ~0 when
    # attached to a running session), `ingest` (catch-up's, beside the JVM start: the two overlap), `query_start`
    # (the source, the plan, the query), `stream` (its batches, until it stopped).
    phase_seconds: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # What absorb_progress has counted (not fields: not part of the result), in constant memory however long the
        # run: the query run it last read, the newest batch id of that run it counted, and its newest progress's time.
        self._query_run: str | None = None
        self._counted_batch = -1
        self._last_report: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def timed(self, phase: str, started: float) -> None:
        """Record `phase` as lasting from `started` (time.monotonic) until now."""
        self.phase_seconds[phase] = round(time.monotonic() - started, 3)

    def add_ingest(self, result: IngestResult) -> None:
        self.ingested_files += result.files
        self.ingested_rows += result.rows
        self.rejected_lines += result.rejected
        self.refused_files += result.refused
        self.waiting_files = result.waiting
        self.files_read_by_tasks += result.by_tasks
        if result.clock is not None:
            self.clock_rows += 1
            self.last_clock = result.clock

    def absorb_progress(self, query: StreamingQuery) -> bool:
        """Count the batches the query ran since the last call; True when there were new ones.

        Within one run of a query its batch ids grow, so one high-water mark per run is all it keeps (a restarted
        query starts a new run: a batch that failed is counted when it runs again). Only progress of a batch that ran
        counts: an idle trigger reports the id of the batch it did not run, without an `addBatch` phase."""
        last = query.lastProgress
        if last is None or (last.timestamp == self._last_report and str(query.runId) == self._query_run):
            return False  # nothing reported since: Spark's recent progress (its last 100) not read again
        if str(query.runId) != self._query_run:
            self._query_run, self._counted_batch = str(query.runId), -1
        self._last_report = last.timestamp
        new = False
        for progress in query.recentProgress:
            if progress.batchId > self._counted_batch and "addBatch" in (progress.durationMs or {}):
                self._counted_batch = progress.batchId
                self.batches += 1
                self.input_rows += int(progress.numInputRows)
                new = True
        return new
