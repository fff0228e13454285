"""Taking a savepoint (state_store.lifecycle's savepoint, stop --savepoint and pre-rescale savepoint): the flow
around the executors' write (state_store.savepoint.files) -- batch, its pin beside a running stream
(state_store.savepoint.pin), full or incremental (state_store.savepoint.policy, state_store.savepoint.chain), catalog
row, failure handling."""
from __future__ import annotations

import datetime as dt
import time
from contextlib import suppress
from dataclasses import replace
from typing import Any, cast

import pyarrow as pa
from py4j.protocol import Py4JError
from pyspark.errors import PySparkException, PythonException
from pyspark.sql import SparkSession

from pipelines.config import Provider, SessionsConfig
from pipelines.coordination import kill_point
from pipelines.coordination.job_leases import running_stream
from pipelines.core import state_format
from pipelines.errors import SavepointDamaged, SavepointFailed, unreadable_savepoint_file
from pipelines.job.checkpoint import CommittedBatch, committed_checkpoint, inspect_checkpoint
from pipelines.job.operators.jvm import has_attributes
from pipelines.job.runtime import log_traceback
from pipelines.job.sink import version_after_batch
from pipelines.storage import filesystem, storage_options
from state_store.results import SavepointInfo, Trigger
from state_store.savepoint import native
from state_store.savepoint.catalog import (
    FULL,
    INCREMENTAL,
    SavepointStore,
    StateFiles,
    new_savepoint_id,
    written_schema,
)
from state_store.savepoint.chain import change_feed, check_increment, latest_per_user
from state_store.savepoint.checksum import checksum_parts, combine_checksum
from state_store.savepoint.files import WrittenFiles, commit_state_files, verify_state_files, write_state_files
from state_store.savepoint.pin import PIN_ATTEMPTS, BatchGone, PinnedBatch, pinned_batch
from state_store.savepoint.policy import SavepointPlan, damaged_chain, plan_savepoint
from state_store.state import read_state

__all__ = ["savepoint_last_batch"]

# A savepoint reads one committed batch N beside a running stream: state version N through Spark's state data source
# (by batch id), the source offset and watermark of N from the offset and commit logs, and the output tables'
# versions as of N (pipelines.job.sink.version_after_batch). Spark keeps the last SESSIONS_MIN_BATCHES_TO_RETAIN
# versions, so beside a running stream the batch's files are pinned first and read there (state_store.savepoint.pin);
# compaction never runs beside a savepoint (both hold the lifecycle lease).

def _retention_check(config: SessionsConfig, source: PinnedBatch, batch_id: int) -> int | None:
    """The newest committed batch when the live checkpoint was read (not pinned) and Spark's retention may have
    removed batch `batch_id`'s version meanwhile (a stream that started after the savepoint did); else None."""
    if source.pinned:
        return None
    newest = inspect_checkpoint(config.checkpoint).last_committed_batch or batch_id
    return newest if newest - batch_id >= config.min_batches_to_retain else None


def _write_batch_state(config: SessionsConfig, spark: SparkSession, store: SavepointStore, savepoint_id: str,
                       batch_id: int, source: PinnedBatch) -> WrittenFiles:
    """State version `batch_id` written as the savepoint's data files by the executors that read it (not committed),
    from where `source` says. Read in place, a read that fails because Spark's retention removed that version
    meanwhile is one line saying so, not "the checkpoint is damaged"; so is a version gone by the end of it."""
    try:
        written = write_state_files(spark, read_state(spark, source.checkpoint, batch_id=batch_id),
                                    store.state_uri(savepoint_id))
    except (PySparkException, Py4JError):
        newest = _retention_check(config, source, batch_id)
        if newest is None:
            raise  # not retention: spark_failures explains it
        log_traceback(config)
        raise SavepointFailed(_retention_lost(batch_id, newest)) from None
    newest = _retention_check(config, source, batch_id)
    if newest is not None:  # read whole, but the version may be gone by now
        raise SavepointFailed(_retention_lost(batch_id, newest))
    return written


