"""Kafka as the ingest source (pipelines/ingest/kafka.py) against Apache Kafka's own broker.

The broker is tests/kafka_broker.py's `kafka_broker`: one single-node KRaft broker (broker and controller in one JVM,
the Apache Kafka 4.4 jars of jvm/kafka/pom.xml) on loopback for the whole session, started by deploy/local-kafka. Every
fault these tests need, it gives on demand through its admin API or as a process: topics of N partitions created,
deleted and created again (a new topic id), records deleted below an offset (DeleteRecords), real time-based
retention (a topic's retention.ms lowered; the broker checks every second), a controlled shutdown or a kill -9 of the
broker and a restart on the same log dir (what it acknowledged is there after; `run` and a consumer in the middle of
an ingest reconnect).

Nothing here is left on librdkafka's in-process mock cluster (testkit/kafka_mock.py, which stays for
benchmarks/kafka_ingest.py): it was needed only for faults Apache Kafka gives on demand as well. A broker that is down
is this broker stopped (connections refused, as the mock's broker_down) or killed (connections reset first); records
deleted in the middle of an ingest's read come from DeleteRecords run between the consumer's first messages and its
next fetch (FaultAfterFirstMessages: small fetches and a 1 KB prefetch queue, so the consumer cannot have fetched
ahead), where the mock would inject OFFSET_OUT_OF_RANGE into a Fetch response. What only the mock can inject --
arbitrary protocol errors in any response (rd_kafka_mock_push_request_errors), a slow broker (_broker_set_rtt) -- no
test here needs.

Tiers: the tests that use the broker are e2e (a server, like moto S3 or PostgreSQL: not in `make test-fast`); the
rest say their own tier.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.kafka_broker import KafkaBroker
from tests.kit.homes import REPO, config_env, free_port, make_config, tool
from tests.kit.tables import read_quarantine, read_sessions
from tests.kit.waits import still_running, wait_until

pytestmark = pytest.mark.tier("e2e")

GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000


def kafka_config(tmp_path: Path, cluster: KafkaBroker, topic: str, **env):
    return make_config(tmp_path, SESSIONS_KAFKA_BOOTSTRAP=cluster.bootstrap, SESSIONS_KAFKA_TOPIC=topic, **env)


def raw_rows(config) -> list[dict]:
    from deltalake import DeltaTable

    return DeltaTable(config.raw_events_table).to_pyarrow_table(
        columns=["source_file", "line_no", "event_id", "reject_reason", "raw", "ingest_seq"]).to_pylist()


def as_messages(events: list[dict]) -> list[tuple[str | None, bytes | None]]:
    return [(e["user_id"], json.dumps(e).encode()) for e in events]


def assert_each_message_once(config, topic: str, acked: list[tuple[int, int, bytes | None]]) -> None:
    """raw_events holds every acknowledged message exactly once, at kafka://topic/partition and its offset (and
    besides them only the rows of accepted losses)."""
    rows = [r for r in raw_rows(config) if r["reject_reason"] != "lost_in_source"]
    where = [(r["source_file"], r["line_no"]) for r in rows]
    assert len(where) == len(set(where)), "a message was ingested twice"
    expected = {(f"kafka://{topic}/{p}", offset): json.loads(value)["event_id"] for p, offset, value in acked}
    assert {w: r["event_id"] for w, r in zip(where, rows)} == expected


# --- (a) several partitions, several ingests, the stream vs the oracle -----------------------------------------

def test_partitions_ingested_once_and_sessions_equal_the_oracle(spark, kafka_broker, tmp_path):
    from pipelines.core.sample_data import arrival_order, generate_events
    from pipelines.ingest import ingest
    from pipelines.ingest.kafka import kafka_lag
    from pipelines.job.stream import catch_up
    from testkit.lifecycle_expectations import expected_closed_sessions

    topic = "clicks-a"
    kafka_broker.create_topic(topic, 3)
    config = kafka_config(tmp_path, kafka_broker, topic)
    events = arrival_order(generate_events(200, 3, seed=11), seed=11)  # duplicates included; jitter 120 s < lateness
    third = len(events) // 3
    chunks = [events[:third], events[third:2 * third], events[2 * third:]]

    acked = kafka_broker.produce(topic, as_messages(chunks[0]))
    assert {p for p, _, _ in acked} == {0, 1, 2}
    first = catch_up(config, spark)  # ingest + stream
    assert first.ingested_rows == len(chunks[0])
    acked += kafka_broker.produce(topic, as_messages(chunks[1]))
    second = ingest(config)
    assert (second.rows, second.files) == (len(chunks[1]), 3)
    assert ingest(config).rows == 0  # nothing new: no commit
    acked += kafka_broker.produce(topic, as_messages(chunks[2]))
    lag = kafka_lag(config)
    assert sum(p["lag"] for p in lag.values()) == len(chunks[2])
    from state_store.status import status

    shown = status(config, with_state=False).kafka_lag  # what `status --json` prints
    assert shown is not None and sum(p["lag"] for p in shown.values()) == len(chunks[2]) and len(shown) == 3
    catch_up(config, spark)

    assert_each_message_once(config, topic, acked)
    assert all(p["lag"] == 0 for p in kafka_lag(config).values())
    expected = expected_closed_sessions([events], GAP_MS, LATENESS_MS)
    assert len(expected) > 400 and read_sessions(config) == expected
    assert read_quarantine(config).empty  # no late event, no bad line


def test_a_backlog_read_by_spark_tasks_has_the_rows_of_a_read_here_and_the_oracles_sessions(spark, kafka_broker,
                                                                                              tmp_path):
    """A backlog of at least SESSIONS_KAFKA_COMMIT_MESSAGES read by Spark tasks (one per partition and round,
    pipelines.job.ingest_tasks) gives the rows a read here gives -- poison messages included -- and records the same
    offsets; a catch-up with tasks in local mode (SESSIONS_INGEST_BY_TASKS=always) writes the oracle's sessions."""
    from pipelines.core.sample_data import arrival_order, generate_events
    from pipelines.ingest import ingest
    from pipelines.ingest.kafka_offsets import recorded_offsets
    from pipelines.ingest.table import open_raw_table
    from pipelines.job.ingest_tasks import SparkIngestTasks
    from pipelines.job.stream import catch_up
    from testkit.lifecycle_expectations import expected_closed_sessions

    topic = "clicks-tasks"
    kafka_broker.create_topic(topic, 3)
    events = arrival_order(generate_events(120, 3, seed=23), seed=23)
    half = len(events) // 2
    poison = [(None, b"not json {"), (None, None), (None, b"\xff\xfe"), (None, b"   ")]
    acked = kafka_broker.produce(topic, as_messages(events[:half]) + poison)
    limit = {"SESSIONS_KAFKA_COMMIT_MESSAGES": 150}  # rounds of tasks, several commits
    here = kafka_config(tmp_path / "here", kafka_broker, topic, **limit)
    tasks = kafka_config(tmp_path / "tasks", kafka_broker, topic, SESSIONS_INGEST_BY_TASKS="always", **limit)
    read_here = ingest(here)
    by_tasks = ingest(tasks, large=SparkIngestTasks(spark, min_bytes=1))
    assert by_tasks.by_tasks == 3 and read_here.by_tasks == 0 and by_tasks.last_seq > 1
    assert (by_tasks.rows, by_tasks.rejected) == (read_here.rows, read_here.rejected) == (half + 2, 2)

    def keyed(config):
        return sorted((r["source_file"], r["line_no"], r["event_id"], r["reject_reason"], r["raw"])
                      for r in raw_rows(config))
    assert keyed(tasks) == keyed(here)
    keys = open_raw_table(tasks).to_pyarrow_table(columns=["ingest_seq", "line_key"]).to_pylist()
    assert len({(r["ingest_seq"], r["line_key"]) for r in keys}) == len(keys)  # the late events' provenance key
    assert recorded_offsets(open_raw_table(tasks), topic) == recorded_offsets(open_raw_table(here), topic)
    assert ingest(tasks, large=SparkIngestTasks(spark, min_bytes=1)).rows == 0

    acked += kafka_broker.produce(topic, as_messages(events[half:]))
    # A home that reads the whole topic in one round of tasks (the limit is per partition): one commit, one
    # micro-batch, as the oracle's one batch -- rounds interleave the partitions' event times.
    per_partition = max(Counter(p for p, _, _ in acked).values())
    stream = kafka_config(tmp_path / "stream", kafka_broker, topic, SESSIONS_INGEST_BY_TASKS="always",
                          SESSIONS_KAFKA_COMMIT_MESSAGES=per_partition)
    summary = catch_up(stream, spark)  # the backlog waits for the session, then its tasks read it
    assert summary.files_read_by_tasks == 3
    valid = [r for r in raw_rows(stream) if r["reject_reason"] is None]
    assert sorted((r["source_file"], r["line_no"], r["event_id"]) for r in valid) == sorted(
        (f"kafka://{topic}/{p}", offset, json.loads(value)["event_id"]) for p, offset, value in acked
        if value and value.startswith(b"{"))  # every event's message once
    assert read_sessions(stream) == expected_closed_sessions([events], GAP_MS, LATENESS_MS)


