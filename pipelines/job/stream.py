"""The streaming query and its two run loops: `catch_up` (availableNow, then stop) and `run_continuously` (until
stopped: by the caller's event, Ctrl-C, or a stop request from `sessionctl stop` on any host). What a loop did is a
RunSummary (pipelines.job.run_summary); a rescale or a restore between two batches, pipelines.job.state_changes."""
from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from pipelines.config import SessionsConfig
from pipelines.coordination.job_leases import job_lock
from pipelines.coordination.leases import Lease
from pipelines.coordination.requests import (
    ErasureAnswer,
    ErasureRequest,
    RescaleRequest,
    RestoreRequest,
    StopAnswer,
    StopRequest,
    StreamRequest,
    answer_request,
    pending_request,
    withdraw,
)
from pipelines.core.rules import compare
from pipelines.errors import ConfigError, LeaseLost, SessionsError, StorageUnavailable
from pipelines.ingest import LargeInput, ingest
from pipelines.job.checkpoint import JobMetadata, batch_source_range, inspect_checkpoint
from pipelines.job.ingest_tasks import SparkIngestTasks
from pipelines.job.operators.seam import StateOperator, keyed_events
from pipelines.job.run_retries import RetryingIngest as _RetryingIngest
from pipelines.job.run_retries import ride_out
from pipelines.job.run_summary import RunSummary
from pipelines.job.runtime import (
    ERRORS_LOG,
    explain_spark_failure,
    fenced_logs,
    get_spark,
    prepare_session,
    spark_failures,
    stop_state_stores,
)
from pipelines.job.sink import MicroBatchSink
from pipelines.job.source import SOURCE_NAME, fields_option
from pipelines.job.startup import checkpoint_metadata, ensure_tables
from pipelines.job.state_changes import OnStateChange, Resumed, batch_end, change_state, first_line
from pipelines.locations import hdfs_outage
from pipelines.spec_file import read_spec
from pipelines.storage import (
    is_object_store_failure,
    is_s3,
    object_store_errors,
    s3_failure,
    s3_limits,
    storage_options,
)

__all__ = ["catch_up", "raw_events_stream", "run_continuously", "start_query"]

log = logging.getLogger(__name__)


def raw_events_stream(spark: SparkSession, config: SessionsConfig,
                      *, source_options: dict[str, Any] | None = None) -> DataFrame:
    """The stream of raw_events rows of `config`'s table, with its session settings."""
    prepare_session(spark, config)
    reader = (spark.readStream.format(SOURCE_NAME)
              .option("path", config.raw_events_table)
              .option("fields", fields_option(config.session_spec.operator_fields)))
    if config.max_versions_per_batch:
        reader = reader.option("maxVersionsPerTrigger", str(config.max_versions_per_batch))
    for key, value in (source_options or {}).items():
        reader = reader.option(key, str(value))
    return reader.load()


def start_query(spark: SparkSession, config: SessionsConfig, meta: JobMetadata, operator: StateOperator,
                *, trigger: dict[str, Any], source_options: dict[str, Any] | None = None,
                lease: Lease | None = None) -> tuple[StreamingQuery, MicroBatchSink]:
    """The query of the checkpoint `meta` describes, run by `operator`. With `lease` (the job lease this process
    holds) the sink checks it before every batch and fences every commit by it (pipelines.coordination.fencing)."""
    rules = meta.rules  # the run's own, recorded at its start (pipelines.job.startup)
    events = keyed_events(raw_events_stream(spark, config, source_options=source_options), rules)
    output = operator.apply(events, rules)
    checkpoint = config.checkpoint
    sink = MicroBatchSink(config.sessions_table, config.quarantine_table, config.raw_events_table, meta.incarnation,
                          seq_range=lambda batch_id: batch_source_range(checkpoint, batch_id),
                          storage_options=storage_options(config, config.warehouse_uri), lease=lease,
                          attributes=rules.attributes)
    writer = output.writeStream.queryName("sessions").option("checkpointLocation", str(config.checkpoint)) \
        .trigger(**trigger)
    query = writer.foreachBatch(sink).start()
    return query, sink


