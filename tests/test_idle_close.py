"""Idle close: when no event has been ingested for SESSIONS_IDLE_CLOSE_MINUTES, ingest appends a clock row to
raw_events that moves the watermark as an event at its time would (README "Idle close").

The clock row's time is max event time + the wall-clock time since the newest commit that held an event or a clock
row. The oracle's view (testkit/oracle.py): a clock row is a batch item ``{"clock_ms": T}`` that counts towards the
max event time and nothing else.
"""
from __future__ import annotations

import datetime as dt
import json
import subprocess
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from pipelines.config import ConfigError
from pipelines.core.sample_data import land
from pipelines.ingest import ingest, latest_seq, open_raw_table
from pipelines.ingest.appender import Appender
from pipelines.ingest.table import CLOCK_KIND, CLOCK_MAX_IDLE_PERIODS, RAW_SCHEMA, IngestClock, latest_clock
from pipelines.job.checkpoint import inspect_checkpoint
from pipelines.job.stream import catch_up
from state_store.lifecycle import restore, take_savepoint
from state_store.state import lookup_user
from state_store.stream_control import stop_stream
from testkit.oracle import run_oracle
from tests.kit.datagen import iso, land_batches, line, make_event
from tests.kit.homes import config_env, make_config, tool
from tests.kit.tables import read_open_sessions, read_quarantine, read_sessions
from tests.kit.waits import still_running, wait_until

pytestmark = pytest.mark.tier("pure")

MINUTE = 60_000
T0 = int(dt.datetime(2026, 10, 5, 12, tzinfo=dt.timezone.utc).timestamp() * 1000)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def _rows(times_ms: list[int], rejected: list[bool]) -> pa.Table:
    return pa.table({"event_time": pa.array([t * 1000 for t in times_ms], pa.timestamp("us", tz="UTC")),
                     "reject_reason": pa.array(["bad" if r else None for r in rejected], pa.string())})


def _clock_rows(config) -> list[dict]:
    rows = DeltaTable(config.raw_events_table).to_pyarrow_table().to_pylist()
    return sorted((r for r in rows if r.get("row_kind") == CLOCK_KIND), key=lambda r: r["ingest_seq"])


# --- the rule (no Spark) ------------------------------------------------------------------------------------------

def test_the_clock_follows_valid_events_and_runs_at_wall_speed_from_the_last_one():
    clock = IngestClock().after(_rows([T0, T0 + 5 * MINUTE, T0 + 99 * MINUTE], [False, False, True]), 1_000)
    assert clock == IngestClock((T0 + 5 * MINUTE) * 1000, 1_000)  # a rejected line's time never counts
    assert clock.after(_rows([T0 + 50 * MINUTE], [True]), 9_000) == clock  # rejected only: not activity
    older = clock.after(_rows([T0], [False]), 2_000)  # an old (late) event is activity, and does not lower the max
    assert older == IngestClock((T0 + 5 * MINUTE) * 1000, 2_000)
    idle_us = 10 * MINUTE * 1000
    assert older.due(2_000 + idle_us - 1, idle_us) is None
    assert older.due(2_000 + idle_us, idle_us) == (T0 + 15 * MINUTE) * 1000
    assert older.due(2_000 + idle_us + 1_500, idle_us) == (T0 + 15 * MINUTE) * 1000 + 1_000  # whole ms
    assert older.due(10**15, 0) is None and IngestClock().due(10**15, 1) is None  # off; no event ever


def test_a_wall_clock_step_is_a_line_in_the_log_not_a_jump():
    """A clock row moves event time at most CLOCK_MAX_IDLE_PERIODS idle periods past the newest event or clock row,
    however far the wall clock says it is past the last commit; a wall clock behind that commit appends none."""
    idle_us = 10 * MINUTE * 1000
    active = (T0 + 3 * MINUTE) * 1000  # when the newest event (T0) was ingested
    clock = IngestClock(T0 * 1000, active)
    assert clock.judge(active + 15 * MINUTE * 1000, idle_us) == ((T0 + 15 * MINUTE) * 1000, None)  # wall speed
    bound = CLOCK_MAX_IDLE_PERIODS * idle_us
    assert clock.judge(active + bound, idle_us) == (T0 * 1000 + bound, None)  # up to the bound: no step
    ahead, step = clock.judge(active + 5 * 60 * MINUTE * 1000, idle_us)  # the host's clock jumped 5 h ahead
    assert ahead == T0 * 1000 + bound and clock.due(active + 5 * 60 * MINUTE * 1000, idle_us) == ahead
    assert step is not None and "300.0 min past" in step and "20 min only" in step
    behind, step = clock.judge(active - 60 * MINUTE * 1000, idle_us)  # stepped back an hour: no row
    assert behind is None and step is not None and "3600.000 s behind" in step
    assert clock.judge(active + idle_us - 1, idle_us) == (None, None) and clock.judge(active - 1, 0) == (None, None)


