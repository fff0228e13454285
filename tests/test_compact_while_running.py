"""Compaction beside a running stream (decided safe, not locked out): OPTIMIZE and VACUUM of raw_events, sessions and
quarantine while `sessionctl run` appends, and what the stream wrote still equals the oracle, each session once."""
from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from pipelines.core.sample_data import land
from state_store.maintenance import compact
from tests.conftest import config_env, make_config, read_sessions, tool
from tests.datagen import in_order_chunks
from tests.lifecycle_expectations import expected_closed_sessions

pytestmark = pytest.mark.tier("subprocess")


def test_compaction_beside_a_running_stream_is_exactly_once(tmp_path):
    config = make_config(tmp_path, "rocksdb")
    chunks = in_order_chunks(60, seed=51, parts=4)
    expected = sorted(expected_closed_sessions(chunks, 30 * 60_000, 10 * 60_000))
    run = subprocess.Popen([tool("sessionctl"), "run", "--poll-seconds", "1"], env=config_env(config),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    compactions = []
    try:
        for i, chunk in enumerate(chunks):
            land(config.landing, f"part-{i}.jsonl", [json.dumps(e) for e in chunk])
            deadline = time.monotonic() + 120
            while any(config.landing.glob("*.jsonl")):  # ingested by the running stream
                assert time.monotonic() < deadline and run.poll() is None, "the stream did not ingest"
                time.sleep(0.5)
            compactions.append(compact(config))  # while the stream processes what it just ingested
        deadline = time.monotonic() + 180
        while read_sessions(config) != expected:
            assert time.monotonic() < deadline and run.poll() is None, "the stream did not catch up"
            time.sleep(2)
        compactions.append(compact(config))
    finally:
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=180)
    assert run.returncode == 0, err[-2000:]
    rewritten = {name for report in compactions for name, table in report.tables.items()
                 if table.get("compacted_files", 0)}
    assert {"raw_events", "sessions"} <= rewritten, f"compaction rewrote only {rewritten} while the stream ran"
    got = read_sessions(config)
    assert len({row[0] for row in got}) == len(got) and got == expected
