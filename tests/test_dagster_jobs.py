"""Dagster surface: definitions load; jobs run the library for real (Spark, Delta); sensors, schedules,
the daily partitioned asset and the asset checks, with Dagster's testing APIs."""
from __future__ import annotations

import datetime as dt
import itertools
import subprocess
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetMaterialization,
    AssetObservation,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    RunRequest,
    SkipReason,
    build_run_status_sensor_context,
    build_schedule_context,
    build_sensor_context,
    materialize,
)
from deltalake import DeltaTable, write_deltalake

from assets.automation import compaction_schedule, maintenance_sensor, resume_stream_after_restore
from assets.checks import newest_savepoint_restorable, newest_savepoint_verifies, sessions_have_unique_ids
from assets.definitions import defs
from assets.observations import observation_sensor
from assets.resources import SessionsResource, pyspark_resource
from assets.tables import daily_session_metrics, state_version
from pipelines.core.sample_data import arrival_order, generate_events, land_sample
from pipelines.job.checkpoint import inspect_checkpoint
from state_store.results import SavepointInfo
from state_store.savepoint import catalog as sp
from state_store.savepoint.catalog import SavepointStore
from tests.kit.homes import tool
from tests.kit.savepoint_expectations import oracle_of
from tests.kit.tables import read_open_sessions, read_sessions
from tests.kit.waits import wait_until

pytestmark = pytest.mark.tier("spark")

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.tier("subprocess")
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


