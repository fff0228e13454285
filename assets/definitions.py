"""Jobs, assets, checks, schedules and sensors. Every op only calls the library (pipelines/, state_store/);
what is Dagster's own (finding and stopping a run, requesting runs) stays here."""
import datetime as dt
import threading
import time
from dataclasses import asdict

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    AssetSpec,
    Config,
    DagsterRunStatus,
    DailyPartitionsDefinition,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    Definitions,
    Failure,
    MetadataValue,
    OpExecutionContext,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    SkipReason,
    asset,
    asset_check,
    job,
    op,
    run_failure_sensor,
    run_status_sensor,
    sensor,
)
from dagster_pyspark import PySparkResource

from assets.resources import SessionsResource, expected_errors, pyspark_resource
from pipelines import job as pipeline
from pipelines.checkpoint import directory_size, last_commit_age_seconds
from pipelines.config import SessionsConfig
from pipelines.errors import JobRunning, SessionsError
from pipelines.metrics import daily_metrics
from state_store import lifecycle, maintenance, savepoints
from state_store.results import StatusReport
from state_store.status import status

RAW_EVENTS, SESSIONS, QUARANTINE, STATE = (AssetKey("raw_events"), AssetKey("sessions"),
                                           AssetKey("quarantine"), AssetKey("session_state"))
# deploy/dagster.yaml lets one run with this tag go at a time; the library's job/lifecycle locks
# guard the same thing for the CLI and for anything outside Dagster.
LIFECYCLE_TAGS = {"sessions/lifecycle": "true"}

table_assets = [
    AssetSpec(RAW_EVENTS, description="Every landed line, with ingest_seq (the stream's source offsets)."),
    AssetSpec(SESSIONS, deps=[RAW_EVENTS], description="Closed sessions, each exactly once."),
    AssetSpec(QUARANTINE, deps=[RAW_EVENTS], description="Rejected lines and late events, with reasons."),
    AssetSpec(STATE, deps=[RAW_EVENTS], description="Open sessions in the Spark state store."),
]


def _observe_state(context, sessions: SessionsResource, spark=None) -> StatusReport:
    report = status(sessions.config(), spark=spark)
    context.log_event(AssetObservation(asset_key=STATE, metadata={
        "provider": report.provider, "partitions": report.partitions or 0,
        "last_committed_batch": report.last_committed_batch if report.last_committed_batch is not None else -1,
        "state_keys": report.state_keys, "open_users": report.open_users,
        "open_sessions": report.open_sessions, "open_events": report.open_events,
        "frozen_prefixes": report.frozen_prefixes,
        "state_bytes": MetadataValue.int(report.state_bytes), "watermark_ms": report.watermark_ms or 0,
    }))
    return report


# ---- the stream -----------------------------------------------------------------------------------

@op(tags=LIFECYCLE_TAGS)
def catch_up_op(context: OpExecutionContext, sessions: SessionsResource, pyspark: PySparkResource) -> None:
    spark = pyspark.spark_session
    summary = expected_errors(pipeline.catch_up, sessions.config(), spark=spark)
    meta = {k: v for k, v in asdict(summary).items() if k != "extra" and v is not None}
    context.log_event(AssetMaterialization(asset_key=RAW_EVENTS, metadata={
        "ingested_files": summary.ingested_files, "ingested_rows": summary.ingested_rows}))
    context.log_event(AssetMaterialization(asset_key=SESSIONS, metadata=meta))
    context.log_event(AssetMaterialization(asset_key=QUARANTINE, metadata={"quarantined": summary.quarantined}))
    _observe_state(context, sessions, spark)


class StreamConfig(Config):
    poll_seconds: float = 5.0


@op
def stream_op(context: OpExecutionContext, sessions: SessionsResource, pyspark: PySparkResource,
              config: StreamConfig) -> None:
    """Runs until the run is cancelled from the UI; the query is then stopped cleanly."""
    stop = threading.Event()

    def progress(summary, sink):
        context.log.info(f"batches={summary.batches} input_rows={summary.input_rows} "
                         f"sessions_written={sink.sessions_written}")

    try:
        summary = expected_errors(pipeline.run_continuously, sessions.config(), spark=pyspark.spark_session,
                                  stop=stop, poll_seconds=config.poll_seconds, on_progress=progress)
    except BaseException:
        stop.set()
        raise
    context.log_event(AssetMaterialization(asset_key=SESSIONS, metadata={
        "sessions_written": summary.sessions_written, "batches": summary.batches}))


