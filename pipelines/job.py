"""The session-tracking job: ingest, the streaming query, and its operator commands."""
from __future__ import annotations

import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from pipelines import state_format
from pipelines.checkpoint import (
    PROVIDER_CLASSES,
    JobMetadata,
    batch_source_range,
    inspect_checkpoint,
    read_job_metadata,
    read_restore_marker,
    rescale_command,
    write_job_metadata,
)
from pipelines.config import SessionsConfig
from pipelines.errors import (
    CheckpointDamaged,
    CheckpointMismatch,
    CheckpointMissing,
    JobRunning,
    LifecycleBusy,
    RescaleIncomplete,
    RestoreIncomplete,
    SessionsError,
    StreamFailed,
)
from pipelines.ingest import ingest
from pipelines.locks import LeaseHeld, lease
from pipelines.operator import sessionize
from pipelines.shipping import cluster_conf
from pipelines.source import BOOTSTRAP_FILE, SOURCE_NAME, RawEventsSource
from pipelines.storage import is_s3, storage_options
from pipelines.tables import QUARANTINE_SCHEMA, SESSIONS_SCHEMA, MicroBatchSink, ensure_table, table_rows

LOG4J2 = Path(__file__).resolve().parent / "log4j2.properties"
ERRORS_LOG = "errors.log"  # Python tracebacks of Spark failures, beside Spark's own spark.log


def explain_spark_failure(error: BaseException, config: SessionsConfig) -> SessionsError:
    """A failure inside Spark (a query, a read, a repartition), as the one line an operator can act on."""
    text = str(error)
    log = f"details in {config.log_dir / ERRORS_LOG} and {config.log_dir / 'spark.log'}"
    if "STREAMING_UNFINISHED_REPARTITION_DETECTED" in text:
        finish = rescale_command(inspect_checkpoint(config.checkpoint)) or "sessionctl rescale --partitions N"
        return _rescale_incomplete(finish, f" ({log})")
    if "CANNOT_LOAD_STATE_STORE" in text or "ChecksumException" in text or "STATE_STORE" in text:
        found = re.search(r"(state/\d+/\d+/[^\s:,]+)", text)
        where = f"the state store file {found.group(1)} of {config.checkpoint}" if found else \
            f"the state store in {config.checkpoint}"
        cause = "checksum error" if "Checksum" in text else ("missing" if "FileNotFound" in text or
                                                              "does not exist" in text else "cannot be read")
        return CheckpointDamaged(f"{where} is damaged ({cause}): `sessionctl restore --savepoint latest` rebuilds the "
                                 f"state from the newest savepoint and replays what came after it ({log})")
    if re.search(r"python worker|PYTHON_WORKER|failed to connect back|pyspark\.daemon", text, re.IGNORECASE):
        said = re.search(r"Error from python worker:\s*\n\s*(.+)", text)
        detail = f" (it said: {said.group(1).strip()[:200]})" if said else ""
        return StreamFailed(f"a Spark Python worker failed to start or connect back{detail}: check PYSPARK_PYTHON "
                            f"({os.environ.get('PYSPARK_PYTHON', sys.executable)}) and the machine's load, then run "
                            f"the command again; nothing was committed by the failed step ({log})")
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)
    return StreamFailed(f"Spark failed: {first[:300]} ({log})")


def _rescale_incomplete(finish: str, suffix: str = "") -> RescaleIncomplete:
    return RescaleIncomplete(f"a rescale was interrupted after Spark began repartitioning the checkpoint: finish it "
                             f"with `{finish}` (or `sessionctl restore --savepoint latest`) before running the job"
                             f"{suffix}", next_step=finish)


@contextmanager
def spark_failures(config: SessionsConfig) -> Iterator[None]:
    """Spark's own exceptions raised in the block become the typed one line (explain_spark_failure); the whole
    traceback is appended to $SESSIONS_HOME/logs/errors.log, where that line points."""
    try:
        yield
    except (PySparkException, Py4JError) as error:
        config.log_dir.mkdir(parents=True, exist_ok=True)
        with (config.log_dir / ERRORS_LOG).open("a") as log:
            log.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')} pid {os.getpid()}\n{traceback.format_exc()}\n")
        raise explain_spark_failure(error, config) from None