@dataclass
class _Run:
    spark: SparkSession
    meta: JobMetadata
    operator: StateOperator
    lease: Lease
    summary: RunSummary
    last_batch_end: float | None = None  # epoch s: the end of the last batch a query of this run ran (Spark's progress)


@contextmanager
def _job(config: SessionsConfig, what: str, spark: SparkSession | None,
         meanwhile: Callable[[RunSummary], None] | None = None) -> Iterator[_Run]:
    """The head both loops share: the job lease, the tables, the checkpoint's metadata and the session.

    `meanwhile` (catch-up's ingest) runs under the lease in a thread while the Spark JVM starts: the two are seconds
    each and use different processes (2M events: ingest ~4 s, JVM start ~5 s). Its error, if any, is raised here.

    A job lease lost on the way (another process took it over: this one was paused or starved past the TTL) ends the
    block with LeaseLost, one line naming the lease and the newer holder -- whatever failed because of it (the query,
    a fenced commit) -- and it is never released (pipelines.coordination.leases)."""
    started = time.monotonic()
    # s3_limits: the run's own S3 requests (ingest, and between two batches a savepoint's native copy, an erasure, a
    # restore) wait and retry as SESSIONS_S3_TIMEOUT / SESSIONS_S3_MAX_RETRIES say, as a lifecycle command's do
    with job_lock(config, what) as held, s3_limits(config):
        ensure_tables(config)
        meta, operator = checkpoint_metadata(config)
        summary = RunSummary()
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{what}-meanwhile") as pool:
            pending = (pool.submit(contextvars.copy_context().run, meanwhile, summary)  # the limits hold there too
                       if meanwhile is not None and spark is None else None)
            begun = time.monotonic()
            with spark_failures(config):
                spark = spark or get_spark(config)
            summary.timed("spark", begun)
            if pending is not None:
                pending.result()
            elif meanwhile is not None:
                meanwhile(summary)
        run = _Run(spark, meta, operator, held, summary)
        summary.lease_epoch = held.epoch
        try:
            with fenced_logs(spark, config.checkpoint, held):  # Spark's own log writes too, in its JVM
                yield run
        except Exception:
            if held.lost is not None:  # whatever it failed of (the query, a commit), it is the lost lease to report
                raise held.lost from None
            try:  # a run frozen past its TTL can fail on Spark's own log (another writer) before any check saw it
                held.check()
            except LeaseLost as lost:
                raise lost from None
            raise
        run.summary.last_committed_batch = inspect_checkpoint(config.checkpoint).last_committed_batch
        run.summary.seconds = round(time.monotonic() - started, 3)


def _close(run: _Run, query: StreamingQuery, sink: MicroBatchSink, config: SessionsConfig) -> None:
    """The tail both loops share: the counts (of the batches it committed, failed or not), then a failed query as the
    typed one line: StorageUnavailable when the warehouse's object store failed it (in the sink, or in the source's
    Python workers: recognised by the failure's text) or an HDFS outage the checkpoint's, else explain_spark_failure's."""
    run.summary.absorb_progress(query)
    run.summary.sessions_written, run.summary.quarantined = sink.sessions_written, sink.quarantined
    failure = query.exception()
    if failure is None:
        return
    outage = hdfs_outage(config.checkpoint, failure)
    if sink.unavailable is None and outage is not None:  # `run` rides it out as it rides out S3's
        _log_details(config, failure)
        raise StorageUnavailable(outage)
    if sink.unavailable is None and not (is_s3(config.warehouse_uri) and is_object_store_failure(failure)):
        raise explain_spark_failure(failure, config)
    _log_details(config, failure)
    raise sink.unavailable or s3_failure(failure, config.warehouse_uri)


def _log_details(config: SessionsConfig, failure: BaseException) -> None:
    """The whole failure into $SESSIONS_HOME/logs/errors.log (the run's line says only the cause)."""
    with suppress(OSError):
        config.log_dir.mkdir(parents=True, exist_ok=True)
        with (config.log_dir / ERRORS_LOG).open("a") as details:
            details.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')} query failed (storage)\n{failure}\n")


