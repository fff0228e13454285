"""`make demo`: land realistic sample clickstream, run the job on the embedded default (local
filesystem, RocksDB), print what it produced. With SESSIONS_KAFKA_BOOTSTRAP and SESSIONS_KAFKA_TOPIC set, the sample
events are produced to that topic instead and the job catches up from it."""
from __future__ import annotations

import json

from pipelines.config import SessionsConfig
from pipelines.core.sample_data import arrival_order, generate_events, land_sample
from pipelines.errors import SourceUnavailable
from pipelines.job.runtime import get_spark
from pipelines.job.stream import catch_up
from state_store.status import status

KAFKA_ONE_LINE = "SESSIONS_KAFKA_BOOTSTRAP=broker:9092 SESSIONS_KAFKA_TOPIC=clicks .venv/bin/sessionctl catch-up"


def produce_sample(config: SessionsConfig, users: int = 2000, sessions_per_user: int = 3) -> int:
    """The sample events as messages of the configured topic (keyed by user); how many."""
    from confluent_kafka import KafkaException, Producer

    events = arrival_order(generate_events(users, sessions_per_user))
    failed: list[str] = []
    producer = Producer({"bootstrap.servers": config.kafka_bootstrap, "linger.ms": 20,
                         **{k: v for k, v in config.kafka_consumer_settings.items()
                            if k.startswith(("security.", "sasl.", "ssl."))}})

    def delivered(err: object, _message: object) -> None:
        if err is not None:
            failed.append(str(err))

    try:
        for event in events:
            while True:
                try:
                    producer.produce(config.kafka_topic, value=json.dumps(event).encode(),
                                     key=event["user_id"].encode(), on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.1)
        left = producer.flush(60)
    except KafkaException as exc:
        raise SourceUnavailable(f"Kafka at {config.kafka_bootstrap} refused the sample events: {exc}") from None
    if left or failed:
        raise SourceUnavailable(f"Kafka at {config.kafka_bootstrap} did not take {left + len(failed)} of the "
                                f"{len(events)} sample events for topic {config.kafka_topic}"
                                + (f" ({failed[0]})" if failed else ""))
    return len(events)


def main() -> None:
    config = SessionsConfig.from_env()
    if config.uses_kafka:
        produced = produce_sample(config)
        print(f"produced {produced} events to Kafka topic {config.kafka_topic} at {config.kafka_bootstrap}")
    else:
        landed = land_sample(config.landing, users=2000, sessions_per_user=3, files=8)
        print(f"landed {landed['events']} events (+{landed['broken_lines']} broken lines) in {landed['files']} files "
              f"under {config.landing}")
    spark = get_spark(config)
    summary = catch_up(config, spark)
    report = status(config, spark=spark)
    print(json.dumps({
        "sessions_written": summary.sessions_written,
        "sessions_table_rows": report.sessions_rows,
        "open_users_in_state": report.open_users,
        "open_sessions_in_state": report.open_sessions,
        "open_events_in_state": report.open_events,
        "quarantined_lines": report.quarantine_rows,
        "provider": report.provider,
        "partitions": report.partitions,
        "last_committed_batch": report.last_committed_batch,
        "state_bytes": report.state_bytes,
        "seconds": summary.seconds,
    }, indent=2))
    print(f"tables under {config.warehouse_uri}; try `.venv/bin/sessionctl status --json` "
          f"or `deploy/dagster-dev`")
    print(f"point it at your Kafka topic in one line (with both variables set, `make demo` produces its sample to "
          f"that topic and catches up from it):\n    {KAFKA_ONE_LINE}   # or run")


if __name__ == "__main__":
    main()
