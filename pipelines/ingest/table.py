"""The raw_events table every source appends to: its schema, its rows, ingest_seq, the ingest clock, what Spark tasks
parse. The commits themselves are made by pipelines.ingest.appender's Appender, which every source (a Source there)
appends through.

Each ingest commit carries a monotone `ingest_seq` (in the rows and in the commit metadata): the stream's offsets
are ingest sequence numbers, which OPTIMIZE and VACUUM of the raw table do not disturb. Decisions that depend on
the moment of ingest (the far-future rule) are made here and stored in the row, so a replay decides the same way.
"""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.transaction import AddAction

from pipelines.config import SessionsConfig
from pipelines.core.spec import DEFAULT_INPUT, InputSpec
from pipelines.errors import Result
from pipelines.ingest import columnar
from pipelines.ingest.erased import ErasedUsers, user_named_by
from pipelines.ingest.lines import Lines, classify_line
from pipelines.storage import read_rows, storage_options

__all__ = ["CLOCK_KEY", "CLOCK_KIND", "CLOCK_MAX_IDLE_PERIODS", "CLOCK_SOURCE", "HISTORY_PAGE", "RAW_SCHEMA", "TABLE_SCHEMA", "IngestClock", "IngestResult", "LargeInput", "ParsedSpan", "RowSource", "KafkaRange", "Span", "IngestTasks", "TaskParse", "latest_clock", "latest_ingest_seq", "latest_seq", "line_rows", "open_raw_table", "raw_schema", "span_from", "standing_erasure", "table_schema", "usable"]

RAW_SCHEMA = pa.schema([
    ("event_id", pa.string()),
    ("user_id", pa.string()),
    ("event_time", pa.timestamp("us", tz="UTC")),
    ("event_type", pa.string()),
    ("page", pa.string()),
    ("source_file", pa.string()),
    ("line_no", pa.int64()),
    ("ingest_seq", pa.int64()),
    ("reject_reason", pa.string()),  # null for a valid event
    ("raw", pa.string()),            # the line as landed, kept only for rejected lines
    # The row's position in its ingest commit (1, 2, ...): with ingest_seq the key a late event carries through
    # the stream back to its line -- line_no alone repeats across the files of one commit. Null in tables
    # written before it existed (readers fall back to -line_no).
    ("line_key", pa.int64()),
    ("ingested_at", pa.timestamp("us", tz="UTC")),  # the commit's clock, which the far-future rule was judged by
])
HISTORY_PAGE = 50               # commits searched to roll the positions forward after a crash
# The table's own columns beyond a line's: `row_kind` is null for a landed line or message, "clock" for a clock row.
TABLE_SCHEMA = RAW_SCHEMA.append(pa.field("row_kind", pa.string()))
CLOCK_KIND = "clock"
CLOCK_SOURCE = "_clock"         # source_file of a clock row (line_no 0)
CLOCK_KEY = "ingest_clock"      # commit metadata: the IngestClock after this commit
# A clock row moves event time at most this many idle periods past the newest event or clock row (IngestClock.due).
CLOCK_MAX_IDLE_PERIODS = 2


def raw_schema(spec: InputSpec = DEFAULT_INPUT) -> pa.Schema:
    """The rows of one commit (line_rows): RAW_SCHEMA, then one nullable `field_<name>` column per typed field of the
    session spec (SESSIONS_SPEC), so that a replay sees the values ingest read."""
    return pa.schema([*RAW_SCHEMA, *columnar.field_schema(spec)]) if spec.fields else RAW_SCHEMA


def table_schema(spec: InputSpec = DEFAULT_INPUT) -> pa.Schema:
    """The table's columns as this spec's ingest writes them: TABLE_SCHEMA, then the fields' columns (a field new to
    the table is added by schema evolution: the Appender's merge)."""
    return pa.schema([*TABLE_SCHEMA, *columnar.field_schema(spec)]) if spec.fields else TABLE_SCHEMA

