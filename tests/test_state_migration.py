"""State that older builds wrote, carried into this one: a savepoint written by the build before the v2 state layout
(schema open_events/v1, one row per open event) restores into the v2 layout, and a checkpoint of the retired Python
operator moves to the JVM operator through a savepoint; the job then goes on exactly as the oracle says.

The fixture (tests/fixtures/savepoint_v1_home) was written by that older build with
tests/fixtures/make_v1_savepoint.py: the first CUT batches processed, a savepoint taken, the checkpoint deleted.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipelines.core import state_format
from pipelines.errors import CheckpointMismatch
from pipelines.job.checkpoint import read_job_metadata
from pipelines.job.operators.jvm import STATE_LAYOUT as JVM_STATE_LAYOUT
from pipelines.job.stream import catch_up
from state_store.lifecycle import restore, take_savepoint
from state_store.savepoint import catalog as sp
from testkit.oracle import run_oracle
from tests.kit.datagen import land_batches, stream_scenario
from tests.kit.homes import make_config
from tests.kit.savepoint_expectations import state_sessions
from tests.kit.tables import assert_late_keys, read_open_sessions, read_sessions
from tests.test_stream_vs_oracle import assert_matches_oracle

pytestmark = pytest.mark.tier("spark")

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "savepoint_v1_home"
CUT = 4
GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000  # make_config's defaults


def migration_batches() -> list[list[dict]]:
    return stream_scenario(2, 6, gap_ms=GAP_MS, lateness_ms=LATENESS_MS)  # the data the fixture was made from


@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_v1_savepoint_restores_into_v2_and_continues_exactly(spark, tmp_path, provider):
    home = tmp_path / "home"
    shutil.copytree(FIXTURE, home)
    config = make_config(tmp_path, provider, home=home)
    (saved,) = sp.SavepointStore.of(config).list()
    assert saved.state_schema == state_format.V1_SCHEMA_ID and saved.rows > 0
    batches = migration_batches()
    land_batches(config, batches[CUT:], start=CUT)

    restored = restore(config, "latest", spark=spark)
    # The v1 rows as stored (one per open event) and the v2 state restored from them: the oracle's at batch CUT.
    from deltalake import DeltaTable

    at_savepoint = run_oracle(batches[:CUT], GAP_MS, LATENESS_MS)
    v1_rows = DeltaTable(str(home / "savepoints" / "state" / saved.savepoint_id)).to_pyarrow_table()
    assert sorted(zip(v1_rows["user_id"].to_pylist(), v1_rows["event_id"].to_pylist())) == \
        sorted(at_savepoint.open_events)
    assert restored.savepoint_id == saved.savepoint_id
    assert read_open_sessions(spark, config) == sorted(at_savepoint.open_sessions)
    catch_up(config, spark)

    expected = run_oracle(batches, GAP_MS, LATENESS_MS)
    assert read_sessions(config) == sorted(expected.closed)
    assert read_open_sessions(spark, config) == sorted(expected.open_sessions)
    assert_late_keys(config, expected)


@pytest.mark.tier("pure")
def test_checkpoint_of_the_json_layout_is_refused_with_the_way_out(tmp_path):
    """A checkpoint written before v2 (its _job.json has no state_layout) cannot run on this build: one clear
    error naming the restore that upgrades, before Spark starts or anything is written."""
    config = make_config(tmp_path, "rocksdb")
    config.checkpoint.mkdir(parents=True)
    (config.checkpoint / "_job.json").write_text(json.dumps(
        {"incarnation": "old", "gap_ms": GAP_MS, "lateness_ms": LATENESS_MS, "buckets": config.state_buckets, "created_from": None}))
    with pytest.raises(CheckpointMismatch, match=r"older layout .*sessionctl restore --savepoint latest"):
        catch_up(config, spark=None)


def test_v2_savepoint_with_frozen_prefixes_restores_on_the_other_provider(spark, tmp_path):
    """A savepoint of the v2 layout (frozen prefixes included) taken on RocksDB restores under the HDFS-backed
    provider, and the job goes on exactly as the oracle says; the savepoint is plain Delta, queryable as such."""
    from deltalake import DeltaTable

    from state_store.lifecycle import take_savepoint

    config = make_config(tmp_path, "rocksdb")
    batches = migration_batches()
    land_batches(config, batches[:CUT])
    catch_up(config, spark)
    saved = take_savepoint(config, spark=spark)
    assert saved.state_schema == state_format.SCHEMA_ID
    rows = DeltaTable(saved.uri).to_pyarrow_table()
    # docs/operations.md "Savepoints": the state table's columns, written out here rather than taken from the product's schema
    utc = "timestamp[us, tz=UTC]"
    assert [(column.name, str(column.type)) for column in rows.schema] == [
        ("user_id", "string"), ("session_start", utc), ("event_id", "string"), ("event_time", utc),
        ("event_type", "string"), ("event_count", "int64"), ("page_views", "int64")]
    assert rows["event_id"].null_count > 0  # frozen prefixes
    assert state_sessions(rows) == sorted(run_oracle(batches[:CUT], GAP_MS, LATENESS_MS).open_sessions)

    land_batches(config, batches[CUT:], start=CUT)
    hdfs = make_config(tmp_path, "hdfs")
    assert restore(hdfs, "latest", spark=spark).provider == "hdfs"
    catch_up(hdfs, spark)
    expected = run_oracle(batches, GAP_MS, LATENESS_MS)
    assert read_sessions(hdfs) == sorted(expected.closed)
    assert read_open_sessions(spark, hdfs) == sorted(expected.open_sessions)


PYTHON_HOME = Path(__file__).resolve().parent / "fixtures" / "python_operator_home"  # make_python_operator_home.py
PYTHON_CUT = 4


def test_a_checkpoint_of_the_retired_python_operator_moves_to_the_jvm_operator(spark, tmp_path):
    """A checkpoint the retired Python operator made (HDFS, 4 batches in) cannot run: one line naming the way out, before
    anything is written. Its state still reads: a savepoint of it, restored (into the JVM operator), then the rest of
    the data: exactly the oracle's sessions, open sessions and late events for the whole stream."""
    home = tmp_path / "home"
    shutil.copytree(PYTHON_HOME, home)
    config = make_config(tmp_path, "hdfs", home=home, SESSIONS_STATE_PARTITIONS=2)
    batches = stream_scenario(2, 6, gap_ms=GAP_MS, lateness_ms=LATENESS_MS)
    land_batches(config, batches[PYTHON_CUT:], start=PYTHON_CUT)
    sessions_before = read_sessions(config)
    with pytest.raises(CheckpointMismatch) as refused:
        catch_up(config, spark)
    message = str(refused.value)
    assert "Python operator" in message and "sessionctl savepoint" in message and "\n" not in message
    assert read_sessions(config) == sessions_before  # refused before anything ran

    saved = take_savepoint(config, spark=spark)
    expected_cut = run_oracle(batches[:PYTHON_CUT], GAP_MS, LATENESS_MS)
    assert saved.rows > 0  # open state crosses over, not only the source position
    restore(config, "latest", spark=spark)
    assert read_job_metadata(config.checkpoint).state_layout == JVM_STATE_LAYOUT
    assert sorted(expected_cut.closed) == sessions_before  # the fixture itself is the oracle's, up to the cut
    catch_up(config, spark)
    assert_matches_oracle(spark, config, batches)
