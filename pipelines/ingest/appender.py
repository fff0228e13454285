"""The ingest commit: the `Appender` every source appends raw_events rows through, one commit each with the next
ingest_seq and the ingest clock after it, fenced by the leases its caller holds; and what a source is to it (`Source`:
one kind of landing, `Ingested`: what it reports). The table it writes -- schema, rows, ingest_seq, the clock -- is
pipelines.ingest.table's."""
from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from pipelines.config import SessionsConfig
from pipelines.coordination import kill_point
from pipelines.coordination.fencing import committing, fence
from pipelines.coordination.leases import Lease
from pipelines.errors import ConcurrentIngest, LeaseLost
from pipelines.ingest.erased import ErasedUsers
from pipelines.ingest.table import (
    CLOCK_KEY,
    CLOCK_KIND,
    CLOCK_SOURCE,
    RAW_SCHEMA,
    TABLE_SCHEMA,
    IngestClock,
    LargeInput,
    ParsedSpan,
    RowSource,
    TaskParse,
    latest_seq,
    line_rows,
    standing_erasure,
    table_schema,
)
from pipelines.storage import is_s3, storage_options

__all__ = ["Appender", "Ingested", "Source"]

log = logging.getLogger("pipelines.ingest")


def _us(moment: dt.datetime) -> int:
    return (moment - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(microseconds=1)


_STEPS_LOGGED: set[tuple[IngestClock, bool]] = set()  # what this process logged already (a poll every few seconds)


class Appender:
    """Appends ingest commits to raw_events, each with the next ingest_seq and the ingest clock after it.

    With `leases` (the ingest lease first, then any other lease the caller holds, such as the run's job lease) each
    commit is fenced (pipelines.coordination.fencing): refused with LeaseLost once a newer holder took one of them over or
    committed to raw_events, and made on the very version it checked -- so no ingest_seq is ever committed twice."""

    def __init__(self, config: SessionsConfig, seq: int, clock: IngestClock | None = None,
                 leases: Sequence[Lease] = (), version: int | None = None):
        self.config, self.uri = config, config.raw_events_table
        self.options = storage_options(config, self.uri)
        self.leases = tuple(leases)
        self.version = version  # the table version `seq` was read at (None: not known; read it at each commit)
        self.seq, self.rows, self.rejected = seq, 0, 0
        self.first_seq: int | None = None
        self.clock = clock or IngestClock()
        self.clock_rows: list[dt.datetime] = []  # event times of the clock rows this appender wrote
        self.erased = ErasedUsers.load(config)
        self.dropped: dict[str, int] = {}  # erased users whose late events this appender dropped -> events
        self.spec = config.session_spec.input  # where each line's fields are (SESSIONS_SPEC), read once

    def append(self, sources: list[RowSource], metadata: dict[str, str]) -> None:
        ingested_at = dt.datetime.now(dt.timezone.utc)
        batch, dropped = standing_erasure(self.erased, line_rows(
            sources, self.seq + 1, ingested_at, dt.timedelta(milliseconds=self.config.max_future_ms), spec=self.spec))
        self._commit_rows(batch, ingested_at, metadata)
        self._count(batch.num_rows, batch.num_rows - batch["reject_reason"].null_count, dropped)

    def append_by_tasks(self, parse: TaskParse, metadata_of: Callable[[ParsedSpan], dict[str, str]]) -> ParsedSpan:
        """One commit of rows that Spark tasks parsed and wrote (`parse`: a Span of a file, or Kafka ranges), with
        `metadata_of` its result (the file's position after it; the partitions' next offsets). The files of a refused
        commit are removed; after a failure that may have committed (S3 did not answer) they stay, in no version or
        in this one."""
        if not DeltaTable.is_deltatable(self.uri, storage_options=self.options):
            # The tasks' files are added to a table: its first commit, empty, holds no ingest_seq.
            write_deltalake(self.uri, table_schema(self.spec).empty_table(), mode="append",
                            storage_options=self.options)
        ingested_at = dt.datetime.now(dt.timezone.utc)
        parsed = parse(table_uri=self.uri, seq=self.seq + 1, ingested_at=ingested_at,
                       max_future=dt.timedelta(milliseconds=self.config.max_future_ms), erased=self.erased,
                       spec=self.spec)
        clock = self.clock.after_newest(parsed.newest_us, _us(ingested_at))
        kill_point("ingest:files-written")

        def write(table: DeltaTable | None, properties: CommitProperties) -> None:
            if table is None:  # created above
                raise ConcurrentIngest(f"raw_events at {self.uri} is gone: ingest again")
            table.create_write_transaction(list[AddAction | RemoveAction](parsed.actions), "append",
                                           table_schema(self.spec), commit_properties=properties)
        try:
            self._commit(clock, metadata_of(parsed), write)
        except (LeaseLost, ConcurrentIngest, CommitFailedError):
            parsed.discard()
            raise
        self._count(parsed.rows, parsed.rejected, parsed.dropped)
        return parsed

    def _count(self, rows: int, rejected: int, dropped: Mapping[str, int]) -> None:
        self.rows += rows
        self.rejected += rejected
        for user, events in dropped.items():
            self.dropped[user] = self.dropped.get(user, 0) + events

    def append_clock(self, now: dt.datetime | None = None) -> dt.datetime | None:
        """Append a clock row when the configured idle time has passed without an event (README "Idle close");
        returns its event time, or None when none is due. `now` is for tests of the rule; ingest passes none."""
        now = now or dt.datetime.now(dt.timezone.utc)
        due_us, step = self.clock.judge(_us(now), self.config.rules.idle_close_ms * 1000)
        back = self.clock.active_us is not None and _us(now) < self.clock.active_us
        if step is not None and (self.clock, back) not in _STEPS_LOGGED:  # one line per clock and kind of step
            if len(_STEPS_LOGGED) > 1000:
                _STEPS_LOGGED.clear()
            _STEPS_LOGGED.add((self.clock, back))
            log.warning("%s", step)
        if due_us is None:
            return None
        at = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=due_us)
        row: dict[str, list[Any]] = {name: [None] for name in TABLE_SCHEMA.names}
        row.update(event_time=[at], source_file=[CLOCK_SOURCE], line_no=[0], ingest_seq=[self.seq + 1],
                   line_key=[1], ingested_at=[now], row_kind=[CLOCK_KIND])
        self._commit_rows(pa.table(row, schema=TABLE_SCHEMA), now, {"idle_close": "clock row"})
        self.clock_rows.append(at)
        return at

    def _commit_rows(self, batch: pa.Table, ingested_at: dt.datetime, metadata: dict[str, str]) -> None:
        if "row_kind" not in batch.column_names:  # line rows (line_rows) carry no kind: null
            # In the table's order: row_kind, then the spec's field_<name> columns (table_schema).
            batch = batch.add_column(len(RAW_SCHEMA), "row_kind", pa.nulls(batch.num_rows, pa.string()))

        def write(table: DeltaTable | None, properties: CommitProperties) -> None:
            write_deltalake(table if table is not None else self.uri, batch, mode="append",
                            storage_options=self.options,
                            # Tables written before line_key, ingested_at and row_kind get them; a field the session
                            # spec gained becomes a column (null in the rows before).
                            schema_mode="merge",
                            commit_properties=properties)
        self._commit(self.clock.after(batch, _us(ingested_at)), metadata, write)

    def _commit(self, clock: IngestClock, metadata: dict[str, str],
                write: Callable[[DeltaTable | None, CommitProperties], None]) -> None:
        if not is_s3(self.uri):
            os.makedirs(self.uri, exist_ok=True)
        committing(lambda: self._commit_once(clock, metadata, write), self.uri)
        self.seq += 1
        self.clock = clock
        self.first_seq = self.seq if self.first_seq is None else self.first_seq

    def _commit_once(self, clock: IngestClock, metadata: dict[str, str],
                     write: Callable[[DeltaTable | None, CommitProperties], None]) -> None:
        """One attempt at the commit of ingest_seq seq + 1, on the version loaded here (fencing.committing)."""
        table = DeltaTable(self.uri, storage_options=self.options) if DeltaTable.is_deltatable(
            self.uri, storage_options=self.options) else None
        transactions, fenced = fence(table, self.leases, self.uri)
        # Whoever committed since this ingest read its seq (a compaction, or an ingester without the lease: an older
        # version's) must not have taken the next seq: this commit lands on exactly the version checked here.
        if table is not None and table.version() != self.version and (found := latest_seq(table)) > self.seq:
            raise ConcurrentIngest(f"raw_events at {self.uri} holds ingest_seq {found} and this ingest would commit "
                                   f"{self.seq + 1}: another process appended to it meanwhile; ingest again")
        write(table, CommitProperties(custom_metadata={
            "ingest_seq": str(self.seq + 1), CLOCK_KEY: clock.to_json(), **metadata, **fenced},
            app_transactions=transactions or None, max_commit_retries=0))
        self.version = table.version() + 1 if table is not None else 0

    def table_id(self) -> str:
        return str(DeltaTable(self.uri, storage_options=self.options).metadata().id)

    def append_rejected(self, rows: list[tuple[str, int, str, str]], metadata: dict[str, str]) -> None:
        """One commit of rejected rows that are no landed line: (source_file, line_no, reject_reason, raw) each, such
        as a Kafka gap an operator accepted (pipelines.ingest.kafka.accept_loss). The sink quarantines them."""
        ingested_at = dt.datetime.now(dt.timezone.utc)
        columns: dict[str, list[Any]] = {name: [None] * len(rows) for name in RAW_SCHEMA.names}
        columns.update(source_file=[r[0] for r in rows], line_no=[r[1] for r in rows],
                       reject_reason=[r[2] for r in rows], raw=[r[3] for r in rows],
                       line_key=list(range(1, len(rows) + 1)), ingest_seq=[self.seq + 1] * len(rows),
                       ingested_at=[ingested_at] * len(rows))
        self._commit_rows(pa.table(columns, schema=RAW_SCHEMA), ingested_at, metadata)
        self._count(len(rows), len(rows), {})


@dataclass(frozen=True)
class Ingested:
    """What one source reports of one ingest (the rows are counted by the Appender)."""
    files: int           # files with lines ingested
    refused: int = 0     # entries refused unread
    waiting: int = 0     # files left in landing for a later ingest
    deferred: int = 0    # files left for Spark tasks (LargeInput "defer")
    by_tasks: int = 0    # files whose lines Spark tasks read (LargeInput: IngestTasks)


class Source(Protocol):
    """One kind of landing (a module: local, s3): appends what is new through the appender, at most `step` files
    per commit, each commit's metadata saying what it holds so that a crash after it neither loses nor repeats."""

    def ingest(self, config: SessionsConfig, table: DeltaTable | None, appender: Appender, step: int,
               large: LargeInput) -> Ingested: ...