def _iso(us: int) -> str:
    try:
        return (dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=us)).isoformat(
            timespec="milliseconds").replace("+00:00", "Z")
    except (OverflowError, ValueError):
        return f"{us} us after the epoch"


@dataclass(frozen=True)
class IngestClock:
    """Event time as ingest has seen it, recorded in the metadata of every ingest commit so that whichever host
    ingests next decides from the table, not from its memory (README "Idle close").

    `max_event_us`: the largest event_time of a valid event or a clock row in raw_events -- what the stream's
    watermark follows. `active_us`: the ingested_at of the newest commit that held one. When ingest has appended
    neither for the idle time, a clock row is due at `max_event_us + (now - active_us)`: event time is taken to
    have moved on at wall-clock speed from the last point the source showed it, as continuing traffic would have
    moved it. Not the wall clock itself: a source that delivers late (a 15-minute buffer) or a replayed backlog
    (last week's files) would see a clock far ahead of its events and every event after the pause judged late.
    Nor more than CLOCK_MAX_IDLE_PERIODS idle periods past `max_event_us` in one row, and none while the wall clock
    is behind `active_us`: a clock that steps (NTP, a skewed host) is a line in the log, not a jump (`judge`)."""
    max_event_us: int | None = None
    active_us: int | None = None

    def after(self, rows: pa.Table, ingested_at_us: int) -> IngestClock:
        """The clock once `rows` (raw_events rows of one commit) are appended."""
        valid = rows.filter(pc.is_null(rows["reject_reason"]))
        if valid.num_rows == 0:
            return self
        return self.after_newest(int(pc.max(valid["event_time"].cast(pa.int64())).as_py()), ingested_at_us)

    def after_newest(self, newest_us: int | None, ingested_at_us: int) -> IngestClock:
        """The clock once a commit whose newest valid event_time is `newest_us` (None: it held none) is appended."""
        if newest_us is None:
            return self
        return IngestClock(newest_us if self.max_event_us is None else max(self.max_event_us, newest_us),
                           ingested_at_us)

    def due(self, now_us: int, idle_us: int) -> int | None:
        """The event time (us, whole ms) of the clock row to append at `now_us`, or None: none yet, or off."""
        return self.judge(now_us, idle_us)[0]

    def judge(self, now_us: int, idle_us: int) -> tuple[int | None, str | None]:
        """(due, step): `due` as above; `step`, one line for the log when the wall clock disagrees with the commit
        history -- `now_us` before `active_us` (the clock stepped back: no clock row until it is past that again), or
        more than CLOCK_MAX_IDLE_PERIODS idle periods after it (a clock stepped forward, or no ingest ran that long:
        the row moves event time by that bound only, never by the whole step). The bound keeps a skewed host from
        putting the watermark hours ahead of the source, where every live event would be judged late."""
        if idle_us <= 0 or self.max_event_us is None or self.active_us is None:
            return None, None
        idle = now_us - self.active_us
        if idle < 0:
            return None, (f"idle close: the wall clock ({_iso(now_us)}) is {-idle / 1e6:.3f} s behind the newest "
                          f"raw_events commit that held an event or a clock row ({_iso(self.active_us)}): it stepped "
                          "back, or hosts disagree (NTP); no clock row until it is past that time again")
        if idle < idle_us:
            return None, None
        bound = CLOCK_MAX_IDLE_PERIODS * idle_us
        if idle <= bound:
            return (self.max_event_us + idle) // 1000 * 1000, None
        return (self.max_event_us + bound) // 1000 * 1000, (
            f"idle close: the wall clock ({_iso(now_us)}) is {idle / 60e6:.1f} min past the newest raw_events commit "
            f"that held an event or a clock row ({_iso(self.active_us)}), more than {CLOCK_MAX_IDLE_PERIODS} idle "
            f"periods: the clock row moves event time by {bound / 60e6:g} min only (a clock step forward, or no ingest "
            "ran meanwhile)")

    def to_json(self) -> str:
        return json.dumps({"max_event_us": self.max_event_us, "active_us": self.active_us})

    @classmethod
    def from_json(cls, text: str) -> IngestClock:
        data = json.loads(text)
        return cls(data.get("max_event_us"), data.get("active_us"))


