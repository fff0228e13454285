"""The jobs by their contract names: the stream, catch-up (the catch_up assets), savepoint, rescale,
compaction. Each op calls one library operation and reports what it returned."""
import datetime as dt
import signal
import threading
from typing import Any

from dagster import (
    AssetObservation,
    Config,
    DagsterExecutionInterruptedError,
    Failure,
    MetadataValue,
    OpExecutionContext,
    job,
    op,
)
from pydantic import Field

from assets import erasure_runs
from assets.resources import SessionsResource, SessionsSpark, expected_errors
from assets.tables import LIFECYCLE_TAGS, REPORTS_VERSIONS_TAGS, SESSIONS, STATE, STREAM_TAGS, only_new, written
from pipelines.config_checks import positive_seconds
from pipelines.coordination.job_leases import running_stream
from pipelines.job import stream
from pipelines.job.run_summary import RunSummary
from pipelines.job.sink import MicroBatchSink
from state_store import erasure, erasure_requests, kernel, lifecycle, maintenance, state, stream_control, verification
from state_store import rescale as rescaling
from state_store.results import OperatorTrigger, SavepointInfo
from state_store.status import status

__all__ = ["CompactionConfig", "ForgetConfig", "LookupConfig", "RescaleConfig", "SavepointConfig", "StopConfig",
           "StreamConfig", "catch_up_op", "compaction", "compaction_op", "forget_user", "forget_user_op", "lookup_state_op", "rescale",
           "rescale_op", "savepoint", "savepoint_op", "session_catch_up", "session_stream", "state_lookup",
           "stop_stream", "stop_stream_op", "stream_op"]

@op(tags=LIFECYCLE_TAGS)
def catch_up_op(context: OpExecutionContext, sessions: SessionsResource, pyspark: SessionsSpark) -> None:
    """Ingest everything landed and process it (trigger availableNow), then stop; each table version and the state's
    batch it made is a materialization (with the ingest's and the stream's figures in the run's log)."""
    config, spark = sessions.config(), pyspark.spark_session
    summary = expected_errors(stream.catch_up, config, spark=spark)
    context.log.info(f"ingested {summary.ingested_rows} rows from {summary.ingested_files} files "
                     f"({summary.rejected_lines} rejected); {summary.to_dict()}")
    for event in only_new(context.instance, written(config, status(config, spark=spark),
                                                    now=dt.datetime.now(dt.timezone.utc))):
        context.log_event(event)


@job(tags={**LIFECYCLE_TAGS, **REPORTS_VERSIONS_TAGS},
     description="Process everything landed, then stop (catch-up: the stream with trigger availableNow). "
                 "Materializes raw_events, sessions, quarantine, session_state.")
def session_catch_up() -> None:
    catch_up_op()


class StreamConfig(Config):
    poll_seconds: float = Field(default=5.0, description=(
        "Seconds between looks for newly landed files (or Kafka messages) while the stream is idle."))


@op(tags=STREAM_TAGS)
def stream_op(context: OpExecutionContext, sessions: SessionsResource, pyspark: SessionsSpark,
              config: StreamConfig) -> None:
    """Runs until the run is cancelled from the UI; the query is then stopped cleanly. The tables' new versions are
    reported by the observation sensor (assets.observations), once each, as for a stream started by the CLI."""
    stop = threading.Event()
    poll_seconds = expected_errors(positive_seconds, config.poll_seconds, "poll_seconds")  # 0 would spin

    def progress(summary: RunSummary, sink: MicroBatchSink) -> None:
        context.log.info(f"batches={summary.batches} input_rows={summary.input_rows} "
                         f"sessions_written={sink.sessions_written}")

    # A cancel from the UI reaches the step's process as SIGINT, which Dagster would hold until the op next reports
    # something: while the stream runs, SIGINT is a clean stop of the query (also of an idle stream), and the run then
    # ends cancelled. Signal handlers belong to the main thread, where Dagster's executors run a step; a step run off
    # it (execute_in_process from a thread) is sent no signal to handle.
    cancelled = threading.Event()

    def cancel(_signal: int, _frame: object) -> None:
        cancelled.set()
        stop.set()

    on_main = threading.current_thread() is threading.main_thread()
    held = signal.signal(signal.SIGINT, cancel) if on_main else None
    try:
        summary = expected_errors(stream_control.run_stream, sessions.config(), spark=pyspark.spark_session,
                                  stop=stop, poll_seconds=poll_seconds, on_progress=progress)
    finally:
        stop.set()
        if on_main:
            signal.signal(signal.SIGINT, held)
    if cancelled.is_set():
        context.log.info(f"stream cancelled from the UI; stopped at batch {summary.last_committed_batch}")
        raise DagsterExecutionInterruptedError("session_stream cancelled")
    context.log.info(f"stream stopped ({summary.stopped_by}) at batch {summary.last_committed_batch}")
    if summary.savepoint:
        context.log_event(AssetObservation(asset_key=STATE, metadata=_savepoint_metadata(
            SavepointInfo.from_row(summary.savepoint))))


