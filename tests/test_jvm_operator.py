"""The experimental JVM operator (SESSIONS_OPERATOR=jvm, jvm/src/sessions/SessionsOperator.java) against the oracle.

The same adversarial scenarios as tests/test_stream_vs_oracle.py on both providers; a savepoint taken from the
Python operator's checkpoint restored into the JVM operator and continued (savepoints are operator-neutral: the
canonical per-user rows), and back; a checkpoint is refused in one line by the other operator.
"""
from __future__ import annotations

import pytest

from pipelines.errors import CheckpointMismatch
from pipelines.stream import catch_up
from state_store.lifecycle import restore, take_savepoint
from tests.conftest import make_config, read_open_sessions, read_sessions
from tests.datagen import land_batches, stream_scenario
from tests.oracle import run_oracle
from tests.test_stream_vs_oracle import GAP_MS, LATENESS_MS, assert_matches_oracle

JVM = {"SESSIONS_OPERATOR": "jvm"}


@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
@pytest.mark.parametrize("seed,parts,very_late,partitions", [
    pytest.param(1, 1, False, 2, id="1batch"),
    pytest.param(4, 10, False, 4, id="10batches-4partitions"),
    pytest.param(5, 5, True, 2, id="5batches-very-late"),
])
def test_jvm_operator_equals_oracle(spark, tmp_path, provider, seed, parts, very_late, partitions):
    config = make_config(tmp_path, provider, SESSIONS_STATE_PARTITIONS=partitions, **JVM)
    batches = stream_scenario(seed, parts, very_late, GAP_MS, LATENESS_MS)
    land_batches(config, batches)
    catch_up(config, spark)
    assert_matches_oracle(spark, config, batches)


@pytest.mark.parametrize("first,then", [("python", "jvm"), ("jvm", "python")])
def test_a_savepoint_moves_state_between_the_operators(spark, tmp_path, first, then):
    """Savepoint on one operator mid-stream, restore with the other, go on: exactly the oracle's sessions."""
    batches = stream_scenario(6, 6, True, GAP_MS, LATENESS_MS)
    cut = 4
    before = make_config(tmp_path, "rocksdb", SESSIONS_OPERATOR=first)
    land_batches(before, batches[:cut])
    catch_up(before, spark)
    saved = take_savepoint(before, spark=spark)
    assert saved.rows > 0  # open state crosses over, not only the source position

    after = make_config(tmp_path, "rocksdb", SESSIONS_OPERATOR=then)
    result = restore(after, "latest", spark=spark)
    assert result.verified
    land_batches(after, batches[cut:], start=cut)
    catch_up(after, spark)
    expected = run_oracle(batches, GAP_MS, LATENESS_MS)
    assert read_sessions(after) == sorted(expected.closed)
    assert read_open_sessions(spark, after) == sorted(expected.open_sessions)


def test_the_other_operator_refuses_the_checkpoint_in_one_line(spark, tmp_path):
    batches = stream_scenario(1, 1, False, GAP_MS, LATENESS_MS)
    config = make_config(tmp_path, "hdfs", **JVM)
    land_batches(config, batches)
    catch_up(config, spark)
    with pytest.raises(CheckpointMismatch) as refused:
        catch_up(make_config(tmp_path, "hdfs"), spark)
    message = str(refused.value)
    assert "made by the jvm operator" in message and "SESSIONS_OPERATOR=jvm" in message and "\n" not in message


@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_rescale_keeps_the_jvm_operators_state(spark, tmp_path, provider):
    """RocksDB: Spark's offline repartition of the per-user state; HDFS: savepoint + restore. Then the stream goes on
    with 3 partitions and still equals the oracle."""
    from state_store.lifecycle import rescale

    batches = stream_scenario(7, 6, True, GAP_MS, LATENESS_MS)
    cut = 3
    config = make_config(tmp_path, provider, **JVM)
    land_batches(config, batches[:cut])
    catch_up(config, spark)
    result = rescale(config, 3, spark=spark)
    assert (result.partitions_before, result.partitions_after) == (2, 3)
    assert result.method == ("repartition" if provider == "rocksdb" else "savepoint-restore")
    rescaled = make_config(tmp_path, provider, SESSIONS_STATE_PARTITIONS=3, **JVM)
    land_batches(rescaled, batches[cut:], start=cut)
    catch_up(rescaled, spark)
    assert_matches_oracle(spark, rescaled, batches)