def _tasks(config: SessionsConfig, spark: SparkSession) -> LargeInput:
    """Large landed files read by the job's Spark tasks (pipelines.job.ingest_tasks), or here
    (SESSIONS_INGEST_BY_TASKS)."""
    if not config.large_files_by_tasks:
        return "read"
    return SparkIngestTasks(spark, min_bytes=config.ingest_task_mib * 1024 * 1024)


def catch_up(config: SessionsConfig, spark: SparkSession | None = None) -> RunSummary:
    """Ingest everything landed, process it all (trigger availableNow), stop.

    The ingest runs while the Spark JVM starts; with SESSIONS_INGEST_BY_TASKS in force, a large landed file
    (SESSIONS_INGEST_TASK_MIB) and every file after it wait for the session, whose tasks read and parse it."""
    deferred: list[int] = []

    def ingest_timed(summary: RunSummary, large: LargeInput = "defer" if config.large_files_by_tasks else "read") -> None:
        begun = time.monotonic()
        with object_store_errors(config.raw_events_table):  # the landing's are StorageUnavailable already
            result = ingest(config, large=large)
        summary.add_ingest(result)
        deferred.append(result.deferred)
        summary.timed("ingest" if isinstance(large, str) else "ingest_tasks", begun)

    with _job(config, "catch-up", spark, meanwhile=ingest_timed) as run:
        if deferred and deferred[-1]:
            with spark_failures(config):
                ingest_timed(run.summary, _tasks(config, run.spark))
        with spark_failures(config):
            begun = time.monotonic()
            query, sink = start_query(run.spark, config, run.meta, run.operator, trigger={"availableNow": True},
                                      lease=run.lease)
            run.summary.timed("query_start", begun)
            begun = time.monotonic()
            try:
                query.awaitTermination()
                run.summary.timed("stream", begun)
            finally:
                _stop_idle_state_stores(run.spark)  # before the lease is free
        _close(run, query, sink, config)
    return run.summary


def _stop_idle_state_stores(spark: SparkSession) -> None:
    """A stopped query's stores stopped too: RocksDB's maintenance would still upload into the checkpoint's directory,
    which a restore taking the job lease next gives to a new checkpoint (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY at
    its first batch). Spark stops them JVM-wide, so not while another query of this JVM runs."""
    if not spark.streams.active:
        stop_state_stores(spark)


# Called by the run loop when a stop request asked for a savepoint: the query is stopped, the job lease still held.
# Returns the savepoint's fields (the state layer takes it; this layer does not know how).
OnStop = Callable[[StopRequest, SparkSession], "dict[str, Any] | None"]


@dataclass(frozen=True)
class SpecChanged:
    """SESSIONS_SPEC's file holds another spec this run can take (pipelines.core.rules.compare): the query stops
    between two batches and starts again under it."""


class _SpecWatch:
    """Whether the spec file changed under the running stream. A file that cannot be read or parsed, or that changes
    an attribute's definition, is one log line (once per content) and the run goes on under the spec it has."""

    def __init__(self) -> None:
        self.said: set[str] = set()

    def moved(self, config: SessionsConfig) -> bool:
        if not config.spec:
            return False
        try:
            changes = compare(config.rules, replace(config.rules, spec=read_spec(config.spec)))
            refused = changes.refusals("the stream runs", how="stop the job and restore a savepoint with "
                                       "`sessionctl restore --migrate`")
            if refused:
                raise ConfigError(refused[0])
        except ConfigError as refused:
            if str(refused) not in self.said:
                self.said.add(str(refused))
                log.error("the session spec was not taken; the stream goes on under the one it has: %s", refused)
            return False
        return not changes.none


def _drain(query: StreamingQuery, timeout_s: float) -> None:
    """Let the batch in flight commit (bounded), then stop: a stop between batches replays nothing."""
    deadline = time.monotonic() + timeout_s
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.1)
    query.stop()


