"""What the lifecycle library's public operations return: frozen dataclasses, read by attribute (the one result
convention, pipelines.errors.Result). `to_dict()` is the JSON shape sessionctl prints and Dagster ops pass on: the
dataclass's fields, in order."""
from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

from pipelines.config import Provider
from pipelines.core.rules import SessionRules
from pipelines.errors import Result

__all__ = ["CATALOG_COLUMNS", "CompactionResult", "MaintenanceDue", "OperatorTrigger", "Phases", "RescaleMethod", "RescaleResult", "RestoreResult", "SavepointInfo", "SavepointKind", "StatusReport", "StopResult", "TableFacts", "Trigger"]

RestoreMethod = Literal["canonical", "native"]
# What asked for a savepoint: an operator (sessionctl, Dagster's savepoint job: OperatorTrigger), or an operation
# that takes one itself.
OperatorTrigger = Literal["manual", "scheduled", "sensor"]
Trigger = Literal[OperatorTrigger, "pre-rescale", "pre-restore", "stop", "erasure"]
SavepointStatus = Literal["complete", "failed"]
SavepointKind = Literal["full", "incremental"]  # state_store.savepoint.catalog's FULL, INCREMENTAL
RescaleMethod = Literal["none", "repartition", "savepoint-restore", "prepared"]


# A SavepointInfo field that is not a catalog column (the catalog's columns are the other fields, in field order).
_NOT_STORED = {"stored": False}


@dataclass(frozen=True)
class SavepointInfo(Result):
    """One savepoint, as its catalog row holds it (SavepointStore.list/get, take_savepoint, validate_savepoint): the
    one owner of the catalog's columns (state_store.savepoint.catalog), which are its fields in order, less those
    marked _NOT_STORED. A column is only ever added at the end (catalogs written by earlier releases still read)."""
    savepoint_id: str
    # A failed attempt's row may hold null where a complete one's is typed as set (rows, checksum, ...): the attempt
    # failed before knowing it.
    status: SavepointStatus
    trigger: Trigger
    created_at: str  # ISO-8601, UTC
    batch_id: int
    source_seq: int  # raw_events ingest sequence the state has consumed
    watermark_ms: int
    gap_ms: int
    lateness_ms: int
    buckets: int
    provider: Provider | None
    partitions: int | None
    state_schema: str
    rows: int
    checksum: str
    sessions_version: int
    quarantine_version: int
    incarnation: str
    state_uri: str
    bytes: int | None
    seconds: float | None
    error: str | None = None
    # set by validate_savepoint (re-read matched the catalog row)
    verified: bool | None = field(default=None, metadata=_NOT_STORED)
    # Incremental savepoints (state_store.savepoint.catalog: "Incremental savepoints"); `rows`/`checksum` above are always
    # the state the savepoint represents, `table_rows` what its own table held when written.
    kind: SavepointKind | None = None
    base_id: str | None = None    # an incremental one's full savepoint
    chain: tuple[str, ...] | None = None  # ids base..this (a full one: its own id)
    table_rows: int | None = None
    # A native copy beside the canonical rows (state_store.savepoint.native): its files' count and bytes, and the
    # SHA-256 of its manifest; None: canonical only (not asked for, dropped by an erasure, or not possible).
    native_files: int | None = None
    native_bytes: int | None = None
    native_checksum: str | None = None
    # The session spec the state was made under (pipelines.core.spec.SessionSpec.to_json); None: the default spec
    # (and every savepoint taken before specs existed). A restore compares it with the current one.
    spec: str | None = None
    # The idle close the job ran with; None: the default (SessionRules.idle_close_recorded), and every savepoint taken
    # before it was recorded. `rules` puts these columns together.
    idle_close_ms: int | None = None
    # take_savepoint's result only (not in the catalog): why it is full though an increment was asked for (a damaged
    # chain, state_store.savepoint.policy)
    note: str | None = field(default=None, metadata=_NOT_STORED)
    _omit_if_none: ClassVar[tuple[str, ...]] = ("error", "verified", "kind", "base_id", "chain", "table_rows",
                                                "native_files", "native_bytes", "native_checksum", "spec", "idle_close_ms",
                                                "note")

    @property
    def uri(self) -> str:
        """Where the savepoint's state table lives (the contract's `uri`)."""
        return self.state_uri

    @property
    def rules(self) -> SessionRules:
        """The session rules the savepoint was taken under (the default spec for a savepoint from before specs)."""
        return SessionRules.recorded(gap_ms=self.gap_ms, lateness_ms=self.lateness_ms,
                                     idle_close_ms=self.idle_close_ms, spec=self.spec)

    @property
    def chain_ids(self) -> list[str]:
        """The savepoint's chain, base first (a full savepoint: itself)."""
        return list(self.chain) if self.chain else [self.savepoint_id]

    @classmethod
    def from_row(cls, row: dict[str, Any], verified: bool | None = None) -> SavepointInfo:
        """From a catalog row (SavepointStore.list, or the row take_savepoint recorded)."""
        created_at = row["created_at"]
        if isinstance(created_at, dt.datetime):
            created_at = created_at.isoformat()
        values = {f.name: row.get(f.name) for f in fields(cls) if f.name not in ("created_at", "verified")}
        chain = values["chain"]
        if chain is not None:  # a catalog table's text (ids joined by commas), or ids
            values["chain"] = tuple(chain.split(",")) if isinstance(chain, str) else tuple(chain)
        return cls(**values, created_at=created_at, verified=verified)  # type: ignore[arg-type]

    def to_dict(self, *, catalog: bool = False) -> dict[str, Any]:
        """The savepoint JSON (`savepoint`, `stop --savepoint`, validate): `uri` after `seconds`, `error` and
        `verified` only when set. With `catalog`, an entry of `savepoints --json`: the catalog row's columns in the
        catalog's order (`error` always, null when none; never `verified`), then `uri`."""
        out = super().to_dict()
        if catalog:  # the fields are in the catalog's order
            row = {k: v for k, v in out.items() if k not in ("error", "verified")}
            return {**row, "error": self.error, "uri": self.uri}
        # The savepoint JSON's order predates the catalog's: `status` after `state_uri`, `uri` after `seconds`.
        ordered: dict[str, Any] = {}
        for key, value in out.items():
            if key not in ("status", "error", "verified"):
                ordered[key] = value
            if key == "state_uri":
                ordered["status"] = out["status"]
            if key == "seconds":
                ordered["uri"] = self.uri
        ordered.update({k: out[k] for k in ("error", "verified") if k in out})
        return ordered


