"""Savepoint (of a stopped or a running stream), stop with savepoint, restore and rescale of the stopped job: the
operations `sessionctl` and Dagster call."""
from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from pipelines import state_format
from pipelines.checkpoint import (
    JobMetadata,
    clear_restore_marker,
    inspect_checkpoint,
    read_job_metadata,
    write_job_metadata,
    write_restore_marker,
)
from pipelines.config import SessionsConfig
from pipelines.errors import (
    JobRunning,
    NoCommittedBatch,
    NotRunning,
    RescaleRefused,
    RestoreIncomplete,
    SavepointDamaged,
    SavepointIncompatible,
    StateMismatch,
    StopIncomplete,
)
from pipelines.guards import (
    JOB,
    LIFECYCLE,
    StopRequest,
    ensure_tables,
    job_lock,
    request_stop,
    running_stream,
    take_stop_answer,
    withdraw_stop,
)
from pipelines.operator import StateOperator, for_layout, for_new_checkpoint
from pipelines.runtime import get_spark, spark_failures
from pipelines.sessionize import rewalk, rows_table
from pipelines.source import BOOTSTRAP_FILE
from pipelines.storage import open_table, table_exists
from pipelines.stream import RunSummary, run_continuously, start_query
from pipelines.tables import MicroBatchSink
from state_store.results import RescaleMethod, RescaleResult, RestoreResult, SavepointInfo, StopResult
from state_store.savepointing import savepoint_last_batch
from state_store.savepoints import SavepointStore, state_checksum
from state_store.state import read_state, repartition_state

REPLACED_SUFFIX = ".replaced-"
FAILED_SUFFIX = ".failed-restore-"  # a half-built checkpoint, kept for a post-mortem


def _locks(config: SessionsConfig, what: str) -> ExitStack:
    """Restore and rescale: no other lifecycle operation, and the stream stopped (they replace its checkpoint)."""
    stack = ExitStack()
    stack.enter_context(job_lock(config, what, name=LIFECYCLE))
    stack.enter_context(job_lock(config, what, name=JOB))
    return stack


def _spark(config: SessionsConfig, spark: SparkSession | None) -> SparkSession:
    return spark or get_spark(config)


def live_state(spark: SparkSession, checkpoint: Path, batch_id: int | None, op: StateOperator | None = None
               ) -> pa.Table:
    """Canonical Arrow table of the state at a committed batch (Spark's state data source)."""
    return state_format.canonical(read_state(spark, checkpoint, batch_id, op).toArrow())


# ---- savepoint ---------------------------------------------------------------------------------

def _take_savepoint(config: SessionsConfig, trigger: str, spark: SparkSession | None) -> SavepointInfo:
    """The savepoint of the last committed batch (state_store.savepointing: written and verified by the executors)."""
    return savepoint_last_batch(config, trigger, _spark(config, spark))


def take_savepoint(config: SessionsConfig, trigger: str = "manual", spark: SparkSession | None = None) -> SavepointInfo:
    """Savepoint at the last committed batch, of a stopped job or beside the running stream (which keeps
    committing): state + source position + watermark + output table versions, all of that one batch."""
    with job_lock(config, "savepoint", name=LIFECYCLE), spark_failures(config):
        return _take_savepoint(config, trigger, spark)


# ---- the stream, and stopping it -----------------------------------------------------------------

def run_stream(config: SessionsConfig, spark: SparkSession | None = None, stop: threading.Event | None = None,
               poll_seconds: float = 5.0,
               on_progress: Callable[[RunSummary, MicroBatchSink], None] | None = None) -> RunSummary:
    """The stream (pipelines.stream.run_continuously) that honours `sessionctl stop --savepoint`: after its last
    batch it takes that batch's savepoint itself, before it releases the job lease (nothing can start between)."""

    def savepoint_at_stop(request: StopRequest, running: SparkSession) -> dict[str, Any]:
        # A compaction or another savepoint may hold the lifecycle lease: wait for it rather than fail the stop.
        with job_lock(config, "stop --savepoint", name=LIFECYCLE, wait_s=config.stop_timeout_s), \
                spark_failures(config):
            return _take_savepoint(config, "stop", running).to_dict()

    return run_continuously(config, spark=spark, stop=stop, poll_seconds=poll_seconds, on_progress=on_progress,
                            on_stop_request=savepoint_at_stop)