def test_jobs_catch_up_savepoint_restore_runbook(resources, spark):
    config = resources["sessions"].config()
    landed = land_sample(config.landing, users=80, sessions_per_user=3, files=4)
    run = defs.resolve_job_def("session_catch_up").execute_in_process(resources=resources)
    assert run.success
    sessions_before = DeltaTable(config.sessions_table).to_pandas()["session_id"].sort_values().tolist()
    assert len(sessions_before) > 0 and len(set(sessions_before)) == len(sessions_before)
    assert len(DeltaTable(config.quarantine_table).to_pandas()) == landed["broken_lines"]
    materialized = {e.event_specific_data.materialization.asset_key.path[0]: e.event_specific_data.materialization
                    for e in run.get_asset_materialization_events()}
    assert set(materialized) == {"sessions", "raw_events", "quarantine", "session_state"}
    state = materialized["session_state"].metadata
    assert state["provider"].value == "rocksdb" and state["open_users"].value == len({row[1] for row in read_open_sessions(spark, config)})

    assert defs.resolve_job_def("savepoint").execute_in_process(resources=resources).success
    savepoint_id = sp.SavepointStore.of(config).list()[0].savepoint_id
    _observations_reflect_what_exists(resources, config, landed, savepoint_id, spark)
    _lookup_job_reads_the_state(resources, config, spark)

    # Launched unchanged, the runbook is a dry run: validated and reported, nothing stopped or restored (those steps
    # skipped), and the run tagged so; its estimate is more than the rows alone would say (a restore's fixed part).
    with DagsterInstance.ephemeral() as instance:
        dry = defs.resolve_job_def("restore_from_snapshot").execute_in_process(resources=resources, instance=instance)
        assert dry.success and instance.get_run_by_id(dry.run_id).tags["sessions/dry_run"] == "true"
    steps = {e.step_key: e.event_type_value for e in dry.all_events
             if e.event_type_value in ("STEP_SUCCESS", "STEP_SKIPPED", "STEP_FAILURE")}
    assert steps == {"validate_savepoint_op": "STEP_SUCCESS", "report_dry_run_op": "STEP_SUCCESS",
                     "stop_running_stream_op": "STEP_SKIPPED", "restore_op": "STEP_SKIPPED",
                     "verify_restore_op": "STEP_SKIPPED"}, steps
    (report,) = [e.event_specific_data.metadata for e in dry.all_events
                 if e.event_type_value == "STEP_OUTPUT" and e.step_key == "report_dry_run_op"]
    assert report["expected_seconds"].value >= 10 and "dry_run: false" in report["next_step"].value
    assert sessions_before == DeltaTable(config.sessions_table).to_pandas()["session_id"].sort_values().tolist()
    restored = defs.resolve_job_def("restore_from_snapshot").execute_in_process(
        resources=resources, run_config=_restore_config(savepoint="latest", partitions=2, resume_stream=True,
                                                        dry_run=False))
    assert restored.success
    # What verify_restore_op reports (the savepoint, the restored state's open sessions and events) and the state and
    # sessions table it leaves: the oracle's over the landed sample (land_sample's default seed; its disorder, 2 min,
    # is inside the lateness: no event is late, whatever the micro-batches).
    expected = oracle_of([arrival_order(generate_events(80, 3, seed=7), seed=7)], config.rules.gap_ms, config.rules.lateness_ms)
    assert restored.output_for_node("verify_restore_op").result.savepoint_id == savepoint_id
    (observed,) = [e.event_specific_data.materialization.metadata for e in restored.all_events
                   if e.event_type_value == "ASSET_MATERIALIZATION" and e.step_key == "verify_restore_op"
                   and e.event_specific_data.materialization.asset_key.path == ["session_state"]]
    assert (observed["open_sessions"].value, observed["open_events"].value) == \
        (len(expected.open_sessions), sum(row[4] for row in expected.open_sessions)) != (0, 0)
    (verified,) = [e.event_specific_data.metadata for e in restored.all_events
                   if e.event_type_value == "STEP_OUTPUT" and e.step_key == "verify_restore_op"]
    assert "resume_stream_after_restore" in verified["next_step"].value
    assert read_open_sessions(spark, config) == sorted(expected.open_sessions)
    assert read_sessions(config) == sorted(expected.closed)
    assert restored.output_for_node("restore_op").result.partitions == 2
    (restore_output,) = [e.event_specific_data.metadata for e in restored.all_events
                         if e.event_type_value == "STEP_OUTPUT" and e.step_key == "restore_op"]
    assert {"state_written", "state_checked"} <= set(restore_output["phases"].value), restore_output
    assert DeltaTable(config.sessions_table).to_pandas()["session_id"].sort_values().tolist() == sessions_before

    missing = defs.resolve_job_def("restore_from_snapshot").execute_in_process(
        resources=resources, raise_on_error=False, run_config=_restore_config(savepoint="sp-nope"))
    assert not missing.success
    failure = [e for e in missing.all_events if e.event_type_value == "STEP_FAILURE"][0]
    assert "no such savepoint" in str(failure.event_specific_data.error.message)
    # The valid choices, newest first, as the failure's next step.
    complete = [s.savepoint_id for s in sp.SavepointStore.of(config).list() if s.status == "complete"]
    next_step = failure.event_specific_data.user_failure_data.metadata["next_step"].value
    assert next_step.startswith("name one of the complete savepoints: latest, " + ", ".join(complete[:5])), next_step

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
    metrics = DeltaTable(config.table_uri("daily_session_metrics")).to_pandas().set_index("day")
    sessions = DeltaTable(config.sessions_table).to_pandas()
    assert metrics.loc[day, "sessions"] == int((sessions["session_start"].dt.strftime("%Y-%m-%d") == day).sum())

    assert sessions_have_unique_ids(resources["sessions"]).passed
    assert newest_savepoint_verifies(resources["sessions"]).passed
    restorable = newest_savepoint_restorable(resources["sessions"])
    assert restorable.passed and restorable.metadata["migrations"].text == "none"
    other_gap = SessionsResource(home=resources["sessions"].home, gap_minutes=45)
    refused = newest_savepoint_restorable(other_gap)
    assert not refused.passed and "--migrate" in refused.metadata["reasons"].text


