"""Schedules and sensors. When to savepoint or compact is the library's policy
(state_store.maintenance.maintenance_due); these only turn its answer into run requests."""
import datetime as dt
from typing import Any

from dagster import (
    DagsterRunStatus,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    RunFailureSensorContext,
    RunRequest,
    RunStatusSensorContext,
    ScheduleDefinition,
    SensorEvaluationContext,
    SkipReason,
    run_failure_sensor,
    run_status_sensor,
    sensor,
)

from assets.jobs import compaction, savepoint, session_stream
from assets.resources import SessionsResource
from assets.runbook import IN_PLACE_TAG, restore_from_snapshot
from state_store.maintenance import maintenance_due

# Retention is a nightly chore; savepoints follow their own age policy (maintenance_sensor).
compaction_schedule = ScheduleDefinition(
    job=compaction, cron_schedule="30 2 * * *", name="nightly_compaction",
    default_status=DefaultScheduleStatus.STOPPED)


@sensor(jobs=[savepoint, compaction], minimum_interval_seconds=300, default_status=DefaultSensorStatus.STOPPED)
def maintenance_sensor(context: SensorEvaluationContext, sessions: SessionsResource) -> list[RunRequest] | SkipReason:
    """A savepoint when the newest is older than SESSIONS_SAVEPOINT_MAX_AGE_HOURS; compaction when a table
    has more than SESSIONS_COMPACT_FILES data files or the state more than SESSIONS_STATE_FILES files."""
    now = dt.datetime.now(dt.timezone.utc)
    due = maintenance_due(sessions.config(), now)
    requests = []
    if due.savepoint:
        requests.append(RunRequest(job_name="savepoint", run_key=f"savepoint-age-{now:%Y%m%d%H}",
                                   run_config={"ops": {"savepoint_op": {"config": {"trigger": "sensor"}}}},
                                   tags={"sessions/reason": due.savepoint[:200]}))
    if due.compaction:
        requests.append(RunRequest(job_name="compaction", run_key=f"compaction-files-{now:%Y%m%d%H}",
                                   tags={"sessions/reason": due.compaction[:200]}))
    if not requests:
        return SkipReason(f"savepoint {due.newest_savepoint_id} is {due.newest_savepoint_age_s} s old; "
                          f"data files {due.data_files}, state files {due.state_files}")
    return requests


@run_failure_sensor(monitored_jobs=[session_stream], request_job=restore_from_snapshot,
                    default_status=DefaultSensorStatus.STOPPED)
def stream_failure_sensor(context: RunFailureSensorContext, sessions: SessionsResource) -> RunRequest | SkipReason:
    """Records a failed stream run; with SESSIONS_AUTO_RESTORE=true starts the restore runbook from the
    latest good savepoint (and resumes the stream after it)."""
    message = context.failure_event.message if context.failure_event else "unknown"
    context.log.error(f"session_stream run {context.dagster_run.run_id} failed: {message}")
    if not sessions.config().auto_restore:
        return SkipReason("failure recorded; SESSIONS_AUTO_RESTORE is not true")
    settings = {"savepoint": "latest", "stop_stream": False, "resume_stream": True, "dry_run": False}
    return RunRequest(run_key=f"auto-restore-{context.dagster_run.run_id}",
                      run_config={"ops": {"validate_savepoint_op": {"config": settings}}})


# Running by default: it acts only on a real restore whose launchpad asked for resume_stream (false by default).
@run_status_sensor(run_status=DagsterRunStatus.SUCCESS, monitored_jobs=[restore_from_snapshot],
                   request_job=session_stream, default_status=DefaultSensorStatus.RUNNING)
def resume_stream_after_restore(context: RunStatusSensorContext) -> RunRequest | SkipReason:
    """The runbook's last step: relaunch session_stream when the restore asked for it (resume_stream)."""
    if context.dagster_run.tags.get(IN_PLACE_TAG) == "true":
        return SkipReason("the running stream restored in place and went on: nothing to resume")
    run_config: dict[str, Any] = dict(context.dagster_run.run_config or {})
    ops = run_config.get("ops", {})
    wanted = ops.get("validate_savepoint_op", {}).get("config", {})
    if wanted.get("resume_stream") and wanted.get("dry_run") is False:  # unset is a dry run (RestoreConfig)
        return RunRequest(run_key=f"resume-{context.dagster_run.run_id}")
    return SkipReason("restore did not ask to resume the stream")
