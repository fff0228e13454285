"""A short seeded crash campaign (benchmarks/crash_campaign.py; the long one has 100+ kill points): commands
SIGKILLed at random moments across catch-up, savepoint, restore, rescale and compact, and beside a running stream,
the operator's recovery, a final catch-up -- no session lost, none written twice, both providers.

What the campaign kills, and the operator's recoveries after a kill, are `sessionctl` processes as in production; the
steps it only prepares with (the setup's catch-up and savepoint, the named kill points' chain) run in the tests'
Spark session (testkit.campaign._step: the same library calls, warm, where a `sessionctl` process pays a JVM start and
a first batch each). SESSIONS_TEST_CAMPAIGN_ALL_CLI=1 runs those as `sessionctl` processes too, as the long campaign
(`benchmarks/crash_campaign.py`) does; `make test` (CI) runs them in process. The breadth is the same either way:
every phase below, every named kill point."""
from __future__ import annotations

import os

import pytest

from testkit import campaign
from testkit.campaign import NAMED_KILLS, run_campaign, run_kill_points
from tests.kit.storages import STORAGES, checkpoint_env

pytestmark = [pytest.mark.tier("e2e"), pytest.mark.timeout(1800)]

ALL_CLI = os.environ.get("SESSIONS_TEST_CAMPAIGN_ALL_CLI") == "1"  # see the module docstring

# Seeds picked (by campaign.plan, the campaign's random choices drawn before it runs) so that the two short runs
# together kill six of the seven phases, the stream's two among them; the seventh, catch-up, is killed twice per
# provider by test_crash_restart.py. 166: a savepoint, a rescale (to the count the job does not have: a real one, a
# pre-rescale savepoint and the repartition or restore), a restore. 662: a savepoint beside the stream (the savepoint
# killed), a stop --savepoint (the stream killed under it), a compaction. Each kill on the stopped job is drawn after
# the command took its lease, within its shortest run (campaign.KILL_WITHIN_S); a command that still finished first (a
# faster machine) is run again with its kill sooner, so it lands inside the command, which the test checks. The moment of each kill is still random (wall clock), the phases are not: a change to the
# campaign's use of its random generator shows up here instead of quietly moving the coverage.
CAMPAIGNS = [("rocksdb", 166, {"savepoint", "rescale", "restore"}),
             ("hdfs", 662, {"compact", "stop-savepoint", "online-savepoint"})]
STOPPED_JOB = {"catch-up", "savepoint", "restore", "rescale", "compact"}


def test_the_seeds_plan_their_phases():
    for _, seed, phases in CAMPAIGNS:
        assert {phase for phase, _ in campaign.plan(seed, 3)} == phases


def _check_kills(report, phases):
    assert sum(report["by_phase"].values()) == 3
    assert {hit.split(":")[0] for hit in report["by_phase"]} == phases, report["by_phase"]
    # Every kill on the stopped job landed inside its command (after its lease, before its end).
    assert all(hit.endswith(":killed") for hit in report["by_phase"] if hit.split(":")[0] in STOPPED_JOB), report


@pytest.mark.parametrize("provider,seed,phases", CAMPAIGNS, ids=[f"{p}-{s}" for p, s, _ in CAMPAIGNS])
def test_short_crash_campaign(tmp_path, spark, provider, seed, phases):
    report = run_campaign(tmp_path, provider, seed, kill_points=3, spark=None if ALL_CLI else spark)
    _check_kills(report, phases)
    assert (report["lost"], report["duplicated"], report["unexpected"]) == (0, 0, 0), report
    assert report["written"] == report["expected_sessions"] > 0


# The named kills that touch only the savepoint store (the catalog, the chain's folded table): that store is a local
# path in every case below (only the checkpoint and the leases move to HDFS or S3), so they run once, with the
# checkpoint on a local path. On HDFS and S3 the savepoint killed between its task files and its commit stays: a JVM
# that read its state from the remote checkpoint, killed with the lifecycle lease held on the remote lease store,
# which the compaction after it takes over. (Each kill is a `sessionctl` process: ~15 s, 3 x 2 of them saved.)
REMOTE_NAMED_KILLS = (("savepoint", "savepoint:files-written"),)


