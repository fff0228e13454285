"""Kafka as the ingest source (pipelines/ingest/kafka.py) against librdkafka's in-process mock cluster.

The mock speaks the Kafka protocol but is not Apache Kafka: it cannot create or delete topics or records through the
admin API, so `MockCluster` drives librdkafka's own mock C API (rd_kafka_mock_topic_create / _topic_delete /
_partition_delete_records / _broker_set_down / _broker_set_up, exported by the wheel's bundled librdkafka) through
ctypes: a topic of exactly 3 partitions, retention (records deleted below an offset), a topic deleted and recreated, a
broker that goes down (refuses connections) and comes back. (The mock itself keeps about 5 MB per
partition and deletes older messages, like retention: keep test topics small.)
"""
from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.kafka_mock import MockCluster
from tests.conftest import REPO, config_env, free_port, make_config, read_quarantine, read_sessions, tool
from tests.harness import still_running, wait_until

pytestmark = pytest.mark.tier("pure")

GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000


@pytest.fixture(scope="session")
def kafka_cluster():
    cluster = MockCluster()
    yield cluster
    cluster.close()


def kafka_config(tmp_path: Path, cluster: MockCluster, topic: str, **env):
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

@pytest.mark.tier("spark")
def test_partitions_ingested_once_and_sessions_equal_the_oracle(spark, kafka_cluster, tmp_path):
    from pipelines.core.sample_data import arrival_order, generate_events
    from pipelines.ingest import ingest
    from pipelines.ingest.kafka import kafka_lag
    from pipelines.job.stream import catch_up
    from testkit.lifecycle_expectations import expected_closed_sessions

    topic = "clicks-a"
    kafka_cluster.create_topic(topic, 3)
    config = kafka_config(tmp_path, kafka_cluster, topic)
    events = arrival_order(generate_events(200, 3, seed=11), seed=11)  # duplicates included; jitter 120 s < lateness
    third = len(events) // 3
    chunks = [events[:third], events[third:2 * third], events[2 * third:]]

    acked = kafka_cluster.produce(topic, as_messages(chunks[0]))
    assert {p for p, _, _ in acked} == {0, 1, 2}
    first = catch_up(config, spark)  # ingest + stream
    assert first.ingested_rows == len(chunks[0])
    acked += kafka_cluster.produce(topic, as_messages(chunks[1]))
    second = ingest(config)
    assert (second.rows, second.files) == (len(chunks[1]), 3)
    assert ingest(config).rows == 0  # nothing new: no commit
    acked += kafka_cluster.produce(topic, as_messages(chunks[2]))
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


# --- (b) kill -9 inside ingest, before and after the Delta commit ------------------------------------------------

CHILD = r"""
import os, sys
from pipelines.config import SessionsConfig
from pipelines.ingest import ingest, kafka_client, table

point, n = sys.argv[1], int(sys.argv[2])
calls = 0
append = table.Appender.append

def killing_append(self, sources, metadata):  # test-only: SIGKILL right before/after the n-th Delta commit
    global calls
    calls += 1
    if point == "before" and calls == n:
        os.kill(os.getpid(), 9)
    append(self, sources, metadata)
    if point == "after" and calls == n:
        os.kill(os.getpid(), 9)

table.Appender.append = killing_append
if point == "group":  # after the last Delta commit, before the consumer group commit
    kafka_client.KafkaClient.commit_group = lambda self, offsets: os.kill(os.getpid(), 9)
ingest(SessionsConfig.from_env())
"""


@pytest.mark.tier("subprocess")
def test_kill_before_and_after_the_delta_commit_loses_and_doubles_nothing(kafka_cluster, tmp_path):
    from confluent_kafka import Consumer, TopicPartition

    from pipelines.core.sample_data import arrival_order, generate_events
    from pipelines.ingest import ingest
    from pipelines.ingest.kafka import kafka_lag
    from pipelines.ingest.kafka_client import DEFAULT_GROUP
    from pipelines.ingest.kafka_offsets import _offsets_from_rows, recorded_offsets
    from pipelines.ingest.table import open_raw_table

    topic = "clicks-kill"
    kafka_cluster.create_topic(topic, 3)
    config = kafka_config(tmp_path, kafka_cluster, topic, SESSIONS_KAFKA_COMMIT_MESSAGES=400)
    env = config_env(config, SESSIONS_KAFKA_BOOTSTRAP=kafka_cluster.bootstrap, SESSIONS_KAFKA_TOPIC=topic,
                     SESSIONS_KAFKA_COMMIT_MESSAGES=400)
    events = arrival_order(generate_events(150, 2, seed=5), seed=5)
    half = len(events) // 2
    acked = kafka_cluster.produce(topic, as_messages(events[:half]))

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
    acked += kafka_cluster.produce(topic, as_messages(events[half:]))
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
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": DEFAULT_GROUP})
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
    finally:
        consumer.close()
    assert {tp.partition: tp.offset for tp in committed} == recorded
    assert all(p["lag"] == 0 for p in kafka_lag(config).values())


