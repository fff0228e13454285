"""A canonical restore by the state writer (pipelines.job.operators.state_writer): the state written straight into
the store by the executors, across partition counts and providers, from a chain of incremental savepoints. Held to
the oracle (testkit/oracle.py) at the savepoint and after catch-ups, and to Spark's own placement of each key (the
state data source's partition_id against Spark's hash of the grouping columns). A savepoint whose rows are not the
ones its catalog row describes is refused in one line, before anything changed."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from pyspark.sql import functions as F

from pipelines.errors import SavepointDamaged
from pipelines.job.checkpoint import inspect_checkpoint
from pipelines.job.operators.seam import state_reader
from pipelines.job.stream import catch_up
from state_store.lifecycle import restore, take_savepoint
from state_store.savepoint.catalog import SavepointStore
from tests.kit.datagen import in_order_chunks, land_batches
from tests.kit.homes import make_config
from tests.kit.savepoint_expectations import oracle_of
from tests.kit.tables import read_open_sessions, read_sessions

pytestmark = pytest.mark.tier("spark")

GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000


def _placed_as_spark_places(spark, config, partitions: int) -> None:
    """Every key in the partition the stateful operator's hash partitioning of (user_hash, user_id) gives it."""
    state = state_reader(spark, config.checkpoint, None)
    wrong = state.where(F.col("partition_id") != F.expr(f"pmod(hash(key.user_hash, key.user_id), {partitions})"))
    assert state.count() > 0 and wrong.count() == 0
    assert inspect_checkpoint(config.checkpoint).partitions == partitions


def _at(spark, config, chunks: list[list[dict]]) -> None:
    expected = oracle_of(chunks, GAP_MS, LATENESS_MS)
    assert read_open_sessions(spark, config) == sorted(expected.open_sessions)
    assert read_sessions(config) == sorted(expected.closed)


def test_writer_restores_a_chain_across_partitions_and_providers(tmp_path, spark):
    """A chain (full + two increments, RocksDB's change feed) at 4 partitions on RocksDB, restored on the HDFS-backed
    provider at 3; the stream goes on from it; its savepoint restored on RocksDB at 8; the stream goes on again: the
    oracle throughout, each key where Spark's partitioning puts it."""
    first, second = "rocksdb", "hdfs"
    config = make_config(tmp_path, first, SESSIONS_STATE_PARTITIONS=4, SESSIONS_SAVEPOINT_CHAIN_SHARE=100)
    chunks = in_order_chunks(24, seed=63, parts=6)
    taken = []
    for k in range(3):
        land_batches(config, [chunks[k]], start=k)
        catch_up(config, spark)
        taken.append(take_savepoint(config, spark=spark))
    assert [s.kind for s in taken] == ["full", "incremental", "incremental"]
    land_batches(config, [chunks[3]], start=3)
    catch_up(config, spark)  # past the savepoint: rolled back by the restore

    other = config.with_(state_store=second)
    restored = restore(other, taken[-1].savepoint_id, partitions=3, spark=spark)
    assert (restored.method, restored.provider, restored.partitions) == ("canonical", second, 3), restored
    assert "state_written" in restored.phases and "bootstrap_batch" not in restored.phases, restored.phases
    assert (restored.rows, restored.checksum) == (taken[-1].rows, taken[-1].checksum)
    _placed_as_spark_places(spark, other, 3)
    _at(spark, other, chunks[:3])
    land_batches(other, [chunks[3]], start=3)
    catch_up(other, spark)
    _at(spark, other, chunks[:4])

    saved = take_savepoint(other, spark=spark)
    back = restore(config, saved.savepoint_id, partitions=8, spark=spark)
    assert (back.provider, back.partitions) == (first, 8), back
    _placed_as_spark_places(spark, config, 8)
    _at(spark, config, chunks[:4])
    land_batches(config, chunks[4:], start=4)
    catch_up(config, spark)
    _at(spark, config, chunks)


def test_a_savepoint_unlike_its_catalog_row_is_refused_before_anything_changes(tmp_path, spark, monkeypatch):
    """The read-back of the written state is the savepoint's verification: rows that are not the ones the catalog
    row describes refuse the savepoint as damaged (one line, its way out), with the old checkpoint back in place and
    the tables untouched."""
    config = make_config(tmp_path, "hdfs")
    chunks = in_order_chunks(8, seed=5, parts=3)
    land_batches(config, chunks[:2], start=0)
    catch_up(config, spark)
    saved = take_savepoint(config, spark=spark)
    land_batches(config, chunks[2:], start=2)
    catch_up(config, spark)
    before = inspect_checkpoint(config.checkpoint).last_committed_batch, read_sessions(config)

    got = SavepointStore.get
    monkeypatch.setattr(SavepointStore, "get", lambda self, which: replace(got(self, which), checksum="0" * 32))
    with pytest.raises(SavepointDamaged) as refused:
        restore(config, saved.savepoint_id, spark=spark)
    line = str(refused.value)
    assert "\n" not in line and f"savepoint {saved.savepoint_id} is damaged" in line, line
    assert refused.value.next_step, refused.value
    assert (inspect_checkpoint(config.checkpoint).last_committed_batch, read_sessions(config)) == before
    monkeypatch.undo()
    restore(config, saved.savepoint_id, spark=spark)
    _at(spark, config, chunks[:2])


