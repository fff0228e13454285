"""A Kafka topic as a source: every partition read from the offsets raw_events' Delta log records.

Selected when SESSIONS_KAFKA_BOOTSTRAP and SESSIONS_KAFKA_TOPIC are both set (consumer settings such as
security.protocol or sasl.* through SESSIONS_KAFKA_CONF). One message value = one event line: the line rules of
pipelines.ingest.lines apply to it unchanged (same quarantine reasons; a null or blank value is skipped like a
blank line, its offset still consumed).

Provenance: `source_file` is `kafka://<topic>/<partition>` and `line_no` is the message's offset, so raw_events and
quarantine keep their columns (rows of landed files stay readable beside them) and a quarantine row names the very
message: topic, partition and offset.

Exactly once -- the Delta log is the truth:
- an ingest reads each partition from the next offset recorded in raw_events' newest commit for this topic up to the
  partition's high watermark as seen at the start of the call (messages produced meanwhile wait for the next call);
  a partition never recorded (new, or the topic's first ingest) starts at its earliest offset;
- every ingest commit appends its rows AND records, in the same Delta commit's metadata (`kafka_offsets`:
  `{"topic": t, "next": {"<partition>": <next offset>, ...}}`, every partition of the topic, not only those in the
  commit), where each partition goes on. A commit is atomic: killed before it, its messages are read again;
  killed after it, the next ingest starts behind them. Nothing is lost or doubled;
- afterwards the offsets are committed to the consumer group (SESSIONS_KAFKA_CONF `group.id`, default
  `sessions-ingest`) for lag tools only: never read back;
- if no commit in the Delta log holds offsets for the topic any more (log cleanup after long idleness), they are
  rebuilt from the rows: max(line_no) + 1 per `kafka://<topic>/<partition>`. Messages after the last row-producing
  one (blank values) are read again and produce no row again.

Lost data is never skipped silently: a recorded next offset below a partition's earliest offset (retention,
DeleteRecords), above its end (the topic deleted and recreated, or a broker that lost messages), or a recorded
partition or topic that is gone raises SourceDataLost naming the topic, the partition and the offsets, and the
next step: `accept_loss` (`sessionctl accept-loss`) records each gap as a `lost_in_source` row of raw_events (and so
of quarantine, forever) and moves the partition past it in the same commit's `kafka_offsets`.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from deltalake import DeltaTable

from pipelines.config import SessionsConfig
from pipelines.errors import ConfigError, SourceDataLost, SourceUnavailable
from pipelines.ingest.lines import Lines
from pipelines.ingest.table import (
    HISTORY_PAGE,
    Appender,
    Ingested,
    RowSource,
    latest_clock,
    latest_seq,
    open_raw_table,
)
from pipelines.locks import waiting_lease
from pipelines.results import Result

OFFSETS_KEY = "kafka_offsets"   # the commit metadata key holding the topic's next offsets
TIMEOUT_S = 10.0                # metadata and watermark calls; a read that gets nothing for STALL_S gives up
STALL_S = 30.0
SLICE_S = 0.5                   # how often a metadata call looks at the errors librdkafka reported meanwhile
DEFAULT_GROUP = "sessions-ingest"
CONSUME_BATCH = 10_000
# Settings the exactly-once reading depends on: SESSIONS_KAFKA_CONF may not change them.
OWNED_SETTINGS = ("bootstrap.servers", "enable.auto.commit", "enable.auto.offset.store", "enable.partition.eof",
                  "auto.offset.reset")

log = logging.getLogger(__name__)


def source_name(topic: str, partition: int) -> str:
    """`source_file` of a message's row."""
    return f"kafka://{topic}/{partition}"


# --- where the Delta log says each partition goes on -----------------------------------------------------------

def _offsets_of(commit: Mapping[str, Any], topic: str) -> dict[int, int] | None:
    raw = commit.get(OFFSETS_KEY)
    if not raw:
        return None
    data = json.loads(raw)
    if data.get("topic") != topic:
        return None
    return {int(p): int(n) for p, n in data["next"].items()}


