"""Restore: a fresh checkpoint built from a savepoint alone -- state, source position, watermark and outputs -- with
the old checkpoint set aside, not deleted. From the savepoint's native copy (a file copy), or from its canonical rows:
the restored checkpoint's first batch runs with no state, then the executors write its state directly
(pipelines.job.operators.state_writer), read back and checked before any output table is rolled back; the driver holds
metadata and checksums only. The pre-flight's checks (state_store.preflight) run first, so a restore is refused
exactly when `--dry-run` says so."""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, suppress
from dataclasses import dataclass, replace
from functools import partial

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from pipelines.config import SessionsConfig
from pipelines.coordination import kill_point
from pipelines.coordination.leases import Lease
from pipelines.core import state_format
from pipelines.core.attributes import partials_from_json, partials_to_json
from pipelines.core.rules import SessionRules
from pipelines.core.sessionize import rewalk, rows_table
from pipelines.errors import (
    LeaseLost,
    RestoreIncomplete,
    SavepointDamaged,
    StateMismatch,
    savepoint_way_out,
    unreadable_savepoint_file,
)
from pipelines.job.checkpoint import (
    BOOTSTRAP_FILE,
    JobMetadata,
    clear_restore_marker,
    inspect_checkpoint,
    write_job_metadata,
    write_restore_marker,
)
from pipelines.job.operators import for_new_checkpoint
from pipelines.job.operators.seam import StateOperator
from pipelines.job.operators.state_writer import (
    StateWritten,
    install_state,
    write_placed_state,
    write_restored_batch,
    write_state,
)
from pipelines.job.runtime import error_line, fenced_logs, get_spark, stop_state_stores
from pipelines.job.sink import roll_back
from pipelines.job.startup import ensure_tables
from pipelines.job.stream import start_query
from pipelines.locations import CheckpointPath, move, remove_tree, set_aside
from pipelines.storage import filesystem
from state_store.kernel import FAILED_SUFFIX, REPLACED_SUFFIX
from state_store.preflight import native_refusal, record_restore, refusals
from state_store.results import Phases, RestoreResult, SavepointInfo
from state_store.savepoint import native
from state_store.savepoint.catalog import SavepointStore
from state_store.savepoint.chain import savepoint_checksum, savepoint_rows, savepoint_rows_by_spark
from state_store.savepoint.checksum import combine_checksum, frame_checksum, state_checksum

__all__ = ["restore_unlocked", "verified_savepoint"]



def verified_savepoint(config: SessionsConfig, spark: SparkSession, *, savepoint: str = "latest") -> SavepointInfo:
    """The catalog row of a complete savepoint whose files, re-read in the executors, hold the catalogued rows and
    checksum."""
    store = SavepointStore.of(config)
    saved = store.get(savepoint)
    rows, checksum = savepoint_checksum(spark, store, saved.savepoint_id)
    if (rows, checksum) != (saved.rows, saved.checksum):
        raise SavepointDamaged(f"savepoint {saved.savepoint_id} is damaged: {rows} rows / {checksum}, catalog says "
                               f"{saved.rows} / {saved.checksum}: {savepoint_way_out(saved.savepoint_id)}",
                               savepoint_id=saved.savepoint_id)
    return replace(saved, verified=True)


def expected_restored_state(state: pa.Table, rules: SessionRules) -> pa.Table:
    """What the restore's bootstrap batch must leave in the store, by the pure core: the rows walked once (watermark
    0, so nothing closes or freezes). Equal to the savepoint's rows for a v2 savepoint under its own gap; for a v1
    savepoint or a new gap it settles each row's session_start. With `attributes` (the restore's spec), each row keeps
    its partials of those (an attribute the savepoint lacks is unknown, one the spec no longer has is dropped)."""
    rows = state_format.canonical_rows_ms(state)
    gap_ms, attributes = rules.gap_ms, rules.attributes
    if not attributes:
        return state_format.to_canonical(rows_table(rewalk(rows, 0, gap_ms)))
    texts = state_format.conform(state, state_format.SAVED_SCHEMA)["attributes"].to_pylist()
    walked = rewalk({**rows, "partials": [partials_from_json(attributes, text) for text in texts]}, 0, gap_ms,
                    attributes=attributes)
    out = state_format.to_canonical(rows_table(walked))
    return out.set_column(out.schema.get_field_index("attributes"), "attributes", pa.array(
        [partials_to_json(attributes, partials) for partials in walked["partials"]], pa.string()))