def test_appending_after_a_clock_step_moves_event_time_by_the_bound_and_logs_one_line(tmp_path, caplog):
    config = make_config(tmp_path, SESSIONS_IDLE_CLOSE_MINUTES="10")
    land_batches(config, [[make_event("u1", "a1", T0, "page_view")]])
    ingest(config)
    table = open_raw_table(config)
    clock = latest_clock(table)
    assert clock.active_us is not None
    active = EPOCH + dt.timedelta(microseconds=clock.active_us)
    appender = Appender(config, latest_seq(table), clock)
    caplog.set_level("WARNING", logger="pipelines.ingest")

    stepped = active + dt.timedelta(hours=6)  # NTP stepped the host's clock six hours ahead
    at = appender.append_clock(stepped)
    assert at == EPOCH + dt.timedelta(milliseconds=T0 + CLOCK_MAX_IDLE_PERIODS * 10 * MINUTE)  # not T0 + 6 h
    [line] = [r.getMessage() for r in caplog.records if r.name == "pipelines.ingest"]
    assert "more than 2 idle periods" in line and "\n" not in line
    assert [r["event_time"] for r in _clock_rows(config)] == [at]
    assert appender.append_clock(stepped + dt.timedelta(minutes=1)) is None  # the next one an idle period later

    caplog.clear()
    for _ in range(3):  # the clock is set right again: behind the row's commit, so no row, and one line, not three
        assert appender.append_clock(active + dt.timedelta(hours=1)) is None
    [line] = [r.getMessage() for r in caplog.records if r.name == "pipelines.ingest"]
    assert "behind the newest raw_events commit" in line
    assert len(_clock_rows(config)) == 1
    # Another host continues from the table: the same clock, the same judgement.
    assert latest_clock(open_raw_table(config)) == appender.clock
    assert appender.clock.max_event_us == int((at - EPOCH) / dt.timedelta(microseconds=1))


def test_idle_close_setting_default_off_and_bad_values():
    assert make_config("/tmp/x", SESSIONS_IDLE_CLOSE_MINUTES=None).rules.idle_close_ms == 10 * MINUTE  # = lateness
    assert make_config("/tmp/x", SESSIONS_IDLE_CLOSE_MINUTES=None,
                       SESSIONS_LATENESS_MINUTES="0").rules.idle_close_ms == 30 * MINUTE  # no lateness: the gap
    assert make_config("/tmp/x", SESSIONS_IDLE_CLOSE_MINUTES="0").rules.idle_close_ms == 0
    assert make_config("/tmp/x", SESSIONS_IDLE_CLOSE_MINUTES="0.5").rules.idle_close_ms == 30_000
    for bad in ("-1", "soon", "inf", "nan"):
        with pytest.raises(ConfigError, match="SESSIONS_IDLE_CLOSE_MINUTES"):
            make_config("/tmp/x", SESSIONS_IDLE_CLOSE_MINUTES=bad)


def test_ingest_appends_one_clock_row_per_idle_period_and_any_host_continues_it(tmp_path):
    config = make_config(tmp_path, SESSIONS_IDLE_CLOSE_MINUTES="0.02")  # 1.2 s
    events = [make_event("u1", "a1", T0, "page_view"), make_event("u1", "a2", T0 + MINUTE, "page_view")]
    land_batches(config, [events])
    assert ingest(config).clock is None and not _clock_rows(config)  # just ingested: not idle
    active = next(r["ingested_at"] for r in DeltaTable(config.raw_events_table).to_pyarrow_table().to_pylist()
                  if r["row_kind"] is None)

    # The idle time is judged at `now` (ingest's clock for tests), not slept through.
    assert ingest(config, now=active + dt.timedelta(seconds=1.1)).clock is None  # not an idle period yet
    now = active + dt.timedelta(seconds=1.3)
    result = ingest(config, now=now)
    (row,) = _clock_rows(config)
    assert result.clock is not None and result.rows == 0
    # max event time + the idle wall-clock time since the events were ingested (whole ms)
    idle_ms = (now - active) // dt.timedelta(milliseconds=1)
    assert row["event_time"] == EPOCH + dt.timedelta(milliseconds=T0 + MINUTE + idle_ms)
    assert (row["reject_reason"], row["user_id"], row["event_id"], row["source_file"]) == (None, None, None, "_clock")
    # the clock row is the newest activity: the next one an idle period later
    assert ingest(config, now=now + dt.timedelta(seconds=1.1)).clock is None

    # A rejected line is not an event: the idle period goes on; the next clock row continues from the last one.
    land(config.landing, "junk.jsonl", ["not json"])
    now += dt.timedelta(seconds=1.3)
    assert ingest(config, now=now).clock is not None
    first, second = _clock_rows(config)
    assert second["event_time"] - first["event_time"] == dt.timedelta(seconds=1.3)
    # Another host (a fresh appender) reads the same clock from the table's newest commit.
    table = open_raw_table(config)
    assert latest_clock(table) == Appender(config, latest_seq(table), latest_clock(table)).clock
    assert latest_clock(table).max_event_us == int((second["event_time"] - EPOCH) / dt.timedelta(microseconds=1))

    off = config.with_(idle_close_minutes=0.0)
    assert ingest(off, now=now + dt.timedelta(seconds=1.3)).clock is None and len(_clock_rows(config)) == 2