def latest_clock(table: DeltaTable | None, history: list[dict[str, Any]] | None = None) -> IngestClock:
    """The clock the newest commit records; for a table written before clocks, recomputed from its rows once
    (`history`: the table's newest HISTORY_PAGE commits, if already read)."""
    if table is None:
        return IngestClock()
    commits = history if history is not None else table.history(limit=HISTORY_PAGE)
    for commit in sorted(commits, key=lambda c: int(c.get("version", 0)), reverse=True):
        if CLOCK_KEY in commit:
            return IngestClock.from_json(commit[CLOCK_KEY])
    columns = [c for c in ("event_time", "ingested_at") if c in table.schema().to_arrow().names]
    rows = read_rows(table, columns=columns, where="reject_reason IS NULL")
    if rows.num_rows == 0:
        return IngestClock()
    newest = int(pc.max(rows["event_time"].cast(pa.int64())).as_py())
    active = (int(pc.max(rows["ingested_at"].cast(pa.int64())).as_py()) if "ingested_at" in columns
              and rows["ingested_at"].null_count < rows.num_rows else None)
    if active is None:  # no ingest time in the rows: the newest commit's time stands in
        active = max(int(c.get("timestamp", 0)) for c in table.history(limit=1)) * 1000
    return IngestClock(newest, active)


@dataclass(frozen=True)
class RowSource:
    """What becomes raw_events rows from one landed file: its complete lines, or one row for a refused file."""
    name: str
    lines: Lines
    refused: str | None = None
    refused_raw: str | None = None


def line_rows(sources: Sequence[RowSource], seq: int, ingested_at: dt.datetime, max_future: dt.timedelta,
              *, per_line: bool = False, keyed_by_line_no: bool = False, spec: InputSpec = DEFAULT_INPUT) -> pa.Table:
    """The raw_events rows of one commit. The columnar path (pipelines/ingest/columnar.py: pyarrow's JSON reader for
    the lines it proves valid, classify_line for the rest) gives the same rows as the per-line loop below, which
    stays the specification (`per_line=True`; tests/test_ingest_columnar.py compares the two).

    line_key is the row's position in the commit, or with `keyed_by_line_no` its line number: a commit of one file
    whose lines Spark tasks parse apart (Span), where no task knows how many rows the others made.

    `spec`: where the fields are in each line and which typed fields it reads (SESSIONS_SPEC); the rows then have
    raw_schema(spec)'s columns."""
    future_limit = ingested_at + max_future
    schema = raw_schema(spec)
    if not per_line:
        lines = columnar.row_columns(sources, future_limit, spec=spec)
        n = len(lines["line_no"])
        keys = lines["line_no"] if keyed_by_line_no else pa.array(np.arange(1, n + 1, dtype=np.int64))
        return pa.table({**lines, "line_key": keys,
                         "ingest_seq": pa.nulls(n, pa.int64()).fill_null(seq),
                         "ingested_at": pa.nulls(n, RAW_SCHEMA.field("ingested_at").type).fill_null(ingested_at)},
                        schema=schema)
    columns: dict[str, list[Any]] = {f.name: [] for f in schema}
    read = ("event_id", "user_id", "event_time", "event_type", "page", *(f.column for f in spec.fields))

    def add(fields_: Mapping[str, Any], source_file: str, line_no: int, reason: str | None, raw: str | None) -> None:
        for name in read:
            columns[name].append(fields_.get(name))
        columns["source_file"].append(source_file)
        columns["line_no"].append(line_no)
        columns["reject_reason"].append(reason)
        columns["raw"].append(raw)
        columns["line_key"].append(line_no if keyed_by_line_no else len(columns["line_key"]) + 1)

    for source in sources:
        if source.refused is not None:
            add({}, source.name, 0, source.refused, source.refused_raw)
        for line_no, raw_bytes in source.lines:
            classified = classify_line(raw_bytes, future_limit, spec)
            if classified is not None:  # blank lines carry nothing to keep (they keep their numbers)
                fields_, reason, text = classified
                add(fields_, source.name, line_no, reason, text if reason else None)
    n = len(columns["line_key"])
    columns["ingest_seq"] = [seq] * n
    columns["ingested_at"] = [ingested_at] * n
    return pa.table(columns, schema=schema)


