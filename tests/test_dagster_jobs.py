"""Dagster surface: definitions load; jobs run the library for real (Spark, Delta); sensor requests."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from dagster import RunRequest, SkipReason, build_sensor_context
from deltalake import DeltaTable

from assets.definitions import defs, savepoint_age_sensor
from assets.resources import SessionsResource
from pipelines.sample_data import land_sample
from state_store.savepoints import list_savepoints

REPO = Path(__file__).resolve().parent.parent


def test_definitions_validate():
    done = subprocess.run([str(REPO / ".venv" / "bin" / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
                          cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    names = {j.name for j in defs.jobs}
    assert {"session_stream", "session_catch_up", "savepoint", "restore_from_snapshot", "rescale", "compaction"} <= names


def test_jobs_catch_up_savepoint_restore(tmp_path):
    home = tmp_path / "home"
    resources = {"sessions": SessionsResource(home=str(home))}
    landed = land_sample(home / "landing", users=80, sessions_per_user=3, files=4)
    run = defs.get_job_def("session_catch_up").execute_in_process(resources=resources)
    assert run.success
    config = resources["sessions"].config()
    sessions_before = DeltaTable(config.sessions_table).to_pandas()["session_id"].sort_values().tolist()
    assert len(sessions_before) > 0 and len(set(sessions_before)) == len(sessions_before)
    quarantined = DeltaTable(config.quarantine_table).to_pandas()
    assert len(quarantined) == landed["broken_lines"]
    mats = [e.event_specific_data.materialization.asset_key.path[0] for e in run.get_asset_materialization_events()]
    assert {"sessions", "raw_events", "quarantine"} <= set(mats)

    saved = defs.get_job_def("savepoint").execute_in_process(resources=resources)
    assert saved.success
    savepoint_id = list_savepoints(config.savepoint_uri)[0]["savepoint_id"]

    dry = defs.get_job_def("restore_from_snapshot").execute_in_process(resources=resources, run_config={
        "ops": {name: {"config": {"savepoint": savepoint_id, "dry_run": True}}
                for name in ("validate_savepoint_op", "restore_op")}})
    assert dry.success
    restored = defs.get_job_def("restore_from_snapshot").execute_in_process(resources=resources, run_config={
        "ops": {name: {"config": {"savepoint": savepoint_id, "partitions": 2}}
                for name in ("validate_savepoint_op", "restore_op")}})
    assert restored.success
    assert restored.output_for_node("restore_op")["verified"] is True
    assert DeltaTable(config.sessions_table).to_pandas()["session_id"].sort_values().tolist() == sessions_before

    missing = defs.get_job_def("restore_from_snapshot").execute_in_process(resources=resources, raise_on_error=False,
        run_config={"ops": {n: {"config": {"savepoint": "sp-nope"}} for n in ("validate_savepoint_op", "restore_op")}})
    assert not missing.success
    failure = [e for e in missing.all_events if e.event_type_value == "STEP_FAILURE"][0]
    assert "no such savepoint" in json.dumps(str(failure.event_specific_data.error.message))


def test_savepoint_age_sensor(tmp_path):
    resource = SessionsResource(home=str(tmp_path / "home"))
    with build_sensor_context(resources={"sessions": resource}) as context:
        request = savepoint_age_sensor(context)
    assert isinstance(request, RunRequest)
    assert request.run_config["ops"]["savepoint_op"]["config"]["trigger"] == "sensor"
    from state_store import savepoints as sp
    import datetime as dt

    sp.record(resource.config().savepoint_uri, {"savepoint_id": "sp-x", "status": "complete",
                                                 "created_at": dt.datetime.now(dt.timezone.utc)})
    with build_sensor_context(resources={"sessions": resource}) as context:
        assert isinstance(savepoint_age_sensor(context), SkipReason)