@job(tags=LIFECYCLE_TAGS)
def session_catch_up():
    catch_up_op()


@job(tags={"sessions/stream": "true"})
def session_stream():
    stream_op()


# ---- savepoint, restore runbook, rescale, compaction ---------------------------------------------------------

class SavepointConfig(Config):
    trigger: str = "manual"


@op(tags=LIFECYCLE_TAGS)
def savepoint_op(context: OpExecutionContext, sessions: SessionsResource, pyspark: PySparkResource,
                 config: SavepointConfig) -> dict:
    saved = expected_errors(lifecycle.take_savepoint, sessions.config(), trigger=config.trigger,
                            spark=pyspark.spark_session)
    context.log_event(AssetObservation(asset_key=STATE, metadata={
        "savepoint_id": saved.savepoint_id, "batch_id": saved.batch_id, "rows": saved.rows,
        "bytes": saved.bytes, "seconds": saved.seconds, "uri": saved.uri, "checksum": saved.checksum}))
    return saved.to_dict()  # op outputs stay plain dicts (stored by the IO manager, read by later ops)


class RestoreConfig(Config):
    savepoint: str = "latest"   # a savepoint id, or latest
    partitions: int = 0         # 0 = the savepoint's partitions
    migrate: bool = False       # accept a savepoint taken with other gap/lateness settings
    dry_run: bool = False       # only validate and report
    stop_stream: bool = True    # cancel a running session_stream run first
    resume_stream: bool = False  # launch session_stream after a successful restore


@op(tags=LIFECYCLE_TAGS)
def validate_savepoint_op(context: OpExecutionContext, sessions: SessionsResource, config: RestoreConfig) -> dict:
    """The runbook's one config block: the later steps take their settings from this step's output."""
    saved = expected_errors(lifecycle.validate_savepoint, sessions.config(), config.savepoint, config.migrate)
    context.log.info(f"savepoint {saved.savepoint_id} verified: {saved.rows} rows, checksum {saved.checksum}")
    context.add_output_metadata({"savepoint_id": saved.savepoint_id, "rows": saved.rows,
                                 "batch_id": saved.batch_id, "checksum": saved.checksum})
    return {**saved.to_dict(), "settings": config.model_dump()}


def _active_stream_runs(instance):
    return instance.get_runs(RunsFilter(job_name="session_stream", statuses=[
        DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]))


@op(tags=LIFECYCLE_TAGS)
def stop_running_stream_op(context: OpExecutionContext, sessions: SessionsResource, validated: dict) -> dict:
    """Cancel running session_stream runs and wait until the job lock is free."""
    stopped = []
    settings = validated["settings"]
    if settings["stop_stream"] and not settings["dry_run"]:
        for run in _active_stream_runs(context.instance):
            context.log.info(f"cancelling session_stream run {run.run_id}")
            context.instance.run_launcher.terminate(run.run_id)
            stopped.append(run.run_id)
        config = sessions.config()
        deadline = time.monotonic() + config.stop_timeout_s
        while True:
            try:
                with pipeline.job_lock(config, "restore runbook (probe)"):
                    break
            except JobRunning as busy:
                if time.monotonic() > deadline:
                    raise Failure(description=f"the stream did not stop in time: {busy}") from None
                time.sleep(2)
    context.add_output_metadata({"stopped_runs": len(stopped)})
    return validated


@op(tags=LIFECYCLE_TAGS)
def restore_op(context: OpExecutionContext, sessions: SessionsResource, pyspark: PySparkResource,
               validated: dict) -> dict:
    settings = validated["settings"]
    if settings["dry_run"]:
        context.log.info(f"dry run: would restore {validated['savepoint_id']} (batch {validated['batch_id']}, "
                         f"{validated['rows']} rows)")
        return {"dry_run": True, **validated}
    result = expected_errors(lifecycle.restore, sessions.config(), validated["savepoint_id"],
                             partitions=settings["partitions"] or None, migrate=settings["migrate"],
                             spark=pyspark.spark_session).to_dict()
    context.add_output_metadata({k: v for k, v in result.items() if isinstance(v, (int, float, str, bool))})
    return result


@op(tags=LIFECYCLE_TAGS)
def verify_restore_op(context: OpExecutionContext, sessions: SessionsResource, pyspark: PySparkResource,
                      restored: dict) -> dict:
    if restored.get("dry_run"):
        return restored
    if not restored.get("verified"):
        raise Failure(description=f"restored state does not match savepoint {restored['savepoint_id']}")
    report = _observe_state(context, sessions, pyspark.spark_session)
    context.log.info(f"restored {restored['savepoint_id']}: {report.open_events} open events in state")
    return restored