def _observations_reflect_what_exists(resources, config, landed, savepoint_id, spark) -> None:
    """Without running a job: the sensor observes tables, checkpoint and catalog and asks for one pass over
    the state per new batch; that pass reports the open sessions and a plot of recent batches."""
    with DagsterInstance.ephemeral() as instance:
        # While a catch-up (which reports the versions it writes when it ends) is running, the sensor observes but
        # leaves the versions to it: a version is never reported by both at once. Once it ended, they are the sensor's.
        catching_up = DagsterRun(job_name="session_catch_up", run_id=str(uuid.uuid4()), status=DagsterRunStatus.STARTED,
                                 tags=defs.resolve_job_def("session_catch_up").tags)
        instance.add_run(catching_up)
        with build_sensor_context(resources={"sessions": resources["sessions"]}, instance=instance) as context:
            deferred = observation_sensor(context)
        assert not [e for e in deferred.asset_events if isinstance(e, AssetMaterialization)], deferred.asset_events
        assert {e.asset_key.path[0] for e in deferred.asset_events if isinstance(e, AssetObservation)} >= {
            "session_state", "savepoint_catalog"}
        instance.report_run_failed(catching_up)
        # One not started yet reports nothing before it has run: the sensor does not wait for it.
        instance.add_run(DagsterRun(job_name="session_catch_up", run_id=str(uuid.uuid4()),
                                    status=DagsterRunStatus.NOT_STARTED,
                                    tags=defs.resolve_job_def("session_catch_up").tags))
        with build_sensor_context(resources={"sessions": resources["sessions"]}, instance=instance) as context:
            result = observation_sensor(context)
        observed = {e.asset_key.path[0]: e.metadata for e in result.asset_events if isinstance(e, AssetObservation)}
        materialized = {e.asset_key.path[0]: e for e in result.asset_events if isinstance(e, AssetMaterialization)}
        # Everything that holds data is materialized, its version as the data version (this instance saw no run).
        assert set(materialized) == {"raw_events", "sessions", "quarantine", "session_state", "savepoint_catalog"}
        assert materialized["savepoint_catalog"].tags["dagster/data_version"] == savepoint_id
        assert materialized["sessions"].tags["dagster/data_version"] == str(DeltaTable(config.sessions_table).version())
        assert materialized["raw_events"].metadata["rows"].value == landed["events"] + landed["broken_lines"]
        assert materialized["sessions"].metadata["rows"].value == len(DeltaTable(config.sessions_table).to_pandas())
        assert observed["savepoint_catalog"]["newest"].value == savepoint_id
        assert savepoint_id in observed["savepoint_catalog"]["newest_savepoints"].value
        last = inspect_checkpoint(config.checkpoint).last_committed_batch
        assert observed["session_state"]["last_committed_batch"].value == last
        assert materialized["session_state"].tags["dagster/data_version"] == state_version(config, last)
        # The checks, evaluated by the sensor itself: unique ids, the newest savepoint re-read and restorable, the
        # state fresh, nothing half-done.
        checked = {e.check_name: e.passed for e in result.asset_events if isinstance(e, AssetCheckEvaluation)}
        assert checked == {"sessions_have_unique_ids": True, "newest_savepoint_verifies": True,
                           "newest_savepoint_restorable": True, "state_is_fresh": True,
                           "no_restore_left_half_done": True}, checked
        for event in result.asset_events:  # what the daemon does with a sensor's result
            instance.report_runless_asset_event(event)
        again = observation_sensor(build_sensor_context(resources={"sessions": resources["sessions"]},
                                                        instance=instance, cursor=result.cursor))
        # The next tick: nothing new to materialize or check, no second pass over the state for the same batch.
        assert len(result.run_requests) == 1 and not again.run_requests
        assert not [e for e in again.asset_events if isinstance(e, (AssetCheckEvaluation, AssetMaterialization))]
        run = defs.resolve_job_def("observe_state").execute_in_process(resources=resources, instance=instance)
        assert run.success
        observations = [e.event_specific_data.asset_observation for e in run.all_events
                        if e.event_type_value == "ASSET_OBSERVATION"]
        (state,) = [o.metadata for o in observations if o.asset_key.path == ["session_state"]]
        complete = [s.savepoint_id for s in SavepointStore.of(config).list() if s.status == "complete"]
        diffs = [o.metadata for o in observations if o.asset_key.path == ["savepoint_catalog"]]
        if len(complete) >= 2:  # the two newest savepoints' diff, with its plot
            (diff,) = diffs
            assert diff["diff"].value == f"{complete[1]}..{complete[0]}" and "added" in diff["diff_plot"].value
        else:
            assert diffs == []
        open_sessions = read_open_sessions(spark, config)
        assert state["open_sessions"].value == len(open_sessions) > 0
        assert state["open_events"].value == sum(row[4] for row in open_sessions)
        assert "open sessions" in state["recent_batches"].value and state["history"].value["open_sessions"] == [len(open_sessions)]
        # The next sensor observation carries the pass's figures forward (the UI shows the newest observation).
        later = observation_sensor(build_sensor_context(resources={"sessions": resources["sessions"]},
                                                        instance=instance, cursor=result.cursor))
        (carried,) = [e.metadata for e in later.asset_events
                      if isinstance(e, AssetObservation) and e.asset_key.path == ["session_state"]]
        assert carried["open_sessions"].value == len(open_sessions)
        assert set(carried) == set(state)  # one key set for every reporter
        assert carried["counted_at_batch"].value == state["last_committed_batch"].value


