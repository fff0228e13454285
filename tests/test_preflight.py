"""`sessionctl restore --dry-run` against what the real restore then does: refused exactly when the pre-flight says so,
for each reason (settings that need --migrate, a running job, a damaged savepoint), and nothing stopped, locked or
written by the pre-flight itself. A restore it called restorable is then done and compared with the oracle."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pipelines.coordination.job_leases import JOB, job_lock
from pipelines.errors import JobRunning, SavepointDamaged, SavepointIncompatible
from pipelines.job.stream import catch_up
from state_store.lifecycle import restore, take_savepoint
from state_store.preflight import plan_restore
from testkit.oracle import run_oracle
from tests.kit.datagen import land_batches, stream_scenario
from tests.kit.homes import config_env, make_config, tool
from tests.kit.tables import read_open_sessions, read_sessions

pytestmark = pytest.mark.tier("spark")

GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000
CUT = 3


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root with its size and mtime: what "nothing written" compares."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def taken(spark, tmp_path_factory):
    """A job CUT batches in, with a savepoint of that batch; the rest of the data landed."""
    tmp = tmp_path_factory.mktemp("preflight")
    config = make_config(tmp, "rocksdb")
    batches = stream_scenario(3, 6, True, GAP_MS, LATENESS_MS)
    land_batches(config, batches[:CUT])
    catch_up(config, spark)
    saved = take_savepoint(config, spark=spark)
    land_batches(config, batches[CUT:], start=CUT)
    return tmp, config, batches, saved


def test_settings_that_need_migrate_are_refused_by_both(taken):
    tmp, config, _, saved = taken
    other_gap = make_config(tmp, "rocksdb", SESSIONS_GAP_MINUTES=45)
    before = _tree(config.home)
    plan = plan_restore(other_gap, saved.savepoint_id)
    assert _tree(config.home) == before  # nothing written, no lease taken
    assert not plan.restorable and len(plan.reasons) == 1 and "--migrate" in plan.reasons[0]
    with pytest.raises(SavepointIncompatible) as refused:
        restore(other_gap, saved.savepoint_id)
    assert str(refused.value) == plan.reasons[0]
    migrating = plan_restore(other_gap, saved.savepoint_id, migrate=True)
    assert migrating.restorable and migrating.reasons == []
    assert migrating.migrations == ["gap 30 -> 45 min, lateness 10 -> 10 min (open sessions re-walked)"]
    hdfs = plan_restore(make_config(tmp, "hdfs"), saved.savepoint_id, partitions=3)
    assert hdfs.restorable and hdfs.migrations == ["state store provider rocksdb -> hdfs", "state partitions 2 -> 3"]
    assert hdfs.expected_seconds >= 0 and hdfs.rows == saved.rows


def test_a_running_job_is_refused_by_both(taken):
    _, config, _, saved = taken
    with job_lock(config, "run", name=JOB):
        plan = plan_restore(config, saved.savepoint_id)
        assert not plan.restorable and "the job is running" in plan.reasons[0]
        with pytest.raises(JobRunning):
            restore(config, saved.savepoint_id)


def test_a_damaged_savepoint_is_refused_by_both(spark, tmp_path):
    config = make_config(tmp_path, "hdfs")
    batches = stream_scenario(4, 3, False, GAP_MS, LATENESS_MS)
    land_batches(config, batches)
    catch_up(config, spark)
    saved = take_savepoint(config, spark=spark)
    data = sorted(Path(saved.uri).glob("*.parquet"))
    assert data, "the savepoint has data files"
    data[0].unlink()
    plan = plan_restore(config, saved.savepoint_id)
    assert not plan.restorable and "data files are gone" in plan.reasons[0]
    with pytest.raises(SavepointDamaged):
        restore(config, saved.savepoint_id, spark=spark)


@pytest.mark.tier("subprocess")
def test_restorable_means_the_restore_goes_through_exactly(spark, taken):
    """Last in the module: it replaces the shared job's checkpoint. The dry-run from the CLI says restorable (exit 0,
    the contract's keys); the restore then puts the job at the savepoint and a catch-up ends at the oracle's."""
    _, config, batches, saved = taken
    done = subprocess.run([tool("sessionctl"), "restore", "--savepoint", saved.savepoint_id, "--dry-run", "--json"],
                          env=config_env(config), capture_output=True, text=True, timeout=120,
                          cwd=os.fspath(config.home))
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert {"restorable", "reasons", "migrations", "expected_seconds"} <= set(plan)
    assert plan["restorable"] is True and plan["reasons"] == [] and plan["migrations"] == []
    restore(config, saved.savepoint_id, spark=spark)
    catch_up(config, spark)
    expected = run_oracle(batches, GAP_MS, LATENESS_MS)
    assert read_sessions(config) == sorted(expected.closed)
    assert read_open_sessions(spark, config) == sorted(expected.open_sessions)


@pytest.mark.tier("pure")
def test_the_estimate_has_a_fixed_part_from_the_reference_or_this_homes_restores(tmp_path):
    """A small savepoint's restore is mostly fixed cost (the bootstrap query, the read-back): the estimate says so
    before any restore ran (the reference: REFERENCE_FIXED_S), then learns it from this home's restores."""
    from state_store.preflight import REFERENCE_FIXED_S, REFERENCE_ROWS_PER_S, _estimate, record_restore

    config = make_config(tmp_path, "rocksdb")
    config.home.mkdir(parents=True, exist_ok=True)
    fixed, rate, source = _estimate(config)
    assert (fixed, rate) == (REFERENCE_FIXED_S, REFERENCE_ROWS_PER_S) and "reference" in source
    assert fixed + 5_936 / rate > 17  # the 5,936-row restore that took ~17 s: no longer "0 s"
    for rows, seconds in ((1_000, 9.0), (170_000, 14.0), (2_000, 30.0)):  # fixed parts 8.99, 12.0, 29.98
        record_restore(config.home, rows, seconds)
    fixed, rate, source = _estimate(config)
    assert fixed == pytest.approx(12.0) and rate == REFERENCE_ROWS_PER_S and "median of 3" in source
