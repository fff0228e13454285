"""Hostile input: every landed line ends up in exactly one place, and the real sessions still equal the
oracle.

Expectations are written from the contract and the input built here, never from the code under test: each line
of each file is built together with what it must become -- a valid event (which the oracle in testkit/oracle.py
then places: a closed session, the open state, a duplicate or a late quarantine row) or one quarantine row with
its reason, file and line number.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import random
import threading
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from pipelines.ingest import INGESTED_DIR, REFUSED_DIR, classify_line, ingest
from pipelines.ingest import local as ingest_local
from pipelines.job.stream import catch_up
from state_store.status import status
from testkit.oracle import run_oracle
from tests.kit.datagen import BASE_MS, iso
from tests.kit.homes import make_config
from tests.kit.storages import STORAGES, checkpoint_env
from tests.kit.tables import read_open_sessions, read_quarantine, read_sessions
from tests.kit.waits import wait_until

pytestmark = pytest.mark.tier("pure")

MIN = 60_000
GAP_MS, LATENESS_MS = 30 * MIN, 10 * MIN
T = BASE_MS
FAR_FUTURE = "9999-12-31T23:59:59Z"


class LandedFile:
    """A file built line by line, each line with what the contract says it must become."""

    def __init__(self, name: str):
        self.name = name
        self.lines: list[bytes] = []
        self.expect: list[tuple[str, object]] = []  # ("event", oracle event) | ("reject", reason) | ("blank", None)

    def event(self, event_id, user: str, ms: int, kind: str | None = "page_view", time_text: str | None = None,
              **extra) -> dict:
        record = {"event_id": event_id, "user_id": user, "event_time": time_text or iso(ms), **extra}
        if kind is not None:
            record["event_type"] = kind
        record.setdefault("page", "/p")
        self.lines.append(json.dumps(record).encode())
        event = {"event_id": str(event_id), "user_id": user, "event_time_ms": ms, "event_type": kind,
                 "where": (self.name, len(self.lines))}
        self.expect.append(("event", event))
        return event

    def reject(self, line: str | bytes, reason: str) -> None:
        self.lines.append(line.encode() if isinstance(line, str) else line)
        self.expect.append(("reject", reason))

    def blank(self, line: bytes = b"") -> None:
        self.lines.append(line)
        self.expect.append(("blank", None))

    def data(self, newline: bytes = b"\n", final_newline: bool = True, bom: bool = False) -> bytes:
        body = newline.join(self.lines) + (newline if final_newline else b"")
        return (b"\xef\xbb\xbf" if bom else b"") + body

    def events(self) -> list[dict]:
        return [e for kind, e in self.expect if kind == "event"]

    def rejects(self) -> list[tuple[str, int, str]]:
        return [(self.name, i + 1, r) for i, (kind, r) in enumerate(self.expect) if kind == "reject"]

    def non_blank(self) -> int:
        return sum(1 for kind, _ in self.expect if kind != "blank")


def _land(landing: Path, name: str, data: bytes) -> None:
    """Write aside, rename in (a fresh mtime: nothing here is 'quiet' unless a test says so)."""
    landing.mkdir(parents=True, exist_ok=True)
    tmp = landing / f".{name}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, landing / name)


def _raw_events(config):
    return DeltaTable(config.raw_events_table).to_pyarrow_table().to_pandas()


def _round_1(outside: Path) -> tuple[list[LandedFile], dict[str, bytes]]:
    """Batch 1: every kind of broken line beside valid traffic of alice, bob, carol, dave, erin, frank."""
    a = LandedFile("r1-a.jsonl")                                       # lands with a UTF-8 BOM
    a.event("a1", "alice", T)                                          # 1 valid (behind the BOM)
    a.event("a2", "alice", T + 5 * MIN, "click", note="extra fields", nested={"k": [1, 2]})
    a.reject('{"event_id": "m1", "user_id": "alice", "event_time": ', "malformed_json")
    a.reject("[1, 2, 3]", "not_an_object")
    a.blank()
    a.event("a1", "alice", T)                                          # 6 duplicate within the file
    a.reject(json.dumps({"event_id": 679.5, "user_id": "alice", "event_time": iso(T)}), "invalid_event_id")
    a.reject(json.dumps({"event_id": "x8", "user_id": ["alice"], "event_time": iso(T)}), "invalid_user_id")
    a.reject(json.dumps({"event_id": "x9", "user_id": "alice"}), "missing_event_time")
    a.reject(json.dumps({"event_id": "x10", "user_id": "alice", "event_time": "yesterday"}), "unparseable_event_time")
    a.reject(json.dumps({"event_id": "x11", "user_id": "alice", "event_time": "2026-11-01T08:00:00"}),
             "unparseable_event_time")                                 # naive: no offset
    a.reject(json.dumps({"event_id": "fut1", "user_id": "alice", "event_time": FAR_FUTURE,
                         "event_type": "page_view"}), "future_event_time")
    b1 = a.event("b1", "bob", T + 10 * MIN, page={"path": "/x", "q": 1})  # an object page: kept as JSON text
    a.reject(json.dumps({"event_id": "x14", "user_id": "bob", "event_time": iso(T), "event_type": ["logout"]}),
             "invalid_event_type")
    a.blank(b"   \t")
    a.reject(b'{"event_id": "u\xff\xfe", "user_id": "bob", "event_time": "2026-11-01T08:00:00Z"}', "invalid_utf8")
    a.event(12345, "carol", T + 20 * MIN)                              # an integer id: kept as "12345"
    a.event("b2", "bob", T + 12 * MIN, time_text=iso(T + 12 * MIN, sub_us=456, offset_minutes=120))
    a.event("b3", "bob", T + 13 * MIN, kind=None)                      # no event_type: allowed
    a.reject(json.dumps({"event_id": "huge", "user_id": "carol", "event_time": iso(T), "blob": "x" * 1_500_000}),
             "line_too_long")
    a.event("big1", "carol", T + 21 * MIN, blob="y" * 300_000)         # big, but under the limit
    a.reject("[" * 50_000 + "]" * 50_000, "malformed_json")            # nesting deeper than any parser's stack
    a.reject('{"event_id": "\\ud800", "user_id": "carol", "event_time": "2026-11-01T08:00:00Z"}', "invalid_utf8")
    a.reject('{"event_id": NaN, "user_id": "carol", "event_time": "2026-11-01T08:00:00Z"}', "invalid_event_id")
    a.reject(json.dumps({"event_id": True, "user_id": "carol", "event_time": iso(T)}), "invalid_event_id")
    a.reject(json.dumps({"event_id": "x26", "user_id": None, "event_time": iso(T)}), "missing_user_id")
    a.reject("null", "not_an_object")
    a.event("a3", "alice", T + 40 * MIN, "logout")

    b = LandedFile("r1-b.jsonl")                                       # CRLF line endings
    b.event("c1", "carol", T + 22 * MIN)
    b.event("a2", "alice", T + 5 * MIN, "click")                       # duplicate in another file of the commit
    b.blank()
    b.reject("{}", "missing_event_id")
    b.event("d1", "dave", T + 30 * MIN, "logout")
    b.reject('"just a string"', "not_an_object")

    c = LandedFile("r1-c.jsonl")                                       # no newline after its last line (an object)
    c.event("e1", "erin", T + 45 * MIN)
    c.event("e2", "erin", T + 50 * MIN)

    d = LandedFile("r1-d.jsonl")                                       # its last line is unfinished (not JSON)
    d.event("f1", "frank", T + 55 * MIN)
    d.event("f2", "frank", T + 60 * MIN)                               # the batch's max: watermark T + 50 min next
    d.reject('{"event_id": "f3", "user_id": "frank", "event_ti', "malformed_json")  # taken once quiet (round 2)

    (outside / "secret.jsonl").write_text(json.dumps({"event_id": "secret-1", "user_id": "mallory",
                                                      "event_time": iso(T + MIN)}) + "\n")
    data = {a.name: a.data(bom=True), b.name: b.data(newline=b"\r\n"), c.name: c.data(final_newline=False),
            d.name: d.data(final_newline=False)}
    assert b1["where"] == ("r1-a.jsonl", 13)
    return [a, b, c, d], data


def _round_2() -> list[LandedFile]:
    """Batch 2 (watermark T + 50 min): late events at equal line numbers in three files of one ingest commit."""
    a = LandedFile("r2-a.jsonl")
    a.event("g1", "gina", T + 120 * MIN)
    a.event("la2", "lou", T + 10 * MIN)                                # 2 late
    a.event("a1", "alice", T)                                          # 3 a copy of a1, late now
    a.event("g2", "gina", T + 125 * MIN)
    b = LandedFile("r2-b.jsonl")
    b.event("h1", "hank", T + 130 * MIN)
    b.event("lb2", "lou", T + 20 * MIN)                                # 2 late
    b.event("lb3", "lou", T + 50 * MIN)                                # 3 late: exactly at the watermark
    b.event("f2", "frank", T + 60 * MIN)                               # a copy from batch 1, on time: a duplicate
    c = LandedFile("r2-c.jsonl")
    c.event("i1", "ivy", T + 140 * MIN)
    c.event("lc2", "lou", T + 30 * MIN)                                # 2 late
    c.event("lc3", "lou", T + 50 * MIN + 1)                            # 3 on time: 1 ms above the watermark
    c.event("h1", "hank", T + 130 * MIN)                               # a copy from another file of this commit
    c.reject("not json at all", "malformed_json")
    c.reject(json.dumps({"event_id": "fut2", "user_id": "ivy", "event_time": "9999-12-31T23:59:59.999+00:00"}),
             "future_event_time")
    return [a, b, c]


def _round_3() -> list[LandedFile]:
    """Batch 3 (watermark T + 130 min)."""
    a = LandedFile("r3-a.jsonl")
    a.event("j1", "jack", T + 200 * MIN)
    a.event("g3", "gina", T + 150 * MIN)
    a.event("lh", "lou", T + 100 * MIN)                                # late
    a.reject(json.dumps({"event_id": "fut3", "user_id": "jack", "event_time": FAR_FUTURE}), "future_event_time")
    a.event("j2", "jack", T + 201 * MIN, "click")
    return [a]


@pytest.mark.parametrize("storage", STORAGES)  # the spark fixture: the spark tier (a local checkpoint)
def test_hostile_mix_every_line_is_accounted_for(spark, request, tmp_path, storage):
    config = make_config(tmp_path, "rocksdb", **checkpoint_env(request, spark, storage, tmp_path))
    outside = tmp_path / "outside"
    outside.mkdir()
    landing = config.landing

    files1, data1 = _round_1(outside)
    for name, data in data1.items():
        _land(landing, name, data)
    landing.joinpath("evil.jsonl").symlink_to(outside / "secret.jsonl")    # points outside landing
    landing.joinpath("dangling.jsonl").symlink_to(outside / "missing.jsonl")
    refused = [("evil.jsonl", 0, "refused_symlink"), ("dangling.jsonl", 0, "refused_symlink")]
    first = catch_up(config, spark)
    assert (first.refused_files, first.waiting_files) == (2, 1)  # the operator sees both in the summary
    # The unfinished last line keeps r1-d.jsonl in landing; everything else is moved away.
    assert sorted(p.name for p in landing.iterdir() if not p.name.startswith("_")) == ["r1-d.jsonl"]
    assert sorted(p.name for p in landing.joinpath(REFUSED_DIR).rglob("*.jsonl")) == ["dangling.jsonl", "evil.jsonl"]

    files2 = _round_2()
    for f in files2:
        _land(landing, f.name, f.data())
    quiet = time.time() - 3600  # r1-d.jsonl untouched for an hour: its last line is complete now
    os.utime(landing / "r1-d.jsonl", (quiet, quiet))
    catch_up(config, spark)
    files3 = _round_3()
    for f in files3:
        _land(landing, f.name, f.data())
    catch_up(config, spark)
    assert not list(landing.glob("*.jsonl"))

    batches = [[e for f in files1 for e in f.events()], [e for f in files2 for e in f.events()],
               [e for f in files3 for e in f.events()]]
    expected = run_oracle(batches, GAP_MS, LATENESS_MS)
    assert len(expected.late_rows) == 6 and expected.duplicates == 4 and expected.open_sessions

    # Exactly one quarantine row per rejected line, refused file and late event, at its true file and line.
    all_files = files1 + files2 + files3
    want = sorted([r for f in all_files for r in f.rejects()] + refused
                  + [(*e["where"], "late") for e in expected.late_rows])
    q = read_quarantine(config)
    got = sorted(zip(q["source_file"], q["line_no"].astype(int), q["reason"]))
    assert got == want
    late = q[q["reason"] == "late"]
    where = {e["where"]: e for f in all_files for e in f.events()}
    for row in late.itertuples():
        event = where[(row.source_file, int(row.line_no))]
        assert (row.event_id, row.user_id, int(row.event_time_ms)) == \
            (event["event_id"], event["user_id"], event["event_time_ms"])

    # The real sessions and the open state are the oracle's: no far-future event moved the watermark.
    sessions = read_sessions(config)
    assert sessions == sorted(expected.closed)
    open_sessions = read_open_sessions(spark, config)
    assert open_sessions == sorted(expected.open_sessions)
    assert status(config, spark=spark, with_state=False).watermark_ms == expected.final_watermark_ms == T + 191 * MIN

    # Every landed line is in exactly one place.
    landed = sum(f.non_blank() for f in all_files) + len(refused)
    assert landed == len(q) + sum(s[4] for s in sessions) + sum(s[4] for s in open_sessions) + expected.duplicates

    # What the rows hold: readable bytes, a JSON page, a bounded preview; nothing read through a symlink.
    by_pos = {(r.source_file, int(r.line_no)): r for r in q.itertuples()}
    assert "\\xff\\xfe" in by_pos[("r1-a.jsonl", 16)].raw
    assert len(by_pos[("r1-a.jsonl", 20)].raw) < 10_000 and "1500" in by_pos[("r1-a.jsonl", 20)].raw
    assert by_pos[("evil.jsonl", 0)].raw == f"symlink to {outside / 'secret.jsonl'}"
    assert by_pos[("r1-d.jsonl", 3)].raw == '{"event_id": "f3", "user_id": "frank", "event_ti'
    raw = _raw_events(config)
    assert "mallory" not in set(raw["user_id"].dropna()) and not raw["raw"].dropna().str.contains("mallory").any()
    page = raw[(raw["source_file"] == "r1-a.jsonl") & (raw["line_no"] == 13)]["page"].tolist()
    assert page == ['{"path":"/x","q":1}']
    assert raw[(raw["source_file"] == "r1-a.jsonl") & (raw["line_no"] == 17)]["event_id"].tolist() == ["12345"]
    future = raw[raw["reject_reason"] == "future_event_time"]
    assert len(future) == 3 and future["ingested_at"].notna().all()


@pytest.mark.parametrize("storage", STORAGES)  # the spark fixture: the spark tier (a local checkpoint)
def test_far_future_event_never_moves_the_watermark(spark, request, tmp_path, storage):
    """One 9999-12-31 event amid normal traffic: quarantined once (future_event_time), and the sessions, the open
    state and the watermark are what the oracle says without it."""
    config = make_config(tmp_path, "hdfs", **checkpoint_env(request, spark, storage, tmp_path))
    rng = random.Random(8)
    first, second = LandedFile("00000.jsonl"), LandedFile("00001.jsonl")
    for i in range(12):
        first.event(f"e{i}", f"u{i % 3}", T + i * 7 * MIN + rng.randint(0, 999), rng.choice(["page_view", "click"]))
    first.reject(json.dumps({"event_id": "doom", "user_id": "u0", "event_time": FAR_FUTURE, "event_type": "click"}),
                 "future_event_time")
    for i in range(12, 20):
        first.event(f"e{i}", f"u{i % 3}", T + i * 7 * MIN, "page_view")
    for i in range(20, 26):  # a second batch: with the watermark at year 9999 all of these would be late
        second.event(f"e{i}", f"u{i % 3}", T + 140 * MIN + i * 4 * MIN, "click")
    _land(config.landing, first.name, first.data())
    catch_up(config, spark)
    _land(config.landing, second.name, second.data())
    catch_up(config, spark)

    expected = run_oracle([first.events(), second.events()], GAP_MS, LATENESS_MS)
    assert not expected.late and expected.closed and expected.open_sessions
    assert read_sessions(config) == sorted(expected.closed)
    assert read_open_sessions(spark, config) == sorted(expected.open_sessions)
    q = read_quarantine(config)
    assert sorted(zip(q["source_file"], q["line_no"].astype(int), q["reason"], q["event_id"])) == \
        [("00000.jsonl", 13, "future_event_time", "doom")]
    assert status(config, spark=spark, with_state=False).watermark_ms == expected.final_watermark_ms


@pytest.mark.tier("spark")
def test_a_file_still_being_written_loses_no_line(spark, tmp_path):
    """A writer keeps one file open and appends to it -- lines split in two writes, pauses, the file moved to
    _ingested/ under it -- while catch-up and ingest run again and again. Every line it wrote is in raw_events
    exactly once, with its true line number, and the sessions equal the oracle's."""
    config = make_config(tmp_path, "rocksdb", SESSIONS_MAX_VERSIONS_PER_BATCH=None)
    config.landing.mkdir(parents=True)
    path = config.landing / "growing.jsonl"
    events = [{"event_id": f"w{i}", "user_id": f"g{i % 4}", "event_time": iso(T + i * 20_000),
               "event_type": "logout" if i % 37 == 36 else "page_view", "page": "/g"} for i in range(1500)]
    paused, resume, stop, written = threading.Event(), threading.Event(), threading.Event(), []

    def writer() -> None:
        rng = random.Random(5)
        with open(path, "ab", buffering=0) as handle:  # one handle for the whole run, as a logging agent holds it
            for i, event in enumerate(events):
                line = json.dumps(event).encode() + b"\n"
                if rng.random() < 0.3:  # a line in two writes: ingest may see the first part alone
                    cut = rng.randint(1, len(line) - 1)
                    handle.write(line[:cut])
                    time.sleep(0.002)  # the writer's pace: the two halves of the line land apart
                    handle.write(line[cut:])
                else:
                    handle.write(line)
                written.append(i)
                if i == 299:  # quiet until an ingest has moved the file: later lines go to the moved file
                    paused.set()
                    resume.wait(timeout=120)
                time.sleep(0.1 if i % 100 == 99 else 0.003)  # the writer's pace (bursts and pauses)
                if stop.is_set() and i > 1000:
                    break

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        catch_up(config, spark)  # races with the first 300 lines
        assert paused.wait(timeout=120)
        ingest(config)
        assert not path.exists()
        resume.set()

        def ingested_while_writing() -> bool:  # ingest again and again until the writer wrote 300 lines more
            ingest(config)
            return len(written) >= 600 or not thread.is_alive()

        wait_until(ingested_while_writing, timeout_s=120, what="the writer's next 300 lines, ingested as they came")
        catch_up(config, spark)
    finally:
        resume.set()
        stop.set()
        thread.join(timeout=120)
    assert not thread.is_alive()
    catch_up(config, spark)

    n = len(written)
    assert n > 1000
    raw = _raw_events(config)
    assert set(raw["source_file"]) == {"growing.jsonl"} and raw["reject_reason"].isna().all()
    assert sorted(zip(raw["line_no"], raw["event_id"])) == [(i + 1, f"w{i}") for i in range(n)]
    assert raw["ingest_seq"].nunique() > 3  # it really was read in pieces
    assert len(list(config.landing.joinpath(INGESTED_DIR).rglob("growing*.jsonl"))) == 1

    expected = run_oracle([[{**e, "event_time_ms": T + i * 20_000} for i, e in enumerate(events[:n])]],
                          GAP_MS, LATENESS_MS)
    assert read_sessions(config) == sorted(expected.closed)
    assert read_open_sessions(spark, config) == sorted(expected.open_sessions)
    assert read_quarantine(config).empty