def _offsets_from_rows(table: DeltaTable, topic: str) -> dict[int, int]:
    """max(line_no) + 1 per partition of the topic's rows (when no commit metadata is left)."""
    prefix = source_name(topic, 0)[:-1]
    # Not the rows of accepted losses: they name the first offset lost, not one read (accept_loss).
    rows = table.to_pyarrow_dataset().to_table(
        columns=["source_file", "line_no"], filter=pc.starts_with(pc.field("source_file"), prefix)
        & (pc.field("reject_reason").is_null() | (pc.field("reject_reason") != LOST_REASON)))
    if rows.num_rows == 0:
        return {}
    grouped = rows.group_by("source_file").aggregate([("line_no", "max")])
    return {int(name[len(prefix):]): int(last) + 1
            for name, last in zip(grouped["source_file"].to_pylist(), grouped["line_no_max"].to_pylist())}


def recorded_offsets(table: DeltaTable | None, topic: str) -> dict[int, int]:
    """The next offset of each partition of `topic` that raw_events' newest commit for it records ({} before any)."""
    if table is None:
        return {}
    for limit in (HISTORY_PAGE, 10 * HISTORY_PAGE, None):
        commits = sorted(table.history(limit=limit), key=lambda c: int(c.get("version", 0)), reverse=True)
        for commit in commits:
            found = _offsets_of(commit, topic)
            if found is not None:
                return found
        if limit is None or len(commits) < limit:
            break
    return _offsets_from_rows(table, topic)


@dataclass(frozen=True)
class Span:
    """What one ingest reads of one partition: offsets [start, end)."""
    start: int
    end: int
    low: int


# What an operator does about a loss, the end of every SourceDataLost line.
NEXT_STEP = ("next: `sessionctl accept-loss` records the loss (a quarantine row per gap) and ingest goes on after it; "
             "or bring the messages back (the old topic, a broker restored from backup) and run the command again")
LOST_REASON = "lost_in_source"  # reject_reason of the raw_events row that records an accepted loss


@dataclass(frozen=True)
class Loss:
    """Messages of one partition that raw_events has not ingested and the topic no longer holds: the error ingest
    raises, and what `accept_loss` records and where ingest goes on once an operator accepted it."""
    partition: int
    error: SourceDataLost
    first: int                # the first offset lost
    last: int | None          # the last one; None: from `first` on, how many is unknown (the partition is gone)
    resume: int | None        # the next offset after acceptance; None: the partition's recorded offset is dropped
    what: str                 # the loss in words, for the quarantine row


def _lost(message: str, topic: str, partition: int, first: int, last: int) -> SourceDataLost:
    return SourceDataLost(f"{message}; {NEXT_STEP}", topic, partition, first, last)


def losses(topic: str, recorded: Mapping[int, int], watermarks: Mapping[int, tuple[int, int]] | None,
           bootstrap: str = "") -> list[Loss]:
    """Every partition whose recorded next offset does not fit the topic as it is now (`watermarks` None: the topic
    does not exist), by partition."""
    found = []
    for partition, next_offset in sorted(recorded.items()):
        if watermarks is None and next_offset > 0:
            error = _lost(f"Kafka topic {topic} does not exist on {bootstrap} any more, but raw_events recorded reading "
                          f"it (partition {partition} up to offset {next_offset - 1}): the topic was deleted; what it "
                          "held after the recorded offsets is lost", topic, partition, next_offset, next_offset)
            found.append(Loss(partition, error, next_offset, None, None,
                              f"Kafka topic {topic} was deleted; raw_events had read partition {partition} up to offset "
                              f"{next_offset - 1}: whatever it held from offset {next_offset} on is lost (how many "
                              "messages is unknown); its recorded offset is dropped (a recreated topic is read from its "
                              "earliest offsets)"))
        elif watermarks is not None and partition not in watermarks and next_offset > 0:
            error = _lost(f"Kafka topic {topic} has no partition {partition} any more, but raw_events recorded reading "
                          f"it up to offset {next_offset - 1}: the topic was deleted and recreated; what it held after "
                          "that offset is unknown", topic, partition, next_offset, next_offset)
            found.append(Loss(partition, error, next_offset, None, None,
                              f"Kafka topic {topic} has no partition {partition} any more; raw_events had read it up to "
                              f"offset {next_offset - 1}: whatever it held from offset {next_offset} on is lost (how "
                              "many messages is unknown); its recorded offset is dropped (read from its earliest "
                              "offset should it come back)"))
    for partition, (low, high) in sorted((watermarks or {}).items()):
        start = recorded.get(partition)
        if start is None:
            continue
        if start < low:
            error = _lost(f"Kafka topic {topic} partition {partition}: offsets {start}..{low - 1} were deleted before "
                          f"they were ingested (raw_events goes on at {start}, the partition now starts at {low}: "
                          "retention, DeleteRecords, or the topic deleted under us)", topic, partition, start, low - 1)
            found.append(Loss(partition, error, start, low - 1, low,
                              f"Kafka topic {topic} partition {partition}: offsets {start}..{low - 1} "
                              f"({low - start} messages) were deleted (retention, DeleteRecords) before raw_events "
                              f"ingested them; ingest goes on at offset {low}"))
        elif start > high:
            error = _lost(f"Kafka topic {topic} partition {partition} ends at offset {high} but raw_events recorded "
                          f"reading it up to {start - 1}: the topic was deleted and recreated, or the broker lost "
                          f"messages; offsets {high}..{start - 1} would be skipped", topic, partition, high, start - 1)
            found.append(Loss(partition, error, start, None, low,
                              f"Kafka topic {topic} partition {partition} now ends at offset {high} but raw_events had "
                              f"read it up to offset {start - 1} (the topic deleted and recreated, or the broker lost "
                              f"messages): whatever the old partition held from offset {start} on is lost (how many "
                              f"messages is unknown); ingest starts over at the partition's earliest offset {low} "
                              "(messages ingested before under the same event_id are duplicates to the stream)"))
    return sorted(found, key=lambda loss: loss.partition)


