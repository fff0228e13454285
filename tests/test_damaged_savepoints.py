"""A damaged savepoint in an incremental chain (a Delta log entry deleted, a data file truncated or its bytes changed)
is named in one line with the way out, and blocks nothing else: the pre-flight says not restorable and names it,
restore and diff refuse in one line (no traceback), the next savepoint is taken full (and says why), an executor that
cannot read a file names it (not "a Python worker failed to start"), and an undamaged older savepoint still restores
to the oracle's state."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pipelines.core.sample_data import land
from pipelines.errors import SavepointDamaged, StreamFailed
from pipelines.ingest import ingest
from pipelines.job.checkpoint import inspect_checkpoint
from pipelines.job.runtime import error_line, explain_spark_failure, spark_failures
from pipelines.job.stream import catch_up
from state_store.history import diff_savepoints
from state_store.lifecycle import restore, take_savepoint
from state_store.maintenance import compact
from state_store.preflight import plan_restore
from state_store.savepoint.catalog import SavepointStore
from state_store.savepoint.chain import savepoint_checksum
from state_store.savepoint.checksum import state_checksum
from state_store.savepoint.damage import check_readable, damaged_members
from testkit.lifecycle_expectations import live_state
from tests.kit.datagen import in_order_chunks
from tests.kit.homes import config_env, make_config, tool
from tests.kit.savepoint_expectations import oracle_of
from tests.kit.tables import read_open_sessions, read_sessions

pytestmark = pytest.mark.tier("spark")

GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000


def _land(config, chunks: list[list[dict]], start: int) -> None:
    for k, chunk in enumerate(chunks, start):
        land(config.landing, f"part-{k:04d}.jsonl", [json.dumps(e) for e in chunk])
        ingest(config, files_per_commit=1)


def _chain(tmp_path: Path, spark, provider: str):
    """A full savepoint and two increments on it, one chunk of 8 users' events each (a fourth chunk kept back)."""
    config = make_config(tmp_path, provider, SESSIONS_SAVEPOINT_CHAIN_SHARE=100)
    chunks = in_order_chunks(8, seed=47, parts=4)
    taken = []
    for k in range(3):
        _land(config, [chunks[k]], k)
        catch_up(config, spark)
        taken.append(take_savepoint(config, spark=spark))
    assert [s.kind for s in taken] == ["full", "incremental", "incremental"]
    return config, chunks, taken


def _sessionctl(config, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([tool("sessionctl"), *args], env=config_env(config), capture_output=True, text=True,
                          timeout=300)


def _one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("sessionctl ")]
    assert len(done.stderr.strip().splitlines()) <= 2, done.stderr[-2000:]  # the line (and at most a JVM notice)
    return line


def _assert_full_on_damage(config, spark, savepoint, damaged_id: str) -> None:
    """The savepoint is full, says which savepoint's damage made it so, and holds the live state."""
    assert savepoint.kind == "full" and savepoint.chain_ids == [savepoint.savepoint_id]
    assert damaged_id in savepoint.note and savepoint.to_dict()["note"] == savepoint.note
    assert savepoint.checksum == state_checksum(live_state(spark, config.checkpoint, batch_id=savepoint.batch_id))


@pytest.mark.tier("subprocess")
def test_a_deleted_log_entry_is_named_in_one_line_and_blocks_no_savepoint(tmp_path, spark):
    config, chunks, (full, first, second) = _chain(tmp_path, spark, "rocksdb")
    (Path(first.uri) / "_delta_log" / "00000000000000000000.json").unlink()
    store = SavepointStore.of(config)
    assert list(damaged_members(store, second)) == [first.savepoint_id]
    assert damaged_members(store, full) == {}
    with pytest.raises(SavepointDamaged) as raised:
        check_readable(store, second)
    assert raised.value.savepoint_id == first.savepoint_id and "sessionctl savepoint --full" in raised.value.next_step

    dry = _sessionctl(config, "restore", "--savepoint", second.savepoint_id, "--dry-run", "--json")
    # the answer on stdout, an exit code that is not the one of a failed check (1; 3 says "not restorable")
    assert dry.returncode in (0, 3) and "Traceback" not in dry.stderr, dry.stderr[-2000:]
    plan = json.loads(dry.stdout)
    assert plan["restorable"] is False and len(plan["reasons"]) == 1, plan
    assert f"savepoint {first.savepoint_id} is damaged" in plan["reasons"][0]
    assert "00000000000000000000.json is missing" in plan["reasons"][0]
    for command in (["restore", "--savepoint", second.savepoint_id],
                    ["savepoints", "diff", full.savepoint_id, second.savepoint_id]):
        line = _one_line(_sessionctl(config, *command))
        assert f"savepoint {first.savepoint_id} is damaged" in line and "`sessionctl savepoint --full`" in line, line

    _land(config, [chunks[3]], 3)
    catch_up(config, spark)
    fallback = take_savepoint(config, spark=spark)  # incremental asked for (the default)
    _assert_full_on_damage(config, spark, fallback, first.savepoint_id)
    after = take_savepoint(config, spark=spark)  # the new chain goes on
    assert (after.kind, after.base_id, after.note) == ("incremental", fallback.savepoint_id, None)

    restore(config, full.savepoint_id, spark=spark)  # older than the damage: restores exactly
    at_full = oracle_of(chunks[:1], GAP_MS, LATENESS_MS)
    assert read_open_sessions(spark, config) == sorted(at_full.open_sessions)
    assert read_sessions(config) == sorted(at_full.closed)