@pytest.mark.parametrize("storage", STORAGES)
def test_kill_points_inside_savepoints_chains_and_folds(tmp_path, request, spark, storage, monkeypatch):
    """SIGKILL at exact moments (pipelines/coordination/__init__.py): a savepoint between its task files and its Delta commit
    and between that commit and its catalog row, inside an incremental chain; a chain fold before and after the
    folded table's commit; a catch-up between its Spark tasks' raw_events files and the ingest commit; a catch-up
    between its tasks' session files and the sink's commit; a catch-up and a restore
    right after taking their lease. Nothing is half-listed as
    complete, every chain stays whole and restorable, a killed lease holder is taken over at once; after a
    compaction, a restore of the newest savepoint and a catch-up: no session lost, none written twice. With the Spark
    checkpoint on a local path, on the real HDFS, or on S3 (the leases beside it, on the same store)."""
    settings = checkpoint_env(request, spark, storage, tmp_path)
    kills = NAMED_KILLS if storage == "local" else REMOTE_NAMED_KILLS
    monkeypatch.setattr(campaign, "NAMED_KILLS", kills)
    report = run_kill_points(tmp_path, "rocksdb", seed=7, spark=None if ALL_CLI else spark, settings=settings,
                             ingest_kill=storage == "local")
    assert [o["point"] for o in report["kill_points"]] == [point for _, point in kills], report
    assert all(o["killed"] for o in report["kill_points"]), report
    assert all(o["complete_unchanged"] and o["chains_whole"] and o["restorable"] for o in report["kill_points"]), report
    assert all(o["incremental_before"] > 0 for o in report["kill_points"]), "the kills hit incremental chains"
    assert [(k["killed"], k["next_command_exit"]) for k in report["lease_kills"]] == [(True, 0), (True, 0)], report
    # The catch-up killed between its tasks' session files and the commit: the files are on disk in no version (read
    # by nobody); the catch-up after it wrote the batch again, once (the exactly-once check below).
    assert report["sink_kill"]["killed"] and report["sink_kill"]["files_in_no_version"] > 0, report
    # Likewise a catch-up whose Spark tasks read a large landed part, killed before the ingest commit: their raw_events
    # files in no version, the part still in landing (its position never committed); read again once, above. Once,
    # with the local checkpoint: raw_events and landing are local paths in every case, the ingest touches no
    # checkpoint, and a killed holder of the remote job lease is the lease kills' above.
    ingest_kill = report["ingest_kill"]
    if storage == "local":
        assert ingest_kill["killed"] and ingest_kill["files_in_no_version"] > 0 and ingest_kill["part_still_landed"]
    else:
        assert ingest_kill is None, report
    assert report["compact_after_kills_folded"] and report["chains_whole_at_end"], report
    assert (report["lost"], report["duplicated"], report["unexpected"]) == (0, 0, 0), report
    assert report["written"] == report["expected_sessions"] > 0


@pytest.mark.parametrize("storage", ["hdfs", "s3"])
def test_short_crash_campaign_with_a_remote_checkpoint(tmp_path, request, spark, storage):
    """The first campaign above (its seed kills a savepoint, a rescale and a restore) with the Spark checkpoint on the
    real HDFS (tests/hdfs_cluster.py) or on S3 (Hadoop's S3A), the leases beside it on the same store: the same
    recoveries, nothing lost or doubled."""
    provider, seed, phases = CAMPAIGNS[0]
    settings = checkpoint_env(request, spark, storage, tmp_path)
    report = run_campaign(tmp_path, provider, seed, kill_points=3, spark=None if ALL_CLI else spark, settings=settings)
    _check_kills(report, phases)
    assert (report["lost"], report["duplicated"], report["unexpected"]) == (0, 0, 0), report
    assert report["written"] == report["expected_sessions"] > 0
