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
next step: `sessionctl accept-loss` (state_store.kafka_loss.accept_loss) records each gap as a `lost_in_source` row
of raw_events (and so of quarantine, forever) and moves the partition past it in the same commit's `kafka_offsets`.

This module is the source itself (`ingest`, an `appender.Source`: the read loop) and `kafka_lag`; the consumer and its
settings are pipelines.ingest.kafka_client's, the recorded offsets and the losses pipelines.ingest.kafka_offsets'.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from functools import partial
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from deltalake import DeltaTable

from pipelines.config import SessionsConfig
from pipelines.errors import ConfigError, SourceDataLost
from pipelines.ingest.appender import Appender, Ingested
from pipelines.ingest.kafka_client import TIMEOUT_S, KafkaClient, first_line
from pipelines.ingest.kafka_offsets import Span, lost, offsets_metadata, plan, recorded_offsets, source_name
from pipelines.ingest.lines import Lines
from pipelines.ingest.table import (
    IngestTasks,
    KafkaRange,
    LargeInput,
    ParsedSpan,
    RowSource,
    open_raw_table,
    usable,
)

__all__ = ["ingest", "kafka_lag", "read_range"]

STALL_S = 30.0                  # a read that gets nothing for this long gives up (SourceUnavailable)
CONSUME_BATCH = 10_000


class _Appends(Protocol):
    def append(self, sources: list[RowSource], metadata: dict[str, str]) -> None: ...


class _Reader:
    """Reads the spans, appending a commit (rows + every partition's next offset) each `limit` messages."""

    def __init__(self, client: KafkaClient, appender: _Appends, spans: Mapping[int, Span], limit: int) -> None:
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
        self.appender.append(sources, offsets_metadata(self.topic, self.next))
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
        return lost(
            f"Kafka topic {self.topic} partition {partition}: offsets {start}..{last} were deleted while this ingest "
            f"read them ({first_line(error.str())}): retention, DeleteRecords or the topic deleted under us",
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


class _Collected:
    """_Reader's appender where a Spark task reads: the rows' sources kept, not committed."""

    def __init__(self) -> None:
        self.sources: list[RowSource] = []

    def append(self, sources: list[RowSource], metadata: dict[str, str]) -> None:
        self.sources += sources


def read_range(config: SessionsConfig, partition: int, start: int, end: int) -> tuple[list[RowSource], int]:
    """Offsets [start, end) of one partition, read where a Spark task runs (pipelines.job.ingest_tasks) with the
    reader and the rules of an ingest here: the messages' sources and the partition's next offset. Raises
    SourceDataLost (offsets deleted while it read) and SourceUnavailable as an ingest here does."""
    client = KafkaClient(config)
    try:
        collected = _Collected()
        reader = _Reader(client, collected, {partition: Span(start, end, start)}, limit=end - start + 1)
        reader.read()
        return collected.sources, reader.next[partition]
    finally:
        client.close()


def ingest(config: SessionsConfig, table: DeltaTable | None, appender: Appender, step: int,
           large: LargeInput = "read") -> Ingested:
    """Every partition from its recorded next offset up to the high watermark seen now, at most
    SESSIONS_KAFKA_COMMIT_MESSAGES messages per commit (`step`, the file sources' files per commit, does not apply).
    `files` of the result counts the partitions with messages ingested.

    A backlog of at least SESSIONS_KAFKA_COMMIT_MESSAGES messages is what `large` says: read here ("read"), left for
    the session ("defer"), or read by Spark tasks, one per partition and up to SESSIONS_KAFKA_COMMIT_MESSAGES of its
    messages each, one commit per round of tasks (IngestTasks)."""
    client = KafkaClient(config)
    try:
        recorded = recorded_offsets(table, config.kafka_topic)
        spans = plan(config.kafka_topic, recorded, client.watermarks(recorded))
        limit = max(1, config.kafka_commit_messages)
        backlog = sum(span.end - span.start for span in spans.values())
        large = usable(large, table, config.session_spec.input)
        if large != "read" and backlog >= limit:
            if isinstance(large, str):
                return Ingested(0, deferred=sum(1 for span in spans.values() if span.end > span.start))
            read, next_offsets = _by_tasks(config, appender, spans, large, limit)
            if read:
                client.commit_group(next_offsets)
            return Ingested(len(read), by_tasks=len(read))
        reader = _Reader(client, appender, spans, limit)
        reader.read()
        if reader.recorded_now:
            client.commit_group(reader.next)
        return Ingested(len(reader.partitions_read))
    finally:
        client.close()


def _by_tasks(config: SessionsConfig, appender: Appender, spans: Mapping[int, Span], tasks: IngestTasks,
              limit: int) -> tuple[set[int], dict[int, int]]:
    """Rounds of one task per partition with messages left, each commit recording every partition's next offset;
    a partition whose task stopped short of its range (the end as the broker sees it: an open transaction's
    messages wait) is done for this ingest. The partitions read, and where each goes on."""
    next_offsets = {p: span.start for p, span in spans.items()}
    done: set[int] = set()
    read: set[int] = set()
    while True:
        ranges: list[KafkaRange] = []
        base = 0
        for partition, span in sorted(spans.items()):
            start = next_offsets[partition]
            if start < span.end and partition not in done:
                end = min(span.end, start + limit)
                ranges.append(KafkaRange(partition, start, end, base))
                base += end - start
        if not ranges:
            return read, next_offsets
        parsed = appender.append_by_tasks(partial(tasks.messages, config, ranges),
                                          partial(_offsets_after, config.kafka_topic, dict(next_offsets)))
        for kafka_range in ranges:
            after = parsed.next_offsets.get(kafka_range.partition, kafka_range.start)
            if after < kafka_range.end:
                done.add(kafka_range.partition)
            if after > kafka_range.start:
                read.add(kafka_range.partition)
            next_offsets[kafka_range.partition] = max(next_offsets[kafka_range.partition], after)


def _offsets_after(topic: str, before: Mapping[int, int], parsed: ParsedSpan) -> dict[str, str]:
    return offsets_metadata(topic, {**before, **parsed.next_offsets})


def kafka_lag(config: SessionsConfig) -> dict[int, dict[str, int]]:
    """Per partition: `next_offset` (where the next ingest starts: the recorded offset, else the earliest),
    `high_watermark` and `lag` (messages not ingested yet), plus `low_watermark`. Read-only: no commit, no group
    offset. Raises SourceUnavailable when the cluster does not answer."""
    if not config.uses_kafka:
        raise ConfigError("kafka_lag needs SESSIONS_KAFKA_BOOTSTRAP and SESSIONS_KAFKA_TOPIC")
    recorded = recorded_offsets(open_raw_table(config), config.kafka_topic)
    client = KafkaClient(config)
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
