"""The restore runbook, started from the UI: validate -> stop the stream -> restore -> verify (-> resume
via a sensor). Steps pass typed values (RestorePlan, RestoreOutcome); a failed step's message is the
library's one line, which says what to do next."""
import time
from dataclasses import dataclass

from dagster import (
    AssetObservation,
    Config,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    Failure,
    OpExecutionContext,
    RunsFilter,
    job,
    op,
)
from dagster_pyspark import PySparkResource

from assets.resources import SessionsResource, expected_errors
from assets.tables import LIFECYCLE_TAGS, STATE, state_metadata
from pipelines.coordination.job_leases import job_lock, running_stream
from pipelines.errors import JobRunning
from state_store import lifecycle, stream_control
from state_store.preflight import plan_restore
from state_store.results import RestoreResult, SavepointInfo
from state_store.status import status


class RestoreConfig(Config):
    savepoint: str = "latest"   # a savepoint id, or latest
    partitions: int = 0         # 0 = the savepoint's partitions
    migrate: bool = False       # accept a savepoint taken with other gap/lateness settings
    dry_run: bool = False       # only validate and report
    stop_stream: bool = True    # cancel a running session_stream run first
    stop_with_savepoint: bool = False  # stop the running stream with a savepoint of its last batch (kept as a
    # recovery point of the state being replaced) instead of cancelling it
    resume_stream: bool = False  # launch session_stream after a successful restore


@dataclass(frozen=True)
class RestorePlan:
    """The verified savepoint and the runbook's settings (the one config block, on the first step)."""
    savepoint: SavepointInfo
    partitions: int | None
    migrate: bool
    dry_run: bool
    stop_stream: bool
    resume_stream: bool
    stop_with_savepoint: bool = False


@dataclass(frozen=True)
class RestoreOutcome:
    plan: RestorePlan
    result: RestoreResult | None  # None for a dry run

    @property
    def dry_run(self) -> bool:
        return self.result is None


@op(tags=LIFECYCLE_TAGS)
def validate_savepoint_op(context: OpExecutionContext, sessions: SessionsResource, config: RestoreConfig) -> RestorePlan:
    """The pre-flight first (`restore --dry-run`: settings, migrations, expected duration; nothing locked), then the
    savepoint's files re-read against its catalog row. A running stream is not a refusal here: the next step stops it."""
    preflight = expected_errors(plan_restore, sessions.config(), config.savepoint,
                                partitions=config.partitions or None, migrate=config.migrate)
    context.log.info(f"pre-flight of {preflight.savepoint_id}: restorable={preflight.restorable}, migrations "
                     f"{preflight.migrations or 'none'}, expected {preflight.expected_seconds:g} s")
    if preflight.savepoint_reasons:
        raise Failure(description="; ".join(preflight.savepoint_reasons),
                      metadata={"reasons": preflight.savepoint_reasons})
    saved = expected_errors(lifecycle.validate_savepoint, sessions.config(), config.savepoint, migrate=config.migrate)
    context.log.info(f"savepoint {saved.savepoint_id} verified: {saved.rows} rows, checksum {saved.checksum}")
    context.add_output_metadata({"savepoint_id": saved.savepoint_id, "rows": saved.rows,
                                 "batch_id": saved.batch_id, "checksum": saved.checksum,
                                 "migrations": preflight.migrations, "expected_seconds": preflight.expected_seconds})
    return RestorePlan(savepoint=saved, partitions=config.partitions or None, migrate=config.migrate,
                       dry_run=config.dry_run, stop_stream=config.stop_stream, resume_stream=config.resume_stream,
                       stop_with_savepoint=config.stop_with_savepoint)


def active_stream_runs(instance: DagsterInstance) -> list[DagsterRun]:
    return list(instance.get_runs(RunsFilter(job_name="session_stream", statuses=[
        DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
        DagsterRunStatus.STARTED])))