@dataclass(frozen=True)
class _Bootstrap:
    """The rows the restored operator starts from (`rows()`, the savepoint's own reader, planned only when asked: the
    ways below usually take the rows; `by_spark`: the same read by Spark's Parquet reader, tried first when there is
    one; `placed`: the same in the state's placement, tried before it), and the (rows, checksum) its state must then
    hold."""
    rows: Callable[[], DataFrame]
    expected: tuple[int, str]
    by_spark: DataFrame | None = None
    placed: list[DataFrame] | None = None


def _bootstrap_rows(config: SessionsConfig, spark: SparkSession, store: SavepointStore, saved: SavepointInfo, *,
                    partitions: int) -> _Bootstrap:
    """The rows the restored operator starts from, and the (rows, checksum) its state must then hold.

    A v2 savepoint under its own gap is loaded as it is, straight from its files by the executors: the walk at
    watermark 0 changes nothing, so the expectation is the catalog's. A v1 savepoint or a new gap (--migrate) is
    upgraded and re-walked by the pure core here, on the driver, and staged next to the checkpoint."""
    if saved.state_schema == state_format.SCHEMA_ID and saved.gap_ms == config.rules.gap_ms:
        kept = {a.key for a in config.rules.attributes}
        if {a.key for a in saved.rules.attributes} <= kept:
            by_spark, placed = savepoint_rows_by_spark(  # a savepoint's files follow its own partitions
                spark, store, saved.savepoint_id, placed_in=partitions if saved.partitions == partitions else None)
            return _Bootstrap(partial(savepoint_rows, spark, store, saved.savepoint_id), (saved.rows, saved.checksum),
                              by_spark, placed)
        # The spec dropped or changed an attribute: the restored rows hold the partials of the others only.
        rows = savepoint_rows(spark, store, saved.savepoint_id)
        return _Bootstrap(lambda: rows, frame_checksum(rows.mapInArrow(partial(_keep_partials, keys=frozenset(kept)),
                                                                       state_format.SAVED_DDL)))
    state = store.read_state(saved.savepoint_id)
    if saved.state_schema == state_format.V1_SCHEMA_ID:
        state = state_format.upgrade_v1(state)
    state = state_format.conform(state)
    staged = config.checkpoint / "bootstrap-state.parquet"  # not "_...": Spark's file reader skips such names
    fs, path = filesystem(str(staged))
    pq.write_table(state, path, filesystem=fs)
    expected = expected_restored_state(state, config.rules)
    restored = spark.read.parquet(str(staged))
    return _Bootstrap(lambda: restored, (expected.num_rows, state_checksum(expected)))


def _keep_partials(batches: Iterator[pa.RecordBatch], *, keys: frozenset[str]) -> Iterator[pa.RecordBatch]:
    """mapInArrow function: canonical rows with only the partials of attributes `keys` in their `attributes`."""
    for batch in batches:
        table = state_format.conform(batch, state_format.SAVED_SCHEMA)
        texts = [None if text is None else json.dumps({k: v for k, v in json.loads(text).items() if k in keys})
                 for text in table["attributes"].to_pylist()]
        yield from table.set_column(table.schema.get_field_index("attributes"), "attributes",
                                    pa.array(texts, pa.string())).to_batches()