def plan(topic: str, recorded: Mapping[int, int], watermarks: Mapping[int, tuple[int, int]]) -> dict[int, Span]:
    """The span of each partition from the recorded next offsets and the (low, high) watermarks; SourceDataLost when
    the recorded offsets do not fit the topic as it is now (never a silent skip)."""
    found = losses(topic, recorded, watermarks)
    if found:
        raise found[0].error
    spans = {}
    for partition, (low, high) in sorted(watermarks.items()):
        start = recorded.get(partition)
        if start is None:
            start = low  # never read (a new partition, or the topic's first ingest): from its earliest message
            if low > 0:
                log.warning("Kafka topic %s partition %d is read for the first time: from its earliest offset %d "
                            "(offsets below it were deleted before this job first read the partition)",
                            topic, partition, low)
        spans[partition] = Span(start, high, low)
    return spans


# --- the consumer ------------------------------------------------------------------------------------------------

class _Client:
    """A consumer with bounded calls: every failure becomes one line naming the bootstrap servers and the cause."""

    def __init__(self, config: SessionsConfig) -> None:
        self.bootstrap, self.topic = config.kafka_bootstrap, config.kafka_topic
        self.errors: list[KafkaError] = []
        self.committed: list[bool] = []
        settings = config.kafka_consumer_settings
        owned = sorted(set(settings) & set(OWNED_SETTINGS))
        if owned:
            raise ConfigError(f"SESSIONS_KAFKA_CONF may not set {', '.join(owned)}: ingest owns "
                              "them (exactly once; the bootstrap servers come from SESSIONS_KAFKA_BOOTSTRAP)")
        conf: dict[str, Any] = {
            "group.id": DEFAULT_GROUP, "client.id": "sessions-ingest", **settings,
            "bootstrap.servers": self.bootstrap, "enable.auto.commit": False, "enable.auto.offset.store": False,
            "enable.partition.eof": True, "auto.offset.reset": "error",
            "logger": _LibrdkafkaLog(),  # to Python logging, not librdkafka's own lines on stderr
            "error_cb": self.errors.append,
            "on_commit": lambda err, _partitions: self.committed.append(err is None),
        }
        try:
            self.consumer = Consumer(conf)
        except (KafkaException, ValueError, TypeError) as exc:
            raise ConfigError(f"SESSIONS_KAFKA_CONF is not accepted by the Kafka client: {_first_line(exc)}") from None

    def cause(self, exc: BaseException | None = None) -> str:
        """The most telling reason: the last connection error librdkafka reported ("Connection refused", "Failed to
        resolve"), not its summary "1/1 brokers are down", else the exception."""
        self.consumer.poll(0)  # serves the error callbacks queued meanwhile
        telling = [e for e in self.errors if e.code() != KafkaError._ALL_BROKERS_DOWN] or self.errors
        if telling:
            return _first_line(telling[-1].str())
        return _first_line(exc) if exc is not None else "no answer"

    def unavailable(self, what: str, exc: BaseException | None = None) -> SourceUnavailable:
        return SourceUnavailable(f"Kafka at {self.bootstrap} {what} ({self.cause(exc)}): start it or fix "
                                 "SESSIONS_KAFKA_BOOTSTRAP / SESSIONS_KAFKA_CONF, then run the command again")

    def watermarks(self, recorded: Mapping[int, int]) -> dict[int, tuple[int, int]]:
        """(low, high) of every partition of the topic now; SourceDataLost when the topic is gone and raw_events holds
        offsets of it; SourceUnavailable when the cluster does not answer or has no such topic."""
        marks = self.watermarks_or_none(recorded)
        if marks is None:
            raise losses(self.topic, recorded, None, self.bootstrap)[0].error
        return marks

    def _metadata(self) -> Any:
        """The topic's metadata, asked in short slices of TIMEOUT_S: once librdkafka reports every bootstrap broker
        down (connection refused, name not resolved) the answer is SourceUnavailable at once, not after TIMEOUT_S --
        the caller (the run loop's backoff, an operator's command) is the one that waits and retries."""
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                return self.consumer.list_topics(self.topic, timeout=min(SLICE_S, max(0.0, deadline - time.monotonic())))
            except KafkaException as exc:
                self.consumer.poll(0)  # serves the error callbacks queued meanwhile
                if time.monotonic() >= deadline or any(e.code() == KafkaError._ALL_BROKERS_DOWN for e in self.errors):
                    raise self.unavailable(f"is unreachable for topic {self.topic}", exc) from None

    def watermarks_or_none(self, recorded: Mapping[int, int]) -> dict[int, tuple[int, int]] | None:
        """watermarks(), but None when the topic does not exist and raw_events holds offsets of it."""
        metadata = self._metadata()
        found = metadata.topics.get(self.topic)
        error = found.error if found is not None else None
        if found is None or (error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            if any(n > 0 for n in recorded.values()):
                return None
            raise SourceUnavailable(f"Kafka topic {self.topic} does not exist on {self.bootstrap}: create it or fix "
                                    "SESSIONS_KAFKA_TOPIC")
        if error is not None:
            raise self.unavailable(f"did not describe topic {self.topic}", KafkaException(error))
        marks = {}
        for partition in sorted(found.partitions):
            try:
                low, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, partition),
                                                                timeout=TIMEOUT_S, cached=False)
            except KafkaException as exc:
                raise self.unavailable(f"did not give the offsets of {self.topic} partition {partition}", exc) from None
            marks[partition] = (int(low), int(high))
        return marks

    def commit_group(self, offsets: Mapping[int, int]) -> None:
        """Offsets to the consumer group, for lag tools only (the Delta log is the truth): a failure is logged."""
        if not offsets:
            return
        try:
            self.consumer.unassign()
            self.consumer.commit(offsets=[TopicPartition(self.topic, p, n) for p, n in sorted(offsets.items())],
                                 asynchronous=True)
            deadline = time.monotonic() + TIMEOUT_S
            while not self.committed and time.monotonic() < deadline:
                self.consumer.poll(0.1)
        except KafkaException as exc:
            log.warning("Kafka consumer group offsets not committed (lag tools only): %s", _first_line(exc))
            return
        if not self.committed or not self.committed[-1]:
            log.warning("Kafka consumer group offsets not committed within %.0f s (lag tools only)", TIMEOUT_S)

    def close(self) -> None:
        with contextlib.suppress(KafkaException, RuntimeError):  # closing twice, or a broker gone meanwhile
            self.consumer.close()