# --- (c) poison messages: the file line rules, per message --------------------------------------------------------

@pytest.mark.tier("spark")
def test_poison_messages_are_quarantined_like_file_lines(spark, kafka_cluster, tmp_path):
    from pipelines.ingest import ingest
    from pipelines.job.stream import catch_up

    topic = "clicks-poison"
    kafka_cluster.create_topic(topic, 1)
    good = [{"event_id": f"e{i}", "user_id": "u1", "event_time": f"2026-11-01T08:0{i}:00Z", "event_type": "page_view",
             "page": "/"} for i in range(3)]
    values = [json.dumps(good[0]).encode(), b"not json {", json.dumps({"event_id": "x1", "event_time":
              "2026-11-01T08:00:30Z"}).encode(), None, b"   ", b"\xff\xfe", json.dumps(good[1]).encode(),
              json.dumps(good[2]).encode()]
    acked = kafka_cluster.produce(topic, [(None, v) for v in values], partition=0)
    config = kafka_config(tmp_path, kafka_cluster, topic)
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


def test_missing_topic_is_one_line(kafka_cluster, tmp_path):
    from pipelines.errors import SourceUnavailable
    from pipelines.ingest import ingest

    config = kafka_config(tmp_path, kafka_cluster, "no-such-topic")
    with pytest.raises(SourceUnavailable, match="Kafka topic no-such-topic does not exist on .*SESSIONS_KAFKA_TOPIC"):
        ingest(config)


# --- (e) offsets out of range: data lost under us ----------------------------------------------------------------

def lost_rows(config) -> list[tuple[str, int, str]]:
    """The quarantine's lost_in_source rows: (source_file, line_no, raw)."""
    quarantine = read_quarantine(config)
    lost = quarantine[quarantine["reason"] == "lost_in_source"]
    return sorted(zip(lost["source_file"], lost["line_no"].astype(int), lost["raw"]))


@pytest.mark.tier("spark")
def test_records_deleted_before_ingest_are_refused_until_an_operator_accepts_the_loss(spark, kafka_cluster, tmp_path):
    from pipelines.errors import SourceDataLost
    from pipelines.ingest import ingest
    from pipelines.ingest.kafka import kafka_lag
    from pipelines.ingest.kafka_offsets import recorded_offsets
    from pipelines.ingest.table import open_raw_table
    from pipelines.job.stream import catch_up
    from state_store.kafka_loss import accept_loss

    topic = "clicks-retention"
    kafka_cluster.create_topic(topic, 2)
    config = kafka_config(tmp_path, kafka_cluster, topic)
    event = {"event_id": "e", "user_id": "u", "event_time": "2026-11-01T08:00:00Z", "event_type": "page_view"}
    acked = kafka_cluster.produce(topic, [(None, json.dumps({**event, "event_id": f"a{i}"}).encode())
                                          for i in range(10)], partition=0)
    assert ingest(config).rows == 10
    acked += kafka_cluster.produce(topic, [(None, json.dumps({**event, "event_id": f"b{i}"}).encode())
                                           for i in range(10)], partition=0)
    kafka_cluster.delete_records(topic, 0, 15)  # offsets 10..14 gone before they were read
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