@job(tags=STREAM_TAGS, description="The stream, until the run is cancelled or the stop_stream job stops it.")
def session_stream() -> None:
    stream_op()


class SavepointConfig(Config):
    # A Literal: Dagster offers the choices and refuses any other at launch.
    trigger: OperatorTrigger = Field(default="manual", description=(
        "Why the savepoint is taken, kept in the catalog: manual, scheduled or sensor."))
    native: bool | None = Field(default=None, description=(
        "Also keep the checkpoint's own files of the batch (a native copy): a restore to the same provider, "
        "partitions and operator is then a file copy instead of a bootstrap batch. Unset: SESSIONS_SAVEPOINT_NATIVE."))


@op(tags=LIFECYCLE_TAGS)
def savepoint_op(context: OpExecutionContext, sessions: SessionsResource, pyspark: SessionsSpark,
                 config: SavepointConfig) -> SavepointInfo:
    settings = sessions.config()
    expected_errors(kernel.give_way_to_stream, settings)  # before the session starts: its JVM inherits the priority
    saved = expected_errors(lifecycle.take_savepoint, settings, trigger=config.trigger,
                            spark=pyspark.spark_session, native_copy=config.native)
    context.log_event(AssetObservation(asset_key=STATE, metadata=_savepoint_metadata(saved)))
    return saved


def _savepoint_metadata(saved: SavepointInfo) -> dict[str, Any]:
    return {"savepoint_id": saved.savepoint_id, "batch_id": saved.batch_id, "rows": saved.rows,
            "bytes": saved.bytes or 0, "seconds": saved.seconds or 0.0, "uri": saved.uri, "checksum": saved.checksum,
            "trigger": saved.trigger, "native_bytes": saved.native_bytes or 0}


@job(tags=LIFECYCLE_TAGS, description="Savepoint at the last committed batch; the stream may keep running.")
def savepoint() -> None:
    savepoint_op()


class StopConfig(Config):
    savepoint: bool = Field(default=True, description=(
        "Take the savepoint of the stream's last batch as part of the stop (stop-with-savepoint)."))
    native: bool | None = Field(default=None, description=(
        "With savepoint: keep its native copy too (the checkpoint's own files of the batch). Unset: "
        "SESSIONS_SAVEPOINT_NATIVE."))


@op
def stop_stream_op(context: OpExecutionContext, sessions: SessionsResource, config: StopConfig) -> dict[str, Any]:
    """Asks the running stream (a session_stream run or `sessionctl run`, any host) to stop after its current batch
    and, when asked, to take the savepoint of that batch before it lets go of the job lease; waits for the answer."""
    result = expected_errors(stream_control.stop_stream, sessions.config(), savepoint=config.savepoint,
                             native_copy=config.native)
    context.log.info(f"stopped {result.stream} at batch {result.last_committed_batch}")
    if result.savepoint is not None:
        context.log_event(AssetObservation(asset_key=STATE, metadata=_savepoint_metadata(result.savepoint)))
    return result.to_dict()


# Not lifecycle-tagged: it only asks the stream, and must not queue behind the savepoint it asks for.
@job(description="Stop the running stream after its current batch, with the savepoint of that batch (stop-with-savepoint).")
def stop_stream() -> None:
    stop_stream_op()


class RescaleConfig(Config):
    partitions: int = Field(description="The new number of state partitions. A running stream does the rescale "
                                        "itself between two batches and goes on; the run reports its downtime.")