def stop_stream(config: SessionsConfig, savepoint: bool = False, timeout_s: float | None = None) -> StopResult:
    """Stop the running stream (this or another process, any host sharing the checkpoint path) after its current
    batch; with `savepoint`, the savepoint of that last batch is taken as part of the stop. Waits for the answer."""
    started = time.monotonic()
    stream = running_stream(config)
    if stream is None:
        raise NotRunning(f"no stream is running: nothing holds {config.lease_dir / 'job.lease'}"
                         + ("; `sessionctl savepoint` takes a savepoint of the stopped job" if savepoint else ""))
    if stream.what != "run":
        raise JobRunning(f"{stream.describe()} holds the job lease and is not a stream: it stops by itself; wait for "
                         f"it", stream.describe(), str(config.lease_dir / "job.lease"))
    request = request_stop(config, stream, savepoint)
    deadline = started + (timeout_s if timeout_s is not None else config.stop_timeout_s * 2)
    while True:
        answer = take_stop_answer(config, request)
        if answer is not None:
            break
        holder = running_stream(config)
        if holder is None or holder.token != stream.token:
            answer = take_stop_answer(config, request)  # answered just before it went away
            if answer is not None:
                break
            withdraw_stop(config, request)
            last = inspect_checkpoint(config.checkpoint).last_committed_batch
            if request.savepoint:
                raise StopIncomplete(f"the stream ({stream.describe()}) went away without answering (killed?); it is "
                                     f"stopped at committed batch {last} without a savepoint: take it with "
                                     f"`sessionctl savepoint`", next_step="sessionctl savepoint")
            return StopResult(True, stream.describe(), last, round(time.monotonic() - started, 3))
        if time.monotonic() > deadline:
            raise StopIncomplete(f"the stream ({stream.describe()}) did not stop within {deadline - started:g} s; the "
                                 f"stop request stands and it stops after its current batch: run `sessionctl stop` "
                                 f"again to wait for it", next_step="sessionctl stop")
        time.sleep(0.5)
    seconds = round(time.monotonic() - started, 3)
    if answer.get("error"):
        raise StopIncomplete(f"the stream stopped at committed batch {answer['last_committed_batch']} but its "
                             f"savepoint failed ({answer['error']}): take it with `sessionctl savepoint`",
                             next_step="sessionctl savepoint")
    taken = answer.get("savepoint")
    if savepoint and not taken:  # joined a stop someone else asked for without a savepoint
        raise StopIncomplete(f"the stream stopped at committed batch {answer['last_committed_batch']} for an earlier "
                             f"stop request without a savepoint ({request.requested_by}): take it with "
                             f"`sessionctl savepoint`", next_step="sessionctl savepoint")
    return StopResult(True, stream.describe(), answer.get("last_committed_batch"), seconds,
                      SavepointInfo.from_row(taken) if taken else None)


# ---- validate / restore ------------------------------------------------------------------------

def validate_savepoint(config: SessionsConfig, savepoint: str = "latest", migrate: bool = False) -> SavepointInfo:
    """Exists, complete, state re-read matches count and checksum, fits the current job settings."""
    saved, _ = _validated(config, savepoint, migrate)
    return replace(saved, verified=True)


READABLE_SCHEMAS = (state_format.SCHEMA_ID, state_format.V1_SCHEMA_ID)