# ---- ingest alone (no Spark) ----------------------------------------------------------------------------


def _lines(config) -> list[tuple[str, int, str | None, str | None]]:
    raw = _raw_events(config)
    return sorted(zip(raw["source_file"], raw["line_no"], raw["event_id"], raw["reject_reason"]))


def _line(event_id: str) -> bytes:
    return json.dumps({"event_id": event_id, "user_id": "u", "event_time": iso(T)}).encode()


def test_lines_appended_after_the_move_are_picked_up(tmp_path):
    config = make_config(tmp_path, "rocksdb")
    config.landing.mkdir(parents=True)
    with open(config.landing / "held.jsonl", "ab", buffering=0) as handle:
        handle.write(_line("e1") + b"\n" + _line("e2") + b"\n")
        assert ingest(config).rows == 2
        assert not (config.landing / "held.jsonl").exists()       # read whole and unchanged: moved
        handle.write(_line("e3")[:10])                             # half a line: not complete, not JSON
        assert ingest(config).rows == 0
        handle.write(_line("e3")[10:] + b"\n\n" + _line("e5") + b"\r\n")
        assert ingest(config).rows == 2
    assert _lines(config) == [("held.jsonl", 1, "e1", None), ("held.jsonl", 2, "e2", None),
                              ("held.jsonl", 3, "e3", None), ("held.jsonl", 5, "e5", None)]
    assert ingest(config).rows == 0