def _write_increment(config: SessionsConfig, spark: SparkSession, store: SavepointStore, savepoint_id: str,
                     source: PinnedBatch, after_batch: int, batch_id: int) -> WrittenFiles | str:
    """The increment from batch `after_batch` to `batch_id` written as the savepoint's data files (not committed);
    when Spark cannot read that change feed (versions gone, a provider without one), the reason, with nothing left
    in the savepoint's folder."""
    if source.changes_after != after_batch:  # pinned without it: retention had removed part of it
        return f"the change feed no longer reaches back to batch {after_batch} of the previous savepoint"
    try:
        written = write_state_files(spark, change_feed(spark, source.checkpoint, after_batch, batch_id),
                                    store.state_uri(savepoint_id), prepare=latest_per_user, schema=written_schema(
                                        increment=True, attributes=has_attributes(source.checkpoint)))
        if _retention_check(config, source, after_batch) is None:
            return written
        reason = f"Spark's retention reached batch {after_batch + 1} while the change feed was read"
    except PythonException:
        raise  # this code's own failure in an executor: said as such, not hidden behind a full savepoint
    except (PySparkException, Py4JError) as error:
        log_traceback(config)
        reason = f"the change feed could not be read ({str(error).strip().splitlines()[0][:200]})"
    fs, root = filesystem(store.state_uri(savepoint_id))
    fs.delete_dir_contents(root, missing_dir_ok=True)  # files of the increment's tasks: never committed
    return reason


def _verify_increment(spark: SparkSession, store: SavepointStore, savepoint_id: str, written: WrittenFiles,
                      tip: SavepointInfo) -> tuple[int, str, StateFiles]:
    """Re-read the committed increment in the executors (SavepointDamaged unless its count and checksum are the
    write pass's); the (rows, checksum) of the state it represents: the previous savepoint's, without what the
    increment's users held there, with what they hold now (state_store.savepoint.chain)."""
    files = store.data_files(savepoint_id)
    users = written.users if written.users is not None else pa.array([], pa.string())
    check = check_increment(spark, store, files, store.chain_members(tip), users)
    if (check.rows, check.checksum) != (written.rows, written.checksum):
        raise SavepointDamaged(f"re-read of {files.uri} does not match the live state: {check.rows} rows / "
                               f"{check.checksum} in {len(files.files)} files, written {written.rows} / "
                               f"{written.checksum}")
    checksum = combine_checksum([checksum_parts(tip.checksum), (-check.old_rows, -check.old_sum),
                                 (written.state_rows, written.state_sum)])
    return int(checksum.split(":")[1]), checksum, files


def _retention_lost(batch_id: int, newest: int) -> str:
    # Only a read in place gets here: no stream ran when the savepoint started (one started meanwhile), or its batch
    # could not be copied (the note of a savepoint that completes says why).
    return (f"state of batch {batch_id} was removed by Spark's retention while the savepoint read it in place (a "
            f"stream committed up to batch {newest} meanwhile): run the savepoint again")


def _native_copy(store: SavepointStore, row: SavepointInfo, committed: CommittedBatch, source: PinnedBatch
                 ) -> tuple[SavepointInfo, str | None]:
    """The row with the batch's native copy (state_store.savepoint.native): the pinned one, or one copied from where
    the batch was read; or unchanged and why there is none."""
    info, copy = committed.info, source.native
    if copy is None:
        if source.native_note is not None:
            return row, source.native_note
        try:
            copy = native.copy_out(source.checkpoint, committed.batch_id, partitions=int(info.partitions or 0),
                                   provider=str(info.provider), store_uri=store.uri, savepoint_id=row.savepoint_id)
        except native.NativeUnavailable as why:
            return row, f"no native copy: {why}"
    kill_point("savepoint:native-copied")
    return replace(row, native_files=len(copy.files), native_bytes=copy.bytes, native_checksum=copy.checksum), None


# What an attempt's row holds until it is known: null in the catalog, as a failed attempt's row always held (its
# `rows` and `checksum` are typed for the complete savepoint they are read as).
_UNKNOWN: Any = None


