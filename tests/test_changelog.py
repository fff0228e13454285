"""RocksDB changelog checkpointing (SESSIONS_ROCKSDB_CHANGELOG, on by default): a checkpoint switched off and on
again between runs keeps its state, and a savepoint (Spark's state data source) and a rescale (Spark's offline
repartition) read versions that exist only as snapshot + changelogs. Compared with the oracle."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.job.checkpoint import inspect_checkpoint
from pipelines.job.stream import catch_up
from state_store.lifecycle import restore, take_savepoint
from state_store.rescale import rescale
from testkit.lifecycle_expectations import expected_closed_sessions
from tests.kit.datagen import in_order_chunks, land_batches
from tests.kit.homes import make_config
from tests.kit.tables import read_open_sessions, read_sessions

pytestmark = pytest.mark.tier("spark")

GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000


def test_changelog_on_off_on_keeps_state_and_lifecycle_reads_it(tmp_path, spark):
    on = make_config(tmp_path, "rocksdb", SESSIONS_ROCKSDB_CHANGELOG="true")
    off = on.with_(rocksdb_changelog=False)
    chunks = in_order_chunks(40, seed=5, parts=6)

    land_batches(on, chunks[:2])
    catch_up(on, spark)
    assert _state_files(on.checkpoint)["changelog"]  # the commits were changelogs
    land_batches(off, chunks[2:3], start=2)
    catch_up(off, spark)  # switched off: loads snapshot + changelogs, commits snapshots
    land_batches(on, chunks[3:4], start=3)
    catch_up(on, spark)
    saved = take_savepoint(on, spark=spark)  # reads the newest version through the state data source
    assert saved.batch_id == inspect_checkpoint(on.checkpoint).last_committed_batch
    rescale(on, 3, spark=spark)  # Spark's offline repartition reads and rewrites it
    land_batches(on, chunks[4:], start=4)
    catch_up(on, spark)

    expected = expected_closed_sessions(chunks, GAP_MS, LATENESS_MS)
    written, open_now = read_sessions(on), read_open_sessions(spark, on)
    assert len(set(written)) == len(written)
    assert sorted(written) == expected
    # And back to the savepoint, from its rows: the same sessions once more, each once.
    restored = restore(on, saved.savepoint_id, spark=spark, canonical=True)
    assert restored.method == "canonical"
    # Its bootstrap batch (version 1, and the empty batch after it) was committed as a snapshot of every key, not as
    # a changelog of them; the stream's next batch goes on with changelogs, as the setting says.
    versions = _state_files(on.checkpoint)
    assert 1 in versions["zip"] and versions["changelog"] == set()
    catch_up(on, spark)
    assert sorted(read_sessions(on)) == expected and read_open_sessions(spark, on) == open_now
    assert min(_state_files(on.checkpoint)["changelog"]) == max(versions["zip"]) + 1


def _state_files(checkpoint: Path) -> dict[str, set[int]]:
    """The versions of the operator's RocksDB snapshot zips and changelogs, by kind."""
    found: dict[str, set[int]] = {"zip": set(), "changelog": set()}
    for path in (checkpoint / "state").rglob("*"):
        stem, _, kind = path.name.partition(".")
        if kind in found and stem.split("_")[0].isdigit():
            found[kind].add(int(stem.split("_")[0]))
    return found


@pytest.mark.parametrize("job", ["run", "catch-up"])
def test_a_finished_job_leaves_no_state_store_writing_into_its_checkpoint(tmp_path, spark, job):
    """`run` and `catch-up` give their job lease back (and `run` answers a stop) only once this JVM's state stores are
    stopped: a stopped query's RocksDB store still uploads in the background (Spark's maintenance thread) into the
    directory it was loaded from, which a restore taking the lease next gives to a new checkpoint (seen as Spark's
    STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY at the restore's first batch)."""
    import threading

    from pipelines.job.stream import run_continuously

    config = make_config(tmp_path, "rocksdb")
    land_batches(config, in_order_chunks(10, seed=3, parts=1))
    if job == "catch-up":
        summary = catch_up(config, spark)
    else:
        stop = threading.Event()
        deadline = threading.Timer(120, stop.set)  # a run that never made progress still ends (and fails below)
        deadline.start()
        try:
            summary = run_continuously(config, spark=spark, stop=stop, poll_seconds=1,
                                       on_progress=lambda summary, sink: stop.set())
        finally:
            deadline.cancel()
    assert summary.batches > 0
    store = spark.sparkContext._jvm.java.lang.Class.forName(
        "org.apache.spark.sql.execution.streaming.state.StateStore$").getField("MODULE$").get(None)
    assert not store.isMaintenanceRunning()
