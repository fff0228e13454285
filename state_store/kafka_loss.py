"""An operator's way past SourceDataLost: `sessionctl accept-loss` (`accept_loss`).

Kafka ingest (pipelines.ingest.kafka) never skips lost messages silently: a recorded offset that no longer fits the
topic raises SourceDataLost. Accepting the loss records each gap for good -- a `lost_in_source` row of raw_events, so
of quarantine -- and moves the partition past it in the same commit's `kafka_offsets`. The mechanisms are the
pipelines': the recorded offsets and the losses (pipelines.ingest.kafka_offsets), the watermarks asked now
(pipelines.ingest.kafka_client), the raw_events commit (pipelines.ingest.appender.Appender) and the ingest lease.
"""
from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from pipelines.config import SessionsConfig
from pipelines.coordination.leases import waiting_lease
from pipelines.errors import ConfigError, Result
from pipelines.ingest.appender import Appender
from pipelines.ingest.kafka_client import losses_now
from pipelines.ingest.kafka_offsets import LOST_REASON, offsets_metadata, recorded_offsets, source_name
from pipelines.ingest.table import latest_clock, latest_seq, open_raw_table

__all__ = ["accept_loss"]

log = logging.getLogger(__name__)


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
    with waiting_lease(config.lease_uri, "ingest", "accept-loss", config.lease_ttl_s, timeout_s=config.lease_wait_s) as held:
        table = open_raw_table(config)
        recorded = recorded_offsets(table, topic)
        found = losses_now(config, recorded)
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
        appender = Appender(config, latest_seq(table) if table is not None else 0, latest_clock(table), leases=[held],
                            version=table.version() if table is not None else None)
        appender.append_rejected(rows, {**offsets_metadata(topic, next_offsets),
                                        "accepted_loss": f"{len(rows)} gap(s) of {topic}"})
        for loss in found:
            log.warning("Kafka loss accepted by an operator: %s", loss.what)
        return AcceptedLoss(topic, accepted, appender.seq)