def spark_conf(config: SessionsConfig) -> dict[str, str]:
    """Spark settings for the job; shared by the CLI's session and Dagster's PySparkResource."""
    return {
        "spark.master": config.spark_master,
        "spark.app.name": "sessions",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(config.state_partitions),
        "spark.sql.streaming.stateStore.providerClass": PROVIDER_CLASSES[config.state_store],
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.enabled": str(config.spark_ui).lower(),
        "spark.ui.showConsoleProgress": "false",  # sessionctl prints JSON; a progress bar would garble it
        "spark.driver.memory": config.spark_driver_memory,
        # How long stopping the query may wait for its batch; the runbook waits a little longer for the lock.
        "spark.sql.streaming.stopTimeout": str(int(config.stop_timeout_s * 1000)),
        "spark.sql.streaming.minBatchesToRetain": str(config.min_batches_to_retain),
        # Spark's log to a file (pipelines/log4j2.properties): the terminal gets sessionctl's one line.
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG4J2} -Dsessions.log.dir={config.log_dir}",
        **cluster_conf(config.spark_master),
    }


def get_spark(config: SessionsConfig) -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder
    for key, value in spark_conf(config).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def prepare_session(spark: SparkSession, config: SessionsConfig) -> None:
    # SQL confs are read when a query starts; an existing checkpoint's own values still win.
    spark.conf.set("spark.sql.shuffle.partitions", str(config.state_partitions))
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDER_CLASSES[config.state_store])
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.dataSource.register(RawEventsSource)


@contextmanager
def job_lock(config: SessionsConfig, what: str, name: str = "job") -> Iterator[None]:
    """One process at a time, on any host, may run the job or a lifecycle operation on it (CLI and Dagster
    alike): a lease beside the checkpoint (pipelines.locks).

    `job` is held by the running stream and by operations that need it stopped (savepoint, restore,
    rescale); `lifecycle` by every lifecycle operation, compaction included, which may run beside
    the stream but never beside another lifecycle operation.
    """
    try:
        with lease(config.lease_dir, name, what, config.lease_ttl_s):
            yield
    except LeaseHeld as held:
        holder = held.info.describe() if held.info else "another process"
        error, busy = ((JobRunning, "the job is running") if name == "job"
                       else (LifecycleBusy, "another lifecycle operation is running"))
        raise error(f"{busy}: {holder} holds {held.path}; wait for it or stop it first", holder,
                    str(held.path)) from None


def ensure_tables(config: SessionsConfig) -> None:
    if not is_s3(config.warehouse_uri):
        Path(config.warehouse_uri).mkdir(parents=True, exist_ok=True)
    options = storage_options(config, config.warehouse_uri)
    ensure_table(config.sessions_table, SESSIONS_SCHEMA, options)
    ensure_table(config.quarantine_table, QUARANTINE_SCHEMA, options)


def checkpoint_metadata(config: SessionsConfig) -> JobMetadata:
    """The checkpoint's job metadata, created for a new checkpoint; refuses settings that do not fit."""
    marker = read_restore_marker(config.checkpoint)
    if marker is not None:
        raise RestoreIncomplete(
            f"a restore from {marker['savepoint_id']} started at {marker['started_at']} did not finish (the process "
            f"was stopped): finish it with `{marker['command']}` before running the job", next_step=marker["command"])
    finish = rescale_command(inspect_checkpoint(config.checkpoint))
    if finish is not None:
        raise _rescale_incomplete(finish)
    meta = read_job_metadata(config.checkpoint)
    if meta is None:
        if table_rows(config.sessions_table, storage_options(config, config.sessions_table)) > 0:
            raise CheckpointMissing(
                f"no checkpoint at {config.checkpoint} but the sessions table already has rows: "
                "restore one with `sessionctl restore --savepoint latest` (a fresh start would write them again)")
        meta = JobMetadata.new(config.gap_ms, config.lateness_ms, config.state_buckets)
        write_job_metadata(config.checkpoint, meta)
        return meta
    if meta.state_layout != state_format.SCHEMA_ID:
        raise CheckpointMismatch(
            f"the checkpoint at {config.checkpoint} holds state in an older layout ({meta.state_layout or 'JSON, v1'}) "
            "that this build cannot run on: restore a savepoint (`sessionctl restore --savepoint latest`; v1 "
            "savepoints are upgraded and the events after them replayed exactly once)")
    if (meta.gap_ms, meta.lateness_ms, meta.buckets) != (config.gap_ms, config.lateness_ms, config.state_buckets):
        raise CheckpointMismatch(
            f"the checkpoint was made with gap {meta.gap_ms // 60000} min, lateness {meta.lateness_ms // 60000} min, "
            f"{meta.buckets} buckets; the settings say gap {config.gap_minutes}, lateness {config.lateness_minutes}, "
            f"{config.state_buckets} buckets: restore a savepoint with --migrate to change them")
    return meta


def raw_events_stream(spark: SparkSession, config: SessionsConfig, checkpoint: Path,
                      source_options: dict[str, Any] | None = None) -> DataFrame:
    """The stream of raw_events rows for a query checkpointed at `checkpoint` (a restore's bootstrap there)."""
    prepare_session(spark, config)
    reader = (spark.readStream.format(SOURCE_NAME)
              .option("path", config.raw_events_table)
              .option("bootstrap", str(checkpoint / BOOTSTRAP_FILE)))
    if config.max_versions_per_batch:
        reader = reader.option("maxVersionsPerTrigger", str(config.max_versions_per_batch))
    for key, value in (source_options or {}).items():
        reader = reader.option(key, str(value))
    return reader.load()


