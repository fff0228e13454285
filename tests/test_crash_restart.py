"""Exactly-once across a hard crash: `sessionctl catch-up` (its own process group: Python driver, JVM, Python
workers) is SIGKILLed mid-run, twice, then run again to completion (catch_up in the test process). The sessions table must equal the oracle
exactly -- no session lost, none written twice -- and the open state too; the malformed lines in the files
are quarantined exactly once.

Kill points: right after the sessions table gets a new data commit (the window between the sink's Delta
commit and Spark's commit log, where a replay must not write the batch again), and after a number of
micro-batches have been committed (mid-run, somewhere inside a batch).
"""
from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
from pathlib import Path

import pytest

from pipelines.job.stream import catch_up
from testkit.oracle import run_oracle, split_events
from tests.kit.datagen import adversarial_events, has_colliding_session_ids, land_files, line, pick_seed, random_split
from tests.kit.homes import SESSIONCTL, config_env, make_config
from tests.kit.tables import read_open_sessions, read_quarantine, read_sessions
from tests.kit.waits import still_running, wait_until

pytestmark = pytest.mark.tier("subprocess")

GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000
TIMEOUT_S = 240
BATCHES = 12


def _delta_versions(table_uri: str) -> int:
    log = Path(table_uri) / "_delta_log"
    return len(list(log.glob("*.json"))) if log.exists() else 0


def _committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0


def _start(config, log: Path) -> subprocess.Popen:
    handle = open(log, "ab")
    return subprocess.Popen([str(SESSIONCTL), "catch-up"], env=config_env(config), stdout=handle, stderr=handle,
                            start_new_session=True)  # own process group: the JVM and workers die with it


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def _run_and_kill(config, log: Path, until) -> None:
    """Start catch-up and SIGKILL its process group as soon as until() holds (polling every 10 ms)."""
    proc = _start(config, log)
    try:
        wait_until(lambda: still_running(proc, log) and until(), timeout_s=TIMEOUT_S, interval_s=0.01,
                   what="the kill point (catch-up must not end before it)")
    finally:
        _kill_group(proc)


def _crash_scenario(seed: int) -> list[list[dict]]:
    rng = random.Random(seed)
    events = adversarial_events(seed, users=8, events_per_user=20, gap_ms=GAP_MS, lateness_ms=LATENESS_MS,
                                held_back=0)
    return split_events(events, random_split(len(events), BATCHES, rng))


def _acceptable(batches) -> bool:
    # No late event at all: Spark drops events below the previous batch's watermark before the operator
    # sees them (test_bad_input::test_very_late_event_is_quarantined); this test is about crashes.
    expected = run_oracle(batches, GAP_MS, LATENESS_MS)
    return not has_colliding_session_ids(expected.closed) and not expected.late


def _with_bad_lines(batches, seed: int):
    """Files of lines: each batch's events plus, in every other file, a malformed line at a random place.
    Returns (files, expected quarantine rows as (source_file, line_no, reason))."""
    rng = random.Random(seed)
    files, bad = [], set()
    for i, batch in enumerate(batches):
        lines = [line(e) for e in batch]
        if i % 2 == 0:
            at = rng.randint(0, len(lines))
            lines.insert(at, f'{{"event_id": "broken-{i}", "user_id": ')
            bad.add((f"part-{i:05d}.jsonl", at + 1, "malformed_json"))
        files.append(lines)
    return files, bad


@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_sigkill_mid_run_then_restart_is_exactly_once(spark, tmp_path, provider):
    config = make_config(tmp_path, provider)
    seed, batches = pick_seed(_crash_scenario, 21 if provider == "rocksdb" else 40, _acceptable)
    files, bad_lines = _with_bad_lines(batches, seed)
    land_files(config, files)  # 12 ingest commits = 12 micro-batches (+1 empty closing batch)
    expected = run_oracle(batches, GAP_MS, LATENESS_MS)
    log = tmp_path / "catch-up.log"

    # Crash 1: right after the sessions table's first data commit (version 0 is the empty table).
    _run_and_kill(config, log, lambda: _delta_versions(config.sessions_table) >= 2)
    batches_done = _committed_batches(config.checkpoint)
    assert batches_done < len(batches), "the crash must come before the end of the run"

    # Crash 2: a few micro-batches further on, whatever the job happens to be doing then.
    _run_and_kill(config, log, lambda: _committed_batches(config.checkpoint) >= batches_done + 2)
    assert _committed_batches(config.checkpoint) < len(batches)
    partial = read_sessions(config)
    assert 0 < len(partial) < len(expected.closed)

    # Run to completion (in this process: the lock and any half-written batch are left by the dead process).
    catch_up(config, spark)

    got = read_sessions(config)
    ids = [r[0] for r in got]
    assert len(ids) == len(set(ids)), "a session was written twice across the crashes"
    assert got == sorted(expected.closed)
    assert read_open_sessions(spark, config) == sorted(expected.open_sessions)
    quarantine = read_quarantine(config)
    rows = list(zip(quarantine["source_file"], quarantine["line_no"].astype(int), quarantine["reason"]))
    assert len(rows) == len(set(rows)), "a quarantine row was written twice across the crashes"
    assert set(rows) == bad_lines