def test_an_unterminated_object_counts_at_once_and_its_newline_later_shifts_nothing(tmp_path):
    config = make_config(tmp_path, "rocksdb", SESSIONS_INGEST_SETTLE_SECONDS=3600)
    _land(config.landing, "f.jsonl", _line("e1") + b"\n" + _line("e2"))
    result = ingest(config)
    assert (result.rows, result.waiting) == (2, 0)
    day = dt.datetime.now(dt.timezone.utc).date().isoformat()
    with open(config.landing / INGESTED_DIR / day / "f.jsonl", "ab") as handle:
        handle.write(b"\n" + _line("e3") + b"\n" + b'{"event_id": "e4", "us')  # a cut line is not taken
    assert ingest(config).rows == 1
    assert _lines(config) == [("f.jsonl", 1, "e1", None), ("f.jsonl", 2, "e2", None), ("f.jsonl", 3, "e3", None)]


def test_an_unfinished_last_line_waits_for_the_settle_time(tmp_path):
    config = make_config(tmp_path, "rocksdb", SESSIONS_INGEST_SETTLE_SECONDS=30)
    _land(config.landing, "f.jsonl", _line("e1") + b"\n" + b"not json, no newline")
    result = ingest(config)
    assert (result.rows, result.waiting) == (1, 1)
    assert (config.landing / "f.jsonl").exists()
    quiet = time.time() - 31
    os.utime(config.landing / "f.jsonl", (quiet, quiet))
    result = ingest(config)
    assert (result.rows, result.rejected, result.waiting) == (1, 1, 0)
    assert _lines(config) == [("f.jsonl", 1, "e1", None), ("f.jsonl", 2, None, "malformed_json")]


