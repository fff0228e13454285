"""Jobs, assets, schedules and sensors. Every op only calls the library (pipelines/, state_store/)."""

import datetime as dt
import threading
from dataclasses import asdict

from dagster import (
    AssetKey, AssetMaterialization, AssetObservation, AssetSpec, Config, DefaultScheduleStatus, Definitions,
    MetadataValue, OpExecutionContext, RunRequest, ScheduleDefinition, SkipReason, job, op, sensor,
)

from assets.resources import SessionsResource, expected_errors
from pipelines import job as pipeline
from state_store import lifecycle, maintenance, savepoints

RAW_EVENTS, SESSIONS, QUARANTINE, STATE = (AssetKey("raw_events"), AssetKey("sessions"),
                                           AssetKey("quarantine"), AssetKey("session_state"))
LIFECYCLE_TAGS = {"sessions/lifecycle": "true"}  # deploy/dagster.yaml limits these to one at a time

table_assets = [
    AssetSpec(RAW_EVENTS, description="Every landed line, with ingest_seq (the stream's source offsets)."),
    AssetSpec(SESSIONS, deps=[RAW_EVENTS], description="Closed sessions, each exactly once."),
    AssetSpec(QUARANTINE, deps=[RAW_EVENTS], description="Rejected lines and late events, with reasons."),
    AssetSpec(STATE, deps=[RAW_EVENTS], description="Open sessions in the Spark state store."),
]


def _report_state(context: OpExecutionContext, sessions: SessionsResource) -> dict:
    report = pipeline.status(sessions.config())
    context.log_event(AssetObservation(asset_key=STATE, metadata={
        "provider": report["provider"], "partitions": report["partitions"],
        "last_committed_batch": report["last_committed_batch"] if report["last_committed_batch"] is not None else -1,
        "state_keys": report["state_keys"], "open_events": report["open_events"],
        "state_bytes": MetadataValue.int(report["state_bytes"]), "watermark_ms": report["watermark_ms"] or 0,
    }))
    return report


@op(tags=LIFECYCLE_TAGS)
def catch_up_op(context: OpExecutionContext, sessions: SessionsResource) -> None:
    summary = expected_errors(pipeline.catch_up, sessions.config())
    meta = {k: v for k, v in asdict(summary).items() if k != "extra" and v is not None}
    context.log_event(AssetMaterialization(asset_key=RAW_EVENTS, metadata={
        "ingested_files": summary.ingested_files, "ingested_rows": summary.ingested_rows}))
    context.log_event(AssetMaterialization(asset_key=SESSIONS, metadata=meta))
    context.log_event(AssetMaterialization(asset_key=QUARANTINE, metadata={"quarantined": summary.quarantined}))
    _report_state(context, sessions)


class StreamConfig(Config):
    poll_seconds: float = 5.0


@op
def stream_op(context: OpExecutionContext, sessions: SessionsResource, config: StreamConfig) -> None:
    stop = threading.Event()

    def progress(summary, sink):
        context.log.info(f"batches={summary.batches} input_rows={summary.input_rows} "
                         f"sessions_written={sink.sessions_written}")

    try:
        summary = expected_errors(pipeline.run_continuously, sessions.config(), stop=stop,
                                  poll_seconds=config.poll_seconds, on_progress=progress)
    except BaseException:
        stop.set()  # cancellation from the UI: run_continuously stops the query in its finally
        raise
    context.log_event(AssetMaterialization(asset_key=SESSIONS, metadata={
        "sessions_written": summary.sessions_written, "batches": summary.batches}))


class SavepointConfig(Config):
    trigger: str = "manual"


@op(tags=LIFECYCLE_TAGS)
def savepoint_op(context: OpExecutionContext, sessions: SessionsResource, config: SavepointConfig) -> dict:
    row = expected_errors(lifecycle.take_savepoint, sessions.config(), trigger=config.trigger)
    context.log_event(AssetObservation(asset_key=STATE, metadata={
        "savepoint_id": row["savepoint_id"], "batch_id": row["batch_id"], "rows": row["rows"],
        "bytes": row["bytes"], "seconds": row["seconds"], "uri": row["uri"]}))
    return row


class RestoreConfig(Config):
    savepoint: str = "latest"
    partitions: int = 0  # 0 = the savepoint's partitions
    migrate: bool = False
    dry_run: bool = False


@op(tags=LIFECYCLE_TAGS)
def validate_savepoint_op(context: OpExecutionContext, sessions: SessionsResource, config: RestoreConfig) -> dict:
    row = expected_errors(lifecycle.validate_savepoint, sessions.config(), config.savepoint, config.migrate)
    context.log.info(f"savepoint {row['savepoint_id']} verified: {row['rows']} rows, checksum {row['checksum']}")
    return row


