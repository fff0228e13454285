"""The restore runbook, started from the UI: validate -> stop the stream -> restore -> verify (-> resume
via a sensor), or validate -> report for a dry run. A running `session_stream` is not stopped by default (`online`):
it restores between two batches and goes on, and the run reports its downtime (the default: a real restore is a deliberate change of the
launchpad's config; the dry run's other steps show as skipped). Steps pass typed values (RestorePlan,
RestoreOutcome); a failed step's message is the library's one line, which says what to do next."""
import datetime as dt
import time
from collections.abc import Iterator
from dataclasses import dataclass

from dagster import (
    Config,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    Failure,
    MetadataValue,
    OpExecutionContext,
    Out,
    Output,
    RunsFilter,
    job,
    op,
)
from pydantic import Field

from assets.resources import SessionsResource, SessionsSpark, expected_errors
from assets.tables import LIFECYCLE_TAGS, REPORTS_VERSIONS_TAGS, only_new, written
from pipelines.coordination.job_leases import job_lock, running_stream
from pipelines.errors import JobRunning
from state_store import lifecycle, stream_control
from state_store.preflight import plan_restore
from state_store.results import RestoreResult, SavepointInfo
from state_store.status import status

DRY_RUN_TAG = "sessions/dry_run"  # on every runbook run: "true" for a dry run, "false" for a real restore
IN_PLACE_TAG = "sessions/restored_in_place"  # "true": the running stream restored and went on (nothing to resume)


class RestoreConfig(Config):
    savepoint: str = Field(default="latest", description=(
        "The savepoint to restore: an id (the savepoint_catalog asset lists them) or latest, the newest complete one."))
    partitions: int = Field(default=0, description=(
        "State partitions of the restored job; 0 keeps the savepoint's (another count rescales as it restores)."))
    migrate: bool = Field(default=False, description=(
        "Accept a savepoint taken with other gap or lateness settings (its open sessions are re-walked)."))
    dry_run: bool = Field(default=True, description=(
        "Only check that the savepoint restores with these settings and estimate how long it takes; nothing is "
        "stopped or changed. Set false for a real restore: it replaces the job's state and rolls the sessions "
        "table back to the savepoint."))
    canonical: bool = Field(default=False, description=(
        "Load the savepoint's canonical rows even when its native copy could be put back (a native copy is used "
        "only for the same provider, partitions and operator)."))
    online: bool = Field(default=True, description=(
        "A running session_stream restores the savepoint itself between two batches and goes on: no cancel, no "
        "relaunch; the run reports the stream's downtime. false: the stream is stopped first (stop_stream)."))
    stop_stream: bool = Field(default=True, description=(
        "Without online (or with no stream able to restore in place), a real restore first cancels a running "
        "session_stream run (the restore needs the job stopped)."))
    stop_with_savepoint: bool = Field(default=False, description=(
        "Keep a savepoint of the running stream's state as a recovery point of the state being replaced: taken "
        "beside it (online), or as it stops instead of cancelling it."))
    resume_stream: bool = Field(default=False, description=(
        "After a successful real restore, launch session_stream again (the resume_stream_after_restore sensor does, "
        "running by default); false: the stream stays stopped until someone launches it."))


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
    expected_seconds: float = 0.0  # the pre-flight's estimate of the restore
    online: bool = False
    canonical: bool = False


@dataclass(frozen=True)
class RestoreOutcome:
    plan: RestorePlan
    result: RestoreResult


@op(tags=LIFECYCLE_TAGS, out={"restore": Out(RestorePlan, is_required=False),
                              "dry_run": Out(RestorePlan, is_required=False)})
def validate_savepoint_op(context: OpExecutionContext, sessions: SessionsResource,
                          config: RestoreConfig) -> Iterator[Output[RestorePlan]]:
    """The pre-flight first (`restore --dry-run`: settings, migrations, expected duration; nothing locked), then the
    savepoint's files re-read against its catalog row. A running stream is not a refusal here: the next step stops it.
    Its one output picks the branch: `restore`, or `dry_run` (the restore's steps are then skipped)."""
    context.instance.add_run_tags(context.run_id, {DRY_RUN_TAG: str(config.dry_run).lower()})
    preflight = expected_errors(plan_restore, sessions.config(), config.savepoint,
                                partitions=config.partitions or None, migrate=config.migrate)
    context.log.info(f"pre-flight of {preflight.savepoint_id}: restorable={preflight.restorable}, migrations "
                     f"{preflight.migrations or 'none'}, expected {preflight.expected_seconds:g} s")
    if preflight.savepoint_reasons:
        raise Failure(description="; ".join(preflight.savepoint_reasons),
                      metadata={"reasons": preflight.savepoint_reasons})
    saved = expected_errors(lifecycle.validate_savepoint, sessions.config(), config.savepoint, migrate=config.migrate)
    context.log.info(f"savepoint {saved.savepoint_id} verified: {saved.rows} rows, checksum {saved.checksum}")
    plan = RestorePlan(savepoint=saved, partitions=config.partitions or None, migrate=config.migrate,
                       dry_run=config.dry_run, stop_stream=config.stop_stream, resume_stream=config.resume_stream,
                       stop_with_savepoint=config.stop_with_savepoint, expected_seconds=preflight.expected_seconds,
                       online=config.online, canonical=config.canonical)
    yield Output(plan, output_name="dry_run" if config.dry_run else "restore", metadata={
        "savepoint_id": saved.savepoint_id, "rows": saved.rows, "batch_id": saved.batch_id, "checksum": saved.checksum,
        "migrations": preflight.migrations, "expected_seconds": preflight.expected_seconds})