def _lookup_job_reads_the_state(resources, config, spark) -> None:
    """state_lookup (user_id, or top N) against the open sessions read independently from the state rows."""
    expected = read_open_sessions(spark, config)
    user = expected[len(expected) // 2][1]
    run = defs.resolve_job_def("state_lookup").execute_in_process(
        resources=resources, run_config={"ops": {"lookup_state_op": {"config": {"user_id": user}}}})
    found = lookup_table(run)
    assert [(s["user"], s["session"], int(s["events"]), int(s["page views"])) for s in found] == \
        [(user, row[0], row[4], row[5]) for row in expected if row[1] == user]
    run = defs.resolve_job_def("state_lookup").execute_in_process(
        resources=resources, run_config={"ops": {"lookup_state_op": {"config": {"top": 3}}}})
    top = lookup_table(run)
    assert [int(s["events"]) for s in top] == sorted((row[4] for row in expected), reverse=True)[:3]


def lookup_table(run) -> list[dict[str, str]]:
    """The rows of a state_lookup run's table (its output metadata `sessions`: the op stores no output value), by
    column header; checked against the metadata's own `open_sessions` count."""
    (output,) = [e.event_specific_data for e in run.all_events
                 if e.event_type_value == "STEP_OUTPUT" and e.step_key == "lookup_state_op"]
    header, _, *rows = output.metadata["sessions"].value.splitlines()
    cells = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in [header, *rows]]
    assert len(rows) == output.metadata["open_sessions"].value
    return [dict(zip(cells[0], row)) for row in cells[1:]]


@pytest.mark.tier("pure")
def test_maintenance_sensor_requests(tmp_path):
    """The library's policy, asked by the sensor: no savepoint -> one; 7 h old with a 6 h limit -> one;
    a fresh one -> none; a table over SESSIONS_COMPACT_FILES data files -> compaction."""
    resource = SessionsResource(home=str(tmp_path / "home"), savepoint_max_age_hours=6, compact_files=2)
    store = sp.SavepointStore.of(resource.config())
    with build_sensor_context(resources={"sessions": resource}) as context:
        requests = maintenance_sensor(context)
    assert [r.job_name for r in requests] == ["savepoint"]
    assert requests[0].run_config["ops"]["savepoint_op"]["config"]["trigger"] == "sensor"
    now = dt.datetime.now(dt.timezone.utc)
    store.record(SavepointInfo.from_row({"savepoint_id": "sp-old", "status": "complete",
                                         "created_at": now - dt.timedelta(hours=7)}))
    with build_sensor_context(resources={"sessions": resource}) as context:
        (request,) = maintenance_sensor(context)
    assert request.job_name == "savepoint" and "sp-old is 7.0 h old" in request.tags["sessions/reason"]
    store.record(SavepointInfo.from_row({"savepoint_id": "sp-new", "status": "complete", "created_at": now}))
    with build_sensor_context(resources={"sessions": resource}) as context:
        assert isinstance(maintenance_sensor(context), SkipReason)
    for n in range(3):  # three appends = three data files
        write_deltalake(resource.config().sessions_table, pa.table({"n": [n]}), mode="append")
    with build_sensor_context(resources={"sessions": resource}) as context:
        (request,) = maintenance_sensor(context)
    assert request.job_name == "compaction" and "sessions has 3 data files" in request.tags["sessions/reason"]


