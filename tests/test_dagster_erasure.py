"""Dagster's run storage after forget_user (docs/operations.md "Erasure and history"): the runs that named the erased user -- a state_lookup's
run config, a top-N lookup's table in its event log, an earlier verify -- are deleted by the forget with their storage
directories, the forget run itself by the erasure_runs_cleanup sensor; no op pickles a user id into the IO manager's
storage; forget_user --verify counts the runs still naming the user. On a persistent instance (SQLite run storage, the
filesystem IO manager under $DAGSTER_HOME/storage), every file of it scanned for the user's bytes."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from dagster import FilesystemIOManager, RunRequest, SkipReason, build_sensor_context, instance_for_test

from assets.definitions import defs
from assets.erasure_runs import FORGET_JOB, USER_LISTING_JOBS, erasure_requests, erasure_runs_cleanup, runs_naming
from assets.resources import SessionsResource, pyspark_resource
from pipelines.ingest.erased import UserSpelling
from pipelines.job.stream import catch_up
from testkit.oracle import run_oracle
from tests.kit.datagen import land_batches, stream_scenario
from tests.test_dagster_jobs import lookup_table

pytestmark = pytest.mark.tier("spark")

GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000
# tests/test_erasure.py's scenario: seed 7's u4 has an open session after the first 3 batches. Renamed to an id whose
# bytes cannot turn up by chance in a binary file (the SQLite files scanned below).
SEED, CUT, RENAMED, USER, OTHER = 7, 3, "u4", "erase-me.4711@example.org", "u1"
SECOND = "u2"  # erased with USER in one forget_user run (config `users`)


def _files_naming(root: Path, user: UserSpelling) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*")
                  if path.is_file() and user.in_bytes(path.read_bytes()))


def _output_metadata(run, op: str) -> dict:
    (output,) = [e.event_specific_data for e in run.all_events if e.event_type_value == "STEP_OUTPUT"
                 and e.step_key == op]
    return {key: value.value for key, value in output.metadata.items()}


def test_forget_user_deletes_the_dagster_runs_that_named_the_user(spark, tmp_path):
    batches = [[dict(e, user_id=USER) if e["user_id"] == RENAMED else e for e in batch]
               for batch in stream_scenario(SEED, 6, False, GAP_MS, LATENESS_MS)[:CUT]]
    expected = sorted(run_oracle(batches, GAP_MS, LATENESS_MS).open_sessions)
    assert {s[1] for s in expected} >= {USER, OTHER, SECOND}
    sessions = SessionsResource(home=str(tmp_path / "home"), state_partitions=2, max_versions_per_batch=1,
                                idle_close_minutes=0)
    config = sessions.config()
    land_batches(config, batches)
    catch_up(config, spark)
    # The filesystem IO manager, as a deployed run has it (execute_in_process would otherwise keep outputs in memory).
    resources = {"sessions": sessions, "pyspark": pyspark_resource(), "io_manager": FilesystemIOManager()}
    user = UserSpelling(USER)

    home = tmp_path / "dagster_home"
    home.mkdir()
    with instance_for_test(temp_dir=str(home)) as instance:
        storage = Path(instance.storage_directory())

        def run(job: str, op: str, settings: dict):
            result = defs.resolve_job_def(job).execute_in_process(
                resources=resources, instance=instance, run_config={"ops": {op: {"config": settings}}})
            assert result.success
            return result

        # The lookup's table is its output metadata (the run's event log); no output value is stored.
        lookup = run("state_lookup", "lookup_state_op", {"user_id": USER})
        assert [(r["session"], int(r["events"]), int(r["page views"])) for r in lookup_table(lookup)] == \
            [(s[0], s[4], s[5]) for s in expected if s[1] == USER] != []
        top = run("state_lookup", "lookup_state_op", {"top": len(expected)})  # its table names every open user
        assert sorted(r["user"] for r in lookup_table(top)) == sorted(s[1] for s in expected)
        other = run("state_lookup", "lookup_state_op", {"user_id": OTHER})
        assert not (storage / lookup.run_id / "lookup_state_op").exists()
        assert _files_naming(storage, user) == []  # nothing pickled: the storage directory never held U
        assert "history/runs.db" in _files_naming(home, user)  # the run storage does (run config, event logs)

        before = run(FORGET_JOB, "forget_user_op", {"user_id": USER, "verify_only": True})
        found = _output_metadata(before, "forget_user_op")
        assert found["found_dagster_runs"] == 2 and found["clean"] is False  # the lookup and the top-N lookup
        assert found["found_live_state_events"] > 0

        # A compliance workflow's request files (state_store.erasure_requests): the sensor asks for one run naming
        # the files, not the users; the run erases both users in one erasure and deletes the files.
        inbox = Path(config.erasure_requests_uri)
        inbox.mkdir(parents=True)
        (inbox / "ticket-1.users").write_text(f"{USER}\n\n")
        (inbox / "ticket-2.users").write_text(f"  {SECOND}\n{USER}\n")
        (inbox / "ticket-3.users.part").write_text(f"{OTHER}\n")  # still being written: not a request yet
        with build_sensor_context(instance=instance, resources={"sessions": sessions}) as context:
            asked = erasure_requests(context)
        assert isinstance(asked, RunRequest) and USER not in str(asked.run_config), asked
        assert asked.run_config == {"ops": {"forget_user_op": {"config": {
            "request_files": ["ticket-1.users", "ticket-2.users"]}}}}
        forget = run(FORGET_JOB, "forget_user_op", asked.run_config["ops"]["forget_user_op"]["config"])
        reported = _output_metadata(forget, "forget_user_op")
        assert reported["dagster_runs_deleted"] == 3 and reported["dagster_runs_unfinished"] == 0  # with the verify
        assert reported["users"] == 2 and reported["removed_live_state_events"] > 0
        assert reported["request_files"] == 2 and reported["refused_files"] == 0
        assert sorted(p.name for p in inbox.iterdir()) == ["ticket-3.users.part"]
        assert USER not in str(reported) and f"'{SECOND}'" not in str(reported)
        assert {r.run_id for r in instance.get_runs()} == {other.run_id, forget.run_id}
        assert runs_naming(instance, USER) == []  # the forget run's config names files, not users
        assert _files_naming(storage, user) == []
        with build_sensor_context(instance=instance, resources={"sessions": sessions}) as context:
            assert isinstance(erasure_requests(context), SkipReason)  # nothing pending

        # The sensor deletes finished forget_user runs (and only those); a verify after it finds no run naming U.
        with build_sensor_context(instance=instance) as context:
            assert isinstance(erasure_runs_cleanup(context), SkipReason)
        assert [r.run_id for r in instance.get_runs()] == [other.run_id]
        assert runs_naming(instance, USER) == []
        after = _output_metadata(run(FORGET_JOB, "forget_user_op", {"users": [USER, SECOND], "verify_only": True}),
                                 "forget_user_op")
        assert after["clean"] is True and after["found_dagster_runs"] == 0 and after["users_clean"] == 2, after
        with build_sensor_context(instance=instance) as context:
            erasure_runs_cleanup(context)
        assert [r.run_id for r in instance.get_runs()] == [other.run_id]
        assert _files_naming(storage, user) == []
        # The SQLite run and event log storage too, where SQLite overwrites deleted rows (SECURE_DELETE: Debian's
        # build, this image's; otherwise freed pages keep the bytes until a VACUUM).
        if sqlite3.connect(":memory:").execute("PRAGMA secure_delete").fetchone()[0]:
            assert _files_naming(home, user) == []


@pytest.mark.tier("pure")
def test_the_cleanup_is_wired_to_the_deployed_jobs():
    """The names erasure_runs matches runs by are the deployed jobs'; the sensor is deployed, running by default."""
    assert defs.resolve_job_def(FORGET_JOB).name == FORGET_JOB
    assert all(defs.resolve_job_def(name).name == name for name in USER_LISTING_JOBS)
    sensor = defs.resolve_sensor_def("erasure_runs_cleanup")
    assert sensor.default_status.value == "RUNNING" and sensor.minimum_interval_seconds == 30
    requests = defs.resolve_sensor_def("erasure_requests")
    assert requests.default_status.value == "RUNNING" and requests.job_name == FORGET_JOB