def _validated(config: SessionsConfig, savepoint: str, migrate: bool) -> tuple[SavepointInfo, pa.Table]:
    """The savepoint (its catalog row) and the verified state rows (restore stages the very rows it checked), in the
    current canonical form (a v1 savepoint is upgraded after its own checksum matched)."""
    store = SavepointStore.of(config)
    saved = store.get(savepoint)
    if saved.state_schema not in READABLE_SCHEMAS:
        raise SavepointIncompatible(f"savepoint {saved.savepoint_id} has state schema {saved.state_schema!r}; "
                             f"this job reads {' or '.join(map(repr, READABLE_SCHEMAS))}")
    if not migrate and (saved.gap_ms, saved.lateness_ms) != (config.gap_ms, config.lateness_ms):
        raise SavepointIncompatible(
            f"savepoint {saved.savepoint_id} was taken with gap {saved.gap_ms // 60000} min and lateness "
            f"{saved.lateness_ms // 60000} min; the job is set to {config.gap_minutes} and "
            f"{config.lateness_minutes}: pass --migrate to restore it under the new settings")
    state = store.read_state(saved.savepoint_id)
    checksum = state_checksum(state)  # order-independent: no need to sort what was read
    if state.num_rows != saved.rows or checksum != saved.checksum:
        raise SavepointDamaged(f"savepoint {saved.savepoint_id} is damaged: {state.num_rows} rows / {checksum}, "
                             f"catalog says {saved.rows} / {saved.checksum}")
    _refuse_abandoned_timeline(config, saved)
    if saved.state_schema == state_format.V1_SCHEMA_ID:
        state = state_format.upgrade_v1(state)
    return saved, state.select(state_format.CANONICAL_SCHEMA.names).cast(state_format.CANONICAL_SCHEMA)


_ROLLBACK = re.compile(r"written_version > (\d+)")


def _refuse_abandoned_timeline(config: SessionsConfig, saved: SavepointInfo) -> None:
    """A savepoint taken after the version an earlier restore rolled the sessions table back to belongs to the
    timeline that restore abandoned: the sessions its batches wrote were removed then, so restoring it would lose
    them. Refused in one line (raw_events still holds every event: an older savepoint replays them)."""
    if not table_exists(config, config.sessions_table):
        return
    for commit in open_table(config, config.sessions_table).history():
        if commit.get("operation") != "DELETE" or int(commit.get("version", -1)) <= int(saved.sessions_version):
            continue
        found = _ROLLBACK.search(str((commit.get("operationParameters") or {}).get("predicate", "")))
        if found and int(found.group(1)) < int(saved.sessions_version):
            raise SavepointIncompatible(
                f"savepoint {saved.savepoint_id} belongs to a timeline that a later restore abandoned (sessions "
                f"table version {commit['version']} rolled back to version {found.group(1)}, before this savepoint's "
                f"{saved.sessions_version}): its sessions are gone; restore the savepoint that restore used, or one "
                f"taken after it, and the events are replayed from raw_events")


def expected_restored_state(state: pa.Table, gap_ms: int) -> pa.Table:
    """What the restore's bootstrap batch must leave in the store: the rows walked once (watermark 0, so
    nothing closes or freezes). Equal to the savepoint's rows for a v2 savepoint under its own gap; for a v1
    savepoint or a new gap it settles each row's session_start."""
    return state_format.to_canonical(rows_table(rewalk(state_format.canonical_rows_ms(state), 0, gap_ms)))


def _set_aside(checkpoint: Path) -> str | None:
    if not checkpoint.exists():
        return None
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    target = checkpoint.with_name(checkpoint.name + REPLACED_SUFFIX + stamp)
    checkpoint.rename(target)
    return str(target)


def _roll_back_outputs(config: SessionsConfig, saved: SavepointInfo) -> dict[str, int]:
    """Remove what the job wrote after the savepoint; the replay writes it again, exactly once."""
    removed = {}
    for name, uri, version in (("sessions", config.sessions_table, saved.sessions_version),
                               ("quarantine", config.quarantine_table, saved.quarantine_version)):
        if table_exists(config, uri):
            metrics = open_table(config, uri).delete(f"written_version > {int(version)}")
            removed[name] = int(metrics.get("num_deleted_rows", 0) or 0)
    return removed


