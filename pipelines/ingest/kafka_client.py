"""The Kafka consumer the ingest uses, with bounded calls: its settings (SESSIONS_KAFKA_CONF, less the ones exactly-once
reading owns), the partitions' watermarks, the consumer group commit (for lag tools only), and one-line errors.

Every failure becomes one line naming the bootstrap servers and the most telling cause librdkafka reported
(SourceUnavailable), a bad setting a ConfigError; librdkafka's own log lines go to Python logging, each distinct
line once. Reading the partitions is pipelines.ingest.kafka's; what the offsets mean, pipelines.ingest.kafka_offsets'.
"""
from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from pipelines.config import SessionsConfig
from pipelines.errors import ConfigError, SourceUnavailable
from pipelines.ingest.kafka_offsets import Loss, losses
from pipelines.kafka_conf import KAFKA_OWNED_SETTINGS, check_kafka_settings

__all__ = ["DEFAULT_GROUP", "TIMEOUT_S", "KafkaClient", "first_line", "losses_now"]

TIMEOUT_S = 10.0                # metadata and watermark calls
SLICE_S = 0.5                   # how often a metadata call looks at the errors librdkafka reported meanwhile
DEFAULT_GROUP = "sessions-ingest"
# Settings the exactly-once reading depends on: SESSIONS_KAFKA_CONF may not change them (nor set anything outside
# pipelines.kafka_conf's allowlist: refused when the configuration is read, and again here).
OWNED_SETTINGS = KAFKA_OWNED_SETTINGS

log = logging.getLogger(__name__)


class KafkaClient:
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
        check_kafka_settings(settings)  # a config made in code (with_) did not pass SessionsConfig.from_env's check
        conf: dict[str, Any] = {
            "group.id": DEFAULT_GROUP, "client.id": "sessions-ingest", **settings,
            "bootstrap.servers": self.bootstrap, "enable.auto.commit": False, "enable.auto.offset.store": False,
            "enable.partition.eof": True, "auto.offset.reset": "error",
            "isolation.level": "read_committed",  # librdkafka's default, stated: never aborted transactions' messages
            "logger": _LibrdkafkaLog(),  # to Python logging, not librdkafka's own lines on stderr
            "error_cb": self.errors.append,
            "on_commit": lambda err, _partitions: self.committed.append(err is None),
        }
        try:
            self.consumer = Consumer(conf)
        except (KafkaException, ValueError, TypeError) as exc:
            raise ConfigError(f"SESSIONS_KAFKA_CONF is not accepted by the Kafka client: {first_line(exc)}") from None

    def cause(self, exc: BaseException | None = None) -> str:
        """The most telling reason: the last connection error librdkafka reported ("Connection refused", "Failed to
        resolve"), not its summary "1/1 brokers are down", else the exception."""
        self.consumer.poll(0)  # serves the error callbacks queued meanwhile
        telling = [e for e in self.errors if e.code() != KafkaError._ALL_BROKERS_DOWN] or self.errors
        if telling:
            return first_line(telling[-1].str())
        return first_line(exc) if exc is not None else "no answer"

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
            log.warning("Kafka consumer group offsets not committed (lag tools only): %s", first_line(exc))
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


def first_line(value: object) -> str:
    """An error or exception in one line (its first), for the one-line messages."""
    text = str(value).strip()
    return text.splitlines()[0] if text else type(value).__name__


def losses_now(config: SessionsConfig, recorded: Mapping[int, int]) -> list[Loss]:
    """Every loss of the configured topic against the offsets raw_events recorded (kafka_offsets.losses), with the
    watermarks asked now. SourceUnavailable when the cluster does not answer."""
    client = KafkaClient(config)
    try:
        return losses(client.topic, recorded, client.watermarks_or_none(recorded), client.bootstrap)
    finally:
        client.close()