@op(tags=LIFECYCLE_TAGS)
def rescale_op(context: OpExecutionContext, sessions: SessionsResource, pyspark: SessionsSpark,
               config: RescaleConfig) -> None:
    settings = sessions.config()
    # Beside a running stream this run prepares the rescale (a savepoint and a side checkpoint, in its own session,
    # at the lower priority: before the session starts, its JVM inherits it); the stream swaps it in.
    stream = running_stream(settings)
    if stream is not None and stream.what == "run":
        expected_errors(kernel.give_way_to_stream, settings)
    result = expected_errors(rescaling.rescale, settings, config.partitions, spark=pyspark.spark_session)
    context.log_event(AssetObservation(asset_key=STATE, metadata={
        **{k: v for k, v in result.to_dict().items() if isinstance(v, (int, float, str)) and v is not None},
        **({"phases": MetadataValue.json(result.phases)} if result.phases else {})}))


@job(tags=LIFECYCLE_TAGS, description="Change the state partitions, keeping all state (a running stream does it "
     "between two batches and goes on).")
def rescale() -> None:
    rescale_op()


class CompactionConfig(Config):
    dry_run: bool = Field(default=False, description=(
        "Only report what OPTIMIZE, VACUUM and savepoint retention would remove (retention: SESSIONS_KEEP_SAVEPOINTS, "
        "SESSIONS_KEEP_DAILY_DAYS, SESSIONS_VACUUM_RETENTION_HOURS)."))


@op(tags=LIFECYCLE_TAGS)
def compaction_op(context: OpExecutionContext, sessions: SessionsResource, config: CompactionConfig) -> None:
    report = expected_errors(maintenance.compact, sessions.config(), dry_run=config.dry_run)
    context.log_event(AssetObservation(asset_key=SESSIONS, metadata={
        "bytes_reclaimed": report.bytes_reclaimed, "bytes_before": report.bytes_before,
        "bytes_after": report.bytes_after, "files_before": report.files_before,
        "files_after": report.files_after, "savepoints_deleted": len(report.savepoints_deleted),
        "seconds": report.seconds}))


@job(tags=LIFECYCLE_TAGS, description="OPTIMIZE + VACUUM, savepoint retention, replaced checkpoints removed.")
def compaction() -> None:
    compaction_op()


class LookupConfig(Config):
    user_id: str = Field(default="", description="One user's open sessions: set this, or top (not both).")
    top: int = Field(default=0, description="The N largest open sessions (a hot-key view): set this, or user_id.")


@op
def lookup_state_op(context: OpExecutionContext, sessions: SessionsResource, pyspark: SessionsSpark,
                    config: LookupConfig) -> None:
    """Live state, read from the committed state store of the running or stopped job (queryable state). What it
    finds is the output's metadata (the run's event log), never an output value: the IO manager would keep the user
    ids in a file of the run's storage directory, which forget_user deletes with the run."""
    if bool(config.user_id) == bool(config.top) or config.top < 0:  # before Spark starts (a lazy session)
        raise Failure(description="set exactly one of user_id and top (a count >= 1)", allow_retries=False,
                      metadata={"next_step": "set user_id: <a user> or top: <N> in ops.lookup_state_op.config"})
    spark = pyspark.spark_session
    if config.user_id:
        found = expected_errors(state.lookup_user, spark, sessions.config(), config.user_id)
        rows = found["open_sessions"]
    else:
        found = expected_errors(state.top_sessions, spark, sessions.config(), config.top)
        rows = found["top"]
    table = ["| user | session | start | last event | events | page views | closes at |", "|---|---|---|---|---|---|---|"]
    table += [f"| {r.get('user_id', config.user_id)} | {r['session_id']} | {r['session_start']} | {r['last_event']} "
              f"({r['last_event_type']}) | {r['events']} | {r['page_views']} | {r['closes_at']} |" for r in rows]
    context.add_output_metadata({"batch_id": found["batch_id"], "watermark": str(found["watermark"]),
                                 "open_sessions": len(rows), "sessions": MetadataValue.md("\n".join(table))})


@job(description="Look inside the state: one user's open sessions (user_id) or the N largest (top).")
def state_lookup() -> None:
    lookup_state_op()