def _restore(config: SessionsConfig, savepoint: str, partitions: int | None, migrate: bool,
             spark: SparkSession | None) -> RestoreResult:
    started = time.monotonic()
    saved, state = _validated(config, savepoint, migrate)
    target = config.with_(state_partitions=partitions or saved.partitions or config.state_partitions)
    write_restore_marker(config.checkpoint, saved.savepoint_id, partitions)  # before the first change
    replaced = _set_aside(config.checkpoint)
    outputs_rolled_back = False
    try:
        operator = for_new_checkpoint()
        meta = JobMetadata.new(config.gap_ms, config.lateness_ms, config.state_buckets, state_layout=operator.layout,
                               created_from=saved.savepoint_id)
        write_job_metadata(config.checkpoint, meta)
        staged = config.checkpoint / "bootstrap-state.parquet"  # not "_...": Spark skips such files
        pq.write_table(state, staged)
        # The source's first batch carries the savepoint's watermark (a marker); the operator loads the rows as
        # Spark's initial state in that same batch (pipelines.operator: the restore's bootstrap).
        (config.checkpoint / BOOTSTRAP_FILE).write_text(json.dumps({
            "savepoint_id": saved.savepoint_id, "source_seq": saved.source_seq,
            "watermark_ms": saved.watermark_ms, "lateness_ms": config.lateness_ms,
        }))
        outputs_rolled_back = True  # from here the tables may differ from what the old checkpoint wrote
        removed = _roll_back_outputs(config, saved)
        ensure_tables(config)
        spark = _spark(target, spark)
        # Only the bootstrap batch (and the empty batch after it): events after the savepoint are the next
        # catch-up's or run's to process.
        query, _ = start_query(spark, target, meta, operator, {"availableNow": True},
                               source_options={"targetSeq": saved.source_seq},
                               initial_rows=spark.read.parquet(str(staged)))
        query.awaitTermination()
        restored = live_state(spark, config.checkpoint, 0, operator)
        checksum = state_checksum(restored)
        expected = expected_restored_state(state, meta.gap_ms)
        if restored.num_rows != expected.num_rows or checksum != state_checksum(expected):
            raise StateMismatch(f"restored state does not match the savepoint: {restored.num_rows} rows / "
                                 f"{checksum} vs {expected.num_rows} / {state_checksum(expected)}")
    except Exception as error:  # noqa: BLE001 -- whatever broke, leave the operator a known next step
        raise _failed_restore(config, saved.savepoint_id, replaced, outputs_rolled_back, error) from None
    clear_restore_marker(config.checkpoint)
    info = inspect_checkpoint(config.checkpoint)
    return RestoreResult(
        savepoint_id=saved.savepoint_id, batch_id=saved.batch_id, rows=saved.rows,
        checksum=checksum, verified=True, source_seq=saved.source_seq,
        watermark_ms=saved.watermark_ms, provider=info.provider, partitions=info.partitions,
        rolled_back=removed, previous_checkpoint=replaced,
        seconds=round(time.monotonic() - started, 3),
    )


def _failed_restore(config: SessionsConfig, savepoint_id: str, replaced: str | None,
                    outputs_rolled_back: bool, error: Exception) -> RestoreIncomplete:
    """Put things where a rerun (or the old job) can go on, and say which it is."""
    cause = f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"
    if config.checkpoint.exists():
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
        config.checkpoint.rename(config.checkpoint.with_name(config.checkpoint.name + FAILED_SUFFIX + stamp))
    if not outputs_rolled_back and replaced is not None:
        Path(replaced).rename(config.checkpoint)
        clear_restore_marker(config.checkpoint)
        return RestoreIncomplete(f"restore from {savepoint_id} failed before any table was changed ({cause}); "
                                 f"the previous checkpoint is back in place",
                                 next_step="none: the previous checkpoint is back in place, the old job can go on")
    kept = f"; the previous checkpoint (ahead of the tables now) is kept at {replaced}" if replaced else ""
    return RestoreIncomplete(f"restore from {savepoint_id} failed once the output tables were being rolled back to it "
                             f"({cause}): run the same restore again{kept}", next_step="run the same restore again")


