"""Landing -> raw_events: the replayable log the stream reads; `ingest` dispatches to the configured source.

Every landed line becomes one row of the raw_events Delta table, valid or not (a rejected line keeps
its raw text and a reason), so the stream's exactly-once sink is the single writer of the quarantine
table and a replay from any source position reproduces it. Each ingest commit carries a monotone
`ingest_seq`, the stream's offsets (see pipelines.ingest.table).

One module per concern: lines (the pure rules for one line), table (the raw_events table every source
shares), appender (its commits), landing (the landing layout), positions (how far local files were read), and one
module per source -- local (a landing directory, tail-read), s3 (landing objects) and kafka (a topic, offsets in the
Delta log) -- each an `appender.Source`.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from pipelines.config import SessionsConfig
from pipelines.coordination.leases import Lease, waiting_lease
from pipelines.ingest.appender import Appender, Source
from pipelines.ingest.lines import classify_line, parse_event_time, parse_line
from pipelines.ingest.positions import INGESTED_DIR, REFUSED_DIR, LandedFile
from pipelines.ingest.table import (
    HISTORY_PAGE,
    RAW_SCHEMA,
    IngestResult,
    LargeInput,
    latest_clock,
    latest_ingest_seq,
    latest_seq,
    open_raw_table,
)
from pipelines.storage import is_s3

__all__ = [
    "INGESTED_DIR", "RAW_SCHEMA", "REFUSED_DIR", "IngestResult", "LandedFile", "LargeInput", "classify_line", "ingest",
    "latest_ingest_seq", "parse_event_time", "parse_line",
]


def _source(config: SessionsConfig) -> Source:
    """The source the configuration names: a Kafka topic (SESSIONS_KAFKA_BOOTSTRAP and SESSIONS_KAFKA_TOPIC), else
    the landing directory, or landing objects on S3."""
    # Imported here: a home reads one source, and the others' clients (confluent_kafka, boto3) stay out of
    # every process that does not.
    if config.uses_kafka:
        from pipelines.ingest import kafka
        return kafka
    if is_s3(config.landing_uri):
        from pipelines.ingest import s3
        return s3
    from pipelines.ingest import local
    return local


def ingest(config: SessionsConfig, *, files_per_commit: int = 16, fenced_by: Sequence[Lease] = (),
           now: dt.datetime | None = None, large: LargeInput = "read") -> IngestResult:
    """Append the new complete lines of every landed file to raw_events and move finished files to
    landing/_ingested/<UTC day>/ (see the docstrings of pipelines.ingest.local and pipelines.ingest.s3); or, with
    Kafka configured, the topic's new messages (pipelines.ingest.kafka: offsets in the same Delta commit). Then,
    when no event has been ingested for SESSIONS_IDLE_CLOSE_MINUTES, one clock row (README "Idle close").

    Crash-safe: each commit carries what it holds (local files: their positions; S3 objects: `name:size:mtime`); after
    a crash the positions are rolled forward from the commits, and an object already committed is only archived.

    Under the ingest lease (waited for at most SESSIONS_LEASE_WAIT_S): every commit is fenced by it and by the leases
    in `fenced_by` (a run passes its job lease), so an ingester that lost its lease commits nothing more.

    `now` is the wall-clock time the idle close judges by (tests of the rule; None: the current time).

    `large`: what becomes of a landed file or S3 object with at least SESSIONS_INGEST_TASK_MIB new bytes, or a Kafka
    backlog of at least SESSIONS_KAFKA_COMMIT_MESSAGES (table.LargeInput) -- read here, left for later ("defer": no
    later file is read before it either, so ingest order stays file order), or read and parsed by Spark tasks, the
    tasks writing raw_events' files and this process making the one commit (IngestTasks:
    pipelines.job.ingest_tasks).
    """
    # Catch-up and run hold the job lease already; this one serialises every writer of raw_events.
    with waiting_lease(config.lease_uri, "ingest", "ingest", config.lease_ttl_s, timeout_s=config.lease_wait_s) as held:
        table = open_raw_table(config)
        history = table.history(limit=HISTORY_PAGE) if table is not None else None  # read once, for both
        appender = Appender(config, latest_seq(table, history) if table is not None else 0, latest_clock(table, history),
                            leases=(held, *fenced_by), version=table.version() if table is not None else None)
        found = _source(config).ingest(config, table, appender, max(1, files_per_commit), large)
        # Only after the source answered: a source that cannot be read (S3 or the broker down) may hold events,
        # so its silence is not idleness.
        # Nor is a landing whose large files wait for Spark tasks ("defer").
        clock = appender.append_clock(now) if not found.deferred else None
        if appender.dropped:
            _record_drops(config, appender)
    return IngestResult(found.files, appender.rows, appender.rejected, appender.first_seq, appender.seq,
                        found.refused, found.waiting, clock.isoformat().replace("+00:00", "Z") if clock else None,
                        found.deferred, found.by_tasks)


def _record_drops(config: SessionsConfig, appender: Appender) -> None:
    """The standing erasure's drops: counted in the erasure log under the keyed hash, and the dropped lines blanked in
    the landed files (archived by now) so that no copy of them stays."""
    import uuid

    from pipelines.ingest.erase_lines import erase_landed_lines
    from pipelines.ingest.erased import DROPPED, log_erasure

    erase_landed_lines(config, sorted(appender.dropped))
    for user, hashed in appender.erased.hashes_of(appender.dropped).items():
        log_erasure(config, erasure_id=f"drop-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}",
                    hashed=hashed, status=DROPPED, removed={"events_dropped": appender.dropped[user]})