def _restore_native(config: SessionsConfig, store: SavepointStore, saved: SavepointInfo, *, partitions: int | None,
                    spark: SparkSession | None, lease: Lease | None, started: float) -> RestoreResult | str:
    """The savepoint's native copy put back as the checkpoint (state_store.savepoint.native): the stream resumes at
    the batch after it, no Spark job here. A copy that turns out damaged while copied leaves everything as it was
    and returns why (the caller restores the canonical rows instead)."""
    phase = Phases(started)

    phase("preflight")
    kill_point("restore:checked")
    _still_held(lease)
    write_restore_marker(config.checkpoint, saved.savepoint_id, partitions)  # before the first change
    if spark is not None:
        stop_state_stores(spark)  # a stopped query's store uploads nothing into the restored checkpoint
    replaced = set_aside(config.checkpoint, REPLACED_SUFFIX)
    kill_point("restore:aside")
    outputs_rolled_back = False
    try:
        _still_held(lease)
        try:
            native.copy_in(store.uri, saved.savepoint_id, str(saved.native_checksum), config.checkpoint)
        except SavepointDamaged as damage:
            _still_held(lease)
            remove_tree(config.checkpoint)
            if replaced is not None:
                move(replaced, config.checkpoint)
            clear_restore_marker(config.checkpoint)
            return f"its native copy is damaged ({damage})"
        phase("native_copied")
        kill_point("restore:native-copied")
        _still_held(lease)
        write_job_metadata(config.checkpoint, JobMetadata.new(
            config.rules, config.state_buckets, state_layout=for_new_checkpoint().layout,
            created_from=saved.savepoint_id))  # a new incarnation: fresh idempotency keys
        outputs_rolled_back = True
        removed = roll_back(config, sessions_version=saved.sessions_version,
                            quarantine_version=saved.quarantine_version, leases=[lease] if lease else [])
        ensure_tables(config)
        phase("outputs_rolled_back")
        kill_point("restore:rolled-back")
    except Exception as error:  # noqa: BLE001 -- whatever broke, leave the operator a known next step
        _lost_lease(lease, error)
        raise _failed_restore(config, saved.savepoint_id, replaced, outputs_rolled_back, error) from None
    clear_restore_marker(config.checkpoint)
    info = inspect_checkpoint(config.checkpoint)
    return RestoreResult(
        savepoint_id=saved.savepoint_id, batch_id=saved.batch_id, rows=saved.rows, checksum=saved.checksum,
        verified=True, source_seq=saved.source_seq, watermark_ms=saved.watermark_ms, provider=info.provider,
        partitions=info.partitions, rolled_back=removed, previous_checkpoint=str(replaced) if replaced else None,
        seconds=round(time.monotonic() - started, 3), phases=phase.seconds, method="native",
    )