def run_continuously(config: SessionsConfig, *, spark: SparkSession | None = None, stop: threading.Event | None = None,
                     poll_seconds: float = 5.0,
                     on_progress: Callable[[RunSummary, MicroBatchSink], None] | None = None,
                     on_stop_request: OnStop | None = None, on_erasure: OnErase | None = None,
                     on_state_change: OnStateChange | None = None) -> RunSummary:
    """Ingest and process until `stop` is set, Ctrl-C, or a stop request (`sessionctl stop`) names this run's
    lease; then stop the query between batches. A stop request is answered before the lease is released.
    An erasure request (`sessionctl forget` beside this stream) is applied between two batches by `on_erasure`,
    answered, and the stream goes on from the checkpoint the erasure left. A rescale or a restore request
    (`sessionctl rescale`, `sessionctl restore --online` beside this stream) likewise by `on_state_change`, answered
    once the first batch after it ran (its downtime measured by Spark's progress times: the end of the last batch
    before to the end of the first after).
    A source that cannot be read (SourceUnavailable, SourceDataLost, StorageUnavailable of the landing) does not end
    the run: logged (logger `pipelines.job.stream`) as its one line, counted in the summary, retried with backoff
    (_RetryingIngest); a stop is still noticed within a second while it waits.
    Nor does a query that the warehouse's object store failed (StorageUnavailable: S3 did not answer while its
    source read raw_events or its sink committed): one line, counted (`storage_errors`), a wait with the same backoff
    (a stop or an erasure request still answered meanwhile), and the query starts again from its checkpoint -- the
    failed batch runs again, and the sink's appends it had committed are not made twice. Any other failure of the
    query ends the run with its one line."""
    stop = stop or threading.Event()
    tick = min(poll_seconds, 1.0)  # how often a stop is noticed; ingest and progress still every poll_seconds
    watch = _SpecWatch()
    with _job(config, "run", spark) as run:
        summary = run.summary
        request: StreamRequest | SpecChanged | None = None
        resumed: Resumed | None = None  # a state change done, answered once the first batch after it ran
        ingest_now = _RetryingIngest(config, summary, poll_seconds, run.lease, large=_tasks(config, run.spark))
        wait = 0.0 if stop.is_set() else ingest_now()
        try:
            while not stop.is_set():  # a Ctrl-C while the JVM started: stop before the query does
                try:
                    request = _run_query(config, run, stop, tick, poll_seconds, ingest_now, wait, on_progress, resumed,
                                         watch)
                except StorageUnavailable as failure:
                    request, wait = ride_out(config, run.lease, stop, tick, ingest_now.query_failed(failure)), 0.0
                    if request is None:
                        continue  # the query again (or the stop the caller asked for meanwhile)
                if resumed is not None and resumed.answered:
                    resumed = None
                if isinstance(request, SpecChanged):
                    # A new configuration object reads the file again (SessionsConfig.session_spec is read once per
                    # object); its metadata records the spec, the sessions table gains the added attributes' columns.
                    config = replace(config)
                    ensure_tables(config)
                    run.meta, run.operator = checkpoint_metadata(config)
                    ingest_now.config = config  # lines ingested from now on are read by the new input part
                elif isinstance(request, ErasureRequest):
                    _answer_erasure(config, run, request, on_erasure)
                elif isinstance(request, (RescaleRequest, RestoreRequest)):
                    if resumed is not None:  # a second change before the first one's batch after: answer the first
                        resumed.answer(config, None)
                    withdraw(config, request)  # taken: answered later (after the first batch), never taken twice
                    try:
                        changed = change_state(config, request, on_state_change, spark=run.spark, lease=run.lease,
                                               before_end=run.last_batch_end, poll_seconds=poll_seconds)
                    finally:
                        run.meta, run.operator = checkpoint_metadata(config)  # the rescaled (or restored) checkpoint
                    resumed = changed  # only once that read: a checkpoint the query cannot run on is not resumed
                else:
                    break
                request, wait = None, 0.0
        finally:
            if resumed is not None and not resumed.answered:  # stopped before a batch ran after the change
                resumed.answer(config, None)
        _stop_idle_state_stores(run.spark)  # before a stop request is answered or the lease is free
        summary.stopped_by = "stop request" if isinstance(request, StopRequest) else "caller"
        if isinstance(request, StopRequest):
            _answer(config, run, request, on_stop_request)
    return summary