def start_query(spark: SparkSession, config: SessionsConfig, meta: JobMetadata, trigger: dict[str, Any],
                source_options: dict[str, Any] | None = None) -> tuple[StreamingQuery, MicroBatchSink]:
    output = sessionize(raw_events_stream(spark, config, config.checkpoint, source_options),
                        meta.gap_ms, meta.lateness_ms, meta.buckets)
    checkpoint = config.checkpoint
    sink = MicroBatchSink(config.sessions_table, config.quarantine_table, config.raw_events_table, meta.incarnation,
                          seq_range=lambda batch_id: batch_source_range(checkpoint, batch_id),
                          storage_options=storage_options(config, config.warehouse_uri))
    query = (output.writeStream.queryName("sessions")
             .option("checkpointLocation", str(config.checkpoint))
             .trigger(**trigger)
             .foreachBatch(sink)
             .start())
    return query, sink


@dataclass
class RunSummary:
    ingested_files: int = 0
    ingested_rows: int = 0
    rejected_lines: int = 0
    batches: int = 0
    input_rows: int = 0
    sessions_written: int = 0
    quarantined: int = 0
    last_committed_batch: int | None = None
    seconds: float = 0.0
    refused_files: int = 0  # symlinks and special files moved to landing/_refused/ (a quarantine row each)
    waiting_files: int = 0  # files left in landing at the last ingest: still being written
    extra: dict = field(default_factory=dict)


def _absorb_progress(query: StreamingQuery, summary: RunSummary, seen: set[int]) -> None:
    for progress in query.recentProgress:
        if progress.batchId in seen:
            continue
        seen.add(progress.batchId)
        summary.batches += 1
        summary.input_rows += int(progress.numInputRows)


def catch_up(config: SessionsConfig, spark: SparkSession | None = None) -> RunSummary:
    """Ingest everything landed, process it all (trigger availableNow), stop."""
    started = time.monotonic()
    with job_lock(config, "catch-up"):
        result = ingest(config)
        ensure_tables(config)
        meta = checkpoint_metadata(config)
        with spark_failures(config):
            spark = spark or get_spark(config)
            query, sink = start_query(spark, config, meta, {"availableNow": True})
            query.awaitTermination()
        summary = RunSummary(result.files, result.rows, result.rejected,
                             refused_files=result.refused, waiting_files=result.waiting)
        _absorb_progress(query, summary, set())
        summary.sessions_written, summary.quarantined = sink.sessions_written, sink.quarantined
        summary.last_committed_batch = inspect_checkpoint(config.checkpoint).last_committed_batch
        summary.seconds = round(time.monotonic() - started, 3)
        return summary


def run_continuously(config: SessionsConfig, spark: SparkSession | None = None, stop: threading.Event | None = None,
                     poll_seconds: float = 5.0,
                     on_progress: Callable[[RunSummary, MicroBatchSink], None] | None = None) -> RunSummary:
    """Ingest and process until `stop` is set (or KeyboardInterrupt), then stop the query cleanly."""
    stop = stop or threading.Event()
    started = time.monotonic()
    with job_lock(config, "run"):
        ensure_tables(config)
        meta = checkpoint_metadata(config)
        with spark_failures(config):
            spark = spark or get_spark(config)
        summary = RunSummary()

        def ingest_landed() -> None:
            result = ingest(config)
            summary.ingested_files += result.files
            summary.ingested_rows += result.rows
            summary.rejected_lines += result.rejected
            summary.refused_files += result.refused
            summary.waiting_files = result.waiting

        ingest_landed()
        with spark_failures(config):
            query, sink = start_query(spark, config, meta, {"processingTime": f"{poll_seconds} seconds"})
        seen: set = set()
        try:
            while not stop.is_set() and query.isActive:
                ingest_landed()
                before = summary.batches
                _absorb_progress(query, summary, seen)
                if on_progress and summary.batches != before:
                    on_progress(summary, sink)
                stop.wait(poll_seconds)
        except KeyboardInterrupt:
            pass
        finally:
            query.stop()
        failure = query.exception()
        if failure is not None:
            raise explain_spark_failure(failure, config)
        _absorb_progress(query, summary, seen)
        summary.sessions_written, summary.quarantined = sink.sessions_written, sink.quarantined
        summary.last_committed_batch = inspect_checkpoint(config.checkpoint).last_committed_batch
        summary.seconds = round(time.monotonic() - started, 3)
        return summary
