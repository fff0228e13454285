"""A truncated state store file (snapshot or changelog): catch-up fails with one line naming the file and the command that recovers,
Spark's own log goes to $SESSIONS_HOME/logs/spark.log, and `restore --savepoint latest` does recover, exactly once."""
from __future__ import annotations

import json
import subprocess

import pytest

from pipelines.core.sample_data import land
from pipelines.ingest import ingest
from pipelines.job.checkpoint import inspect_checkpoint
from pipelines.job.stream import catch_up
from state_store.lifecycle import restore, take_savepoint
from testkit.lifecycle_expectations import expected_closed_sessions
from tests.kit.datagen import in_order_chunks
from tests.kit.homes import config_env, make_config, tool
from tests.kit.tables import read_sessions

pytestmark = pytest.mark.tier("subprocess")


def test_damaged_state_file_is_one_line_and_restore_recovers(tmp_path, spark):
    config = make_config(tmp_path, "rocksdb")
    chunks = in_order_chunks(50, seed=41, parts=2)
    land(config.landing, "part-0.jsonl", [json.dumps(e) for e in chunks[0]])
    ingest(config, files_per_commit=1)
    catch_up(config, spark)
    take_savepoint(config, spark=spark)
    land(config.landing, "part-1.jsonl", [json.dumps(e) for e in chunks[1]])
    # The file the next run loads the newest version from: its snapshot if one was uploaded, else its changelog
    # (RocksDB's changelog checkpointing, the default, commits changelogs and uploads snapshots in the background).
    files = [p for p in (config.checkpoint / "state" / "0" / "0").iterdir() if p.suffix in (".zip", ".changelog")]
    newest = max(files, key=lambda p: (int(p.stem), p.suffix == ".zip"))
    newest.write_bytes(newest.read_bytes()[:100])  # truncated, as a full disk or a bad copy leaves it

    done = subprocess.run([tool("sessionctl"), "catch-up"], env=config_env(config), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("sessionctl ")]
    if newest.suffix == ".zip":  # a snapshot: Hadoop's checksum names the file
        assert f"the state store file state/0/0/{newest.name} of {config.checkpoint} is damaged" in line, line
        assert "ChecksumException" in (config.log_dir / "spark.log").read_text()
    else:  # a changelog: read without a checksum, and Spark's error does not name it
        assert f"the state store in {config.checkpoint} is damaged (a changelog file is truncated or corrupt)" in line
        assert "StateStoreChangelogReader" in (config.log_dir / "errors.log").read_text()
    assert "`sessionctl restore --savepoint latest`" in line and str(config.log_dir / "spark.log") in line
    assert len(done.stderr.strip().splitlines()) <= 2, done.stderr[-2000:]  # the line (and at most a JVM notice)

    restore(config, "latest", spark=spark)
    catch_up(config, spark)
    got = read_sessions(config)
    assert len({row[0] for row in got}) == len(got)
    assert got == sorted(expected_closed_sessions(chunks, 30 * 60_000, 10 * 60_000))


def test_python_worker_that_cannot_start_is_one_line_and_nothing_is_committed(tmp_path, spark):
    """A Python worker that dies at start (a broken PYSPARK_PYTHON, as a bad image or an overloaded host leaves
    it): catch-up and savepoint fail in one line that quotes the worker and names the log; nothing is committed,
    and a catch-up with a working interpreter goes on exactly once. (The source and the savepoint's writing tasks run
    in Python workers.)"""
    config = make_config(tmp_path, "hdfs")
    chunks = in_order_chunks(40, seed=43, parts=2)
    land(config.landing, "part-0.jsonl", [json.dumps(e) for e in chunks[0]])
    ingest(config, files_per_commit=1)
    catch_up(config, spark)
    land(config.landing, "part-1.jsonl", [json.dumps(e) for e in chunks[1]])
    committed = inspect_checkpoint(config.checkpoint).last_committed_batch

    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'No module named pandas' >&2\nexit 3\n")
    broken.chmod(0o755)
    for command in (["catch-up"], ["savepoint"]):
        done = subprocess.run([tool("sessionctl"), *command], env=config_env(config, PYSPARK_PYTHON=str(broken)),
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
        (line,) = [line for line in done.stderr.splitlines() if line.startswith("sessionctl ")]
        assert "Python worker failed to start" in line and "No module named pandas" in line, line
        assert str(broken) in line and str(config.log_dir / "errors.log") in line
        assert len(done.stderr.strip().splitlines()) <= 2, done.stderr[-2000:]
    assert inspect_checkpoint(config.checkpoint).last_committed_batch == committed
    assert "Traceback" in (config.log_dir / "errors.log").read_text()

    catch_up(config, spark)  # with a working interpreter (the shared session's): no JVM of its own needed for that
    got = read_sessions(config)
    assert len({row[0] for row in got}) == len(got)
    assert got == sorted(expected_closed_sessions(chunks, 30 * 60_000, 10 * 60_000))