def restore_unlocked(config: SessionsConfig, savepoint: str, *, partitions: int | None, migrate: bool,
                     spark: SparkSession | None, lease: Lease | None = None, canonical: bool = False,
                     side: bool = False) -> RestoreResult:
    """The restore, for a caller that holds the job and lifecycle leases (state_store.lifecycle); with `lease` (the
    job lease) its writes are fenced by it. From the savepoint's native copy when it has one this restore can use
    and not `canonical`; else from its canonical rows. A `side` checkpoint (built beside a running stream to become
    the savepoint's native copy: state_store.rescale) writes nothing to the output tables: they are not
    rolled back, and no batch runs after batch 0 (which closes no session: the savepoint's watermark is the next
    batch's) -- the stream that resumes from it closes them in its first batch, after its own rollback."""
    started = time.monotonic()
    phase = Phases(started)

    store = SavepointStore.of(config)
    saved = store.get(savepoint)
    refused = refusals(config, saved, partitions=partitions, migrate=migrate, store=store)
    if refused:
        raise refused[0]
    note = native_refusal(config, store, saved, partitions=partitions, migrate=migrate, canonical=canonical)
    if note is None:
        done = _restore_native(config, store, saved, partitions=partitions, spark=spark, lease=lease, started=started)
        if isinstance(done, RestoreResult):
            return done
        note = done
    # RocksDB commits the bootstrap batch as a snapshot, not as a changelog of every key: the read-back below and the
    # stream's first batch after load its files as they are instead of replaying every put (the stream goes on with
    # its own setting: switching keeps the state).
    target = config.with_(state_partitions=partitions or saved.partitions or config.state_partitions,
                          rocksdb_changelog=False)
    spark = spark or get_spark(target)
    phase("preflight")
    kill_point("restore:checked")
    _still_held(lease)
    write_restore_marker(config.checkpoint, saved.savepoint_id, partitions)  # before the first change
    stop_state_stores(spark)  # a stopped query's store uploads no snapshot into the new checkpoint
    replaced = set_aside(config.checkpoint, REPLACED_SUFFIX)
    kill_point("restore:aside")
    outputs_rolled_back = False
    fence = ExitStack()
    try:
        _still_held(lease)
        if lease is not None:  # Spark's own writes of the new checkpoint's logs (its queries' batches) too
            fence.enter_context(fenced_logs(spark, config.checkpoint, lease))
        operator = for_new_checkpoint()
        meta = JobMetadata.new(config.rules, config.state_buckets, state_layout=operator.layout,
                               created_from=saved.savepoint_id)
        write_job_metadata(config.checkpoint, meta)
        # Batch 0 -- the source at the savepoint's position, its watermark the next batch's -- written as the stream's
        # query would leave it (its logs, the operator's metadata and state schema; no query run); its state written
        # by the state writer in the executors into a staging directory -- each user's rows walked once at watermark
        # 0 as the operator walks a stored user, no per-key call (pipelines.job.operators.state_writer) -- and then
        # moved into place.
        _still_held(lease)
        (config.checkpoint / BOOTSTRAP_FILE).write_text(json.dumps({
            "savepoint_id": saved.savepoint_id, "source_seq": saved.source_seq,
            "watermark_ms": saved.watermark_ms, "lateness_ms": config.rules.lateness_ms,
        }))
        partitions = target.state_partitions
        write_restored_batch(spark, target, source_seq=saved.source_seq, watermark_ms=saved.watermark_ms)
        initial = _bootstrap_rows(config, spark, store, saved, partitions=partitions)
        expected = initial.expected
        by_catalog = expected == (saved.rows, saved.checksum)
        if not by_catalog:  # the read-back checks a re-walk: the savepoint's files are checked against the catalog first
            saved = verified_savepoint(config, spark, savepoint=saved.savepoint_id)
            phase("savepoint_verified")
        written = _write_state(initial, config, watermark_ms=saved.watermark_ms, partitions=partitions)
        if inspect_checkpoint(config.checkpoint).partitions != partitions:
            raise StateMismatch(f"the restored checkpoint's batch 0 records "
                                f"{inspect_checkpoint(config.checkpoint).partitions} state partitions, not {partitions}")
        _still_held(lease)
        install_state(spark, config.checkpoint, partitions=partitions)
        phase("state_written")
        # The read-back: each partition's committed store loaded by a fresh provider in the task that wrote it.
        got = written.read_rows, combine_checksum([(written.read_rows, written.read_sum)])
        phase("state_checked")
        if got != expected and by_catalog:  # checked before any table changed: the savepoint is refused as it is
            raise SavepointDamaged(f"savepoint {saved.savepoint_id} is damaged: its state restored as {got[0]} rows / "
                                   f"{got[1]}, catalog says {expected[0]} / {expected[1]}: "
                                   f"{savepoint_way_out(saved.savepoint_id)}", savepoint_id=saved.savepoint_id)
        if got != expected:
            raise StateMismatch(f"restored state does not match the savepoint: {got[0]} rows / {got[1]} vs "
                                f"{expected[0]} / {expected[1]}")
        outputs_rolled_back = not side  # from here the tables may differ from what the old checkpoint wrote
        removed = {} if side else roll_back(config, sessions_version=saved.sessions_version,
                                            quarantine_version=saved.quarantine_version,
                                            leases=[lease] if lease else [])
        ensure_tables(config)
        phase("outputs_rolled_back")
        kill_point("restore:rolled-back")
        if not side and written.due:
            # The stream's batch after batch 0, with the savepoint's watermark: it closes the sessions the savepoint
            # holds as due, into the rolled-back tables. With none due it would write nothing and is left to the
            # stream's first batch, as a side checkpoint leaves it: no query (nor Python worker) for it here.
            _settle_batch(spark, target, meta, operator, saved, lease)
            phase("settle_batch")
    except Exception as error:  # noqa: BLE001 -- whatever broke, leave the operator a known next step
        fence.close()
        with suppress(Exception):  # the restore's own failure is what to report
            stop_state_stores(spark)  # nor the failed restore's into the checkpoint moved back
        _lost_lease(lease, error)
        failed = _failed_restore(config, saved.savepoint_id, replaced, outputs_rolled_back, error)
        # (an executor that could not read one of the savepoint's files names it)
        damage = error if isinstance(error, SavepointDamaged) else unreadable_savepoint_file(str(error))
        if damage is not None and not outputs_rolled_back:
            raise damage from None  # nothing changed: the savepoint's own line, with its way out
        raise failed from None
    fence.close()
    clear_restore_marker(config.checkpoint)
    info = inspect_checkpoint(config.checkpoint)
    seconds = round(time.monotonic() - started, 3)
    record_restore(config.home, saved.rows, seconds)
    return RestoreResult(
        savepoint_id=saved.savepoint_id, batch_id=saved.batch_id, rows=saved.rows,
        checksum=got[1], verified=True, source_seq=saved.source_seq,
        watermark_ms=saved.watermark_ms, provider=info.provider, partitions=info.partitions,
        rolled_back=removed, previous_checkpoint=str(replaced) if replaced else None, seconds=seconds, phases=phase.seconds,
        note=f"the native copy was not used: {note}" if note else None,
    )


