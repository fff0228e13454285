"""Compaction beside a running stream (decided safe, not locked out): OPTIMIZE and VACUUM of raw_events, sessions and
quarantine while `sessionctl run` appends, and what the stream wrote still equals the oracle, each session once."""
from __future__ import annotations

import json
import signal
import subprocess

import pytest
from deltalake import DeltaTable

from pipelines.core.sample_data import land
from state_store.maintenance import compact
from testkit.lifecycle_expectations import expected_closed_sessions
from tests.kit.datagen import in_order_chunks
from tests.kit.homes import config_env, make_config, tool
from tests.kit.tables import read_sessions
from tests.kit.waits import still_running, stream_caught_up, wait_until

pytestmark = pytest.mark.tier("subprocess")


def _between_stream_commits(uri: str) -> tuple[list[int], list[tuple[int, str]]]:
    """The versions of the table's OPTIMIZE commits (the compactions') that landed between two appends (the running
    stream's: nothing else appends in this test), and the history as (version, operation) for the message."""
    history = sorted((int(c["version"]), str(c["operation"])) for c in DeltaTable(uri).history())
    appends = [v for v, op in history if op == "WRITE"]
    between = [v for v, op in history if op == "OPTIMIZE" and appends and appends[0] < v < appends[-1]]
    return between, history


def test_compaction_beside_a_running_stream_is_exactly_once(tmp_path):
    config = make_config(tmp_path, "rocksdb")
    chunks = in_order_chunks(60, seed=51, parts=4)
    expected = sorted(expected_closed_sessions(chunks, 30 * 60_000, 10 * 60_000))
    run = subprocess.Popen([tool("sessionctl"), "run", "--poll-seconds", "1"], env=config_env(config),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    compactions = []
    try:
        for i, chunk in enumerate(chunks):
            # The previous part's batch committed first, so each compaction finds the stream's earlier sessions
            # files to rewrite while it processes the part that just landed (and the next part's commit follows it).
            wait_until(lambda: still_running(run) and stream_caught_up(config), timeout_s=120, interval_s=0.2,
                       what=f"the stream to commit the batches before part-{i}")
            land(config.landing, f"part-{i}.jsonl", [json.dumps(e) for e in chunk])
            wait_until(lambda: still_running(run) and not any(config.landing.glob("*.jsonl")), timeout_s=120,
                       interval_s=0.2, what=f"part-{i} ingested by the running stream")
            compactions.append(compact(config))  # while the stream processes what it just ingested
        wait_until(lambda: still_running(run) and read_sessions(config) == expected, timeout_s=180, interval_s=1,
                   what="the stream to catch up (every expected session written)")
        compactions.append(compact(config))
    finally:
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=180)
    assert run.returncode == 0, err[-2000:]
    rewritten = {name for report in compactions for name, table in report.tables.items()
                 if table.get("compacted_files", 0)}
    assert {"raw_events", "sessions"} <= rewritten, f"compaction rewrote only {rewritten} while the stream ran"
    # The overlap happened: on both tables the stream appends to, a compaction committed between two of the running
    # stream's commits (the stream went on writing after the files under it were rewritten).
    for uri in (config.raw_events_table, config.sessions_table):
        between, history = _between_stream_commits(str(uri))
        assert between, f"no compaction of {uri} between two stream commits: {history}"
    got = read_sessions(config)
    assert len({row[0] for row in got}) == len(got) and got == expected