@job(tags=LIFECYCLE_TAGS, description="Runbook: validate -> stop stream -> restore -> verify (-> resume via sensor).")
def restore_from_snapshot():
    verify_restore_op(restore_op(stop_running_stream_op(validate_savepoint_op())))


class RescaleConfig(Config):
    partitions: int


@op(tags=LIFECYCLE_TAGS)
def rescale_op(context: OpExecutionContext, sessions: SessionsResource, pyspark: PySparkResource,
               config: RescaleConfig) -> None:
    result = expected_errors(lifecycle.rescale, sessions.config(), config.partitions, spark=pyspark.spark_session)
    context.log_event(AssetObservation(asset_key=STATE, metadata={
        k: v for k, v in result.to_dict().items() if isinstance(v, (int, float, str)) and v is not None}))


class CompactionConfig(Config):
    keep_last: int = 5          # newest complete savepoints kept
    keep_daily_days: int = 7    # plus the newest of each of these days
    vacuum_retention_hours: int = 168
    dry_run: bool = False


@op(tags=LIFECYCLE_TAGS)
def compaction_op(context: OpExecutionContext, sessions: SessionsResource, config: CompactionConfig) -> None:
    report = expected_errors(maintenance.compact, sessions.config(), keep_last=config.keep_last,
                             keep_daily_days=config.keep_daily_days, dry_run=config.dry_run,
                             vacuum_retention_hours=config.vacuum_retention_hours)
    context.log_event(AssetObservation(asset_key=SESSIONS, metadata={
        "bytes_reclaimed": report.bytes_reclaimed, "bytes_before": report.bytes_before,
        "bytes_after": report.bytes_after, "files_before": report.files_before,
        "files_after": report.files_after, "savepoints_deleted": len(report.savepoints_deleted),
        "seconds": report.seconds}))


@job(tags=LIFECYCLE_TAGS)
def savepoint():
    savepoint_op()


@job(tags=LIFECYCLE_TAGS)
def rescale():
    rescale_op()


@job(tags=LIFECYCLE_TAGS)
def compaction():
    compaction_op()


# ---- derived asset and checks ---------------------------------------------------------------------------------

@asset(partitions_def=DailyPartitionsDefinition(start_date="2026-01-01"), deps=[SESSIONS],
       description="Per day (UTC, by session start): sessions, users, median duration, page views.")
def daily_session_metrics(context: AssetExecutionContext, sessions: SessionsResource) -> None:
    row = daily_metrics(sessions.config(), context.partition_key)
    context.add_output_metadata({k: v for k, v in row.items() if k != "day"})


@asset_check(asset=SESSIONS, description="Every session_id appears once.")
def sessions_have_unique_ids(sessions: SessionsResource) -> AssetCheckResult:
    from deltalake import DeltaTable

    ids = DeltaTable(sessions.config().sessions_table).to_pyarrow_table(columns=["session_id"])["session_id"]
    duplicates = len(ids) - len(ids.unique())
    return AssetCheckResult(passed=duplicates == 0, metadata={"rows": len(ids), "duplicates": duplicates})


@asset_check(asset=STATE, description="The newest complete savepoint re-reads with its count and checksum.")
def newest_savepoint_verifies(sessions: SessionsResource) -> AssetCheckResult:
    try:
        saved = lifecycle.validate_savepoint(sessions.config(), "latest", migrate=True)
    except SessionsError as error:
        return AssetCheckResult(passed=False, metadata={"error": str(error)})
    return AssetCheckResult(passed=True, metadata={"savepoint_id": saved.savepoint_id, "rows": saved.rows})


@asset_check(asset=STATE, description="The state's newest committed batch is recent (SESSIONS_STATE_MAX_AGE_MINUTES).")
def state_is_fresh(sessions: SessionsResource) -> AssetCheckResult:
    config = sessions.config()
    age = last_commit_age_seconds(config.checkpoint)
    limit = config.state_max_age_minutes * 60
    return AssetCheckResult(passed=age is not None and age <= limit, severity=AssetCheckSeverity.WARN,
                            metadata={"age_seconds": -1.0 if age is None else round(age, 1), "limit_seconds": limit})


# ---- schedules and sensors -------------------------------------------------------------------------------------