def test_a_crash_between_commit_and_positions_file_is_rolled_forward(tmp_path, monkeypatch):
    """The commit is the truth: a crash after it (before the positions file and the move) neither loses nor
    repeats a line, even when the file grows in between."""
    config = make_config(tmp_path, "rocksdb")
    config.landing.mkdir(parents=True)
    path = config.landing / "f.jsonl"
    path.write_bytes(_line("e1") + b"\n" + _line("e2") + b"\n")
    (config.landing / "link.jsonl").symlink_to(path)

    def crash(*_args: object) -> None:
        raise RuntimeError("killed")

    monkeypatch.setattr(ingest_local, "save_positions", crash)
    with pytest.raises(RuntimeError, match="killed"):
        ingest(config)
    monkeypatch.undo()
    assert path.exists()
    with open(path, "ab") as handle:
        handle.write(_line("e3") + b"\n")
    assert ingest(config).rows == 1
    assert _lines(config) == [("f.jsonl", 1, "e1", None), ("f.jsonl", 2, "e2", None), ("f.jsonl", 3, "e3", None),
                              ("link.jsonl", 0, None, "refused_symlink")]
    assert not path.exists() and not (config.landing / "link.jsonl").is_symlink()
    assert [p.name for p in config.landing.joinpath(REFUSED_DIR).rglob("*.jsonl")] == ["link.jsonl"]


