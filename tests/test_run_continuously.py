"""`sessionctl run`: processes files as they land, stops cleanly on Ctrl-C (SIGINT), and what it wrote
equals the oracle; the job lock makes a concurrent savepoint fail with one clear line."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from deltalake import DeltaTable

from pipelines.sample_data import arrival_order, generate_events, land
from tests.conftest import tool
from tests.lifecycle_expectations import expected_closed_sessions

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
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert _wait_for(lambda: len(_sessions(home)) > 0, 120), "no session written while running"
        busy = subprocess.run([tool("sessionctl"), "savepoint", "--json"], env=env,
                              capture_output=True, text=True, timeout=120)
        assert busy.returncode == 1 and busy.stderr.startswith("sessionctl savepoint: the job is running")
        land(home / "landing", "second.jsonl", [json.dumps(e) for e in second])
        expected = expected_closed_sessions([first, second], 30 * 60_000, 10 * 60_000)
        assert _wait_for(lambda: _sessions(home) == sorted(expected), 120), "second file not processed"
    finally:
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["ingested_files"] == 2 and summary["sessions_written"] == len(expected)