def test_a_truncated_or_overwritten_data_file_is_named_and_a_savepoint_on_it_is_full(tmp_path, spark):
    config, chunks, (full, first, second) = _chain(tmp_path, spark, "hdfs")
    store = SavepointStore.of(config)
    data = Path(store.data_files(first.savepoint_id).files[0].removeprefix("file://"))
    whole = data.read_bytes()
    data.write_bytes(whole[:len(whole) // 2])  # as a full disk or a bad copy leaves it

    plan = plan_restore(config, second.savepoint_id)
    assert not plan.restorable and f"savepoint {first.savepoint_id} is damaged" in plan.reasons[0], plan.reasons
    assert "truncated" in plan.reasons[0] and data.name in plan.reasons[0]
    assert plan_restore(config, full.savepoint_id).restorable
    with pytest.raises(SavepointDamaged, match=f"savepoint {first.savepoint_id} is damaged"):
        restore(config, second.savepoint_id, spark=spark)
    with pytest.raises(SavepointDamaged, match=f"savepoint {first.savepoint_id} is damaged"):
        diff_savepoints(config, spark, full.savepoint_id, second.savepoint_id)
    # Read past the checks, the executors' failure names the file and its savepoint.
    with pytest.raises(SavepointDamaged) as raised, spark_failures(config):
        savepoint_checksum(spark, store, second.savepoint_id)
    assert raised.value.savepoint_id == first.savepoint_id and data.name in str(raised.value)
    assert "Python worker" not in str(raised.value)
    # The way out the line names: compaction goes on around it (no OPTIMIZE of a file it cannot read) and says so.
    assert compact(config).savepoints_damaged == [first.savepoint_id]

    # The same size again, other bytes: only a read sees it -- the increment's check of the previous chain does, and
    # the savepoint is taken full in the same run.
    data.write_bytes(b"\0" * len(whole))
    assert plan_restore(config, second.savepoint_id).restorable
    _land(config, [chunks[3]], 3)
    catch_up(config, spark)
    _assert_full_on_damage(config, spark, take_savepoint(config, spark=spark), first.savepoint_id)

    # A full savepoint's file overwritten the same way: its restore reads it with Spark's Parquet reader first, which
    # refuses it; the savepoint's own reader then names the file, and nothing changed.
    batch_before, sessions_before = inspect_checkpoint(config.checkpoint).last_committed_batch, read_sessions(config)
    full_file = Path(store.data_files(full.savepoint_id).files[0].removeprefix("file://"))
    full_file.write_bytes(b"\0" * full_file.stat().st_size)
    with pytest.raises(SavepointDamaged, match=f"savepoint {full.savepoint_id} is damaged") as refused:
        restore(config, full.savepoint_id, spark=spark)
    assert full_file.name in str(refused.value) and "\n" not in str(refused.value)
    assert inspect_checkpoint(config.checkpoint).last_committed_batch == batch_before
    assert read_sessions(config) == sessions_before


_RAISED = ("An exception was thrown from the Python worker. Please see the stack trace below.\n"
           "Traceback (most recent call last):\n  File \"/x/worker.py\", line 1, in main\n    process()\n{}\n"
           "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:1)\n")


@pytest.mark.tier("pure")
def test_an_executor_failure_says_its_own_cause(tmp_path):
    """Only a worker that did not start is said to be one; Python code that raised in a task says its exception."""
    config = make_config(tmp_path)
    said = explain_spark_failure(Exception(_RAISED.format("ValueError: the real cause")), config)
    assert isinstance(said, StreamFailed) and "in an executor: ValueError: the real cause" in str(said), said
    assert "failed to start" not in str(said)
    start = Exception("Python worker exited unexpectedly (crashed)\nError from python worker:\n  No module named pandas")
    assert "failed to start or connect back (it said: No module named pandas)" in str(explain_spark_failure(start, config))
    unreadable = explain_spark_failure(Exception(_RAISED.format(
        "OSError: savepoint data file file:///h/savepoints/state/sp-1-b2/part-0.zstd.parquet cannot be read "
        "(ArrowInvalid: Parquet magic bytes not found in footer)")), config)
    assert isinstance(unreadable, SavepointDamaged) and unreadable.savepoint_id == "sp-1-b2"
    assert "savepoint sp-1-b2 is damaged: its data file" in str(unreadable) and "\n" not in str(unreadable)


def test_a_jvm_call_that_throws_says_the_java_exception_and_its_root_cause(spark, tmp_path):
    """A Py4JJavaError's first line ("An error occurred while calling o12.method.") says nothing; the one line names
    the Java exception and its innermost cause."""
    from py4j.protocol import Py4JJavaError

    config = make_config(tmp_path)
    jvm = spark.sparkContext._jvm
    with pytest.raises(Py4JJavaError) as thrown:  # a real JVM throw, wrapped with a cause, through py4j
        jvm.java.util.concurrent.CompletableFuture.failedFuture(
            jvm.java.io.UncheckedIOException("upload failed", jvm.java.io.IOException("the root cause"))).join()
    said = str(explain_spark_failure(thrown.value, config))
    assert said.startswith("Spark failed: join raised java.util.concurrent.CompletionException"), said
    assert "caused by java.io.IOException: the root cause" in said and "\n" not in said, said
    line = error_line(thrown.value)  # what a failed restore's one line carries
    assert line.startswith("join raised java.util.concurrent.CompletionException"), line
    assert line.endswith("caused by java.io.IOException: the root cause"), line
    assert error_line(OSError("disk full\nmore")) == "OSError: disk full"