def savepoint_last_batch(config: SessionsConfig, trigger: Trigger, spark: SparkSession, *, full: bool = False,
                         native_copy: bool | None = None, beside: bool = False) -> SavepointInfo:
    """The savepoint of the last committed batch, full or incremental (state_store.savepoint.policy; `full` forces
    full). The state is written, checksummed and verified by the executors (state_store.savepoint.files); this process
    commits the files' metadata in one Delta transaction and records the catalog row -- it never holds the state.
    With `native_copy` (None: SESSIONS_SAVEPOINT_NATIVE), the checkpoint's own files for the batch are copied beside
    it (state_store.savepoint.native).
    The caller holds the lifecycle lease; with `beside`, only that one: a stream may be committing batches, and when
    one runs the batch is pinned before it is read (state_store.savepoint.pin) -- a batch that retention removes
    while it is copied is given up for the newest one (PIN_ATTEMPTS times; no catalog row for it)."""
    started = time.monotonic()
    keep_native = config.savepoint_native if native_copy is None else native_copy
    pin = beside and running_stream(config) is not None
    lost = ""
    for _ in range(PIN_ATTEMPTS):
        try:
            return _savepoint_attempt(config, trigger, spark, full=full, native_copy=keep_native, pin=pin,
                                      started=started)
        except BatchGone as gone:
            lost = str(gone)
    raise SavepointFailed(f"the running stream's retention removed each of the {PIN_ATTEMPTS} newest batches the "
                          f"savepoint tried while it copied them to read ({lost}): run it again")


def _savepoint_attempt(config: SessionsConfig, trigger: Trigger, spark: SparkSession, *, full: bool, native_copy: bool,
                       pin: bool, started: float) -> SavepointInfo:
    """One attempt at the last committed batch (BatchGone: retention removed it while it was pinned)."""
    committed = committed_checkpoint(config.checkpoint, "nothing to savepoint")
    info, meta, batch_id = committed.info, committed.meta, committed.batch_id
    store = SavepointStore.of(config)
    now = dt.datetime.now(dt.timezone.utc)
    savepoint_id = new_savepoint_id(batch_id, now)
    options = storage_options(config, config.warehouse_uri)
    # The attempt's catalog row: failed until its table is verified (then complete).
    row = SavepointInfo(
        savepoint_id=savepoint_id, status="failed", trigger=trigger, created_at=now.isoformat(),
        batch_id=batch_id, source_seq=int((info.source_offset or {}).get("seq", 0)),
        watermark_ms=int(committed.watermark_ms or 0), gap_ms=meta.gap_ms, lateness_ms=meta.lateness_ms,
        # (the checkpoint's provider as read: a provider class this job never sets is recorded by its name)
        buckets=meta.buckets, provider=cast("Provider | None", info.provider), partitions=info.partitions,
        state_schema=state_format.SCHEMA_ID, rows=_UNKNOWN, checksum=_UNKNOWN,
        sessions_version=version_after_batch(config.sessions_table, meta.incarnation, batch_id, options),
        quarantine_version=version_after_batch(config.quarantine_table, meta.incarnation, batch_id, options),
        # The result's state_uri is this store's table; the catalog records it relative (SavepointStore._append).
        incarnation=meta.incarnation, state_uri=store.state_uri(savepoint_id), bytes=None, seconds=None,
        spec=meta.spec, idle_close_ms=meta.idle_close_ms,  # the rules, as the job metadata records them
    )
    try:
        if store.exists(savepoint_id):  # also: the store answers, before any executor writes to it
            raise SavepointFailed(f"{row.state_uri} exists already")
        plan = plan_savepoint(config, store, store.list(), committed, full=full)
        with pinned_batch(config, store.uri, committed, savepoint_id, pin=pin, native_copy=native_copy,
                          changes_after=plan.tip.batch_id if plan.tip else None) as source:
            row, files, plan, native_note = _write_pinned(config, spark, store, row, committed, plan, source,
                                                          native_copy)
        row = replace(row, status="complete", bytes=files.bytes, seconds=round(time.monotonic() - started, 3))
        store.record(row)
    except Exception as error:  # noqa: BLE001 -- any failure must leave no complete row behind
        executor = isinstance(error, PythonException)  # the executors' write or re-read raised
        if executor:
            log_traceback(config)
        said = _python_error(str(error)) if executor else f"{type(error).__name__}: {error}"
        with suppress(Exception):  # a native copy no complete row names is an orphan (compaction removes it too)
            native.drop(store.uri, savepoint_id)
        if isinstance(error, BatchGone):
            raise  # nothing read yet: the caller tries the newest batch
        row = replace(row, status="failed", error=said[:500], seconds=round(time.monotonic() - started, 3))
        try:
            store.record(row)
            recorded = "recorded as failed in the catalog"
        except Exception:  # noqa: BLE001 -- the store is down: keep the row for the next catalog access
            store.defer(row)
            recorded = "the catalog is unreachable: the failed attempt will be recorded at the next catalog access"
        if not executor and isinstance(error, (PySparkException, Py4JError)):
            raise  # Spark's own failure (a worker, the state store): spark_failures makes it the typed one line
        cause = said if executor else str(error).splitlines()[0][:300] if str(error) else type(error).__name__
        raise SavepointFailed(f"savepoint {savepoint_id} failed and is not listed as complete ({recorded}): "
                              f"{cause}") from None
    note = "; ".join(n for n in (plan.note, source.note, native_note) if n) or None
    return replace(row, note=note)


