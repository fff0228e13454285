"""A truncated state store file: catch-up fails with one line naming the file and the command that recovers,
Spark's own log goes to $SESSIONS_HOME/logs/spark.log, and `restore --savepoint latest` does recover, exactly once."""
from __future__ import annotations

import json
import subprocess

from pipelines.ingest import ingest
from pipelines.job import catch_up
from pipelines.sample_data import arrival_order, generate_events, land
from state_store.lifecycle import restore, take_savepoint
from tests.conftest import config_env, make_config, read_sessions, tool
from tests.lifecycle_expectations import expected_closed_sessions


def test_damaged_state_file_is_one_line_and_restore_recovers(tmp_path, spark):
    config = make_config(tmp_path, "rocksdb")
    events = arrival_order(generate_events(50, 3, seed=41), seed=41, jitter_seconds=120)
    half = len(events) // 2
    chunks = [events[:half], events[half:]]
    land(config.landing, "part-0.jsonl", [json.dumps(e) for e in chunks[0]])
    ingest(config, files_per_commit=1)
    catch_up(config, spark)
    take_savepoint(config, spark=spark)
    land(config.landing, "part-1.jsonl", [json.dumps(e) for e in chunks[1]])
    newest = max((config.checkpoint / "state" / "0" / "0").glob("*.zip"), key=lambda p: int(p.stem))
    newest.write_bytes(newest.read_bytes()[:100])  # truncated, as a full disk or a bad copy leaves it

    done = subprocess.run([tool("sessionctl"), "catch-up"], env=config_env(config), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("sessionctl ")]
    assert f"the state store file state/0/0/{newest.name} of {config.checkpoint} is damaged" in line, line
    assert "`sessionctl restore --savepoint latest`" in line and str(config.log_dir / "spark.log") in line
    assert len(done.stderr.strip().splitlines()) <= 2, done.stderr[-2000:]  # the line (and at most a JVM notice)
    assert "ChecksumException" in (config.log_dir / "spark.log").read_text()

    restore(config, "latest", spark=spark)
    catch_up(config, spark)
    got = read_sessions(config)
    assert len({row[0] for row in got}) == len(got)
    assert got == sorted(expected_closed_sessions(chunks, 30 * 60_000, 10 * 60_000))
