"""Bad input goes to quarantine with the right reason, source_file and line_no; the valid events beside it
are still sessionized; and nothing is lost: every landed non-blank line is in a session, in the open state,
in quarantine, or a dropped duplicate."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from pipelines.job.stream import catch_up
from testkit.oracle import run_oracle
from tests.kit.datagen import BASE_MS, iso
from tests.kit.homes import make_config
from tests.kit.storages import STORAGES, checkpoint_env
from tests.kit.tables import read_open_sessions, read_quarantine, read_sessions

pytestmark = pytest.mark.tier("spark")

MIN = 60_000
GAP_MS, LATENESS_MS = 30 * MIN, 10 * MIN


def _event(eid, user, ms, kind="page_view", **extra):
    return {"event_id": eid, "user_id": user, "event_time": iso(ms), "event_type": kind, "page": "/x", **extra}


def _write(landing: Path, name: str, data: bytes, mtime: int) -> None:
    """Atomic landing of exact bytes (CRLF, no trailing newline...): write aside, rename in."""
    landing.mkdir(parents=True, exist_ok=True)
    tmp = landing / f".{name}.tmp"
    tmp.write_bytes(data)
    os.utime(tmp, (mtime, mtime))
    os.replace(tmp, landing / name)


@pytest.mark.parametrize("storage", STORAGES)
def test_bad_lines_are_quarantined_and_nothing_is_lost(spark, request, tmp_path, storage):
    config = make_config(tmp_path, "rocksdb", **checkpoint_env(request, spark, storage, tmp_path))
    t0 = BASE_MS
    a1 = _event("a1", "alice", t0)
    a2 = _event("a2", "alice", t0 + 5 * MIN, "click", note="extra fields are ignored")
    # 08:07:30+02:00 is 06:07:30Z: an offset is honoured (this is 2 h before t0, in its own session).
    b1 = {"event_id": "b1", "user_id": "bob", "event_time": "2026-11-01T08:07:30.123456+02:00",
          "event_type": "page_view", "page": None}
    file1 = [
        json.dumps(a1),                                                           # 1 valid
        '{"event_id": "x1", "user_id": "alice", "event_time": ',                  # 2 malformed_json
        '[1, 2, 3]',                                                              # 3 not_an_object (array)
        json.dumps({"user_id": "alice", "event_time": iso(t0)}),                 # 4 missing_event_id
        json.dumps({"event_id": "x4", "event_time": iso(t0)}),                   # 5 missing_user_id
        json.dumps({"event_id": "x5", "user_id": "alice"}),                      # 6 missing_event_time
        json.dumps({"event_id": "x6", "user_id": "alice", "event_time": "yesterday"}),  # 7 unparseable
        json.dumps({"event_id": "x7", "user_id": "alice", "event_time": "2026-11-01T08:00:00"}),  # 8 no offset
        "",                                                                       # 9 blank: skipped
        json.dumps(a2),                                                           # 10 valid
        json.dumps(a1),                                                           # 11 duplicate of line 1
        '"just a string"',                                                        # 12 not_an_object
        json.dumps(b1),                                                           # 13 valid, +02:00 offset
        "   ",                                                                    # 14 blank
        json.dumps({"event_id": "", "user_id": "alice", "event_time": iso(t0)}),  # 15 missing_event_id (empty)
        json.dumps(_event("a3", "alice", t0 + 10 * MIN, "logout")),               # 16 valid, no newline after
    ]
    _write(config.landing, "f1.jsonl", "\n".join(file1).encode(), 1_700_000_000)

    # File 2 (CRLF line endings) moves time on by 2 h: file 3's watermark is t0 + 111 min.
    c1 = _event("c1", "carol", t0 + 120 * MIN)
    file2 = [json.dumps(c1), "null", "{}", json.dumps(_event("c2", "carol", t0 + 121 * MIN, "logout"))]
    _write(config.landing, "f2.jsonl", ("\r\n".join(file2) + "\r\n").encode(), 1_700_000_010)

    late = _event("late1", "dave", t0 + 111 * MIN)       # exactly at the watermark: late
    on_time = _event("ok1", "dave", t0 + 111 * MIN + 1)  # 1 ms above it: on time
    late_dup = _event("a2", "alice", t0 + 5 * MIN)        # a duplicate of a closed event, and late
    file3 = [json.dumps(late), json.dumps(on_time), "not json at all", json.dumps(late_dup)]
    _write(config.landing, "f3.jsonl", "\n".join(file3).encode() + b"\n", 1_700_000_020)

    from pipelines.ingest import ingest

    ingest(config, files_per_commit=1)  # one file = one micro-batch, in landing order
    started = time.monotonic()
    summary = catch_up(config, spark)
    wall = time.monotonic() - started
    # The stream reads the well-formed rows only (rejected lines go to quarantine from raw_events, below).
    raw = DeltaTable(config.raw_events_table).to_pyarrow_table(columns=["reject_reason"])
    assert summary.input_rows == raw["reject_reason"].null_count < raw.num_rows
    # Where the seconds went, each phase once, within the call's own time (the JVM was attached: ~0 s).
    phases = summary.phase_seconds
    assert set(phases) == {"spark", "ingest", "query_start", "stream"} and phases["stream"] > 0
    assert sum(phases.values()) <= wall + 0.01 and phases["spark"] < 1

    q = read_quarantine(config)
    got = sorted(zip(q["source_file"], q["line_no"].astype(int), q["reason"]))
    expected = sorted([
        ("f1.jsonl", 2, "malformed_json"), ("f1.jsonl", 3, "not_an_object"), ("f1.jsonl", 4, "missing_event_id"),
        ("f1.jsonl", 5, "missing_user_id"), ("f1.jsonl", 6, "missing_event_time"),
        ("f1.jsonl", 7, "unparseable_event_time"), ("f1.jsonl", 8, "unparseable_event_time"),
        ("f1.jsonl", 12, "not_an_object"), ("f1.jsonl", 15, "missing_event_id"),
        ("f2.jsonl", 2, "not_an_object"), ("f2.jsonl", 3, "missing_event_id"),
        ("f3.jsonl", 1, "late"), ("f3.jsonl", 3, "malformed_json"), ("f3.jsonl", 4, "late"),
    ])
    assert got == expected

    # The raw line is kept for rejected lines; late rows keep the event's identity and time.
    by_pos = {(r.source_file, int(r.line_no)): r for r in q.itertuples()}
    assert by_pos[("f1.jsonl", 2)].raw == file1[1]
    assert by_pos[("f1.jsonl", 3)].raw == "[1, 2, 3]"
    assert by_pos[("f1.jsonl", 8)].raw == file1[7]
    assert by_pos[("f2.jsonl", 2)].raw == "null"  # CRLF stripped
    assert by_pos[("f3.jsonl", 3)].raw == "not json at all"
    for pos, event, ms in ((("f3.jsonl", 1), late, t0 + 111 * MIN), (("f3.jsonl", 4), late_dup, t0 + 5 * MIN)):
        row = by_pos[pos]
        assert (row.event_id, row.user_id, int(row.event_time_ms)) == (event["event_id"], event["user_id"], ms)
        assert json.loads(row.raw)["event_id"] == event["event_id"]
    assert (by_pos[("f1.jsonl", 5)].event_id, by_pos[("f1.jsonl", 6)].user_id) == ("x4", "alice")
    assert set(q["ingest_seq"].astype(int)) == {1, 2, 3}
    assert len(q) == len(expected)  # each bad line quarantined exactly once

    # The valid events: sessions and open state equal the oracle's; b1's time is truncated to the ms.
    b1_ms = t0 - 2 * 3_600_000 + 7 * MIN + 30_000 + 123
    valid = [[{"event_id": "a1", "user_id": "alice", "event_time_ms": t0, "event_type": "page_view"},
              {"event_id": "a2", "user_id": "alice", "event_time_ms": t0 + 5 * MIN, "event_type": "click"},
              {"event_id": "a1", "user_id": "alice", "event_time_ms": t0, "event_type": "page_view"},
              {"event_id": "b1", "user_id": "bob", "event_time_ms": b1_ms, "event_type": "page_view"},
              {"event_id": "a3", "user_id": "alice", "event_time_ms": t0 + 10 * MIN, "event_type": "logout"}],
             [{"event_id": "c1", "user_id": "carol", "event_time_ms": t0 + 120 * MIN, "event_type": "page_view"},
              {"event_id": "c2", "user_id": "carol", "event_time_ms": t0 + 121 * MIN, "event_type": "logout"}],
             [{"event_id": "late1", "user_id": "dave", "event_time_ms": t0 + 111 * MIN, "event_type": "page_view"},
              {"event_id": "ok1", "user_id": "dave", "event_time_ms": t0 + 111 * MIN + 1, "event_type": "page_view"},
              {"event_id": "a2", "user_id": "alice", "event_time_ms": t0 + 5 * MIN, "event_type": "page_view"}]]
    oracle = run_oracle(valid, GAP_MS, LATENESS_MS)
    assert sorted(oracle.late) == ["a2", "late1"] and oracle.duplicates == 1
    sessions = read_sessions(config)
    assert sessions == sorted(oracle.closed)
    assert {(s[1], s[4], s[5], s[6]) for s in sessions} == {("alice", 3, 1, "logout"), ("bob", 1, 1, "inactivity")}
    assert b1_ms in {s[2] for s in sessions}
    open_sessions = read_open_sessions(spark, config)
    assert open_sessions == sorted(oracle.open_sessions)
    assert sorted((s[1], s[4], s[6]) for s in open_sessions) == [("carol", 2, "logout"), ("dave", 1, "inactivity")]

    # Nothing lost: non-blank lines = quarantined + sessionized + open + dropped duplicates.
    non_blank = sum(1 for text in file1 + file2 + file3 if text.strip())
    assert non_blank == 22
    assert len(q) + sum(s[4] for s in sessions) + sum(s[4] for s in open_sessions) + oracle.duplicates == non_blank


@pytest.mark.parametrize("storage", STORAGES)
def test_very_late_event_is_quarantined(spark, request, tmp_path, storage):
    """An event below the PREVIOUS micro-batch's watermark is late like any other: quarantined, reason late.

    Batches (one file each): c1 at t0+60 min; c2 at t0+120 min; then very-late at t0+10 min and late at
    t0+100 min. Batch 3 runs with watermark t0+110 min (batch 2's was t0+50 min): both are late. Spark's
    FlatMapGroupsWithState drops input rows at or below the previous batch's watermark before the Python
    function sees them when the timeout is EventTimeTimeout, so very-late would vanish without a trace.
    """
    config = make_config(tmp_path, "hdfs", **checkpoint_env(request, spark, storage, tmp_path))
    t0 = BASE_MS
    files = [[json.dumps(_event("c1", "c", t0 + 60 * MIN, "click"))],
             [json.dumps(_event("c2", "c", t0 + 120 * MIN, "click"))],
             [json.dumps(_event("very-late", "v", t0 + 10 * MIN)), json.dumps(_event("late", "v", t0 + 100 * MIN))]]
    for i, lines in enumerate(files):
        _write(config.landing, f"{i:05d}.jsonl", ("\n".join(lines) + "\n").encode(), 1_700_000_000 + 10 * i)
    from pipelines.ingest import ingest

    ingest(config, files_per_commit=1)
    catch_up(config, spark)
    q = read_quarantine(config)
    got = sorted(zip(q["reason"], q["event_id"], q["source_file"], q["line_no"].astype(int)))
    assert got == [("late", "late", "00002.jsonl", 2), ("late", "very-late", "00002.jsonl", 1)]
    # c1's session (ends t0+60) closes at t0+90 <= the final watermark t0+110; c2 stays open.
    batches = [[{"user_id": "c", "event_id": "c1", "event_time_ms": t0 + 60 * MIN, "event_type": "click"}],
               [{"user_id": "c", "event_id": "c2", "event_time_ms": t0 + 120 * MIN, "event_type": "click"}],
               [{"user_id": "v", "event_id": "very-late", "event_time_ms": t0 + 10 * MIN, "event_type": "page_view"},
                {"user_id": "v", "event_id": "late", "event_time_ms": t0 + 100 * MIN, "event_type": "page_view"}]]
    expected = run_oracle(batches, 30 * MIN, 10 * MIN)
    assert sorted(expected.late) == ["late", "very-late"]
    assert read_sessions(config) == sorted(expected.closed) and len(expected.closed) == 1
    assert read_open_sessions(spark, config) == sorted(expected.open_sessions)
    assert [(s[1], s[4]) for s in expected.open_sessions] == [("c", 1)]


@pytest.mark.parametrize("storage", STORAGES)
def test_late_event_in_first_batch_of_a_new_run_is_quarantined(spark, request, tmp_path, storage):
    """Run 1: c1 at t0+60 min (the run ends with its empty closing batch at watermark t0+50 min).
    Run 2, its first micro-batch: "late" exactly at the watermark t0+50 min, and "ok" 1 ms above it.
    "late" must be quarantined. (Its batch and the batch before -- run 1's closing batch -- have the same
    watermark, so Spark's own late-row filter, a batch behind, drops it before the operator sees it.)
    """
    config = make_config(tmp_path, "rocksdb", **checkpoint_env(request, spark, storage, tmp_path))
    t0 = BASE_MS
    from pipelines.ingest import ingest

    _write(config.landing, "00000.jsonl", (json.dumps(_event("c1", "c", t0 + 60 * MIN, "click")) + "\n").encode(),
           1_700_000_000)
    ingest(config, files_per_commit=1)
    catch_up(config, spark)
    lines = [json.dumps(_event("late", "v", t0 + 50 * MIN)), json.dumps(_event("ok", "v", t0 + 50 * MIN + 1))]
    _write(config.landing, "00001.jsonl", ("\n".join(lines) + "\n").encode(), 1_700_000_010)
    ingest(config, files_per_commit=1)
    catch_up(config, spark)
    q = read_quarantine(config)
    assert sorted(zip(q["reason"], q["event_id"], q["line_no"].astype(int))) == [("late", "late", 1)]
    assert sorted((s[1], s[2], s[4]) for s in read_open_sessions(spark, config)) == [("c", t0 + 60 * MIN, 1),
                                                                               ("v", t0 + 50 * MIN + 1, 1)]