def _write_pinned(config: SessionsConfig, spark: SparkSession, store: SavepointStore, row: SavepointInfo,
                  committed: CommittedBatch, plan: SavepointPlan, source: PinnedBatch, native_copy: bool
                  ) -> tuple[SavepointInfo, StateFiles, SavepointPlan, str | None]:
    """The savepoint's table written from `source` (the pinned batch), committed and verified; then its native copy.
    Returns the row (counted, with the native copy), the table's files, the plan as carried out and why there is no
    native copy."""
    savepoint_id, batch_id = row.savepoint_id, committed.batch_id
    increment: WrittenFiles | str | None = None
    if plan.tip is not None:
        increment = _write_increment(config, spark, store, savepoint_id, source, plan.tip.batch_id, batch_id)
        if isinstance(increment, str):
            plan = SavepointPlan(FULL, increment)
    written = increment if isinstance(increment, WrittenFiles) else \
        _write_batch_state(config, spark, store, savepoint_id, batch_id, source)
    try:
        row = _counted(row, plan, written)
        row, files = _commit_and_verify(spark, store, plan, written, row)
    except (PySparkException, Py4JError) as error:
        # The increment's check re-reads the previous chain: a file of it that cannot be read is damage the
        # plan's cheap check could not see (bytes changed in place). This savepoint is taken full instead.
        damage = unreadable_savepoint_file(str(error))
        if plan.kind != INCREMENTAL or damage is None or damage.savepoint_id in (None, savepoint_id):
            raise
        log_traceback(config)
        fs, root = filesystem(store.state_uri(savepoint_id))
        fs.delete_dir_contents(root, missing_dir_ok=True)  # the increment's table: no catalog row names it
        plan = damaged_chain((str(damage.savepoint_id), "a data file cannot be read"))
        written = _write_batch_state(config, spark, store, savepoint_id, batch_id, source)
        row = _counted(row, plan, written)
        row, files = _commit_and_verify(spark, store, plan, written, row)
    native_note = None
    if native_copy:
        row, native_note = _native_copy(store, row, committed, source)
    return row, files, plan, native_note


def _counted(row: SavepointInfo, plan: SavepointPlan, written: WrittenFiles) -> SavepointInfo:
    """The row with the written table's kind, chain, count and checksum: what the attempt records from here on, also
    when the commit or the re-read then fails."""
    savepoint_id = row.savepoint_id
    return replace(row, rows=written.rows, checksum=written.checksum, table_rows=written.rows, kind=plan.kind,
                   chain=(*plan.tip.chain_ids, savepoint_id) if plan.tip else (savepoint_id,),
                   base_id=plan.tip.chain_ids[0] if plan.tip else None)


def _commit_and_verify(spark: SparkSession, store: SavepointStore, plan: SavepointPlan, written: WrittenFiles,
                       row: SavepointInfo) -> tuple[SavepointInfo, StateFiles]:
    """The written files committed as the savepoint's table and re-read by the executors. Returns the row (an
    increment's: with the count and checksum of the state it represents) and the table's files."""
    savepoint_id = row.savepoint_id
    kill_point("savepoint:files-written")
    commit_state_files(written, store.options)
    kill_point("savepoint:committed")
    if plan.tip is not None and plan.kind == INCREMENTAL:
        rows, checksum, files = _verify_increment(spark, store, savepoint_id, written, plan.tip)
        return replace(row, rows=rows, checksum=checksum), files
    return row, verify_state_files(spark, store, savepoint_id, written.rows, written.checksum)


def _python_error(text: str) -> str:
    """The exception line of a Python traceback an executor sent back (its last unindented line)."""
    lines = [line for line in text.splitlines() if line.strip() and not line[0].isspace()]
    return f"in an executor: {lines[-1][:300] if lines else 'its Python code failed'}"