# The savepoint catalog's columns, in their stored order (state_store.savepoint.catalog types them from the hints).
CATALOG_COLUMNS = tuple(f.name for f in fields(SavepointInfo) if f.metadata.get("stored", True))


@dataclass(frozen=True)
class RestoreResult(Result):
    savepoint_id: str
    batch_id: int
    rows: int
    checksum: str
    verified: bool
    source_seq: int
    watermark_ms: int
    provider: str | None
    partitions: int | None
    rolled_back: dict[str, int]  # output table -> rows removed (written after the savepoint)
    previous_checkpoint: str | None  # where the replaced checkpoint was set aside
    seconds: float
    # where the time went: pre-flight, savepoint verified, outputs rolled back, bootstrap batch, restored state checked
    # (from a native copy: pre-flight, native files copied back, outputs rolled back)
    phases: dict[str, float] = field(default_factory=dict)
    # "native": the savepoint's native copy put back as the checkpoint (no Spark job); "canonical": its rows loaded
    # by a bootstrap batch and read back.
    method: RestoreMethod = "canonical"
    note: str | None = None  # why a savepoint's native copy was not used (it had one)
    # A running stream's restore (`restore --online`: done by the stream between two batches): its downtime, as for a
    # rescale (RescaleResult), and the stream that did it.
    downtime_seconds: float | None = None
    resumed_seconds: float | None = None
    stream: str | None = None
    _omit_if_none: ClassVar[tuple[str, ...]] = ("note", "downtime_seconds", "resumed_seconds", "stream")