def _run_query(config: SessionsConfig, run: _Run, stop: threading.Event, tick: float, poll_seconds: float,
               ingest_now: _RetryingIngest, wait: float,
               on_progress: Callable[[RunSummary, MicroBatchSink], None] | None,
               resumed: Resumed | None = None, watch: _SpecWatch | None = None) -> StreamRequest | SpecChanged | None:
    """One query of the run, until the caller stops it or a request (stop, erasure, rescale, restore) arrives;
    drained and closed. `resumed`: a state change to answer once this query's first batch ran. `watch`: the spec
    file, looked at before each ingest (SpecChanged: a new spec to start the next query under)."""
    summary = run.summary
    request: StreamRequest | SpecChanged | None = None
    with spark_failures(config):
        begun = time.monotonic()
        query, sink = start_query(run.spark, config, run.meta, run.operator,
                                  trigger={"processingTime": f"{poll_seconds} seconds"}, lease=run.lease)
        summary.timed("query_start", begun)
    if resumed is not None:
        resumed.resume()
    sink.sessions_written, sink.quarantined = summary.sessions_written, summary.quarantined  # the run's, so far
    begun = time.monotonic()
    try:
        next_poll = time.monotonic() + wait
        next_progress = time.monotonic() + poll_seconds
        while not stop.is_set() and query.isActive:
            run.lease.check()  # between polls too: a lost lease ends the run (LeaseLost), not the caller
            if resumed is not None and not resumed.answered:
                resumed.check(config, query)
            try:
                request = pending_request(config, run.lease)
            except StorageUnavailable:  # an S3 lease store that does not answer now: asked again next tick
                request = None
            if request is not None:
                break
            if time.monotonic() >= next_poll:
                if watch is not None and watch.moved(config):
                    request = SpecChanged()
                    break
                next_poll = time.monotonic() + ingest_now()
            if time.monotonic() >= next_progress:
                if summary.absorb_progress(query):
                    ingest_now.query_progressed()
                    if on_progress:
                        on_progress(summary, sink)
                next_progress = time.monotonic() + poll_seconds
            stop.wait(tick)
    except KeyboardInterrupt:
        pass
    finally:
        _drain(query, config.stop_timeout_s)
        summary.timed("stream", begun)
        run.last_batch_end = batch_end(query) or run.last_batch_end
    if summary.absorb_progress(query):  # batches since the last poll (a stop right after one): the warehouse answered
        ingest_now.query_progressed()
    _close(run, query, sink, config)
    return request


# Called by the run loop for an erasure request, with the query stopped and the job lease held; returns the answer
# (the erasure's result). The state layer does the erasure (state_store.erasure); this layer does not know how.
OnErase = Callable[[ErasureRequest, SparkSession, Lease], "dict[str, Any]"]


def _answer_erasure(config: SessionsConfig, run: _Run, request: ErasureRequest, on_erase: OnErase | None) -> None:
    answer = ErasureAnswer()
    try:
        if on_erase is None:
            raise SessionsError("this stream cannot apply erasures (no erasure handler): stop it and run forget")
        answer = ErasureAnswer(erased=on_erase(request, run.spark, run.lease))
    except SessionsError as error:
        answer = ErasureAnswer(error=first_line(error))
    finally:
        answer_request(config, request, answer)
    run.meta, run.operator = checkpoint_metadata(config)  # the erasure may have restored the checkpoint


def _answer(config: SessionsConfig, run: _Run, request: StopRequest, on_stop: OnStop | None) -> None:
    last = inspect_checkpoint(config.checkpoint).last_committed_batch
    if request.savepoint:
        try:
            if on_stop is None:
                raise SessionsError("this stream cannot take savepoints (no savepoint handler)")
            run.summary.savepoint = on_stop(request, run.spark)
        except Exception as error:  # noqa: BLE001 -- the stopper is told either way; an unexpected one is raised too
            answer_request(config, request, StopAnswer(last_committed_batch=last, error=first_line(error)))
            if not isinstance(error, SessionsError):
                raise
            return
    answer_request(config, request, StopAnswer(last_committed_batch=last, savepoint=run.summary.savepoint))
