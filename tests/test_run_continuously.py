"""`sessionctl run`: processes files as they land, stops cleanly on Ctrl-C (SIGINT), and what it wrote
equals the oracle; a savepoint works beside it, a restore is refused in one line naming `sessionctl stop`."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from pipelines.core.sample_data import arrival_order, generate_events, land
from tests.conftest import tool
from tests.lifecycle_expectations import expected_closed_sessions

pytestmark = pytest.mark.tier("subprocess")

REPO = Path(__file__).resolve().parent.parent


def _sessions(home: Path) -> list[tuple]:
    uri = home / "warehouse" / "sessions"
    if not DeltaTable.is_deltatable(str(uri)):
        return []
    frame = DeltaTable(str(uri)).to_pandas()
    return sorted((r.session_id, r.user_id, r.session_start.value // 1_000_000, r.session_end.value // 1_000_000,
                   int(r.event_count), int(r.page_views), r.end_reason) for r in frame.itertuples())


def _wait_for(predicate, seconds: float):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(1)
    return False


def test_run_processes_landed_files_and_stops_cleanly(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "SESSIONS_HOME": str(home), "PYSPARK_PYTHON": sys.executable}
    events = arrival_order(generate_events(40, 3, seed=21), seed=21, jitter_seconds=120)
    first, second = events[: len(events) // 2], events[len(events) // 2:]
    land(home / "landing", "first.jsonl", [json.dumps(e) for e in first])
    run = subprocess.Popen([tool("sessionctl"), "run", "--poll-seconds", "1"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert _wait_for(lambda: len(_sessions(home)) > 0, 120), "no session written while running"
        busy = subprocess.run([tool("sessionctl"), "restore", "--savepoint", "latest"], env=env,
                              capture_output=True, text=True, timeout=120)
        assert busy.returncode == 1 and busy.stderr.startswith("sessionctl restore: the job is running")
        assert busy.stderr.count("\n") == 1 and "`sessionctl stop`" in busy.stderr
        land(home / "landing", "second.jsonl", [json.dumps(e) for e in second])
        expected = expected_closed_sessions([first, second], 30 * 60_000, 10 * 60_000)
        assert _wait_for(lambda: _sessions(home) == sorted(expected), 120), "second file not processed"
    finally:
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err[-2000:]
    # An orderly stop: no JVM fatal-error banner in place of the summary, no crash file left behind.
    assert not [line for line in (out + err).splitlines() if line.startswith("#")], (out + err)[-3000:]
    assert not list(tmp_path.glob("hs_err_pid*.log")) and not list(REPO.glob("hs_err_pid*.log"))
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["ingested_files"] == 2 and summary["sessions_written"] == len(expected)