@op(tags=LIFECYCLE_TAGS)
def report_dry_run_op(context: OpExecutionContext, plan: RestorePlan) -> None:
    """A dry run's end: what a real restore would do, and how to start one. Nothing was stopped or changed."""
    saved = plan.savepoint
    step = ("launch restore_from_snapshot again with dry_run: false (ops.validate_savepoint_op.config) to restore "
            f"{saved.savepoint_id}")
    context.log.info(f"dry run: nothing was stopped or changed; a restore of {saved.savepoint_id} (batch "
                     f"{saved.batch_id}, {saved.rows} rows) would take about {plan.expected_seconds:g} s; {step}")
    context.add_output_metadata({"dry_run": True, "savepoint_id": saved.savepoint_id, "batch_id": saved.batch_id,
                                 "rows": saved.rows, "expected_seconds": plan.expected_seconds, "next_step": step})


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
    config = sessions.config()
    stream = running_stream(config)
    if plan.online and stream is not None and stream.what == "run":
        # The stream restores in place (restore_op asks it); the recovery point, if wanted, is taken beside it.
        if plan.stop_with_savepoint:
            kept = expected_errors(lifecycle.take_savepoint, config, trigger="pre-restore").savepoint_id
        context.log.info(f"{stream.describe()} restores in place between two batches: not stopped"
                         + (f"; savepoint {kept} kept of the state it replaces" if kept else ""))
    elif plan.stop_stream:
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
def restore_op(context: OpExecutionContext, sessions: SessionsResource, pyspark: SessionsSpark,
               plan: RestorePlan) -> RestoreOutcome:
    saved, config = plan.savepoint, sessions.config()
    # A running stream restores in its own session: this run only asks and waits, and starts no JVM.
    stream = running_stream(config) if plan.online else None
    in_place = stream is not None and stream.what == "run"
    result = expected_errors(lifecycle.restore, config, saved.savepoint_id, partitions=plan.partitions,
                             migrate=plan.migrate, spark=None if in_place else pyspark.spark_session,
                             online=plan.online, canonical=plan.canonical)
    if result.stream is not None:
        context.instance.add_run_tags(context.run_id, {IN_PLACE_TAG: "true"})
        context.log.info(f"{result.stream} restored {result.savepoint_id} between two batches and went on; "
                         f"downtime {result.downtime_seconds} s")
    context.add_output_metadata({**{k: v for k, v in result.to_dict().items() if isinstance(v, (int, float, str, bool))},
                                 **({"phases": MetadataValue.json(result.phases)} if result.phases else {})})
    return RestoreOutcome(plan, result)


@op(tags=LIFECYCLE_TAGS)
def verify_restore_op(context: OpExecutionContext, sessions: SessionsResource, pyspark: SessionsSpark,
                      outcome: RestoreOutcome) -> RestoreOutcome:
    result = outcome.result
    if not result.verified:
        raise Failure(description=f"restored state does not match savepoint {result.savepoint_id}: "
                                  "run the restore again")
    config = sessions.config()
    report = status(config, spark=pyspark.spark_session)
    for event in only_new(context.instance, written(config, report, now=dt.datetime.now(dt.timezone.utc))):
        context.log_event(event)  # the state it built, the sessions table rolled back to the savepoint
    after = f"the events after savepoint {result.savepoint_id} (its batch {result.batch_id})"
    step = (f"nothing to resume: the running stream restored in place and processes {after}"
            if result.stream is not None else
            f"the resume_stream_after_restore sensor launches session_stream now: it processes {after}"
            if outcome.plan.resume_stream else
            f"resume the stream: launch session_stream (or `sessionctl run`); it processes {after}")
    context.log.info(f"restored {result.savepoint_id}: {report.open_events} open events in state; next: {step}")
    context.add_output_metadata({"savepoint_id": result.savepoint_id, "open_sessions": report.open_sessions,
                                 "open_events": report.open_events, "next_step": step})
    return outcome


@job(tags={**LIFECYCLE_TAGS, **REPORTS_VERSIONS_TAGS}, description=(
    "Runbook: validate -> stop stream -> restore -> verify (-> resume via sensor); a running stream restores in "
    "place between two batches instead (online). Launched unchanged it is a dry "
    "run (validate -> report; the other steps skipped): set dry_run: false to restore."))
def restore_from_snapshot() -> None:
    restore, dry_run = validate_savepoint_op()
    report_dry_run_op(dry_run)
    verify_restore_op(restore_op(stop_running_stream_op(restore)))