def _write_state(initial: _Bootstrap, config: SessionsConfig, *, partitions: int, watermark_ms: int) -> StateWritten:
    """The restored state written by the executors (state_writer) into the checkpoint's staging directory, from the
    rows Spark's reader reads when it can -- no Python worker then; with no shuffle either where the savepoint's files
    are in the restored state's placement -- else, or when that reader refuses a file, from the rows the savepoint's
    own reader reads (which names a damaged file)."""
    if initial.placed is not None:
        try:  # the savepoint's files as its state partitions wrote them: no shuffle (each row checked)
            placed = write_placed_state(initial.placed, config.checkpoint, rules=config.rules,
                                        watermark_ms=watermark_ms)
            if placed is not None:
                return placed
        except Exception:  # noqa: BLE001 -- any refusal: the ways below say what it is
            pass
    if initial.by_spark is not None:
        try:
            return write_state(initial.by_spark, config.checkpoint, rules=config.rules, partitions=partitions,
                               watermark_ms=watermark_ms, staged=True)
        except Exception:  # noqa: BLE001 -- any refusal: the savepoint's own reader says what it is
            pass
    return write_state(initial.rows(), config.checkpoint, rules=config.rules, partitions=partitions,
                       watermark_ms=watermark_ms, staged=True)


def _settle_batch(spark: SparkSession, config: SessionsConfig, meta: JobMetadata, operator: StateOperator,
                  saved: SavepointInfo, lease: Lease | None) -> None:
    """The restored checkpoint's batch after batch 0, up to the savepoint's source position: no event, the
    savepoint's watermark, so it closes the sessions the savepoint holds as due into the output tables."""
    query, _ = start_query(spark, config, meta, operator, trigger={"availableNow": True},
                           source_options={"targetSeq": saved.source_seq, "settle": "true"}, lease=lease)
    query.awaitTermination()
    failure = query.exception()
    if failure is not None:
        raise failure


def _still_held(lease: Lease | None) -> None:
    """LeaseLost unless this process still holds the job lease: a restore paused past the lease's TTL (another
    process may have restored meanwhile) writes nothing more into the checkpoint."""
    if lease is not None:
        lease.check()


def _lost_lease(lease: Lease | None, error: BaseException) -> None:
    """A failed restore whose job lease is lost raises that (LeaseLost), touching nothing: the way back
    (_failed_restore) moves checkpoints, and the one in place may now be another holder's."""
    if isinstance(error, LeaseLost):
        raise error
    try:
        _still_held(lease)
    except LeaseLost as lost:
        raise lost from None


def _failed_restore(config: SessionsConfig, savepoint_id: str, replaced: CheckpointPath | None,
                    outputs_rolled_back: bool, error: BaseException) -> RestoreIncomplete:
    """Put things where a rerun (or the old job) can go on, and say which it is."""
    cause = error_line(error)
    set_aside(config.checkpoint, FAILED_SUFFIX)
    if not outputs_rolled_back and replaced is not None:
        move(replaced, config.checkpoint)
        clear_restore_marker(config.checkpoint)
        return RestoreIncomplete(f"restore from {savepoint_id} failed before any table was changed ({cause}); "
                                 f"the previous checkpoint is back in place",
                                 next_step="none: the previous checkpoint is back in place, the old job can go on")
    kept = f"; the previous checkpoint (ahead of the tables now) is kept at {replaced}" if replaced else ""
    return RestoreIncomplete(f"restore from {savepoint_id} failed once the output tables were being rolled back to it "
                             f"({cause}): run the same restore again{kept}", next_step="run the same restore again")