class ForgetConfig(Config):
    # The users to erase. Dagster's run storage keeps them in this run's config: a forget deletes every other run whose
    # config or tags (a state_lookup: also its event log) name one of them, with its storage directory; this run itself
    # is deleted by the erasure_runs_cleanup sensor once finished (assets/erasure_runs.py).
    user_id: str = Field(default="", description="A user to erase from every table, the live state and every "
                         "savepoint (or list them in users).")
    users: list[str] = Field(default=[], description="Users to erase, all in one erasure (about the cost of one); "
                             "with user_id, both.")
    request_files: list[str] = Field(default=[], description="Erasure request files (names of *.users files at "
                                     "SESSIONS_ERASURE_REQUESTS_URI) whose users to erase too; deleted once they are "
                                     "erased. The erasure_requests sensor sets it.")
    verify_only: bool = Field(default=False, description="Only say where the users still appear; erase nothing.")

    def user_ids(self) -> list[str]:
        return list(dict.fromkeys(u for u in [self.user_id, *self.users] if u))


@op(tags=LIFECYCLE_TAGS)
def forget_user_op(context: OpExecutionContext, sessions: SessionsResource, pyspark: SessionsSpark,
                   config: ForgetConfig) -> None:
    """`sessionctl forget --user U [--user V ...]` (or `--verify`): the erasure log and this op's metadata name the
    users by keyed hash only; no output value (the IO manager would keep them). Then Dagster's own run storage: the
    other runs naming a user are deleted (`dagster_runs_deleted`; a run still going is left and counted,
    `dagster_runs_unfinished`), or with verify_only counted (`found_dagster_runs`: not clean while any)."""
    settings = sessions.config()
    requests = expected_errors(erasure_requests.read_requests, settings, config.request_files) \
        if config.request_files else None
    if requests is not None and requests.refused:
        context.log.warning("request files left in place: " + "; ".join(f"{name}: {why}" for name, why
                                                                        in requests.refused.items()))
    users = list(dict.fromkeys([*config.user_ids(), *(requests.user_ids if requests else [])]))
    if not users and requests is not None:  # erased and deleted by an earlier run: nothing is pending
        context.add_output_metadata({"request_files": 0, "users": 0, "refused_files": len(requests.refused)})
        return
    if not users:  # before Spark starts (a lazy session)
        raise Failure(description="set user_id or users: nobody to erase", allow_retries=False,
                      metadata={"next_step": "set users: [<a user>, ...] in ops.forget_user_op.config"})
    spark = pyspark.spark_session
    if config.verify_only:
        found = expected_errors(verification.verify_many, settings, users, spark=spark)
        runs = erasure_runs.runs_naming(context.instance, users, besides=context.run_id)
        context.add_output_metadata({"clean": found.clean and not runs,
                                     **{f"found_{k}": v for k, v in found.found.items()},
                                     "found_dagster_runs": len(runs),
                                     "unreadable_files": len(found.users[0].unreadable),
                                     "users": len(users), "users_clean": sum(u.clean for u in found.users)})
        return
    result = expected_errors(erasure.forget, settings, users, spark=spark)
    deleted, unfinished = erasure_runs.delete_runs_naming(context.instance, users, besides=context.run_id)
    if requests is not None:  # last: a failure before leaves them pending for the next run
        erasure_requests.close_requests(settings, requests)
    if unfinished:
        context.log.warning(f"{unfinished} Dagster run(s) naming an erased user are still going: run forget_user "
                            "again once they have finished")
    context.add_output_metadata({"erasure_id": result.erasure_id, "user_hash": result.user_hash,
                                 "users": len(result.users),
                                 "user_hashes": MetadataValue.json([u.user_hash for u in result.users]),
                                 **{f"removed_{k}": v for k, v in result.removed.items()},
                                 "purged_files": result.purged_files, "dagster_runs_deleted": deleted,
                                 "dagster_runs_unfinished": unfinished,
                                 "request_files": len(requests.files) if requests else 0,
                                 "refused_files": len(requests.refused) if requests else 0})


@job(tags=LIFECYCLE_TAGS, description="Erase users everywhere (one or many in one run): tables, live state, "
     "savepoints, older table versions.")
def forget_user() -> None:
    forget_user_op()