@op(tags=LIFECYCLE_TAGS)
def restore_op(context: OpExecutionContext, sessions: SessionsResource, config: RestoreConfig, validated: dict) -> dict:
    if config.dry_run:
        context.log.info(f"dry run: would restore {validated['savepoint_id']}")
        return {"dry_run": True, **validated}
    result = expected_errors(lifecycle.restore, sessions.config(), validated["savepoint_id"],
                             partitions=config.partitions or None, migrate=config.migrate)
    context.log_event(AssetObservation(asset_key=STATE, metadata={
        k: v for k, v in result.items() if isinstance(v, (int, float, str, bool))}))
    return result


@op(tags=LIFECYCLE_TAGS)
def verify_restore_op(context: OpExecutionContext, sessions: SessionsResource, restored: dict) -> None:
    if restored.get("dry_run"):
        return
    if not restored.get("verified"):
        from dagster import Failure

        raise Failure(description=f"restored state does not match savepoint {restored['savepoint_id']}")
    _report_state(context, sessions)


class RescaleConfig(Config):
    partitions: int


@op(tags=LIFECYCLE_TAGS)
def rescale_op(context: OpExecutionContext, sessions: SessionsResource, config: RescaleConfig) -> None:
    result = expected_errors(lifecycle.rescale, sessions.config(), config.partitions)
    context.log_event(AssetObservation(asset_key=STATE, metadata={
        k: v for k, v in result.items() if isinstance(v, (int, float, str)) and v is not None}))


class CompactionConfig(Config):
    keep_last: int = 5
    keep_daily_days: int = 7
    dry_run: bool = False


@op(tags=LIFECYCLE_TAGS)
def compaction_op(context: OpExecutionContext, sessions: SessionsResource, config: CompactionConfig) -> None:
    report = expected_errors(maintenance.compact, sessions.config(), keep_last=config.keep_last,
                             keep_daily_days=config.keep_daily_days, dry_run=config.dry_run)
    context.log_event(AssetObservation(asset_key=SESSIONS, metadata={
        "bytes_reclaimed": report["bytes_reclaimed"], "files_before": report["files_before"],
        "files_after": report["files_after"], "savepoints_deleted": len(report["savepoints_deleted"])}))


@job(tags=LIFECYCLE_TAGS)
def session_catch_up():
    catch_up_op()


@job
def session_stream():
    stream_op()


@job(tags=LIFECYCLE_TAGS)
def savepoint():
    savepoint_op()


@job(tags=LIFECYCLE_TAGS)
def restore_from_snapshot():
    verify_restore_op(restore_op(validate_savepoint_op()))


@job(tags=LIFECYCLE_TAGS)
def rescale():
    rescale_op()


@job(tags=LIFECYCLE_TAGS)
def compaction():
    compaction_op()


savepoint_schedule = ScheduleDefinition(
    job=savepoint, cron_schedule="0 */6 * * *", name="periodic_savepoint",
    run_config={"ops": {"savepoint_op": {"config": {"trigger": "scheduled"}}}},
    default_status=DefaultScheduleStatus.STOPPED)
compaction_schedule = ScheduleDefinition(
    job=compaction, cron_schedule="30 2 * * *", name="nightly_compaction",
    default_status=DefaultScheduleStatus.STOPPED)


@sensor(job=savepoint, minimum_interval_seconds=300)
def savepoint_age_sensor(context, sessions: SessionsResource):
    """Requests a savepoint when the newest complete one is older than SESSIONS_SAVEPOINT_MAX_AGE_HOURS (6)."""
    import os

    config = sessions.config()
    max_age = dt.timedelta(hours=float(os.environ.get("SESSIONS_SAVEPOINT_MAX_AGE_HOURS", "6")))
    complete = [r for r in savepoints.list_savepoints(config.savepoint_uri) if r["status"] == "complete"]
    if complete:
        age = dt.datetime.now(dt.timezone.utc) - dt.datetime.fromisoformat(complete[0]["created_at"])
        if age < max_age:
            return SkipReason(f"newest savepoint {complete[0]['savepoint_id']} is {age} old")
    hour = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d%H")
    return RunRequest(run_key=f"savepoint-age-{hour}",
                      run_config={"ops": {"savepoint_op": {"config": {"trigger": "sensor"}}}})


defs = Definitions(
    assets=table_assets,
    jobs=[session_catch_up, session_stream, savepoint, restore_from_snapshot, rescale, compaction],
    schedules=[savepoint_schedule, compaction_schedule],
    sensors=[savepoint_age_sensor],
    resources={"sessions": SessionsResource()},
)
