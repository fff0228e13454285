"""Dagster surface: definitions load; jobs run the library for real (Spark, Delta); sensors, schedules,
the daily partitioned asset and the asset checks, with Dagster's testing APIs."""
from __future__ import annotations

import datetime as dt
import subprocess
from pathlib import Path

import pytest
from dagster import (
    DagsterInstance,
    RunRequest,
    SkipReason,
    build_run_status_sensor_context,
    build_schedule_context,
    build_sensor_context,
    materialize,
)
from deltalake import DeltaTable

from assets.definitions import (
    compaction_schedule,
    daily_session_metrics,
    defs,
    maintenance_sensor,
    newest_savepoint_verifies,
    resume_stream_after_restore,
    savepoint_schedule,
    sessions_have_unique_ids,
)
from assets.resources import SessionsResource, pyspark_resource
from pipelines.sample_data import land_sample
from state_store import savepoints as sp
from tests.conftest import tool

REPO = Path(__file__).resolve().parent.parent


def test_definitions_validate():
    done = subprocess.run([tool("dagster"), "definitions", "validate", "-w", "workspace.yaml"],
                          cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert {j.name for j in defs.jobs} >= {"session_stream", "session_catch_up", "savepoint",
                                            "restore_from_snapshot", "rescale", "compaction"}


@pytest.fixture()
def resources(tmp_path):
    return {"sessions": SessionsResource(home=str(tmp_path / "home")), "pyspark": pyspark_resource()}


def _restore_config(**settings) -> dict:
    return {"ops": {"validate_savepoint_op": {"config": settings}}}


def test_jobs_catch_up_savepoint_restore_runbook(resources):
    config = resources["sessions"].config()
    landed = land_sample(config.landing, users=80, sessions_per_user=3, files=4)
    run = defs.get_job_def("session_catch_up").execute_in_process(resources=resources)
    assert run.success
    sessions_before = DeltaTable(config.sessions_table).to_pandas()["session_id"].sort_values().tolist()
    assert len(sessions_before) > 0 and len(set(sessions_before)) == len(sessions_before)
    assert len(DeltaTable(config.quarantine_table).to_pandas()) == landed["broken_lines"]
    materialized = {e.event_specific_data.materialization.asset_key.path[0] for e in run.get_asset_materialization_events()}
    assert {"sessions", "raw_events", "quarantine"} <= materialized
    observed = [e.event_specific_data.asset_observation for e in run.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    assert observed[-1].metadata["provider"].value == "rocksdb" and observed[-1].metadata["state_keys"].value > 0

    assert defs.get_job_def("savepoint").execute_in_process(resources=resources).success
    savepoint_id = sp.SavepointStore.of(config).list()[0]["savepoint_id"]

    dry = defs.get_job_def("restore_from_snapshot").execute_in_process(
        resources=resources, run_config=_restore_config(savepoint=savepoint_id, dry_run=True))
    assert dry.success and dry.output_for_node("restore_op")["dry_run"] is True
    restored = defs.get_job_def("restore_from_snapshot").execute_in_process(
        resources=resources, run_config=_restore_config(savepoint="latest", partitions=2, resume_stream=True))
    assert restored.success
    assert restored.output_for_node("verify_restore_op")["verified"] is True
    assert restored.output_for_node("restore_op")["partitions"] == 2
    assert DeltaTable(config.sessions_table).to_pandas()["session_id"].sort_values().tolist() == sessions_before

    missing = defs.get_job_def("restore_from_snapshot").execute_in_process(
        resources=resources, raise_on_error=False, run_config=_restore_config(savepoint="sp-nope"))
    assert not missing.success
    failure = [e for e in missing.all_events if e.event_type_value == "STEP_FAILURE"][0]
    assert "no such savepoint" in str(failure.event_specific_data.error.message)

    # The runbook's last step: the sensor relaunches session_stream after a restore that asked for it.
    with DagsterInstance.ephemeral() as instance:
        run_record = restored.dagster_run
        context = build_run_status_sensor_context(
            sensor_name="resume_stream_after_restore", dagster_instance=instance,
            dagster_run=run_record, dagster_event=restored.get_run_success_event())
        assert isinstance(resume_stream_after_restore(context), RunRequest)

    # Daily metrics: a two-day backfill, each partition from the sessions table.
    day = DeltaTable(config.sessions_table).to_pandas()["session_start"].min().strftime("%Y-%m-%d")
    for key in (day, (dt.date.fromisoformat(day) + dt.timedelta(days=1)).isoformat()):
        result = materialize([daily_session_metrics], partition_key=key, resources={"sessions": resources["sessions"]})
        assert result.success
    metrics = DeltaTable(str(config.warehouse / "daily_session_metrics")).to_pandas().set_index("day")
    sessions = DeltaTable(config.sessions_table).to_pandas()
    assert metrics.loc[day, "sessions"] == int((sessions["session_start"].dt.strftime("%Y-%m-%d") == day).sum())

    assert sessions_have_unique_ids(resources["sessions"]).passed
    assert newest_savepoint_verifies(resources["sessions"]).passed


def test_maintenance_sensor_requests(tmp_path):
    resource = SessionsResource(home=str(tmp_path / "home"))
    with build_sensor_context(resources={"sessions": resource}) as context:
        requests = maintenance_sensor(context)
    assert [r.job_name for r in requests] == ["savepoint"]
    assert requests[0].run_config["ops"]["savepoint_op"]["config"]["trigger"] == "sensor"
    sp.SavepointStore.of(resource.config()).record({"savepoint_id": "sp-x", "status": "complete",
                                                 "created_at": dt.datetime.now(dt.timezone.utc)})
    with build_sensor_context(resources={"sessions": resource}) as context:
        assert isinstance(maintenance_sensor(context), SkipReason)


def test_schedules_request_their_jobs():
    context = build_schedule_context(scheduled_execution_time=dt.datetime(2026, 11, 22, 6))
    request = savepoint_schedule.evaluate_tick(context).run_requests[0]
    assert request.run_config["ops"]["savepoint_op"]["config"]["trigger"] == "scheduled"
    assert savepoint_schedule.job_name == "savepoint" and compaction_schedule.job_name == "compaction"
    assert compaction_schedule.cron_schedule == "30 2 * * *"


def test_stream_failure_sensor_records_and_optionally_restores(tmp_path, monkeypatch):
    from assets.definitions import stream_failure_sensor

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("SESSIONS_HOME cannot live under a file")
    failed = defs.get_job_def("session_stream").execute_in_process(
        resources={"sessions": SessionsResource(home=str(blocker / "home")), "pyspark": pyspark_resource()},
        raise_on_error=False)
    assert not failed.success
    with DagsterInstance.ephemeral() as instance:
        failure_event = [e for e in failed.all_events if e.event_type_value == "PIPELINE_FAILURE"][0]
        context = build_run_status_sensor_context(
            sensor_name="stream_failure_sensor", dagster_instance=instance, dagster_run=failed.dagster_run,
            dagster_event=failure_event).for_run_failure()
        monkeypatch.delenv("SESSIONS_AUTO_RESTORE", raising=False)
        assert isinstance(stream_failure_sensor(context), SkipReason)
        monkeypatch.setenv("SESSIONS_AUTO_RESTORE", "true")
        request = stream_failure_sensor(context)
        assert isinstance(request, RunRequest)
        assert request.run_config["ops"]["validate_savepoint_op"]["config"]["savepoint"] == "latest"


def test_lifecycle_runs_never_overlap(resources):
    """Two guards: the run queue lets one lifecycle-tagged run go at a time, and the library's lock makes a
    lifecycle op that starts anyway (another instance, or the CLI) fail with one clear line."""
    import yaml

    from pipelines.job import job_lock

    limits = {(limit["key"], limit.get("value")): limit["limit"]
              for limit in yaml.safe_load((REPO / "deploy" / "dagster.yaml").read_text())
              ["run_coordinator"]["config"]["tag_concurrency_limits"]}
    assert limits[("sessions/lifecycle", "true")] == 1
    lifecycle_jobs = {"savepoint", "restore_from_snapshot", "rescale", "compaction"}
    assert all(defs.get_job_def(name).tags.get("sessions/lifecycle") == "true" for name in lifecycle_jobs)

    config = resources["sessions"].config()
    with job_lock(config, "sessionctl compact", name="lifecycle"):
        busy = defs.get_job_def("compaction").execute_in_process(resources=resources, raise_on_error=False)
    assert not busy.success
    failure = [e for e in busy.all_events if e.event_type_value == "STEP_FAILURE"][0]
    message = str(failure.event_specific_data.error.message)
    assert "another lifecycle operation is running" in message and "sessionctl compact" in message