class _LibrdkafkaLog:
    """librdkafka's log lines to Python logging, each distinct line once per consumer: a broker that is down makes
    librdkafka repeat the same connection failure many times a second (the error itself reaches the operator as
    the one-line SourceUnavailable)."""

    def __init__(self) -> None:
        self.logger = logging.getLogger(f"{__name__}.librdkafka")
        self.seen: set[str] = set()

    def log(self, level: int, fmt: str, *args: object) -> None:
        text = fmt % args if args else fmt
        key = re.sub(r"\(after \d+ms[^)]*\)", "", text)
        if key not in self.seen and len(self.seen) < 1000:
            self.seen.add(key)
            self.logger.log(level, "%s", text)


def _first_line(value: object) -> str:
    text = str(value).strip()
    return text.splitlines()[0] if text else type(value).__name__


class _Reader:
    """Reads the spans, appending a commit (rows + every partition's next offset) each `limit` messages."""

    def __init__(self, client: _Client, appender: Appender, spans: Mapping[int, Span], limit: int) -> None:
        self.client, self.appender, self.topic = client, appender, client.topic
        self.next = {p: s.start for p, s in spans.items()}  # every partition: what the next commit records
        self.ends = {p: s.end for p, s in spans.items()}
        self.pending: dict[int, list[tuple[int, bytes]]] = {}
        self.count, self.limit = 0, limit
        self.partitions_read: set[int] = set()
        self.recorded_now = False  # whether a commit of this call recorded offsets

    def flush(self) -> None:
        if not self.pending:
            return
        sources = [RowSource(source_name(self.topic, p), Lines.from_pairs(lines))
                   for p, lines in sorted(self.pending.items())]
        offsets = {"topic": self.topic, "next": {str(p): n for p, n in sorted(self.next.items())}}
        self.appender.append(sources, {OFFSETS_KEY: json.dumps(offsets, separators=(",", ":"))})
        self.partitions_read |= set(self.pending)
        self.pending, self.count, self.recorded_now = {}, 0, True

    def _lost_while_reading(self, partition: int, error: KafkaError) -> SourceDataLost:
        start = self.next[partition]
        try:
            low, _ = self.client.consumer.get_watermark_offsets(TopicPartition(self.topic, partition),
                                                                timeout=TIMEOUT_S, cached=False)
        except KafkaException:
            low = self.ends[partition]
        last = max(start, int(low) - 1)
        return _lost(
            f"Kafka topic {self.topic} partition {partition}: offsets {start}..{last} were deleted while this ingest "
            f"read them ({_first_line(error.str())}): retention, DeleteRecords or the topic deleted under us",
            self.topic, partition, start, last)

    def _take(self, message: Message, todo: dict[int, int]) -> bool:
        """One consumed message or event; whether it moved a partition on."""
        partition, offset = message.partition(), message.offset()
        if partition is None or partition not in todo:
            return False
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                # The end as the broker sees it (after control records and aborted transactions): done.
                if offset is not None:
                    self.next[partition] = max(self.next[partition], min(int(offset), todo[partition]))
                del todo[partition]
                return True
            if error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE,
                                KafkaError.UNKNOWN_TOPIC_OR_PART):
                self.flush()  # what was read before the loss is kept
                raise self._lost_while_reading(partition, error)
            if error.fatal():
                self.flush()
                raise self.client.unavailable(f"failed reading {self.topic} partition {partition}",
                                              KafkaException(error))
            self.client.errors.append(error)  # retriable: librdkafka goes on by itself
            return False
        if offset is None or offset < self.next[partition]:
            return False
        if offset >= todo[partition]:
            del todo[partition]  # past the high watermark seen at the start: the next call's
            return True
        self.pending.setdefault(partition, []).append((offset, message.value() or b""))
        self.count += 1
        self.next[partition] = offset + 1
        if self.next[partition] >= todo[partition]:
            del todo[partition]
        return True

    def read(self) -> None:
        todo = {p: end for p, end in self.ends.items() if self.next[p] < end}
        if not todo:
            return
        consumer = self.client.consumer
        consumer.assign([TopicPartition(self.topic, p, self.next[p]) for p in sorted(todo)])
        last_progress = time.monotonic()
        while todo:
            moved = False
            for message in consumer.consume(CONSUME_BATCH, 1.0):
                moved = self._take(message, todo) or moved
                if self.count >= self.limit:
                    self.flush()
            if moved:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > STALL_S:
                self.flush()
                partition = min(todo)
                raise self.client.unavailable(
                    f"delivered nothing of {self.topic} partition {partition} from offset {self.next[partition]} "
                    f"for {STALL_S:.0f} s")
        self.flush()


