"""A restore resumes at the savepoint's watermark, not at one rebuilt from the state rows it loads.

With lateness 0 a logout at the newest event time closes its session in the settle batch, so a savepoint can hold
no open row at all while its watermark is far from 0: only the bootstrap's watermark marker carries it. An event at
or below that watermark, arriving after the restore, is late (the oracle says so) and must be quarantined, not
sessionized.
"""
from __future__ import annotations

import datetime as dt

import pytest

from pipelines.job.stream import catch_up
from state_store.lifecycle import restore, take_savepoint
from testkit.oracle import run_oracle
from tests.kit.datagen import land_batches, make_event
from tests.kit.homes import make_config
from tests.kit.tables import read_quarantine, read_sessions

pytestmark = pytest.mark.tier("spark")

GAP_MS = 30 * 60_000
T0 = int(dt.datetime(2026, 10, 5, 12, tzinfo=dt.timezone.utc).timestamp() * 1000)
MINUTE = 60_000


@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_event_below_the_savepoints_watermark_is_late_after_restore(tmp_path, spark, provider):
    config = make_config(tmp_path, provider, SESSIONS_LATENESS_MINUTES="0", SESSIONS_GAP_MINUTES="30")
    before = [make_event("u1", "a1", T0, "page_view"), make_event("u1", "a2", T0 + 5 * MINUTE, "logout")]
    after = [make_event("u2", "b0", T0 + 2 * MINUTE, "page_view"),  # below the watermark (T0 + 5 min): late
             make_event("u2", "b1", T0 + 10 * MINUTE, "page_view"),
             make_event("u2", "b2", T0 + 12 * MINUTE, "logout")]
    expected = run_oracle([before, after], GAP_MS, 0)
    assert expected.late == ["b0"]  # the scenario is the one described, by the independent oracle

    land_batches(config, [before])
    catch_up(config, spark)
    saved = take_savepoint(config, spark=spark)
    assert saved.rows == 0 and saved.watermark_ms == T0 + 5 * MINUTE  # nothing open: only the marker keeps it
    restore(config, "latest", spark=spark)

    land_batches(config, [after], start=1)
    catch_up(config, spark)
    sessions = read_sessions(config)
    assert sorted(sessions) == sorted(expected.closed)
    late = read_quarantine(config)
    assert sorted(zip(late["event_id"], late["reason"])) == [("b0", "late")]
