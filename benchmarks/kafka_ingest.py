"""Ingest throughput: Kafka topic vs local landing files, the same events, side by side in one run (A B B A ...).

Per round and variant: a fresh SESSIONS_HOME, then `pipelines.ingest.ingest` timed alone (read the source, apply the
line rules, append raw_events; Kafka also records offsets in the commits and commits the consumer group; files also
archive). The events are produced / landed once, before the rounds. The broker is librdkafka's in-process mock
cluster (driven through its C API by testkit/kafka_mock.py, for a topic of --partitions partitions: the mock
keeps about 5 MB per partition and deletes older messages, like retention): it runs in this process's threads and
shares the 2 cores with the ingest; it is not Apache Kafka (no disk, no replication, loopback only). Prints one JSON
object with both figures and the machine's load average before and after.

    .venv/bin/python benchmarks/kafka_ingest.py                  # 200k events, 2 rounds each, ~1-2 min on 2 cores
    .venv/bin/python benchmarks/kafka_ingest.py --events 50000 --rounds 1
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from confluent_kafka import Producer  # noqa: E402

from pipelines.config import SessionsConfig  # noqa: E402
from pipelines.core.sample_data import arrival_order, generate_events  # noqa: E402
from pipelines.ingest import ingest  # noqa: E402
from testkit.kafka_mock import MockCluster  # noqa: E402  (librdkafka's mock C API through ctypes)

TOPIC = "bench-clicks"


def _events(count: int) -> list[bytes]:
    users = max(1, count // 20)  # ~6.5 events per session, 3 sessions per user: a little over count
    events = arrival_order(generate_events(users, 4, seed=3), seed=3)
    while len(events) < count:
        users *= 2
        events = arrival_order(generate_events(users, 4, seed=3), seed=3)
    return [json.dumps(e).encode() for e in events[:count]]


def _mock_topic(values: list[bytes], partitions: int) -> tuple[MockCluster, float]:
    """A mock cluster holding the values in a topic of `partitions` partitions; seconds to produce them."""
    cluster = MockCluster()
    cluster.create_topic(TOPIC, partitions)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 20, "batch.num.messages": 10000})
    started = time.perf_counter()
    for n, value in enumerate(values):
        while True:
            try:
                producer.produce(TOPIC, value=value, key=str(n % 1000).encode())
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120) != 0:
        raise RuntimeError("the mock cluster did not take every message")
    return cluster, time.perf_counter() - started


def _land(landing: Path, values: list[bytes], files: int) -> None:
    landing.mkdir(parents=True, exist_ok=True)
    per = -(-len(values) // files)
    for k in range(files):
        tmp = landing / f".part-{k:03d}.tmp"
        tmp.write_bytes(b"".join(v + b"\n" for v in values[k * per:(k + 1) * per]))
        os.replace(tmp, landing / f"part-{k:03d}.jsonl")


def _round(variant: str, n: int, work: Path, values: list[bytes], bootstrap: str, files: int) -> dict[str, Any]:
    home = work / f"{variant}-{n}"
    env = {"SESSIONS_HOME": str(home)}
    if variant == "kafka":
        env.update(SESSIONS_KAFKA_BOOTSTRAP=bootstrap, SESSIONS_KAFKA_TOPIC=TOPIC)
    config = SessionsConfig.from_env(env)
    if variant == "file":
        _land(config.landing, values, files)
    started = time.perf_counter()
    result = ingest(config)
    seconds = time.perf_counter() - started
    if result.rows != len(values):
        raise RuntimeError(f"{variant}: ingested {result.rows} rows, expected {len(values)}")
    commits = result.last_seq - (result.first_seq or result.last_seq) + 1
    return {"variant": variant, "round": n, "seconds": round(seconds, 3), "rows": result.rows, "commits": commits,
            "events_per_s": round(len(values) / seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2, help="rounds per variant, alternating A B B A")
    parser.add_argument("--files", type=int, default=8, help="landing files the file variant reads")
    parser.add_argument("--partitions", type=int, default=8,
                        help="topic partitions (the mock keeps ~5 MB per partition: older messages are deleted)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    values = _events(args.events)
    cluster, produce_s = _mock_topic(values, args.partitions)
    runs = []
    with tempfile.TemporaryDirectory(prefix="kafka-bench-") as work:
        for n in range(args.rounds):
            order = ("file", "kafka") if n % 2 == 0 else ("kafka", "file")
            for variant in order:
                runs.append(_round(variant, n, Path(work), values, cluster.bootstrap, args.files))
    cluster.close()
    medians = {v: statistics.median(r["events_per_s"] for r in runs if r["variant"] == v) for v in ("file", "kafka")}
    print(json.dumps({
        "benchmark": "kafka_ingest", "events": len(values), "bytes": sum(len(v) for v in values),
        "rounds_per_variant": args.rounds, "landing_files": args.files,
        "kafka": {"broker": "librdkafka mock cluster, in-process (not Apache Kafka)", "partitions": args.partitions,
                  "produce_seconds": round(produce_s, 3), "events_per_commit": SessionsConfig.kafka_commit_messages},
        "median_events_per_s": medians, "kafka_vs_file": round(medians["kafka"] / medians["file"], 3),
        "runs": runs, "cpus": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }, indent=2))


if __name__ == "__main__":
    main()