@dataclass(frozen=True)
class Span:
    """The complete lines of one landed file that Spark tasks read and parse where the file is (IngestTasks), not
    this process: bytes [start, end) of the file at `uri`, numbered on from `lines_before` as split_lines numbers
    them (`open_before`: the line before `start` was taken unterminated, so the first newline closes it)."""
    name: str            # source_file of its rows
    uri: str             # a local path or s3://bucket/key
    start: int
    end: int
    lines_before: int
    open_before: bool

    @property
    def first_line(self) -> int:
        return self.lines_before if self.open_before else self.lines_before + 1


@dataclass(frozen=True)
class ParsedSpan:
    """What the tasks made of a Span: the raw_events data files they wrote (in no table version until the ingest
    commit adds them) and what the commit needs to know of their rows."""
    actions: list[AddAction]
    rows: int
    rejected: int
    newest_us: int | None       # the newest valid event_time (the ingest clock's)
    lines: int = 0              # the file's lines consumed once the span is (FilePosition.lines)
    dropped: dict[str, int] = field(default_factory=dict)  # the standing erasure's drops: user -> events
    discard: Callable[[], None] = lambda: None  # remove the files: the commit was refused
    next_offsets: dict[int, int] = field(default_factory=dict)  # Kafka: partition -> next offset after the ranges


@dataclass(frozen=True)
class KafkaRange:
    """Offsets [start, end) of one partition for one Spark task to read; its rows' line_key is `key_base` plus the
    row's position (unique in the commit: the ranges' bases are apart by their lengths)."""
    partition: int
    start: int
    end: int
    key_base: int


class TaskParse(Protocol):
    """What Appender.append_by_tasks calls: Spark tasks parse and write the rows of ingest_seq `seq`."""

    def __call__(self, *, table_uri: str, seq: int, ingested_at: dt.datetime, max_future: dt.timedelta,
                 erased: ErasedUsers, spec: InputSpec = DEFAULT_INPUT) -> ParsedSpan: ...


class IngestTasks(Protocol):
    """Spark tasks that read and parse with the rules of line_rows and write raw_events files
    (pipelines.job.ingest_tasks): a Span's lines (files with at least `min_bytes` new bytes), or Kafka ranges."""
    min_bytes: int

    def __call__(self, span: Span, *, table_uri: str, seq: int, ingested_at: dt.datetime,
                 max_future: dt.timedelta, erased: ErasedUsers, spec: InputSpec = DEFAULT_INPUT) -> ParsedSpan: ...

    def messages(self, config: SessionsConfig, ranges: Sequence[KafkaRange], *, table_uri: str, seq: int,
                 ingested_at: dt.datetime, max_future: dt.timedelta, erased: ErasedUsers,
                 spec: InputSpec = DEFAULT_INPUT) -> ParsedSpan: ...


# What ingest does with large input -- a file with at least SESSIONS_INGEST_TASK_MIB new bytes, a Kafka backlog of at
# least SESSIONS_KAFKA_COMMIT_MESSAGES: read it here ("read"), leave it and everything after it for a later ingest
# ("defer": catch-up's ingest while the JVM starts), or have Spark tasks read it (IngestTasks).
LargeInput = Literal["read", "defer"] | IngestTasks


