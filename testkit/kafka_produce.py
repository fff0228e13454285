"""Producing test messages to a Kafka broker and getting back where each one landed: used with Apache Kafka's broker
(tests/kafka_broker.py) and with librdkafka's mock cluster (testkit/kafka_mock.py, the Kafka benchmark)."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any


def produce(bootstrap: str, topic: str, values: list[tuple[str | None, bytes | None]], *,
            partition: int | None = None, timestamp_ms: int | None = None,
            logger: logging.Logger | None = None) -> list[tuple[int, int, bytes | None]]:
    """(key, value) messages -> (partition, offset, value) as the broker acknowledged them, in send order."""
    from confluent_kafka import Producer

    settings: dict[str, Any] = {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
    if logger is not None:
        settings["logger"] = logger
    producer = Producer(settings)
    acked: dict[int, tuple[int, int, bytes | None]] = {}

    def delivered(index: int) -> Callable[[Any, Any], None]:
        def callback(err: Any, message: Any) -> None:
            assert err is None, err
            acked[index] = (message.partition(), message.offset(), message.value())
        return callback

    extra: dict[str, Any] = {} if partition is None else {"partition": partition}
    if timestamp_ms is not None:
        extra["timestamp"] = timestamp_ms
    for index, (key, value) in enumerate(values):
        while True:
            try:
                producer.produce(topic, value=value, key=key, on_delivery=delivered(index), **extra)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(60) == 0
    return [acked[i] for i in range(len(values))]