savepoint_schedule = ScheduleDefinition(
    job=savepoint, cron_schedule="0 */6 * * *", name="periodic_savepoint",
    run_config={"ops": {"savepoint_op": {"config": {"trigger": "scheduled"}}}},
    default_status=DefaultScheduleStatus.STOPPED)
compaction_schedule = ScheduleDefinition(
    job=compaction, cron_schedule="30 2 * * *", name="nightly_compaction",
    default_status=DefaultScheduleStatus.STOPPED)


def _count_data_files(uri: str) -> int:
    from deltalake import DeltaTable

    return len(DeltaTable(uri).file_uris()) if DeltaTable.is_deltatable(uri) else 0


@sensor(jobs=[savepoint, compaction], minimum_interval_seconds=300, default_status=DefaultSensorStatus.STOPPED)
def maintenance_sensor(context, sessions: SessionsResource):
    """Savepoint when the newest one is older than SESSIONS_SAVEPOINT_MAX_AGE_HOURS (6); compaction when a
    table has more than SESSIONS_COMPACT_FILES (200) data files or the state more than SESSIONS_STATE_FILES (2000)."""

    config = sessions.config()
    now = dt.datetime.now(dt.timezone.utc)
    requests = []
    max_age = dt.timedelta(hours=config.savepoint_max_age_hours)
    complete = [r for r in savepoints.list_savepoints(config.savepoint_uri) if r["status"] == "complete"]
    if not complete or now - dt.datetime.fromisoformat(complete[0]["created_at"]) >= max_age:
        requests.append(RunRequest(job_name="savepoint", run_key=f"savepoint-age-{now:%Y%m%d%H}",
                                   run_config={"ops": {"savepoint_op": {"config": {"trigger": "sensor"}}}}))
    files = {name: _count_data_files(uri) for name, uri in
             (("sessions", config.sessions_table), ("quarantine", config.quarantine_table),
              ("raw_events", config.raw_events_table))}
    state_files, _ = directory_size(config.checkpoint / "state")
    if max(files.values()) > config.compact_files or state_files > config.state_files:
        requests.append(RunRequest(job_name="compaction", run_key=f"compaction-files-{now:%Y%m%d%H}"))
    if not requests:
        return SkipReason(f"savepoint {complete[0]['savepoint_id']} is recent; data files {files}, "
                          f"state files {state_files}")
    return requests


@run_failure_sensor(monitored_jobs=[session_stream], request_job=restore_from_snapshot,
                    default_status=DefaultSensorStatus.STOPPED)
def stream_failure_sensor(context):
    """Records a failed stream run; with SESSIONS_AUTO_RESTORE=true starts the restore runbook from the
    latest good savepoint (and resumes the stream after it)."""
    message = context.failure_event.message if context.failure_event else "unknown"
    context.log.error(f"session_stream run {context.dagster_run.run_id} failed: {message}")
    if not SessionsConfig.from_env().auto_restore:
        return SkipReason("failure recorded; SESSIONS_AUTO_RESTORE is not true")
    settings = {"savepoint": "latest", "stop_stream": False, "resume_stream": True}
    return RunRequest(run_key=f"auto-restore-{context.dagster_run.run_id}",
                      run_config={"ops": {"validate_savepoint_op": {"config": settings}}})


@run_status_sensor(run_status=DagsterRunStatus.SUCCESS, monitored_jobs=[restore_from_snapshot],
                   request_job=session_stream, default_status=DefaultSensorStatus.STOPPED)
def resume_stream_after_restore(context):
    """The runbook's last step: relaunch session_stream when the restore asked for it (resume_stream)."""
    ops = (context.dagster_run.run_config or {}).get("ops", {})
    wanted = ops.get("validate_savepoint_op", {}).get("config", {})
    if wanted.get("resume_stream") and not wanted.get("dry_run"):
        return RunRequest(run_key=f"resume-{context.dagster_run.run_id}")
    return SkipReason("restore did not ask to resume the stream")


defs = Definitions(
    assets=[*table_assets, daily_session_metrics],
    asset_checks=[sessions_have_unique_ids, newest_savepoint_verifies, state_is_fresh],
    jobs=[session_catch_up, session_stream, savepoint, restore_from_snapshot, rescale, compaction],
    schedules=[savepoint_schedule, compaction_schedule],
    sensors=[maintenance_sensor, stream_failure_sensor, resume_stream_after_restore],
    resources={"sessions": SessionsResource(), "pyspark": pyspark_resource()},
)