def ingest(config: SessionsConfig, table: DeltaTable | None, appender: Appender, step: int) -> Ingested:
    """Every partition from its recorded next offset up to the high watermark seen now, at most
    SESSIONS_KAFKA_COMMIT_MESSAGES messages per commit (`step`, the file sources' files per commit, does not apply).
    `files` of the result counts the partitions with messages ingested."""
    client = _Client(config)
    try:
        recorded = recorded_offsets(table, config.kafka_topic)
        spans = plan(config.kafka_topic, recorded, client.watermarks(recorded))
        reader = _Reader(client, appender, spans, max(1, config.kafka_commit_messages))
        reader.read()
        if reader.recorded_now:
            client.commit_group(reader.next)
        return Ingested(len(reader.partitions_read))
    finally:
        client.close()


def kafka_lag(config: SessionsConfig) -> dict[int, dict[str, int]]:
    """Per partition: `next_offset` (where the next ingest starts: the recorded offset, else the earliest),
    `high_watermark` and `lag` (messages not ingested yet), plus `low_watermark`. Read-only: no commit, no group
    offset. Raises SourceUnavailable when the cluster does not answer."""
    if not config.uses_kafka:
        raise ConfigError("kafka_lag needs SESSIONS_KAFKA_BOOTSTRAP and SESSIONS_KAFKA_TOPIC")
    recorded = recorded_offsets(open_raw_table(config), config.kafka_topic)
    client = _Client(config)
    try:
        marks = client.watermarks(recorded)
    finally:
        client.close()
    lag = {}
    for partition, (low, high) in sorted(marks.items()):
        next_offset = recorded.get(partition, low)
        lag[partition] = {"next_offset": next_offset, "high_watermark": high, "lag": max(0, high - next_offset),
                          "low_watermark": low}
    return lag