@dataclass(frozen=True)
class RescaleResult(Result):
    partitions_before: int | None
    partitions_after: int | None
    method: RescaleMethod
    savepoint_id: str | None  # the pre-rescale savepoint
    rows: int | None
    seconds: float
    # where the time went: the pre-rescale savepoint, then Spark's repartition and the repartitioned state checked
    # against that savepoint (RocksDB), or the savepoint's restore at the new count (HDFS-backed: its own phases)
    phases: dict[str, float] = field(default_factory=dict)
    # A running stream's rescale (done by the stream between two batches): its downtime, from the end of its last
    # batch before to the end of its first batch after; `resumed_seconds` from that last batch to the query running
    # again (what is known when no batch ran after within the wait: no new events).
    downtime_seconds: float | None = None
    resumed_seconds: float | None = None
    stream: str | None = None  # the stream that did it (its lease holder)
    _omit_if_none: ClassVar[tuple[str, ...]] = ("rows", "downtime_seconds", "resumed_seconds", "stream")


@dataclass(frozen=True)
class CompactionResult(Result):
    dry_run: bool
    files_before: int
    files_after: int
    bytes_before: int
    bytes_after: int
    bytes_reclaimed: int
    savepoints_deleted: list[str]
    replaced_checkpoints_removed: list[str]
    orphan_state_removed: list[str]  # state/<id>/ folders of savepoints killed before their catalog row
    replaced_checkpoint_bytes: int
    state_files: int
    state_bytes: int
    tables: dict[str, dict[str, int]]  # per table: files_/bytes_before, and after or would_vacuum (dry run)
    seconds: float
    savepoints_folded: list[str] = field(default_factory=list)  # incremental savepoints made full (their chains')
    # kept savepoints whose table cannot be read (state_store.savepoint.damage): not optimized, vacuumed or folded
    savepoints_damaged: list[str] = field(default_factory=list)
    # native/<id>/ folders no kept complete savepoint names (state_store.savepoint.native)
    orphan_native_removed: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class StatusReport(Result):
    checkpoint: str
    provider: str
    partitions: int
    last_committed_batch: int | None
    watermark_ms: int | None
    source_offset: dict[str, Any] | None
    state_files: int
    state_bytes: int
    sessions_rows: int
    quarantine_rows: int
    restore_in_progress: str | None  # the command that finishes an interrupted restore, None when none is
    rescale_in_progress: str | None = None  # the same for a rescale interrupted inside Spark's repartition
    kafka_lag: dict[str, Any] | None = None  # Kafka ingest: per partition next_offset, high_watermark, lag
    # from a pass over the live state (zeros when not read: --no-state, or nothing committed)
    state_keys: int = 0
    open_users: int = 0
    open_sessions: int = 0
    open_events: int = 0
    state_rows: int = 0
    frozen_prefixes: int = 0
    state_value_bytes: int = 0


@dataclass(frozen=True)
class MaintenanceDue(Result):
    """The maintenance policy's answer (maintenance.maintenance_due): what is due now, and why."""
    savepoint: str | None      # why a savepoint is due, None when the newest one is recent enough
    compaction: str | None     # why compaction is due, None when files are below the thresholds
    newest_savepoint_id: str | None
    newest_savepoint_age_s: float | None
    data_files: dict[str, int]  # live data files per table
    state_files: int            # files under the checkpoint's state/


@dataclass(frozen=True)
class TableFacts(Result):
    """A Delta table as its log describes it (no data read): observe.table_facts."""
    uri: str
    version: int
    rows: int
    data_files: int
    bytes: int


@dataclass(frozen=True)
class StopResult(Result):
    """What `stop` did: the stream it stopped, its last committed batch and, when asked, the savepoint of it."""
    stopped: bool
    stream: str  # the holder of the job lease that was stopped (operation, pid, host)
    last_committed_batch: int | None
    seconds: float
    savepoint: SavepointInfo | None = None

    def to_dict(self) -> dict[str, Any]:
        """The stop's fields, then the savepoint's (the contract: `stop --savepoint` prints them)."""
        out = {"stopped": self.stopped, "stream": self.stream, "last_committed_batch": self.last_committed_batch,
               "stop_seconds": self.seconds}
        if self.savepoint is not None:
            out.update(self.savepoint.to_dict())
        return out


class Phases:
    """Seconds per phase of an operation, each from the end of the one before: `phase("name")` closes a phase; a
    result's `phases` is `phase.seconds`."""

    def __init__(self, started: float | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.monotonic() if started is None else started

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self.seconds[name], self._last = round(now - self._last, 3), now