@pytest.mark.tier("pure")
def test_compaction_schedule_fires_the_compaction_job_nightly():
    """README (Dagster): `nightly_compaction` compacts once a night at 02:30 (UTC, the schedule sets no timezone).
    Over three fixed days, the ticks the scheduler daemon would fire (its own cron iteration) are exactly those, and
    each tick's evaluation asks for one run of the compaction job, resolved through the deployed definitions."""
    from dagster._utils.schedules import schedule_execution_time_iterator  # the daemon's iteration (dagster pinned)

    schedule = defs.resolve_schedule_def(compaction_schedule.name)
    utc = dt.timezone.utc
    start, end = dt.datetime(2026, 11, 20, 12, tzinfo=utc), dt.datetime(2026, 11, 23, 12, tzinfo=utc)
    ticks = list(itertools.takewhile(lambda tick: tick < end, schedule_execution_time_iterator(
        start.timestamp(), schedule.cron_schedule, schedule.execution_timezone)))
    assert ticks == [dt.datetime(2026, 11, day, 2, 30, tzinfo=utc) for day in (21, 22, 23)]
    for tick in ticks:
        (request,) = schedule.evaluate_tick(build_schedule_context(scheduled_execution_time=tick)).run_requests
        job = defs.resolve_job_def(request.job_name or schedule.job_name)
        assert job.name == "compaction" and job.tags.get("sessions/lifecycle") == "true"  # one lifecycle at a time


def test_stream_failure_sensor_records_and_optionally_restores(tmp_path, monkeypatch):
    from assets.automation import stream_failure_sensor

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("SESSIONS_HOME cannot live under a file")
    failed = defs.resolve_job_def("session_stream").execute_in_process(
        resources={"sessions": SessionsResource(home=str(blocker / "home")), "pyspark": pyspark_resource()},
        raise_on_error=False)
    assert not failed.success
    with DagsterInstance.ephemeral() as instance:
        failure_event = [e for e in failed.all_events if e.event_type_value == "PIPELINE_FAILURE"][0]
        context = build_run_status_sensor_context(
            sensor_name="stream_failure_sensor", dagster_instance=instance, dagster_run=failed.dagster_run,
            dagster_event=failure_event, resources={"sessions": SessionsResource()}).for_run_failure()
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

    from pipelines.coordination.job_leases import job_lock

    limits = {(limit["key"], limit.get("value")): limit["limit"]
              for limit in yaml.safe_load((REPO / "deploy" / "dagster.yaml").read_text())
              ["run_coordinator"]["config"]["tag_concurrency_limits"]}
    assert limits[("sessions/lifecycle", "true")] == 1
    lifecycle_jobs = {"savepoint", "restore_from_snapshot", "rescale", "compaction"}
    assert all(defs.resolve_job_def(name).tags.get("sessions/lifecycle") == "true" for name in lifecycle_jobs)

    config = resources["sessions"].config()
    with job_lock(config, "sessionctl compact", name="lifecycle"):
        busy = defs.resolve_job_def("compaction").execute_in_process(resources=resources, raise_on_error=False)
    assert not busy.success
    failure = [e for e in busy.all_events if e.event_type_value == "STEP_FAILURE"][0]
    message = str(failure.event_specific_data.error.message)
    assert "another lifecycle operation is running" in message and "sessionctl compact" in message