def _check_partitions(partitions: int, operator: StateOperator, buckets: int) -> None:
    if partitions < 1:
        raise RescaleRefused(f"--partitions must be at least 1, got {partitions}")
    bound = operator.max_partitions(buckets)
    if bound is not None and partitions > bound:
        # More partitions than the state has keys would hold nothing but cost a task, a state store instance and its
        # files each, every batch.
        raise RescaleRefused(f"--partitions must be between 1 and {bound} (the state of this checkpoint has at most "
                             f"that many keys), got {partitions}")


def restore(config: SessionsConfig, savepoint: str = "latest", partitions: int | None = None,
            migrate: bool = False, spark: SparkSession | None = None) -> RestoreResult:
    """Put state, source position and outputs back to a savepoint, into a fresh checkpoint built from
    the canonical Delta form alone (the old checkpoint is kept aside, not deleted)."""
    if partitions is not None:
        _check_partitions(partitions, for_new_checkpoint(), config.state_buckets)
    with _locks(config, "restore"), spark_failures(config):
        return _restore(config, savepoint, partitions, migrate, spark)


# ---- rescale -----------------------------------------------------------------------------------

def rescale(config: SessionsConfig, partitions: int, spark: SparkSession | None = None) -> RescaleResult:
    """Change the state partitions of the stopped job, keeping all state. A pre-rescale savepoint is
    taken first; RocksDB uses Spark's offline repartition, the HDFS-backed provider savepoint+restore."""
    meta = read_job_metadata(config.checkpoint)  # the operator the checkpoint was made with bounds its partitions
    if meta is not None:
        _check_partitions(partitions, for_layout(meta.state_layout), meta.buckets)
    else:
        _check_partitions(partitions, for_new_checkpoint(), config.state_buckets)
    started = time.monotonic()
    with _locks(config, "rescale"), spark_failures(config):
        info = inspect_checkpoint(config.checkpoint)
        if info.last_committed_batch is None:
            raise NoCommittedBatch(f"nothing to rescale: no committed batch in {config.checkpoint}")
        before = info.partitions
        if info.unfinished_rescale is not None:
            # Spark repartitions only to the interrupted attempt's count until that one is finished: finish it
            # (the state it starts from is the last committed batch's, untouched), then go on to the count asked.
            repartition_state(_spark(config, spark), config.checkpoint, info.unfinished_rescale)
            info = inspect_checkpoint(config.checkpoint)
        if info.partitions == partitions:
            return RescaleResult(partitions_before=before, partitions_after=partitions,
                                 method="none" if before == partitions else "repartition",
                                 savepoint_id=None, rows=None, seconds=0.0)
        spark = _spark(config, spark)
        saved = _take_savepoint(config, "pre-rescale", spark)
        method: RescaleMethod = "savepoint-restore"
        if info.provider == "rocksdb":
            repartition_state(spark, config.checkpoint, partitions)
            method = "repartition"
            after = inspect_checkpoint(config.checkpoint)
            state = live_state(spark, config.checkpoint, after.last_committed_batch)
            if state.num_rows != saved.rows or state_checksum(state) != saved.checksum:
                raise StateMismatch(f"repartitioned state does not match the pre-rescale savepoint "
                                    f"{saved.savepoint_id}; restore it with `sessionctl restore --savepoint "
                                    f"{saved.savepoint_id} --partitions {partitions}`")
        else:
            _restore(config.with_(state_store=info.provider), saved.savepoint_id, partitions, False, spark)
        return RescaleResult(partitions_before=before,
                             partitions_after=inspect_checkpoint(config.checkpoint).partitions,
                             method=method, savepoint_id=saved.savepoint_id, rows=saved.rows,
                             seconds=round(time.monotonic() - started, 3))


def replaced_checkpoints(config: SessionsConfig) -> list[Path]:
    parent = config.checkpoint.parent
    if not parent.exists():
        return []
    prefixes = (config.checkpoint.name + REPLACED_SUFFIX, config.checkpoint.name + FAILED_SUFFIX)
    return sorted(p for p in parent.iterdir() if p.name.startswith(prefixes))


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