@pytest.mark.tier("subprocess")
def test_a_catch_up_killed_between_the_kafka_tasks_files_and_the_ingest_commit_loses_and_repeats_nothing(
        spark, kafka_broker, tmp_path):
    """`sessionctl catch-up` with a backlog read by Spark tasks, SIGKILLed at ingest:files-written: the tasks'
    raw_events files are on disk in no table version and no offset is recorded; the next catch-up reads the same
    messages again, and every message is in raw_events once and every session the oracle's, once. The next catch-up
    is the library call `sessionctl catch-up` makes, in the tests' session: what it must redo is what the killed
    process left on disk (a second process would add only a JVM start; a `sessionctl catch-up` process after a kill:
    the crash campaign's recoveries)."""
    from deltalake import DeltaTable

    from pipelines.core.sample_data import arrival_order, generate_events
    from pipelines.job.stream import catch_up
    from testkit.lifecycle_expectations import expected_closed_sessions

    topic = "clicks-tasks-kill"
    kafka_broker.create_topic(topic, 3)
    events = arrival_order(generate_events(60, 3, seed=29), seed=29)
    acked = kafka_broker.produce(topic, as_messages(events))
    per_partition = max(Counter(p for p, _, _ in acked).values())  # one round of tasks: one commit, one batch
    config = kafka_config(tmp_path, kafka_broker, topic)
    env = config_env(config, SESSIONS_KAFKA_BOOTSTRAP=kafka_broker.bootstrap, SESSIONS_KAFKA_TOPIC=topic,
                     SESSIONS_INGEST_BY_TASKS="always", SESSIONS_KAFKA_COMMIT_MESSAGES=per_partition)
    killed = subprocess.run([tool("sessionctl"), "catch-up"], env={**env, "SESSIONS_KILL_AT": "ingest:files-written"},
                            capture_output=True, text=True, timeout=600, start_new_session=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    raw = Path(config.raw_events_table)
    on_disk = {str(p) for p in raw.glob("*.parquet")}
    assert on_disk and not set(DeltaTable(str(raw)).file_uris()) & on_disk  # written, committed nowhere

    resumed = catch_up(kafka_config(tmp_path, kafka_broker, topic, SESSIONS_INGEST_BY_TASKS="always",
                                    SESSIONS_KAFKA_COMMIT_MESSAGES=per_partition), spark).to_dict()
    assert resumed["files_read_by_tasks"] == 3
    assert_each_message_once(config, topic, acked)
    assert read_sessions(config) == expected_closed_sessions([events], GAP_MS, LATENESS_MS)


# --- (b) kill -9 inside ingest, before and after the Delta commit ------------------------------------------------

CHILD = r"""
import os, sys
from pipelines.config import SessionsConfig
from pipelines.ingest import appender, ingest, kafka_client

point, n = sys.argv[1], int(sys.argv[2])
calls = 0
append = appender.Appender.append

def killing_append(self, sources, metadata):  # test-only: SIGKILL right before/after the n-th Delta commit
    global calls
    calls += 1
    if point == "before" and calls == n:
        os.kill(os.getpid(), 9)
    append(self, sources, metadata)
    if point == "after" and calls == n:
        os.kill(os.getpid(), 9)

appender.Appender.append = killing_append
if point == "group":  # after the last Delta commit, before the consumer group commit
    kafka_client.KafkaClient.commit_group = lambda self, offsets: os.kill(os.getpid(), 9)
ingest(SessionsConfig.from_env())
"""


def test_kill_before_and_after_the_delta_commit_loses_and_doubles_nothing(kafka_broker, tmp_path):
    from confluent_kafka import Consumer, TopicPartition

    from pipelines.core.sample_data import arrival_order, generate_events
    from pipelines.ingest import ingest
    from pipelines.ingest.kafka import kafka_lag
    from pipelines.ingest.kafka_client import DEFAULT_GROUP
    from pipelines.ingest.kafka_offsets import _offsets_from_rows, recorded_offsets
    from pipelines.ingest.table import open_raw_table

    topic = "clicks-kill"
    kafka_broker.create_topic(topic, 3)
    config = kafka_config(tmp_path, kafka_broker, topic, SESSIONS_KAFKA_COMMIT_MESSAGES=400)
    env = config_env(config, SESSIONS_KAFKA_BOOTSTRAP=kafka_broker.bootstrap, SESSIONS_KAFKA_TOPIC=topic,
                     SESSIONS_KAFKA_COMMIT_MESSAGES=400)
    events = arrival_order(generate_events(150, 2, seed=5), seed=5)
    half = len(events) // 2
    acked = kafka_broker.produce(topic, as_messages(events[:half]))

    def killed(point: str, n: int) -> None:
        done = subprocess.run([sys.executable, "-c", CHILD, point, str(n)], env=env, cwd=REPO, capture_output=True,
                              text=True, timeout=180)
        assert done.returncode == -9, done.stderr[-3000:]

    def ingested() -> int:
        return len(raw_rows(config)) if open_raw_table(config) is not None else 0

    killed("before", 1)  # nothing committed
    assert ingested() == 0
    killed("after", 2)  # two commits of 400, the rest not
    assert ingested() == 800
    killed("group", 0)  # every Delta commit made, the consumer group never told
    assert ingested() == half
    acked += kafka_broker.produce(topic, as_messages(events[half:]))
    killed("before", 2)  # one more commit of 400, killed before the second
    assert ingested() == half + 400
    killed("after", 1)
    assert ingested() == half + 800
    result = ingest(config)
    assert result.rows == len(events) - half - 800
    assert_each_message_once(config, topic, acked)

    # The Delta log is the truth; the consumer group got the same offsets afterwards (for lag tools only).
    recorded = recorded_offsets(open_raw_table(config), topic)
    assert recorded == {p: 1 + max(o for q, o, _ in acked if q == p) for p in range(3)}
    assert _offsets_from_rows(open_raw_table(config), topic) == recorded  # the fallback after log cleanup agrees
    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": DEFAULT_GROUP})
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
    finally:
        consumer.close()
    assert {tp.partition: tp.offset for tp in committed} == recorded
    assert all(p["lag"] == 0 for p in kafka_lag(config).values())


# --- (c) poison messages: the file line rules, per message --------------------------------------------------------

def test_poison_messages_are_quarantined_like_file_lines(spark, kafka_broker, tmp_path):
    from pipelines.ingest import ingest
    from pipelines.job.stream import catch_up

    topic = "clicks-poison"
    kafka_broker.create_topic(topic, 1)
    good = [{"event_id": f"e{i}", "user_id": "u1", "event_time": f"2026-11-01T08:0{i}:00Z", "event_type": "page_view",
             "page": "/"} for i in range(3)]
    values = [json.dumps(good[0]).encode(), b"not json {", json.dumps({"event_id": "x1", "event_time":
              "2026-11-01T08:00:30Z"}).encode(), None, b"   ", b"\xff\xfe", json.dumps(good[1]).encode(),
              json.dumps(good[2]).encode()]
    acked = kafka_broker.produce(topic, [(None, v) for v in values], partition=0)
    config = kafka_config(tmp_path, kafka_broker, topic)
    assert ingest(config).rows == 6  # the null value and the blank one carry nothing (their offsets are consumed)
    rows = {r["line_no"]: r for r in raw_rows(config)}
    offsets = [offset for _, offset, _ in acked]
    assert rows[offsets[1]]["reject_reason"] == "malformed_json" and rows[offsets[1]]["raw"] == "not json {"
    assert rows[offsets[2]]["reject_reason"] == "missing_user_id"
    assert rows[offsets[5]]["reject_reason"] == "invalid_utf8" and rows[offsets[5]]["raw"] == "\\xff\\xfe"
    assert offsets[3] not in rows and offsets[4] not in rows
    assert [rows[offsets[i]]["event_id"] for i in (0, 6, 7)] == ["e0", "e1", "e2"]

    # The same values as lines of a landed file get the same reasons.
    file_config = make_config(tmp_path / "files")
    file_config.landing.mkdir(parents=True)
    (file_config.landing / ".same.tmp").write_bytes(b"".join((v or b"") + b"\n" for v in values))
    os.replace(file_config.landing / ".same.tmp", file_config.landing / "same.jsonl")  # written aside, renamed in
    ingest(file_config)
    by_line = {r["line_no"]: r["reject_reason"] for r in raw_rows(file_config)}
    assert [by_line.get(i + 1) for i in range(len(values))] == [rows[o]["reject_reason"] if o in rows else None
                                                                  for o in offsets]

    catch_up(config, spark)
    quarantine = read_quarantine(config)
    assert sorted(zip(quarantine["source_file"], quarantine["line_no"], quarantine["reason"])) == sorted([
        (f"kafka://{topic}/0", offsets[1], "malformed_json"), (f"kafka://{topic}/0", offsets[2], "missing_user_id"),
        (f"kafka://{topic}/0", offsets[5], "invalid_utf8")])


# --- (d) broker unreachable -----------------------------------------------------------------------------------------

@pytest.mark.tier("pure")
def test_unreachable_broker_is_one_line_naming_the_bootstrap(tmp_path, capfd):
    from pipelines.errors import SourceUnavailable
    from pipelines.ingest import ingest
    from pipelines.ingest.kafka import kafka_lag
    from pipelines.ingest.kafka_client import TIMEOUT_S

    bootstrap = f"127.0.0.1:{free_port()}"
    config = make_config(tmp_path, SESSIONS_KAFKA_BOOTSTRAP=bootstrap, SESSIONS_KAFKA_TOPIC="clicks")
    started = time.monotonic()
    with pytest.raises(SourceUnavailable) as raised:
        ingest(config)
    # A refused connection is known at once: the command does not wait out the client's timeout to say so.
    assert time.monotonic() - started < TIMEOUT_S / 2
    message = str(raised.value)
    assert "\n" not in message and bootstrap in message and "clicks" in message
    assert "Connection refused" in message or "transport" in message.lower(), message
    assert "%3|" not in capfd.readouterr().err  # librdkafka's log lines go to Python logging, not stderr
    with pytest.raises(SourceUnavailable):
        kafka_lag(config)


def test_missing_topic_is_one_line(kafka_broker, tmp_path):
    from pipelines.errors import SourceUnavailable
    from pipelines.ingest import ingest

    config = kafka_config(tmp_path, kafka_broker, "no-such-topic")
    with pytest.raises(SourceUnavailable, match="Kafka topic no-such-topic does not exist on .*SESSIONS_KAFKA_TOPIC"):
        ingest(config)


# --- (e) offsets out of range: data lost under us ----------------------------------------------------------------

def lost_rows(config) -> list[tuple[str, int, str]]:
    """The quarantine's lost_in_source rows: (source_file, line_no, raw)."""
    quarantine = read_quarantine(config)
    lost = quarantine[quarantine["reason"] == "lost_in_source"]
    return sorted(zip(lost["source_file"], lost["line_no"].astype(int), lost["raw"]))


def test_records_deleted_before_ingest_are_refused_until_an_operator_accepts_the_loss(spark, kafka_broker, tmp_path):
    from pipelines.errors import SourceDataLost
    from pipelines.ingest import ingest
    from pipelines.ingest.kafka import kafka_lag
    from pipelines.ingest.kafka_offsets import recorded_offsets
    from pipelines.ingest.table import open_raw_table
    from pipelines.job.stream import catch_up
    from state_store.kafka_loss import accept_loss

    topic = "clicks-retention"
    kafka_broker.create_topic(topic, 2)
    config = kafka_config(tmp_path, kafka_broker, topic)
    event = {"event_id": "e", "user_id": "u", "event_time": "2026-11-01T08:00:00Z", "event_type": "page_view"}
    acked = kafka_broker.produce(topic, [(None, json.dumps({**event, "event_id": f"a{i}"}).encode())
                                          for i in range(10)], partition=0)
    assert ingest(config).rows == 10
    acked += kafka_broker.produce(topic, [(None, json.dumps({**event, "event_id": f"b{i}"}).encode())
                                           for i in range(10)], partition=0)
    kafka_broker.delete_records(topic, 0, 15)  # offsets 10..14 gone before they were read
    before = len(raw_rows(config))
    with pytest.raises(SourceDataLost) as raised:
        ingest(config)
    lost = raised.value
    assert (lost.topic, lost.partition, lost.first, lost.last) == (topic, 0, 10, 14)
    assert "\n" not in str(lost) and f"topic {topic} partition 0: offsets 10..14" in str(lost)
    assert "next: `sessionctl accept-loss` records the loss" in str(lost)  # the way on, in the same line
    assert len(raw_rows(config)) == before  # nothing skipped, nothing written
    assert kafka_lag(config)[0] == {"next_offset": 10, "high_watermark": 20, "lag": 10, "low_watermark": 15}
    with pytest.raises(SourceDataLost):
        ingest(config)  # still refused: never a silent skip

    accepted = accept_loss(config)
    (gap,) = accepted.accepted
    assert (gap["partition"], gap["first"], gap["last"], gap["resumes_at"]) == (0, 10, 14, 15)
    assert "offsets 10..14 (5 messages)" in gap["what"] and "accepted the loss with `sessionctl accept-loss`" in gap["what"]
    # One commit: the gap's row and the partition's next offset past it (every partition recorded, as ingest does).
    assert recorded_offsets(open_raw_table(config), topic) == {0: 15, 1: 0}
    assert accepted.ingest_seq == max(r["ingest_seq"] for r in raw_rows(config))
    assert accept_loss(config).accepted == []  # nothing lost any more: no commit
    assert len(raw_rows(config)) == before + 1

    summary = catch_up(config, spark)
    assert summary.ingested_rows == 5  # b5..b9 (offsets 15..19), once
    assert_each_message_once(config, topic, [a for a in acked if not 10 <= a[1] <= 14])
    assert lost_rows(config) == [(f"kafka://{topic}/0", 10, gap["what"])]  # in quarantine, for good
    assert ingest(config).rows == 0


def test_topic_deleted_or_recreated_is_refused_until_an_operator_accepts_the_loss(spark, kafka_broker, tmp_path):
    from pipelines.errors import SourceDataLost, SourceUnavailable
    from pipelines.ingest import ingest
    from pipelines.ingest.kafka_offsets import recorded_offsets
    from pipelines.ingest.table import open_raw_table
    from pipelines.job.stream import catch_up
    from state_store.kafka_loss import accept_loss

    topic = "clicks-recreated"
    kafka_broker.create_topic(topic, 2)
    config = kafka_config(tmp_path, kafka_broker, topic)
    event = {"event_id": "e", "user_id": "u", "event_time": "2026-11-01T08:00:00Z"}
    kafka_broker.produce(topic, [(None, json.dumps({**event, "event_id": f"a{i}"}).encode()) for i in range(6)],
                          partition=1)
    assert ingest(config).rows == 6
    kafka_broker.delete_topic(topic)
    with pytest.raises(SourceDataLost, match=f"Kafka topic {topic} does not exist .* any more") as raised:
        ingest(config)
    assert raised.value.partition == 1
    kafka_broker.create_topic(topic, 2)  # recreated, empty: offsets 0..5 would be the new topic's, skipped
    (new,) = kafka_broker.produce(topic, [(None, json.dumps({**event, "event_id": "new"}).encode())], partition=1)
    with pytest.raises(SourceDataLost) as raised:
        ingest(config)
    assert (raised.value.partition, raised.value.first, raised.value.last) == (1, 1, 5)
    assert "deleted and recreated" in str(raised.value) and str(raised.value).count("sessionctl accept-loss") == 1

    # Recreated: the partition starts over at its new earliest offset; the loss is what the old one held after 5.
    (recreated,) = accept_loss(config).accepted
    assert (recreated["partition"], recreated["first"], recreated["last"], recreated["resumes_at"]) == (1, 6, None, 0)
    assert "from offset 6 on is lost" in recreated["what"]
    catch_up(config, spark)
    rows = raw_rows(config)
    assert [r["line_no"] for r in rows if r["event_id"] == "new"] == [new[1]]  # the new topic's message, once

    # Deleted (and not yet recreated): the partition's recorded offset is dropped; the missing topic is then the
    # plain one-line error, and a topic created again is read from its earliest offsets.
    kafka_broker.delete_topic(topic)
    with pytest.raises(SourceDataLost, match="does not exist .* any more"):
        ingest(config)
    (deleted,) = accept_loss(config).accepted
    assert (deleted["partition"], deleted["first"], deleted["last"], deleted["resumes_at"]) == (1, 1, None, None)
    assert recorded_offsets(open_raw_table(config), topic) == {0: 0}
    with pytest.raises(SourceUnavailable, match=f"Kafka topic {topic} does not exist on .*: create it"):
        ingest(config)
    kafka_broker.create_topic(topic, 2)
    kafka_broker.produce(topic, [(None, json.dumps({**event, "event_id": "newer"}).encode())], partition=1)
    catch_up(config, spark)
    assert sorted(r["event_id"] for r in raw_rows(config) if r["event_id"]) == sorted(
        [f"a{i}" for i in range(6)] + ["new", "newer"])
    assert lost_rows(config) == sorted([(f"kafka://{topic}/1", 6, recreated["what"]),
                                        (f"kafka://{topic}/1", 1, deleted["what"])])


def test_accept_loss_command_prints_one_json_line(kafka_broker, tmp_path):
    from pipelines.ingest import ingest

    topic = "clicks-accept-cli"
    kafka_broker.create_topic(topic, 1)
    config = kafka_config(tmp_path, kafka_broker, topic)
    env = config_env(config, SESSIONS_KAFKA_BOOTSTRAP=kafka_broker.bootstrap, SESSIONS_KAFKA_TOPIC=topic)
    event = {"event_id": "e", "user_id": "u", "event_time": "2026-11-01T08:00:00Z"}
    kafka_broker.produce(topic, [(None, json.dumps({**event, "event_id": f"a{i}"}).encode()) for i in range(8)])
    kafka_broker.delete_records(topic, 0, 3)  # 0..2 gone before the first ingest: nothing lost (never recorded)
    assert ingest(config).rows == 5
    kafka_broker.produce(topic, [(None, json.dumps({**event, "event_id": f"b{i}"}).encode()) for i in range(4)])
    kafka_broker.delete_records(topic, 0, 10)  # 8, 9 lost

    def accept(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([tool("sessionctl"), "accept-loss", *args], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    done = accept("--json")
    assert done.stdout.count("\n") == 1, done.stdout
    shown = json.loads(done.stdout)
    assert shown["topic"] == topic and shown["ingest_seq"] == 2
    assert [(g["partition"], g["first"], g["last"], g["resumes_at"]) for g in shown["accepted"]] == [(0, 8, 9, 10)]
    again = accept()
    assert again.stdout.startswith("nothing lost") and again.stdout.count("\n") == 1, again.stdout
    assert ingest(config).rows == 2  # b2, b3


@pytest.mark.tier("pure")
def test_plan_new_partitions_start_at_their_earliest_and_lost_ones_are_refused():
    from pipelines.errors import SourceDataLost
    from pipelines.ingest.kafka_offsets import Span, plan

    spans = plan("t", {0: 5, 1: 3}, {0: (0, 9), 1: (2, 3), 2: (4, 7)})  # partition 2 is new (retention below 4)
    assert spans == {0: Span(5, 9, 0), 1: Span(3, 3, 2), 2: Span(4, 7, 4)}
    with pytest.raises(SourceDataLost) as raised:
        plan("t", {0: 5, 3: 8}, {0: (0, 9)})  # a recorded partition gone
    assert (raised.value.partition, raised.value.first) == (3, 8)
    assert plan("t", {0: 5, 3: 0}, {0: (0, 9)}) == {0: Span(5, 9, 0)}  # never read: nothing lost


# --- (f) a restore to a savepoint older than the topic's retention: replayed from raw_events alone ----------------

def test_restore_to_a_savepoint_older_than_the_topics_retention_replays_from_raw_events(spark, kafka_broker, tmp_path):
    from pipelines.core.sample_data import arrival_order, generate_events
    from pipelines.ingest.kafka import kafka_lag
    from pipelines.job.stream import catch_up
    from state_store.lifecycle import restore, take_savepoint
    from testkit.lifecycle_expectations import expected_closed_sessions

    topic = "clicks-retained"
    kafka_broker.create_topic(topic, 2)
    config = kafka_config(tmp_path, kafka_broker, topic)
    events = arrival_order(generate_events(60, 3, seed=23), seed=23)
    third = len(events) // 3
    chunks = [events[:third], events[third:2 * third], events[2 * third:]]
    expected = expected_closed_sessions(chunks, GAP_MS, LATENESS_MS)

    # Chunks 0 and 1 carry timestamps two hours old, chunk 2 the time it is produced: a retention of one hour set
    # after chunk 1 was ingested drops exactly chunks 0 and 1.
    two_hours_ago = int(time.time() * 1000) - 2 * 3600_000
    acked = kafka_broker.produce(topic, as_messages(chunks[0]), timestamp_ms=two_hours_ago)
    catch_up(config, spark)
    saved = take_savepoint(config, spark=spark)
    acked += kafka_broker.produce(topic, as_messages(chunks[1]), timestamp_ms=two_hours_ago)
    catch_up(config, spark)
    # Retention passes: the broker deletes every segment older than retention.ms, the messages after the savepoint
    # included (it rolls the active segment first: the partition then starts at its high watermark).
    assert {p for p, _, _ in acked} == {0, 1}
    kafka_broker.set_topic_config(topic, retention_ms=3600_000)
    ends = {p: 1 + max(o for q, o, _ in acked if q == p) for p in range(2)}
    wait_until(lambda: all(kafka_broker.watermarks(topic, p) == (ends[p], ends[p]) for p in range(2)), timeout_s=60,
               interval_s=0.2, what="the broker's retention to delete chunks 0 and 1")
    assert all(p["low_watermark"] == p["high_watermark"] and p["lag"] == 0 for p in kafka_lag(config).values())
    acked += kafka_broker.produce(topic, as_messages(chunks[2]))  # the topic goes on

    restore(config, saved.savepoint_id, spark=spark)
    assert len(read_sessions(config)) < len(expected) - 20  # the sessions chunk 1 closed are gone with the restore
    summary = catch_up(config, spark)  # no SourceDataLost: raw_events holds what the topic dropped
    assert summary.ingested_rows == len(chunks[2])
    assert_each_message_once(config, topic, acked)
    assert len(expected) > 100 and read_sessions(config) == expected  # every session once, chunk 1 replayed
    assert read_quarantine(config).empty


# --- (g) `run` rides out a broker outage ----------------------------------------------------------------------

def _wait_until(predicate, seconds: float, what: str, run: subprocess.Popen, err: Path) -> None:
    """harness.wait_until while `run` lives (its stderr, `err`, in the message when it died)."""
    wait_until(lambda: still_running(run, err) and predicate(), timeout_s=seconds, interval_s=0.5, what=what)


def test_run_retries_with_backoff_while_the_broker_is_down(kafka_broker, tmp_path):
    from pipelines.core.sample_data import arrival_order, generate_events
    from pipelines.ingest.table import open_raw_table
    from testkit.lifecycle_expectations import expected_closed_sessions

    topic = "clicks-outage"
    # One partition: the run may ingest the second half while it is being produced, and a read of one partition is
    # a prefix of arrival order, which this data's bounded disorder keeps on time at every cut. Across partitions a
    # read can hold one partition's later events without another's earlier ones, making some events late by design.
    kafka_broker.create_topic(topic, 1)
    bootstrap = kafka_broker.bootstrap
    config = kafka_config(tmp_path, kafka_broker, topic)
    env = config_env(config, SESSIONS_KAFKA_BOOTSTRAP=bootstrap, SESSIONS_KAFKA_TOPIC=topic)
    events = arrival_order(generate_events(60, 3, seed=31), seed=31)
    half = len(events) // 2
    acked = kafka_broker.produce(topic, as_messages(events[:half]))
    expected = expected_closed_sessions([events[:half], events[half:]], GAP_MS, LATENESS_MS)

    def ingested() -> int:
        return len(raw_rows(config)) if open_raw_table(config) is not None else 0

    out, err = tmp_path / "run.out", tmp_path / "run.err"
    with out.open("w") as out_file, err.open("w") as err_file:
        run = subprocess.Popen([tool("sessionctl"), "run", "--poll-seconds", "1"], env=env, stdout=out_file,
                               stderr=err_file, cwd=tmp_path)
    try:
        _wait_until(lambda: ingested() == half, 180, "the first half ingested", run, err)
        kafka_broker.stop(kill=True)  # a crash: connections reset, then refused
        # Each attempt gives up once the client finds the broker down (within its 10 s); the waits between them
        # double from the poll interval.
        _wait_until(lambda: "next attempt in 4 s" in err.read_text(), 90, "two failed ingests", run, err)
        lines = [line for line in err.read_text().splitlines() if "run retries by itself" in line]
        assert all(line.startswith(f"sessionctl run: Kafka at {bootstrap} ") for line in lines), lines
        assert "next attempt in 2 s" in lines[0] and any(
            f"is unreachable for topic {topic} (" in line for line in lines), lines
        kafka_broker.start()  # the same log dir and port: the first half is still there
        acked += kafka_broker.produce(topic, as_messages(events[half:]))
        _wait_until(lambda: ingested() == len(events), 120, "the second half ingested", run, err)
        _wait_until(lambda: read_sessions(config) == expected, 120, "the sessions of both halves", run, err)
    finally:
        run.send_signal(signal.SIGINT)
        run.wait(timeout=120)
        kafka_broker.ensure_running()
    assert run.returncode == 0, err.read_text()[-3000:]
    summary = json.loads(out.read_text().strip().splitlines()[-1])
    assert summary["source_errors"] >= 2 and summary["last_source_error"].startswith(f"Kafka at {bootstrap}")
    assert "the source answers again after" in err.read_text()
    assert_each_message_once(config, topic, acked)
    assert read_sessions(config) == expected and read_quarantine(config).empty


# --- (h) idle close: a quiet topic gets clock rows, a broker that is down does not ---------------------------------

def test_idle_close_with_kafka_appends_a_clock_row_only_when_the_broker_answers(kafka_broker, tmp_path, monkeypatch):
    from pipelines.core.sample_data import generate_events
    from pipelines.errors import SourceUnavailable
    from pipelines.ingest import ingest, kafka
    from pipelines.ingest.table import CLOCK_KIND

    monkeypatch.setattr(kafka, "TIMEOUT_S", 2.0)  # a broker that is down: the error after 2 s, not 10
    topic = "clicks-idle"
    kafka_broker.create_topic(topic, 2)
    config = kafka_config(tmp_path, kafka_broker, topic, SESSIONS_IDLE_CLOSE_MINUTES="0.02")  # 1.2 s
    events = generate_events(5, 1, seed=3)
    kafka_broker.produce(topic, as_messages(events))

    def clock_rows() -> list[dict]:
        from deltalake import DeltaTable

        return [r for r in DeltaTable(config.raw_events_table).to_pyarrow_table().to_pylist()
                if r["row_kind"] == CLOCK_KIND]

    first = ingest(config)
    assert first.rows == len(events) and first.clock is None  # just ingested: not idle
    # The idle time is judged at `now` (ingest's clock for tests), not slept through.
    now = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1.3)
    quiet = ingest(config, now=now)
    assert quiet.rows == 0 and quiet.clock is not None
    assert [r["event_time"] for r in clock_rows()] == [dt.datetime.fromisoformat(quiet.clock.replace("Z", "+00:00"))]

    now += dt.timedelta(seconds=1.3)  # idle long enough again, but the broker is down: its silence is not idleness
    kafka_broker.stop()
    try:
        with pytest.raises(SourceUnavailable):
            ingest(config, now=now)
        assert len(clock_rows()) == 1
    finally:
        kafka_broker.start()
    assert ingest(config, now=now).clock is not None and len(clock_rows()) == 2  # it answers (nothing new)


# --- (i) the broker restarts: between two ingests, with messages pending, in the middle of an ingest ---------------

# Small fetches and a prefetch queue of 1 KB: the consumer holds a few messages ahead of what ingest took, never the
# whole partition, so what happens on the broker in the middle of an ingest reaches its next fetch. (A full queue
# postpones the next fetch by fetch.queue.backoff.ms, 1 s by default: 10 ms here.)
SMALL_FETCHES = {"max.partition.fetch.bytes": 1024, "queued.max.messages.kbytes": 1, "queued.min.messages": 1,
                 "fetch.queue.backoff.ms": 10}


def produce_in_small_batches(broker: KafkaBroker, topic: str, messages: list[tuple[str | None, bytes | None]],
                             partition: int | None = None, per_batch: int = 10) -> list[tuple[int, int, bytes | None]]:
    """One produce call (one record batch per partition at most) per `per_batch` messages."""
    acked = []
    for start in range(0, len(messages), per_batch):
        acked += broker.produce(topic, messages[start:start + per_batch], partition=partition)
    return acked


class FaultAfterFirstMessages:
    """The ingest's consumer (KafkaClient.consumer), with `fault()` run once its first consume call returned messages:
    that call asks for at most 5, so the fault falls in the middle of the read whatever the batch size; meanwhile the
    consumer prefetches at most SMALL_FETCHES' queue. Counts the messages delivered after the fault."""

    def __init__(self, consumer, fault) -> None:
        self.consumer, self.fault = consumer, fault
        self.done, self.after = False, 0

    def consume(self, num_messages: int = 1, timeout: float = -1):
        if self.done:
            messages = self.consumer.consume(num_messages, timeout)
            self.after += sum(1 for m in messages if m.error() is None)
            return messages
        messages = self.consumer.consume(min(num_messages, 5), timeout)
        if any(m.error() is None for m in messages):
            self.done = True
            self.fault()
        return messages

    def __getattr__(self, name: str):
        return getattr(self.consumer, name)


def fault_in_the_first_read(monkeypatch, fault) -> list:
    """Every KafkaClient made from now on reads through a FaultAfterFirstMessages (its `consumer`); the clients made
    are returned."""
    from pipelines.ingest import kafka_client

    made: list = []
    init = kafka_client.KafkaClient.__init__

    def faulty_init(self, config):
        init(self, config)
        self.consumer = FaultAfterFirstMessages(self.consumer, fault)
        made.append(self)

    monkeypatch.setattr(kafka_client.KafkaClient, "__init__", faulty_init)
    return made


def test_broker_restarts_between_ingests_and_with_messages_pending_lose_and_double_nothing(spark, kafka_broker,
                                                                                            tmp_path):
    from pipelines.core.sample_data import arrival_order, generate_events
    from pipelines.errors import SourceUnavailable
    from pipelines.ingest import ingest
    from pipelines.ingest.kafka import kafka_lag
    from pipelines.job.stream import catch_up
    from testkit.lifecycle_expectations import expected_closed_sessions

    topic = "clicks-restart"
    kafka_broker.create_topic(topic, 3)
    config = kafka_config(tmp_path, kafka_broker, topic)
    events = arrival_order(generate_events(90, 2, seed=41), seed=41)
    third = len(events) // 3
    chunks = [events[:third], events[third:2 * third], events[2 * third:]]

    acked = kafka_broker.produce(topic, as_messages(chunks[0]))
    assert ingest(config).rows == len(chunks[0])
    acked += kafka_broker.produce(topic, as_messages(chunks[1]))  # acknowledged, not ingested yet
    before = len(raw_rows(config))
    try:
        kafka_broker.stop()  # a controlled shutdown
        with pytest.raises(SourceUnavailable) as raised:
            ingest(config)
        assert "\n" not in str(raised.value) and f"Kafka at {kafka_broker.bootstrap} " in str(raised.value)
        assert len(raw_rows(config)) == before  # nothing written
        kafka_broker.start()  # the same log dir: chunk 1 is still there, raw_events' offsets still point into it
        assert sum(p["lag"] for p in kafka_lag(config).values()) == len(chunks[1])
        acked += kafka_broker.produce(topic, as_messages(chunks[2]))
        kafka_broker.restart(kill=True)  # a crash with chunks 1 and 2 pending
    finally:
        kafka_broker.ensure_running()
    assert sum(p["lag"] for p in kafka_lag(config).values()) == len(chunks[1]) + len(chunks[2])
    summary = catch_up(config, spark)
    assert summary.ingested_rows == len(chunks[1]) + len(chunks[2])

    assert_each_message_once(config, topic, acked)
    assert all(p["lag"] == 0 for p in kafka_lag(config).values())
    expected = expected_closed_sessions([events], GAP_MS, LATENESS_MS)
    assert len(expected) > 150 and read_sessions(config) == expected
    assert read_quarantine(config).empty


def test_a_consumer_reconnects_when_the_broker_restarts_in_the_middle_of_an_ingest(kafka_broker, tmp_path,
                                                                                    monkeypatch):
    from confluent_kafka import KafkaError

    from pipelines.ingest import ingest
    from pipelines.ingest.kafka import kafka_lag

    topic = "clicks-reconnect"
    kafka_broker.create_topic(topic, 2)
    # Reconnect attempts at most 1 s apart (librdkafka's default backs off up to 10 s).
    conf = json.dumps({**SMALL_FETCHES, "reconnect.backoff.max.ms": 1000})
    config = kafka_config(tmp_path, kafka_broker, topic, SESSIONS_KAFKA_COMMIT_MESSAGES=20, SESSIONS_KAFKA_CONF=conf)
    event = {"event_id": "e", "user_id": "u", "event_time": "2026-11-01T08:00:00Z", "event_type": "page_view"}
    acked = produce_in_small_batches(kafka_broker, topic, [
        (f"u{i % 7}", json.dumps({**event, "event_id": f"m{i}", "user_id": f"u{i % 7}"}).encode()) for i in range(300)])
    assert {p for p, _, _ in acked} == {0, 1}

    # After the first messages: the broker crashes and comes back (the same log dir and port).
    clients = fault_in_the_first_read(monkeypatch, lambda: kafka_broker.restart(kill=True))
    try:
        result = ingest(config)
    finally:
        kafka_broker.ensure_running()
    (client,) = clients
    assert client.consumer.done and result.rows == len(acked)
    # Most messages were fetched after the restart: the consumer lost its connection (and found the broker down),
    # reconnected and went on from where it was.
    assert client.consumer.after > len(acked) // 2, client.consumer.after
    assert any(e.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN) for e in client.errors), [
        e.str() for e in client.errors]
    assert_each_message_once(config, topic, acked)
    assert all(p["lag"] == 0 for p in kafka_lag(config).values())


# --- (j) more partitions than cores ------------------------------------------------------------------------------

def test_a_topic_with_more_partitions_than_cores_is_ingested_once(spark, kafka_broker, tmp_path):
    from pipelines.core.sample_data import arrival_order, generate_events
    from pipelines.ingest import ingest
    from pipelines.ingest.kafka import kafka_lag
    from pipelines.job.stream import catch_up
    from state_store.status import status
    from testkit.lifecycle_expectations import expected_closed_sessions

    topic = "clicks-six"
    kafka_broker.create_topic(topic, 6)  # the machine has 2 cores; Spark runs local[2]
    config = kafka_config(tmp_path, kafka_broker, topic)
    events = arrival_order(generate_events(120, 2, seed=43), seed=43)
    third = len(events) // 3
    chunks = [events[:third], events[third:2 * third], events[2 * third:]]

    acked = kafka_broker.produce(topic, as_messages(chunks[0]))
    assert {p for p, _, _ in acked} == set(range(6))
    first = ingest(config)
    assert (first.rows, first.files) == (len(chunks[0]), 6)
    acked += kafka_broker.produce(topic, as_messages(chunks[1]))
    catch_up(config, spark)
    acked += kafka_broker.produce(topic, as_messages(chunks[2]))
    shown = status(config, with_state=False).kafka_lag
    assert shown is not None and len(shown) == 6 and sum(p["lag"] for p in shown.values()) == len(chunks[2])
    catch_up(config, spark)

    assert_each_message_once(config, topic, acked)
    assert len(kafka_lag(config)) == 6 and all(p["lag"] == 0 for p in kafka_lag(config).values())
    expected = expected_closed_sessions([events], GAP_MS, LATENESS_MS)
    assert len(expected) > 200 and read_sessions(config) == expected
    assert read_quarantine(config).empty


# --- (k) records deleted while an ingest reads them ---------------------------------------------------------------

def test_records_deleted_while_an_ingest_reads_them_keep_what_was_read_and_refuse_the_rest(kafka_broker, tmp_path,
                                                                                            monkeypatch):
    from pipelines.errors import SourceDataLost
    from pipelines.ingest import ingest
    from state_store.kafka_loss import accept_loss

    topic = "clicks-deleted-mid-read"
    kafka_broker.create_topic(topic, 1)
    config = kafka_config(tmp_path, kafka_broker, topic, SESSIONS_KAFKA_COMMIT_MESSAGES=10,
                          SESSIONS_KAFKA_CONF=json.dumps(SMALL_FETCHES))
    event = {"event_id": "e", "user_id": "u", "event_time": "2026-11-01T08:00:00Z", "event_type": "page_view"}
    acked = produce_in_small_batches(kafka_broker, topic, [
        (None, json.dumps({**event, "event_id": f"m{i}"}).encode()) for i in range(100)], partition=0)
    # After the first messages, far ahead of what the consumer fetched: offsets 0..59 deleted.
    fault_in_the_first_read(monkeypatch, lambda: kafka_broker.delete_records(topic, 0, 60))
    with pytest.raises(SourceDataLost) as raised:
        ingest(config)
    monkeypatch.undo()
    read = sorted(r["line_no"] for r in raw_rows(config))
    # What was read before the broker answered "out of range" is committed, without a gap: the messages the consumer
    # had fetched before the deletion, no more.
    assert 5 <= len(read) < 60 and read == list(range(len(read)))
    lost = raised.value
    assert (lost.partition, lost.first, lost.last) == (0, len(read), 59), str(lost)
    assert "\n" not in str(lost) and "were deleted while this ingest read them" in str(lost)

    (gap,) = accept_loss(config).accepted
    assert (gap["first"], gap["last"], gap["resumes_at"]) == (len(read), 59, 60)
    assert ingest(config).rows == 40
    assert_each_message_once(config, topic, [a for a in acked if not len(read) <= a[1] <= 59])


# --- configuration ---------------------------------------------------------------------------------------------

@pytest.mark.tier("pure")
def test_kafka_settings(tmp_path):
    from pipelines.config import ConfigError, SessionsConfig, kafka_settings
    from pipelines.ingest import _source, kafka, kafka_client, local

    with pytest.raises(ConfigError, match="^SESSIONS_KAFKA_BOOTSTRAP is set but SESSIONS_KAFKA_TOPIC is not"):
        make_config(tmp_path, SESSIONS_KAFKA_BOOTSTRAP="b:9092")
    with pytest.raises(ConfigError, match="^SESSIONS_KAFKA_TOPIC is set but SESSIONS_KAFKA_BOOTSTRAP is not"):
        make_config(tmp_path, SESSIONS_KAFKA_TOPIC="t")
    assert _source(make_config(tmp_path)) is local
    config = make_config(tmp_path, SESSIONS_KAFKA_BOOTSTRAP="b:9092", SESSIONS_KAFKA_TOPIC="t",
                         SESSIONS_KAFKA_CONF="security.protocol=SASL_SSL, sasl.password=s=cr")
    assert _source(config) is kafka
    assert "s=cr" not in repr(config)  # may hold credentials
    assert config.kafka_consumer_settings == {"security.protocol": "SASL_SSL", "sasl.password": "s=cr"}
    assert kafka_settings('{"fetch.max.bytes": 1048576, "check.crcs": true, "sasl.jaas.config": "a,b"}') == {
        "fetch.max.bytes": "1048576", "check.crcs": "true", "sasl.jaas.config": "a,b"}
    with pytest.raises(ConfigError, match="item 2 is not key=value") as raised:
        SessionsConfig.from_env({"SESSIONS_HOME": str(tmp_path), "SESSIONS_KAFKA_CONF": "sasl.password=a,secret"})
    assert "secret" not in str(raised.value)
    with pytest.raises(ConfigError, match="is not a JSON object"):
        kafka_settings("{nope")
    with pytest.raises(ConfigError, match="may not set auto.offset.reset"):  # refused when the settings are read
        make_config(tmp_path, SESSIONS_KAFKA_BOOTSTRAP="b:9092", SESSIONS_KAFKA_TOPIC="t",
                    SESSIONS_KAFKA_CONF="auto.offset.reset=latest")
    kafka = make_config(tmp_path, SESSIONS_KAFKA_BOOTSTRAP="b:9092", SESSIONS_KAFKA_TOPIC="t")
    with pytest.raises(ConfigError, match="may not set auto.offset.reset"):  # and by the client, for a config in code
        kafka_client.KafkaClient(kafka.with_(kafka_conf="auto.offset.reset=latest"))
    # Only an allowlist passes: nothing that loads code or runs a command, no read of aborted transactions; the line
    # names the key, never the value.
    for conf, says in (("plugin.library.paths=/tmp/evil.so", "'plugin.library.paths' is not an allowed"),
                       ("ssl.engine.location=/tmp/evil.so", "'ssl.engine.location' is not an allowed"),
                       ("sasl.kerberos.kinit.cmd=touch /tmp/pwned", "'sasl.kerberos.kinit.cmd' is not an allowed"),
                       ("isolation.level=read_uncommitted", "isolation.level may only be read_committed"),
                       ("enable.auto.commit=true", "may not set enable.auto.commit"),
                       ("metadata.broker.list=elsewhere:9092", "may not set metadata.broker.list"),
                       ("sasl.password=a,b=secret", "no consumer property name")):
        with pytest.raises(ConfigError, match=says) as refused:
            make_config(tmp_path, SESSIONS_KAFKA_CONF=conf)
        assert conf.split("=")[-1] not in str(refused.value)
        with pytest.raises(ConfigError, match=says):
            kafka_client.KafkaClient(kafka.with_(kafka_conf=conf))
    allowed = make_config(tmp_path, SESSIONS_KAFKA_CONF='{"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", '
                          '"ssl.ca.location": "/ca.pem", "group.id": "g", "client.id": "c", "session.timeout.ms": 9000, '
                          '"fetch.max.bytes": 1, "socket.timeout.ms": 1, "isolation.level": "read_committed"}')
    assert len(allowed.kafka_consumer_settings) == 9
