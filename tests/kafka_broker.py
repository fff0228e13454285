"""Apache Kafka's own broker for the tests: one single-node KRaft broker (broker and controller in one JVM, from the
jars `make setup` fetched into build/kafka/, jvm/kafka/pom.xml) on free loopback ports, started and stopped by
deploy/local-kafka.

Fixture
-------
``kafka_broker``  (session scope) one ``KafkaBroker`` for the whole test run, running; stopped at the end. Registered
                  in tests/conftest.py by importing it. A test that stops it (``stop``/``restart``) leaves it running
                  again (``ensure_running`` in a ``finally``).

``KafkaBroker``
    ``bootstrap``                         ``127.0.0.1:<port>``: the same across restarts.
    ``start()`` / ``stop(kill=False)``    start (formats a new log dir first) and wait until an AdminClient's
                                          list_topics answers / stop and wait until the JVM exited (``kill``: SIGKILL,
                                          a crash; else a controlled shutdown). ``restart(kill=False)`` is both, on the
                                          same log dir: what was acknowledged before is there after.
    ``create_topic(topic, partitions, **config)``  waits until every partition has its leader.
    ``delete_topic(topic)``               waits until the broker no longer lists it (a topic can be created again).
    ``delete_records(topic, partition, before)``   AdminClient.delete_records: offsets below ``before`` are gone.
    ``set_topic_config(topic, **config)`` incremental_alter_configs (``retention_ms=...`` for ``retention.ms``).
    ``watermarks(topic, partition)``      (low, high) now.
    ``produce(topic, [(key, value)], partition=None, timestamp_ms=None)``  -> [(partition, offset, value)] as the
                                          broker acknowledged them (acks=all, idempotent), in send order.
"""
from __future__ import annotations

import logging
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.kafka_produce import produce
from tests.kit.waits import wait_until

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "deploy" / "local-kafka"
START_TIMEOUT_S = 150  # the script gives the JVM 120 s on a busy machine; then the admin client's first answer

log = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KafkaBroker:
    """A KRaft broker+controller on 127.0.0.1 with its data, config and log in `root` (deploy/local-kafka's --dir)."""

    def __init__(self, root: Path) -> None:
        self.dir = Path(root)
        self.port, self.controller_port = _free_port(), _free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._admin: Any = None

    # --- the process ------------------------------------------------------------------------------------------

    def _script(self, *args: str, timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run([str(SCRIPT), *args, "--dir", str(self.dir)], capture_output=True, text=True,
                              timeout=timeout, cwd=REPO, env={**os.environ, "KAFKA_JARS": str(REPO / "build" / "kafka")})

    def start(self) -> None:
        done = self._script("start", "--port", str(self.port), "--controller-port", str(self.controller_port),
                            timeout=START_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"the Kafka broker did not start: {done.stderr.strip()[-3000:]}")
        assert done.stdout.strip() == self.bootstrap, done.stdout
        wait_until(self.answers, timeout_s=60, interval_s=0.1, what=f"the Kafka broker at {self.bootstrap} to answer")

    def stop(self, kill: bool = False) -> None:
        self._admin = None  # its threads would go on reconnecting to a broker that is gone
        done = self._script("stop", *(["--kill"] if kill else []), timeout=60)
        assert done.returncode == 0, done.stderr

    def restart(self, kill: bool = False) -> None:
        self.stop(kill=kill)
        self.start()

    def running(self) -> bool:
        return self._script("status", timeout=30).returncode == 0

    def ensure_running(self) -> None:
        if not self.running():
            self.start()

    @property
    def log_file(self) -> Path:
        return self.dir / "broker.log"

    # --- the admin API ----------------------------------------------------------------------------------------

    @property
    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            # librdkafka's log lines to Python logging (pytest shows them with a failure), not to stderr.
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": log})
        return self._admin

    def answers(self) -> bool:
        """The broker lists its topics and itself as the one broker."""
        from confluent_kafka import KafkaException

        try:
            metadata = self.admin.list_topics(timeout=2)
        except KafkaException:
            return False
        return list(metadata.brokers) == [1]

    def _topic_metadata(self, topic: str) -> Any:
        return self.admin.list_topics(timeout=10).topics.get(topic)

    def create_topic(self, topic: str, partitions: int, **config: Any) -> None:
        from confluent_kafka.admin import NewTopic

        new = NewTopic(topic, num_partitions=partitions, replication_factor=1,
                       config={k.replace("_", "."): str(v) for k, v in config.items()})
        self.admin.create_topics([new], operation_timeout=30)[topic].result(timeout=60)

        def led() -> bool:
            found = self._topic_metadata(topic)
            return (found is not None and found.error is None and len(found.partitions) == partitions
                    and all(p.leader == 1 and p.error is None for p in found.partitions.values()))

        wait_until(led, timeout_s=60, interval_s=0.1, what=f"the {partitions} partitions of {topic} to have a leader")

    def delete_topic(self, topic: str) -> None:
        self.admin.delete_topics([topic], operation_timeout=30)[topic].result(timeout=60)
        wait_until(lambda: self._topic_metadata(topic) is None, timeout_s=60, interval_s=0.1,
                   what=f"topic {topic} to be gone")

    def delete_records(self, topic: str, partition: int, before: int) -> None:
        from confluent_kafka import TopicPartition

        futures = self.admin.delete_records([TopicPartition(topic, partition, before)], operation_timeout=30)
        (deleted,) = (f.result(timeout=60) for f in futures.values())
        assert deleted.low_watermark == before, deleted

    def set_topic_config(self, topic: str, **config: Any) -> None:
        from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

        entries = [ConfigEntry(k.replace("_", "."), str(v), incremental_operation=AlterConfigOpType.SET)
                   for k, v in config.items()]
        resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
        for future in self.admin.incremental_alter_configs([resource]).values():
            future.result(timeout=60)

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec

        marks = []
        for spec in (OffsetSpec.earliest(), OffsetSpec.latest()):
            futures = self.admin.list_offsets({TopicPartition(topic, partition): spec}, request_timeout=30)
            (answer,) = (f.result(timeout=60) for f in futures.values())
            marks.append(answer.offset)
        return marks[0], marks[1]

    # --- a producer ---------------------------------------------------------------------------------------------

    def produce(self, topic: str, values: list[tuple[str | None, bytes | None]], partition: int | None = None,
                timestamp_ms: int | None = None) -> list[tuple[int, int, bytes | None]]:
        """(key, value) messages -> (partition, offset, value) as the broker acknowledged them, in send order."""
        return produce(self.bootstrap, topic, values, partition=partition, timestamp_ms=timestamp_ms, logger=log)


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """One Apache Kafka broker (KRaft, broker+controller) on loopback for the whole test run."""
    if not (REPO / "build" / "kafka" / ".fetched").exists():
        pytest.fail("no Kafka jars in build/kafka: run `make setup` (jvm/kafka/pom.xml)")
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka-broker"))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
