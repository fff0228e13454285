"""`sessionctl run`: processes files as they land, stops cleanly on Ctrl-C (SIGINT), and what it wrote
equals the oracle; a savepoint works beside it, a restore is refused in one line naming `sessionctl stop`."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.core.sample_data import arrival_order, generate_events, land
from testkit.lifecycle_expectations import expected_closed_sessions
from tests.kit.homes import make_config, tool
from tests.kit.tables import read_sessions
from tests.kit.waits import still_running, wait_until

pytestmark = pytest.mark.tier("subprocess")

REPO = Path(__file__).resolve().parent.parent


def test_run_processes_landed_files_and_stops_cleanly(tmp_path):
    home = tmp_path / "home"
    config = make_config(tmp_path)  # where the run below (SESSIONS_HOME alone) writes: for reading its tables
    assert config.sessions_table == str(home / "warehouse" / "sessions")
    env = {**os.environ, "SESSIONS_HOME": str(home), "PYSPARK_PYTHON": sys.executable}
    events = arrival_order(generate_events(40, 3, seed=21), seed=21, jitter_seconds=120)
    first, second = events[: len(events) // 2], events[len(events) // 2:]
    land(home / "landing", "first.jsonl", [json.dumps(e) for e in first])
    run = subprocess.Popen([tool("sessionctl"), "run", "--poll-seconds", "1"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        wait_until(lambda: still_running(run) and read_sessions(config, missing_ok=True), timeout_s=120, interval_s=0.5,
                   what="a session written while running")
        busy = subprocess.run([tool("sessionctl"), "restore", "--savepoint", "latest"], env=env,
                              capture_output=True, text=True, timeout=120)
        assert busy.returncode == 1 and busy.stderr.startswith("sessionctl restore: the job is running")
        assert busy.stderr.count("\n") == 1 and "`sessionctl stop`" in busy.stderr
        land(home / "landing", "second.jsonl", [json.dumps(e) for e in second])
        expected = expected_closed_sessions([first, second], 30 * 60_000, 10 * 60_000)
        wait_until(lambda: still_running(run) and read_sessions(config, missing_ok=True) == sorted(expected), timeout_s=120,
                   interval_s=0.5, what="the second file's sessions written")
    finally:
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err[-2000:]
    # An orderly stop: no JVM fatal-error banner in place of the summary, no crash file left behind.
    assert not [line for line in (out + err).splitlines() if line.startswith("#")], (out + err)[-3000:]
    assert not list(tmp_path.glob("hs_err_pid*.log")) and not list(REPO.glob("hs_err_pid*.log"))
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["ingested_files"] == 2 and summary["sessions_written"] == len(expected)