def test_a_table_written_before_clocks_gets_its_clock_from_its_rows(tmp_path):
    config = make_config(tmp_path)
    now = dt.datetime(2026, 11, 20, tzinfo=dt.timezone.utc)
    rows = {name: [None, None] for name in RAW_SCHEMA.names}
    rows.update(event_time=[EPOCH + dt.timedelta(milliseconds=T0), EPOCH + dt.timedelta(milliseconds=T0 + 9 * MINUTE)],
                reject_reason=[None, "far_future"], ingested_at=[now, now], ingest_seq=[1, 1], line_no=[1, 2])
    write_deltalake(config.raw_events_table, pa.table(rows, schema=RAW_SCHEMA))
    clock = latest_clock(open_raw_table(config))
    assert clock == IngestClock(T0 * 1000, int((now - EPOCH) / dt.timedelta(microseconds=1)))


# --- the stream: a clock row closes and judges late exactly as an event at its time would --------------------------

def _append_clock_at(config, clock_ms: int) -> None:
    """A clock row at event time `clock_ms`, as ingest would append it after the matching idle time."""
    table = open_raw_table(config)
    clock = latest_clock(table)
    assert clock.max_event_us is not None and clock.active_us is not None
    now = EPOCH + dt.timedelta(microseconds=clock.active_us + clock_ms * 1000 - clock.max_event_us)
    assert Appender(config, latest_seq(table), clock).append_clock(now) == EPOCH + dt.timedelta(milliseconds=clock_ms)


@pytest.mark.tier("spark")
@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_clock_rows_close_like_events_and_replay_after_a_restore(tmp_path, spark, provider):
    gap, lateness = 30 * MINUTE, 10 * MINUTE
    config = make_config(tmp_path, provider, SESSIONS_IDLE_CLOSE_MINUTES="30")  # the clock row below: 35 min idle
    before = [make_event("u1", "a1", T0, "page_view"), make_event("u1", "a2", T0 + 5 * MINUTE, "click"),
              make_event("u2", "b1", T0 + 20 * MINUTE, "page_view"), make_event("u2", "b2", T0 + 25 * MINUTE, "click")]
    clock_ms = T0 + 60 * MINUTE  # watermark T0 + 50 min: u1 (closes at T0 + 35) closes, u2 (T0 + 55) stays open
    after = [make_event("u2", "b3", T0 + 45 * MINUTE, "page_view"),   # <= T0 + 50: late, because of the clock
             make_event("u2", "b4", T0 + 51 * MINUTE, "page_view"),   # joins u2's session (26 min after b2)
             make_event("u3", "c1", T0 + 52 * MINUTE, "page_view")]
    expected = run_oracle([before, [{"clock_ms": clock_ms}], after], gap, lateness)
    assert [s[1] for s in expected.closed] == ["u1"] and expected.late == ["b3"]
    assert run_oracle([before, after], gap, lateness).late == []  # without the clock row nothing is late

    land_batches(config, [before])
    catch_up(config, spark)
    saved = take_savepoint(config, spark=spark)  # before the quiet period: u1 and u2 open
    assert saved.rows > 0 and len(read_open_sessions(spark, config)) == 2 and read_sessions(config) == []
    _append_clock_at(config, clock_ms)
    land_batches(config, [after], start=1)

    def check() -> None:
        assert sorted(read_sessions(config)) == sorted(expected.closed)  # a list: a session written twice shows
        late = read_quarantine(config)
        assert sorted(zip(late["event_id"], late["reason"])) == [("b3", "late")]
        assert read_open_sessions(spark, config) == sorted(expected.open_sessions)

    catch_up(config, spark)
    check()
    restore(config, saved.savepoint_id, spark=spark)  # back before the clock row: the replay sees the same clock
    catch_up(config, spark)
    check()


