"""Where each partition of a Kafka topic goes on, as raw_events' Delta log records it, and what was lost.

Every ingest commit of a topic records in its metadata (OFFSETS_KEY, `kafka_offsets`) the next offset of every
partition; `recorded_offsets` reads the newest such record back (or rebuilds it from the rows when the log no longer
holds one). `plan` holds those offsets against the partitions' watermarks now: the span each partition is read over,
or SourceDataLost when the recorded offsets do not fit the topic any more (`losses`: every such gap, and where
ingest goes on once an operator accepted it; the operator's command is state_store.kafka_loss.accept_loss).
No Kafka client here: only the Delta table and the numbers.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deltalake import DeltaTable

from pipelines.errors import SourceDataLost
from pipelines.ingest.table import HISTORY_PAGE
from pipelines.storage import read_rows, sql_literal

__all__ = ["LOST_REASON", "Loss", "Span", "losses", "lost", "offsets_metadata", "plan", "recorded_offsets", "source_name"]

OFFSETS_KEY = "kafka_offsets"   # the commit metadata key holding the topic's next offsets
LOST_REASON = "lost_in_source"  # reject_reason of the raw_events row that records an accepted loss
# What an operator does about a loss, the end of every SourceDataLost line.
NEXT_STEP = ("next: `sessionctl accept-loss` records the loss (a quarantine row per gap) and ingest goes on after it; "
             "or bring the messages back (the old topic, a broker restored from backup) and run the command again")

log = logging.getLogger(__name__)


def source_name(topic: str, partition: int) -> str:
    """`source_file` of a message's row."""
    return f"kafka://{topic}/{partition}"


def offsets_metadata(topic: str, next_offsets: Mapping[int, int]) -> dict[str, str]:
    """The commit metadata recording where every partition of `topic` goes on (what recorded_offsets reads back)."""
    offsets = {"topic": topic, "next": {str(p): n for p, n in sorted(next_offsets.items())}}
    return {OFFSETS_KEY: json.dumps(offsets, separators=(",", ":"))}


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
    rows = read_rows(table, columns=["source_file", "line_no"],
                     where=f"starts_with(source_file, {sql_literal(prefix)}) AND (reject_reason IS NULL"
                           f" OR reject_reason <> {sql_literal(LOST_REASON)})")
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



# --- what the topic no longer holds ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Loss:
    """Messages of one partition that raw_events has not ingested and the topic no longer holds: the error ingest
    raises, and what `accept_loss` (state_store.kafka_loss) records and where ingest goes on once an operator
    accepted it."""
    partition: int
    error: SourceDataLost
    first: int                # the first offset lost
    last: int | None          # the last one; None: from `first` on, how many is unknown (the partition is gone)
    resume: int | None        # the next offset after acceptance; None: the partition's recorded offset is dropped
    what: str                 # the loss in words, for the quarantine row


def lost(message: str, topic: str, partition: int, first: int, last: int) -> SourceDataLost:
    """The error for offsets first..last of a partition lost, ending with the operator's next step."""
    return SourceDataLost(f"{message}; {NEXT_STEP}", topic, partition, first, last)


def losses(topic: str, recorded: Mapping[int, int], watermarks: Mapping[int, tuple[int, int]] | None,
           bootstrap: str = "") -> list[Loss]:
    """Every partition whose recorded next offset does not fit the topic as it is now (`watermarks` None: the topic
    does not exist), by partition."""
    found = []
    for partition, next_offset in sorted(recorded.items()):
        if watermarks is None and next_offset > 0:
            error = lost(f"Kafka topic {topic} does not exist on {bootstrap} any more, but raw_events recorded reading "
                          f"it (partition {partition} up to offset {next_offset - 1}): the topic was deleted; what it "
                          "held after the recorded offsets is lost", topic, partition, next_offset, next_offset)
            found.append(Loss(partition, error, next_offset, None, None,
                              f"Kafka topic {topic} was deleted; raw_events had read partition {partition} up to offset "
                              f"{next_offset - 1}: whatever it held from offset {next_offset} on is lost (how many "
                              "messages is unknown); its recorded offset is dropped (a recreated topic is read from its "
                              "earliest offsets)"))
        elif watermarks is not None and partition not in watermarks and next_offset > 0:
            error = lost(f"Kafka topic {topic} has no partition {partition} any more, but raw_events recorded reading "
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
            error = lost(f"Kafka topic {topic} partition {partition}: offsets {start}..{low - 1} were deleted before "
                          f"they were ingested (raw_events goes on at {start}, the partition now starts at {low}: "
                          "retention, DeleteRecords, or the topic deleted under us)", topic, partition, start, low - 1)
            found.append(Loss(partition, error, start, low - 1, low,
                              f"Kafka topic {topic} partition {partition}: offsets {start}..{low - 1} "
                              f"({low - start} messages) were deleted (retention, DeleteRecords) before raw_events "
                              f"ingested them; ingest goes on at offset {low}"))
        elif start > high:
            error = lost(f"Kafka topic {topic} partition {partition} ends at offset {high} but raw_events recorded "
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