# --- an operator's way past SourceDataLost ----------------------------------------------------------------------

@dataclass(frozen=True)
class AcceptedLoss(Result):
    """What `sessionctl accept-loss` recorded (to_dict: its JSON)."""
    topic: str
    # One per gap: partition, first (offset), last (null: how many unknown), resumes_at (null: the partition's
    # recorded offset dropped), what (the quarantine row's raw text).
    accepted: list[dict[str, Any]]
    ingest_seq: int | None  # the raw_events commit that recorded them; None when nothing was lost


def accept_loss(config: SessionsConfig) -> AcceptedLoss:
    """Accept every loss SourceDataLost reports now, in ONE raw_events commit: each gap's partition goes on past it
    (deleted records: at the partition's earliest offset; a recreated topic: starts over at the new earliest; a
    partition or topic gone: its recorded offset dropped), recorded in the commit's `kafka_offsets` like every ingest
    commit, and each gap a rejected row (`lost_in_source` at `kafka://topic/partition`, line_no the first offset
    lost, raw what was lost) that the stream's sink writes to quarantine. Under the ingest lease (beside a running
    stream, between its ingests). Nothing lost: no commit. SourceUnavailable when Kafka does not answer."""
    if not config.uses_kafka:
        raise ConfigError("accept-loss needs SESSIONS_KAFKA_BOOTSTRAP and SESSIONS_KAFKA_TOPIC: it accepts messages "
                          "lost from a Kafka topic")
    topic = config.kafka_topic
    with waiting_lease(config.lease_dir, "ingest", "accept-loss", config.lease_ttl_s):
        table = open_raw_table(config)
        recorded = recorded_offsets(table, topic)
        client = _Client(config)
        try:
            found = losses(topic, recorded, client.watermarks_or_none(recorded), client.bootstrap)
        finally:
            client.close()
        if not found:
            return AcceptedLoss(topic, [], None)
        accepted_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
        next_offsets = dict(recorded)
        rows, accepted = [], []
        for loss in found:
            if loss.resume is None:
                next_offsets.pop(loss.partition, None)
            else:
                next_offsets[loss.partition] = loss.resume
            what = f"{loss.what}. An operator accepted the loss with `sessionctl accept-loss` at {accepted_at}."
            rows.append((source_name(topic, loss.partition), loss.first, LOST_REASON, what))
            accepted.append({"partition": loss.partition, "first": loss.first, "last": loss.last,
                             "resumes_at": loss.resume, "what": what})
        appender = Appender(config, latest_seq(table) if table is not None else 0, latest_clock(table))
        offsets = {"topic": topic, "next": {str(p): n for p, n in sorted(next_offsets.items())}}
        appender.append_rejected(rows, {OFFSETS_KEY: json.dumps(offsets, separators=(",", ":")),
                                        "accepted_loss": f"{len(rows)} gap(s) of {topic}"})
        for loss in found:
            log.warning("Kafka loss accepted by an operator: %s", loss.what)
        return AcceptedLoss(topic, accepted, appender.seq)