@pytest.mark.tier("spark")
def test_topic_deleted_or_recreated_is_refused_until_an_operator_accepts_the_loss(spark, kafka_cluster, tmp_path):
    from pipelines.errors import SourceDataLost, SourceUnavailable
    from pipelines.ingest import ingest
    from pipelines.ingest.kafka_offsets import recorded_offsets
    from pipelines.ingest.table import open_raw_table
    from pipelines.job.stream import catch_up
    from state_store.kafka_loss import accept_loss

    topic = "clicks-recreated"
    kafka_cluster.create_topic(topic, 2)
    config = kafka_config(tmp_path, kafka_cluster, topic)
    event = {"event_id": "e", "user_id": "u", "event_time": "2026-11-01T08:00:00Z"}
    kafka_cluster.produce(topic, [(None, json.dumps({**event, "event_id": f"a{i}"}).encode()) for i in range(6)],
                          partition=1)
    assert ingest(config).rows == 6
    kafka_cluster.delete_topic(topic)
    with pytest.raises(SourceDataLost, match=f"Kafka topic {topic} does not exist .* any more") as raised:
        ingest(config)
    assert raised.value.partition == 1
    kafka_cluster.create_topic(topic, 2)  # recreated, empty: offsets 0..5 would be the new topic's, skipped
    (new,) = kafka_cluster.produce(topic, [(None, json.dumps({**event, "event_id": "new"}).encode())], partition=1)
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
    kafka_cluster.delete_topic(topic)
    with pytest.raises(SourceDataLost, match="does not exist .* any more"):
        ingest(config)
    (deleted,) = accept_loss(config).accepted
    assert (deleted["partition"], deleted["first"], deleted["last"], deleted["resumes_at"]) == (1, 1, None, None)
    assert recorded_offsets(open_raw_table(config), topic) == {0: 0}
    with pytest.raises(SourceUnavailable, match=f"Kafka topic {topic} does not exist on .*: create it"):
        ingest(config)
    kafka_cluster.create_topic(topic, 2)
    kafka_cluster.produce(topic, [(None, json.dumps({**event, "event_id": "newer"}).encode())], partition=1)
    catch_up(config, spark)
    assert sorted(r["event_id"] for r in raw_rows(config) if r["event_id"]) == sorted(
        [f"a{i}" for i in range(6)] + ["new", "newer"])
    assert lost_rows(config) == sorted([(f"kafka://{topic}/1", 6, recreated["what"]),
                                        (f"kafka://{topic}/1", 1, deleted["what"])])


@pytest.mark.tier("subprocess")
def test_accept_loss_command_prints_one_json_line(kafka_cluster, tmp_path):
    from pipelines.ingest import ingest

    topic = "clicks-accept-cli"
    kafka_cluster.create_topic(topic, 1)
    config = kafka_config(tmp_path, kafka_cluster, topic)
    env = config_env(config, SESSIONS_KAFKA_BOOTSTRAP=kafka_cluster.bootstrap, SESSIONS_KAFKA_TOPIC=topic)
    event = {"event_id": "e", "user_id": "u", "event_time": "2026-11-01T08:00:00Z"}
    kafka_cluster.produce(topic, [(None, json.dumps({**event, "event_id": f"a{i}"}).encode()) for i in range(8)])
    kafka_cluster.delete_records(topic, 0, 3)  # 0..2 gone before the first ingest: nothing lost (never recorded)
    assert ingest(config).rows == 5
    kafka_cluster.produce(topic, [(None, json.dumps({**event, "event_id": f"b{i}"}).encode()) for i in range(4)])
    kafka_cluster.delete_records(topic, 0, 10)  # 8, 9 lost

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

@pytest.mark.tier("spark")
def test_restore_to_a_savepoint_older_than_the_topics_retention_replays_from_raw_events(spark, kafka_cluster, tmp_path):
    from pipelines.core.sample_data import arrival_order, generate_events
    from pipelines.ingest.kafka import kafka_lag
    from pipelines.job.stream import catch_up
    from state_store.lifecycle import restore, take_savepoint
    from testkit.lifecycle_expectations import expected_closed_sessions

    topic = "clicks-retained"
    kafka_cluster.create_topic(topic, 2)
    config = kafka_config(tmp_path, kafka_cluster, topic)
    events = arrival_order(generate_events(60, 3, seed=23), seed=23)
    third = len(events) // 3
    chunks = [events[:third], events[third:2 * third], events[2 * third:]]
    expected = expected_closed_sessions(chunks, GAP_MS, LATENESS_MS)

    acked = kafka_cluster.produce(topic, as_messages(chunks[0]))
    catch_up(config, spark)
    saved = take_savepoint(config, spark=spark)
    acked += kafka_cluster.produce(topic, as_messages(chunks[1]))
    catch_up(config, spark)
    # Retention passes: everything up to the high watermarks is deleted, the messages after the savepoint included
    # (delete_records leaves the offsets consistent: raw_events recorded reading up to the high watermark).
    for partition in range(2):
        kafka_cluster.delete_records(topic, partition, 1 + max(o for p, o, _ in acked if p == partition))
    assert all(p["low_watermark"] == p["high_watermark"] and p["lag"] == 0 for p in kafka_lag(config).values())
    acked += kafka_cluster.produce(topic, as_messages(chunks[2]))  # the topic goes on

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