def usable(large: LargeInput, table: DeltaTable | None, spec: InputSpec = DEFAULT_INPUT) -> LargeInput:
    """`large`, but "read" in place of Spark tasks while raw_events' columns are not those the tasks write
    (table_schema(spec)): written before its newest columns, or before a field the spec gained (the next commit made
    here merges them in), or with a field the spec no longer has."""
    if not isinstance(large, str) and table is not None and (
            table.schema().to_arrow().names != table_schema(spec).names):
        return "read"
    return large


def span_from(config: SessionsConfig, table: DeltaTable | None, large: LargeInput) -> int | None:
    """The new bytes from which a landed file or object is large input (None: every one is read here)."""
    large = usable(large, table, config.session_spec.input)
    if large == "read":
        return None
    return config.ingest_task_mib * 1024 * 1024 if isinstance(large, str) else large.min_bytes


def standing_erasure(erased: ErasedUsers, batch: pa.Table) -> tuple[pa.Table, dict[str, int]]:
    """Rows of erased users dropped (pipelines.ingest.erased.ErasedUsers), and who was dropped -> events (for the
    landing eraser and the erasure log's counts under their keyed hash)."""
    drop = erased.drop_mask(batch["user_id"], batch["event_time"].cast(pa.int64()), batch["raw"])
    if drop is None or not pc.any(drop).as_py():
        return batch, {}
    dropped: dict[str, int] = {}
    for uid, raw in zip(pc.filter(batch["user_id"], drop).to_pylist(), pc.filter(batch["raw"], drop).to_pylist()):
        user = uid if uid is not None else user_named_by(raw or "")
        if user is not None:
            dropped[user] = dropped.get(user, 0) + 1
    return batch.filter(pc.invert(drop)), dropped


def latest_ingest_seq(table_uri: str, storage_options: dict[str, str] | None = None) -> int:
    """The newest ingest sequence number: the data files' statistics (max of ingest_seq) survive OPTIMIZE,
    VACUUM and log cleanup; the newest commits' metadata covers the rest."""
    if not DeltaTable.is_deltatable(table_uri, storage_options=storage_options):
        return 0
    return latest_seq(DeltaTable(table_uri, storage_options=storage_options))


def latest_seq(table: DeltaTable, history: list[dict[str, Any]] | None = None) -> int:
    """latest_ingest_seq of an open table (`history`: its newest HISTORY_PAGE commits, if already read)."""
    adds = pa.table(table.get_add_actions(flatten=True))
    # A file written without statistics (a writer configured to collect none) has no max: the commits' metadata and
    # the other files still tell.
    seq = (int(pc.max(adds["max.ingest_seq"]).as_py() or 0)
           if adds.num_rows and "max.ingest_seq" in adds.column_names else 0)
    for commit in history if history is not None else table.history(limit=HISTORY_PAGE):
        if "ingest_seq" in commit:
            seq = max(seq, int(commit["ingest_seq"]))
    return seq


def open_raw_table(config: SessionsConfig) -> DeltaTable | None:
    """The raw_events table, or None before its first commit."""
    uri = config.raw_events_table
    options = storage_options(config, uri)
    return DeltaTable(uri, storage_options=options) if DeltaTable.is_deltatable(uri, storage_options=options) else None


@dataclass(frozen=True)
class IngestResult(Result):
    """What one ingest did (to_dict: its JSON shape)."""
    files: int           # files with lines ingested (a growing file counts at each ingest that read some)
    rows: int
    rejected: int
    first_seq: int | None
    last_seq: int
    refused: int = 0     # symlinks and special files moved to landing/_refused/
    waiting: int = 0     # files left in landing: still being written (or an unfinished last line)
    clock: str | None = None  # the event time of the clock row appended (README "Idle close"), ISO 8601
    deferred: int = 0    # large files left for an ingest by Spark tasks (catch-up's, once its session is up)
    by_tasks: int = 0    # files whose lines Spark tasks read and parsed where they are