def test_session_stream_job_closes_sessions_of_a_quiet_stream(tmp_path, spark):
    """Idle close from the Dagster `session_stream` job (README "Idle close"): with no new events, its ingest appends
    clock rows and a session the events alone cannot close is written; the newest user's session stays open. The
    `rescale` job launched beside it is done by the stream, which goes on."""
    import threading
    import time

    from pipelines.core.sample_data import land
    from pipelines.job.checkpoint import inspect_checkpoint, read_job_metadata
    from state_store.stream_control import stop_stream
    from testkit.oracle import run_oracle
    from tests.kit.datagen import iso, line, make_event

    resources = {"sessions": SessionsResource(home=str(tmp_path / "home"), gap_minutes=2, lateness_minutes=0,
                                              idle_close_minutes=0.05, state_partitions=2),
                 "pyspark": pyspark_resource()}
    config = resources["sessions"].config()
    now_ms = int(time.time() * 1000)
    # u1's session closes when event time reaches now - 170 s + 120 s: 10 s after the newest event, which only a
    # clock row can bring (lateness 0: the events alone hold the watermark at the newest event, now - 60 s); u2's
    # 120 s after it, long after this test stops the stream.
    events = [make_event("u1", "a1", now_ms - 170_000, "page_view"), make_event("u2", "b1", now_ms - 60_000, "click")]
    for event in events:
        event["event_time"] = iso(event["event_time_ms"])
    expected = run_oracle([events, [{"clock_ms": now_ms - 45_000}]], 120_000, 0)
    assert [s[1] for s in expected.closed] == ["u1"] and not run_oracle([events], 120_000, 0).closed
    land(config.landing, "quiet.jsonl", [line(e) for e in events])

    outcome: dict = {}
    job = threading.Thread(target=lambda: outcome.update(result=defs.resolve_job_def("session_stream").execute_in_process(
        resources=resources, run_config={"ops": {"stream_op": {"config": {"poll_seconds": 1.0}}}})), daemon=True)
    job.start()
    def job_alive() -> bool:
        assert job.is_alive(), outcome
        return True

    wait_until(lambda: job_alive() and read_sessions(config, missing_ok=True),
               timeout_s=180, interval_s=0.5, what="the job's clock row to close u1's session")
    # The `rescale` job beside the running stream: it asks, the stream rescales between two batches and goes on.
    rescaled = defs.resolve_job_def("rescale").execute_in_process(
        resources=resources, run_config={"ops": {"rescale_op": {"config": {"partitions": 3}}}})
    assert rescaled.success and job.is_alive()
    observed = [e.event_specific_data.asset_observation.metadata for e in rescaled.all_events
                if e.event_type_value == "ASSET_OBSERVATION"]
    assert len(observed) == 1 and observed[0]["partitions_after"].value == 3, observed
    assert observed[0]["method"].value == "repartition" and observed[0]["stream"].value.startswith("run")
    assert inspect_checkpoint(config.checkpoint).partitions == 3
    # The restore runbook beside the running stream, as launched by default (online): the stream restores the
    # savepoint in place between two batches and goes on; nothing for the resume sensor to relaunch.
    assert defs.resolve_job_def("savepoint").execute_in_process(resources=resources).success
    savepoint_id = sp.SavepointStore.of(config).list()[0].savepoint_id
    with DagsterInstance.ephemeral() as instance:
        restored = defs.resolve_job_def("restore_from_snapshot").execute_in_process(
            resources=resources, instance=instance, run_config=_restore_config(savepoint=savepoint_id, dry_run=False))
        assert restored.success and job.is_alive()
        assert instance.get_run_by_id(restored.run_id).tags["sessions/restored_in_place"] == "true"
        context = build_run_status_sensor_context(
            sensor_name="resume_stream_after_restore", dagster_instance=instance,
            dagster_run=instance.get_run_by_id(restored.run_id), dagster_event=restored.get_run_success_event())
        assert isinstance(resume_stream_after_restore(context), SkipReason)
    done = restored.output_for_node("verify_restore_op").result
    assert done.savepoint_id == savepoint_id and done.stream.startswith("run")
    assert read_job_metadata(config.checkpoint).created_from == savepoint_id
    (verified,) = [e.event_specific_data.metadata for e in restored.all_events
                   if e.event_type_value == "STEP_OUTPUT" and e.step_key == "verify_restore_op"]
    assert verified["next_step"].value.startswith("nothing to resume: the running stream restored in place")
    stop_stream(config)
    job.join(timeout=300)
    assert outcome["result"].success
    written = DeltaTable(config.sessions_table).to_pandas()
    assert sorted(written["session_id"]) == sorted(s[0] for s in expected.closed)
    assert [s[1] for s in read_open_sessions(spark, config)] == ["u2"]
    raw = DeltaTable(config.raw_events_table).to_pyarrow_table(columns=["row_kind"])
    assert raw["row_kind"].to_pylist().count("clock") >= 1