# --- under `sessionctl run`: a stream that goes quiet -------------------------------------------------------------

@pytest.mark.tier("subprocess")
def test_a_quiet_stream_closes_its_sessions_under_run(tmp_path, spark):
    # u1's session is due 2 s of clock after the newest event, u2's (the newest) a whole gap after it: a clock row
    # closes u1 within the run's first idle periods, and u2 stays open well past the test (nothing waits for a gap).
    gap, idle_s, poll_s = 5 * MINUTE, 6.0, 1.0
    config = make_config(tmp_path, SESSIONS_GAP_MINUTES="5", SESSIONS_LATENESS_MINUTES="0",
                         SESSIONS_IDLE_CLOSE_MINUTES=str(idle_s / 60))
    now_ms = int(time.time() * 1000)
    newest = now_ms - 15_000
    events = [make_event("u1", "a1", newest - gap, "page_view"), make_event("u1", "a2", newest - gap + 2_000, "click"),
              make_event("u2", "b1", newest - 5_000, "page_view"), make_event("u2", "b2", newest, "click")]
    for event in events:
        event["event_time"] = iso(event["event_time_ms"])
    expected = run_oracle([events, [{"clock_ms": newest + MINUTE}]], gap, 0)
    assert [s[1] for s in expected.closed] == ["u1"]  # a clock a minute on closes u1 only
    assert run_oracle([events], gap, 0).closed == set()  # the events alone close nothing

    land(config.landing, "quiet.jsonl", [line(e) for e in events])
    catch_up(config, spark)  # in this process (the shared session): only the run below needs its own
    saved = take_savepoint(config, spark=spark)
    assert saved.rows > 0 and read_sessions(config) == []
    ingested_at = DeltaTable(config.raw_events_table).to_pyarrow_table().to_pylist()[0]["ingested_at"]

    started = dt.datetime.now(dt.timezone.utc)
    run = subprocess.Popen([tool("sessionctl"), "run", "--poll-seconds", str(poll_s)], env=config_env(config),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=config.home.parent)
    try:
        # The clock runs at wall speed from the newest event (ingested at `ingested_at`): a session is due when it
        # reaches session_end + gap, written within one idle period and one poll after (plus the batch itself).
        [session] = expected.closed
        due = ingested_at + dt.timedelta(milliseconds=session[3] + gap - newest)
        # 60 s: the run's start (JVM) and the batches, on a loaded machine
        deadline = max(due, started) + dt.timedelta(seconds=idle_s + poll_s + 60)
        wait_until(lambda: still_running(run) and session in read_sessions(config), interval_s=0.5,
                   timeout_s=max(0.0, (deadline - dt.datetime.now(dt.timezone.utc)).total_seconds()),
                   what=f"{session[1]}'s session written by {deadline}")
        assert sorted(read_sessions(config)) == sorted(expected.closed)
        # The running job's state agrees, read from this process (the library under `sessionctl state`): u1's
        # session is closed, u2's still open (due a gap after the newest event). The lookup reads the last
        # *committed* batch, and Spark writes a batch's commit only after its sink: wait for the batch that wrote
        # the session to commit (CI once read the batch before it, where u1 was still open).
        [written_by] = DeltaTable(config.sessions_table).to_pyarrow_table(columns=["batch_id"])["batch_id"].to_pylist()
        wait_until(lambda: still_running(run)
                   and (inspect_checkpoint(config.checkpoint).last_committed_batch or -1) >= written_by,
                   timeout_s=30, interval_s=0.2, what=f"batch {written_by} committed")  # the commit follows the sink
        u1 = lookup_user(spark, config, "u1")
        assert u1["batch_id"] >= written_by and u1["open_sessions"] == []
        assert len(lookup_user(spark, config, "u2")["open_sessions"]) == 1
    finally:
        if run.poll() is None:
            stop_stream(config)  # the library under `sessionctl stop`: the run's summary says so
        out, err = run.communicate(timeout=300)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["clock_rows"] >= 1 and summary["stopped_by"] == "stop request", err[-3000:]

    # Back to before the quiet period: the replay reads the same clock rows and writes the same sessions, once.
    restore(config, saved.savepoint_id, spark=spark)
    catch_up(config, spark)
    assert sorted(read_sessions(config)) == sorted(expected.closed)
    assert [s[1] for s in read_open_sessions(spark, config)] == ["u2"]