def test_a_restore_at_the_savepoints_partitions_takes_its_files_as_placed(tmp_path, spark, monkeypatch):
    """At the savepoint's own partition count the writer reads each state partition's files in its own task, with no
    shuffle (StateWriter.writePlaced); rows that are not so placed -- here each partition's files given to the next
    partition's task -- are found out by the tasks, and the restore writes them with the shuffle instead: the oracle and
    Spark's placement both times."""
    import state_store.restore as restoring

    config = make_config(tmp_path, "rocksdb", SESSIONS_STATE_PARTITIONS=4)
    chunks = in_order_chunks(24, seed=17, parts=3)
    land_batches(config, chunks[:2], start=0)
    catch_up(config, spark)
    saved = take_savepoint(config, spark=spark, full=True)
    land_batches(config, chunks[2:], start=2)
    catch_up(config, spark)

    placed_writes: list[object] = []
    real_write = restoring.write_placed_state
    monkeypatch.setattr(restoring, "write_placed_state",
                        lambda *a, **k: placed_writes.append(real_write(*a, **k)) or placed_writes[-1])
    done = restore(config, saved.savepoint_id, spark=spark, canonical=True)
    assert (done.rows, done.checksum, done.partitions) == (saved.rows, saved.checksum, 4), done
    assert len(placed_writes) == 1 and placed_writes[0] is not None  # written as placed
    _placed_as_spark_places(spark, config, 4)
    _at(spark, config, chunks[:2])

    real_rows = restoring.savepoint_rows_by_spark

    def not_placed(*args, **kwargs):  # each partition's files handed to the next partition's task
        rows, parts = real_rows(*args, **kwargs)
        return rows, parts[1:] + parts[:1]

    monkeypatch.setattr(restoring, "savepoint_rows_by_spark", not_placed)
    again = restore(config, saved.savepoint_id, spark=spark, canonical=True)
    assert (again.rows, again.checksum) == (saved.rows, saved.checksum), again
    assert len(placed_writes) == 2 and placed_writes[1] is None  # refused by the tasks, written with the shuffle
    _placed_as_spark_places(spark, config, 4)
    _at(spark, config, chunks[:2])
    land_batches(config, chunks[2:], start=2)
    catch_up(config, spark)
    _at(spark, config, chunks)


def _batch_zero(checkpoint) -> dict:
    """What a checkpoint's batch 0 leaves besides the state: its offset log entry (settings, source offset), its
    commit, the operator's metadata and state schema."""
    offsets = (checkpoint / "offsets" / "0").read_text().splitlines()
    meta = json.loads(offsets[1])
    return {"conf": meta["conf"], "batch_watermark": meta["batchWatermarkMs"], "source": json.loads(offsets[2]),
            "commit": (checkpoint / "commits" / "0").read_text().splitlines(),
            "operator": (checkpoint / "state" / "0" / "_metadata" / "metadata").read_bytes(),
            "schema": (checkpoint / "state" / "0" / "0" / "_metadata" / "schema").read_bytes(),
            "query_id": json.loads((checkpoint / "metadata").read_text())["id"]}


def test_the_restored_batch_zero_is_the_one_the_streams_query_writes(tmp_path, spark):
    """A restore writes batch 0 without running a query: its settings, operator metadata and state schema are
    byte for byte what the stream's own first batch wrote, its source offset the savepoint's position after the
    marker, its commit the savepoint's watermark; a new query id. At 8 partitions from 2 users, the partitions no
    user lands in still get their (empty) store: the stream goes on from it and meets the oracle."""
    config = make_config(tmp_path, "hdfs", SESSIONS_STATE_PARTITIONS=8)
    chunks = in_order_chunks(2, seed=29, parts=2)
    land_batches(config, chunks[:1], start=0)
    catch_up(config, spark)
    streams = _batch_zero(config.checkpoint)
    saved = take_savepoint(config, spark=spark, full=True)

    done = restore(config, saved.savepoint_id, spark=spark, canonical=True)
    assert (done.rows, done.checksum, done.partitions) == (saved.rows, saved.checksum, 8), done
    restored = _batch_zero(config.checkpoint)
    assert restored["conf"] == streams["conf"] and restored["conf"]["spark.sql.shuffle.partitions"] == "8"
    assert (restored["operator"], restored["schema"]) == (streams["operator"], streams["schema"])
    assert restored["batch_watermark"] == 0 and restored["query_id"] != streams["query_id"]
    assert restored["source"] == {"seq": saved.source_seq, "boot": True, "settled": False}
    assert json.loads(restored["commit"][1]) == {"nextBatchWatermarkMs": saved.watermark_ms}
    assert {p.name for p in (config.checkpoint / "state" / "0").iterdir()} >= {str(p) for p in range(8)}
    _at(spark, config, chunks[:1])
    land_batches(config, chunks[1:], start=1)
    catch_up(config, spark)
    _at(spark, config, chunks)