@pytest.mark.tier("subprocess")
def test_run_retries_with_backoff_while_the_broker_is_down(tmp_path):
    from pipelines.core.sample_data import arrival_order, generate_events
    from pipelines.ingest.table import open_raw_table
    from testkit.lifecycle_expectations import expected_closed_sessions

    cluster = MockCluster()  # its own: this test takes the broker down
    try:
        topic = "clicks-outage"
        cluster.create_topic(topic, 3)
        config = kafka_config(tmp_path, cluster, topic)
        env = config_env(config, SESSIONS_KAFKA_BOOTSTRAP=cluster.bootstrap, SESSIONS_KAFKA_TOPIC=topic)
        events = arrival_order(generate_events(60, 3, seed=31), seed=31)
        half = len(events) // 2
        acked = cluster.produce(topic, as_messages(events[:half]))
        expected = expected_closed_sessions([events[:half], events[half:]], GAP_MS, LATENESS_MS)

        def ingested() -> int:
            return len(raw_rows(config)) if open_raw_table(config) is not None else 0

        out, err = tmp_path / "run.out", tmp_path / "run.err"
        with out.open("w") as out_file, err.open("w") as err_file:
            run = subprocess.Popen([tool("sessionctl"), "run", "--poll-seconds", "1"], env=env, stdout=out_file,
                                   stderr=err_file, cwd=tmp_path)
        try:
            _wait_until(lambda: ingested() == half, 180, "the first half ingested", run, err)
            cluster.broker_down()
            # Each attempt gives up once the client finds the broker down (within its 10 s); the waits between them
            # double from the poll interval.
            _wait_until(lambda: "next attempt in 4 s" in err.read_text(), 90, "two failed ingests", run, err)
            lines = [line for line in err.read_text().splitlines() if "run retries by itself" in line]
            assert lines[0].startswith(f"sessionctl run: Kafka at {cluster.bootstrap} is unreachable for topic "
                                       f"{topic} (") and "next attempt in 2 s" in lines[0], lines
            cluster.broker_up()
            acked += cluster.produce(topic, as_messages(events[half:]))
            _wait_until(lambda: ingested() == len(events), 120, "the second half ingested", run, err)
            _wait_until(lambda: read_sessions(config) == expected, 120, "the sessions of both halves", run, err)
        finally:
            run.send_signal(signal.SIGINT)
            run.wait(timeout=120)
        assert run.returncode == 0, err.read_text()[-3000:]
        summary = json.loads(out.read_text().strip().splitlines()[-1])
        assert summary["source_errors"] >= 2 and summary["last_source_error"].startswith(f"Kafka at {cluster.bootstrap}")
        assert "the source answers again after" in err.read_text()
        assert_each_message_once(config, topic, acked)
        assert read_sessions(config) == expected and read_quarantine(config).empty
    finally:
        cluster.close()


# --- (h) idle close: a quiet topic gets clock rows, a broker that is down does not ---------------------------------

def test_idle_close_with_kafka_appends_a_clock_row_only_when_the_broker_answers(tmp_path, monkeypatch):
    from pipelines.core.sample_data import generate_events
    from pipelines.errors import SourceUnavailable
    from pipelines.ingest import ingest, kafka
    from pipelines.ingest.table import CLOCK_KIND

    monkeypatch.setattr(kafka, "TIMEOUT_S", 2.0)  # a broker that is down: the error after 2 s, not 10
    cluster = MockCluster()
    try:
        topic = "clicks-idle"
        cluster.create_topic(topic, 2)
        config = kafka_config(tmp_path, cluster, topic, SESSIONS_IDLE_CLOSE_MINUTES="0.02")  # 1.2 s
        events = generate_events(5, 1, seed=3)
        cluster.produce(topic, as_messages(events))

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
        cluster.broker_down()
        with pytest.raises(SourceUnavailable):
            ingest(config, now=now)
        assert len(clock_rows()) == 1
        cluster.broker_up()
        assert ingest(config, now=now).clock is not None and len(clock_rows()) == 2  # it answers (nothing new)
    finally:
        cluster.close()


# --- configuration ---------------------------------------------------------------------------------------------

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


def test_the_streams_source_imports_neither_the_kafka_client_nor_pandas():
    """Spark starts ~4 Python processes per query start that import pipelines.job.source (the source and its schema, the
    streaming runner, the read planner, the readers); each paid ~0.3 s for pandas (via pyarrow.dataset), the Kafka
    client and the landing sources before they were imported where used (benchmarks/README.md, end_to_end.py)."""
    heavy = ("pandas", "confluent_kafka", "boto3", "pyarrow.dataset",
             "pipelines.ingest.kafka", "pipelines.ingest.kafka_client", "pipelines.ingest.kafka_offsets",
             "pipelines.ingest.s3", "pipelines.ingest.local")
    probe = f"import sys, pipelines.job.source; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