def test_a_new_file_under_an_old_name_is_read_from_its_start(tmp_path):
    config = make_config(tmp_path, "rocksdb")
    _land(config.landing, "f.jsonl", _line("e1") + b"\n")
    ingest(config)
    _land(config.landing, "f.jsonl", _line("n1") + b"\n" + _line("n2") + b"\n")
    ingest(config)
    assert _lines(config) == [("f.jsonl", 1, "e1", None), ("f.jsonl", 1, "n1", None), ("f.jsonl", 2, "n2", None)]
    assert len(list(config.landing.joinpath(INGESTED_DIR).rglob("f*.jsonl"))) == 2


@pytest.mark.parametrize("line,reason", [
    (b'\xef\xbb\xbf{"event_id": "a", "user_id": "u", "event_time": "2026-11-01T08:00:00Z"}', None),
    (b'{"event_id": "a", "user_id": "u", "event_time": "2026-11-01T08:00:00Z"}\r', None),
    (b'{"event_id": 7, "user_id": "u", "event_time": "2026-11-01T08:00:00+05:30"}', None),
    (b'{"event_id": "a", "user_id": "u", "event_time": "2026-11-01T08:00:00Z", "page": [1]}', None),
    (b'{"event_id": 679.5, "user_id": "u", "event_time": "2026-11-01T08:00:00Z"}', "invalid_event_id"),
    (b'{"event_id": "a", "user_id": 3.0, "event_time": "2026-11-01T08:00:00Z"}', "invalid_user_id"),
    (b'{"event_id": "a", "user_id": {}, "event_time": "2026-11-01T08:00:00Z"}', "invalid_user_id"),
    (b'{"event_id": " ", "user_id": "u", "event_time": "2026-11-01T08:00:00Z"}', "missing_event_id"),
    (b'{"event_id": "a", "user_id": "u", "event_time": "2026-11-01T08:00:00Z", "event_type": 1}',
     "invalid_event_type"),
    (b'{"event_id": "a", "user_id": "u", "event_time": "9999-12-31T23:59:59-05:00"}', "unparseable_event_time"),
    (b'{"event_id": "a", "user_id": "u", "event_time": 1793520000000}', "unparseable_event_time"),
    (b'{"event_id": "a\xc3", "user_id": "u", "event_time": "2026-11-01T08:00:00Z"}', "invalid_utf8"),
    (b'{"event_id": "a", "user_id": "u", "event_time": "2026-11-01T08:00:00Z", "n": ' + b"9" * 5000 + b"}",
     "malformed_json"),
])
def test_line_classification(line, reason):
    classified = classify_line(line)
    assert classified is not None and classified[1] == reason