@op(tags=LIFECYCLE_TAGS)
def stop_running_stream_op(context: OpExecutionContext, sessions: SessionsResource, plan: RestorePlan) -> RestorePlan:
    """With stop_with_savepoint, stop the running stream with a savepoint of its last batch (stop_stream); cancel
    session_stream runs through the run coordinator (a queued run is dequeued, a started one terminated by the
    launcher), then wait until the job lock is free."""
    stopped = []
    kept: str | None = None
    if plan.stop_stream and not plan.dry_run:
        config = sessions.config()
        stream = running_stream(config)
        running = (DagsterRunStatus.STARTING, DagsterRunStatus.STARTED)

        def cancel(runs: list[DagsterRun]) -> None:
            for run in runs:
                context.log.info(f"cancelling session_stream run {run.run_id} ({run.status.value})")
                context.instance.run_coordinator.cancel_run(run.run_id)
                stopped.append(run.run_id)

        # Queued runs first: none may start a stream once this one stops.
        cancel([run for run in active_stream_runs(context.instance) if run.status not in running])
        if plan.stop_with_savepoint and stream is not None and stream.what == "run":
            deadline = time.monotonic() + config.stop_timeout_s + 30
            result = expected_errors(stream_control.stop_stream, config, savepoint=True)
            kept = result.savepoint.savepoint_id if result.savepoint else None
            context.log.info(f"stopped {result.stream} at batch {result.last_committed_batch}, savepoint {kept}")
            # The stopped stream's run is still closing its session: it ends by itself, successfully. Cancelling it
            # now would fail a run that did what was asked, so only runs still active after that are cancelled.
            while active_stream_runs(context.instance) and time.monotonic() < deadline:
                time.sleep(1)
        cancel(active_stream_runs(context.instance))
        deadline = time.monotonic() + config.stop_timeout_s + 30  # query.stop() itself may take stop_timeout_s
        while True:
            try:
                with job_lock(config, "restore runbook (probe)"):
                    break
            except JobRunning as busy:
                if time.monotonic() > deadline:
                    raise Failure(description=f"the stream did not stop within {config.stop_timeout_s:g} s "
                                              f"({busy}): stop it, then launch the runbook again") from None
                time.sleep(2)
    context.add_output_metadata({"stopped_runs": len(stopped), "stop_savepoint_id": kept or ""})
    return plan


@op(tags=LIFECYCLE_TAGS)
def restore_op(context: OpExecutionContext, sessions: SessionsResource, pyspark: PySparkResource,
               plan: RestorePlan) -> RestoreOutcome:
    saved = plan.savepoint
    if plan.dry_run:
        context.log.info(f"dry run: would restore {saved.savepoint_id} (batch {saved.batch_id}, {saved.rows} rows)")
        return RestoreOutcome(plan, None)
    result = expected_errors(lifecycle.restore, sessions.config(), saved.savepoint_id, partitions=plan.partitions,
                             migrate=plan.migrate, spark=pyspark.spark_session)
    context.add_output_metadata({k: v for k, v in result.to_dict().items() if isinstance(v, (int, float, str, bool))})
    return RestoreOutcome(plan, result)


@op(tags=LIFECYCLE_TAGS)
def verify_restore_op(context: OpExecutionContext, sessions: SessionsResource, pyspark: PySparkResource,
                      outcome: RestoreOutcome) -> RestoreOutcome:
    if outcome.result is None:
        return outcome
    if not outcome.result.verified:
        raise Failure(description=f"restored state does not match savepoint {outcome.result.savepoint_id}: "
                                  "run the restore again")
    report = status(sessions.config(), spark=pyspark.spark_session)
    context.log_event(AssetObservation(asset_key=STATE, metadata=state_metadata(report)))
    context.log.info(f"restored {outcome.result.savepoint_id}: {report.open_events} open events in state")
    return outcome


@job(tags=LIFECYCLE_TAGS, description="Runbook: validate -> stop stream -> restore -> verify (-> resume via sensor).")
def restore_from_snapshot() -> None:
    verify_restore_op(restore_op(stop_running_stream_op(validate_savepoint_op())))
