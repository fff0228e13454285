"""Savepoints as Delta tables (delta-rs) on a local path or S3: canonical state rows + a catalog.

Layout under SESSIONS_SAVEPOINT_URI:
  catalog/          one row per savepoint attempt (status complete | failed); the only index
  state/<id>/       a full savepoint: the open state in canonical form (pipelines.core.state_format.SAVED_SCHEMA,
                    schema id in the catalog row; v1 savepoints -- one row per open event -- still restore);
                    an incremental one: INCREMENT_SCHEMA (canonical + `deleted`), see below
A savepoint is listed as complete only after its state table was written, re-read and its count and
checksum matched the live state; a half-written state table is never referenced by a complete row. The executors
write, re-read and checksum the state table (state_store.savepoint.files); this process handles its metadata only.

Incremental savepoints (state_store.savepoint.chain). An incremental savepoint's table holds only the users whose
state changed since the previous savepoint of its chain: every canonical row of each such user (its whole state at
the savepoint's batch, `deleted` false) and, for a user whose state was removed, one tombstone row (`user_id` set,
the other canonical columns null, `deleted` true). The catalog row names its `chain` (ids from the full savepoint it
builds on, `base_id`, to itself) and its `kind`; the state it represents is the chain resolved: per user the rows of
the newest table of the chain that holds the user, unless those are a tombstone. As a Delta view (SQL):

    SELECT user_id, session_start, event_id, event_time, event_type, event_count, page_views FROM (
      SELECT *, MAX(pos) OVER (PARTITION BY user_id) AS newest FROM (
        SELECT *, false AS deleted, 0 AS pos FROM delta.`state/<base_id>`
        UNION ALL SELECT *, 1 AS pos FROM delta.`state/<chain[1]>` ... UNION ALL SELECT *, n AS pos FROM ...))
    WHERE pos = newest AND NOT deleted

A table without the `deleted` column is full: resolution starts at the newest full table of the chain (compaction
folds a chain by rewriting a member's table as full, state_store.savepoint.fold). `rows` and `checksum` in the
catalog are always those of the resolved state (what a restore loads and verifies); `table_rows` what the
savepoint's own table held when written.
"""
from __future__ import annotations

import builtins
import datetime as dt
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from pipelines.config import SessionsConfig
from pipelines.core import state_format
from pipelines.errors import SavepointDamaged, SavepointNotFound
from pipelines.storage import join, read_rows, s3_errors, storage_options
from state_store.results import CATALOG_COLUMNS, SavepointInfo

__all__ = ["written_schema", "CATALOG_SCHEMA", "DELETED", "FULL", "INCREMENTAL", "INCREMENT_SCHEMA", "SavepointStore", "StateFiles", "new_savepoint_id"]


# The catalog's columns are SavepointInfo's (results.CATALOG_COLUMNS, in their stored order); each one's type comes
# from its type hint here.
def _column(name: str, hint: Any) -> pa.Field:
    kind = hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # `X | None` -> X
        kind = next(k for k in typing.get_args(hint) if k is not type(None))
    if name == "created_at":
        return pa.field(name, pa.timestamp("us", tz="UTC"))  # ISO text in the result, a timestamp in the table
    if kind is int:
        return pa.field(name, pa.int64())
    if kind is float:
        return pa.field(name, pa.float64())
    if kind is str or typing.get_origin(kind) in (typing.Literal, tuple):
        return pa.field(name, pa.string())  # a chain is stored comma-separated (_stored_row)
    raise TypeError(f"SavepointInfo.{name}: no catalog column type for {hint}")


_HINTS = typing.get_type_hints(SavepointInfo)
CATALOG_SCHEMA = pa.schema([_column(name, _HINTS[name]) for name in CATALOG_COLUMNS])


def _stored_row(saved: SavepointInfo) -> dict[str, Any]:
    """A row as the catalog table holds it: every column, `created_at` a timestamp, the chain as ids joined by
    commas."""
    stored = {name: getattr(saved, name) for name in CATALOG_COLUMNS}
    stored["created_at"] = dt.datetime.fromisoformat(saved.created_at) if saved.created_at else None
    stored["chain"] = ",".join(saved.chain) if saved.chain is not None else None
    return stored


FULL: Final = "full"  # (Final: typed as the literal, a results.SavepointKind)
INCREMENTAL: Final = "incremental"
DELETED = "deleted"  # the tombstone flag of an incremental savepoint's table
INCREMENT_SCHEMA = state_format.SAVED_SCHEMA.append(pa.field(DELETED, pa.bool_()))  # as read (any age)


def written_schema(*, increment: bool, attributes: bool) -> pa.Schema:
    """The columns a savepoint's table is written with: the `attributes` column only for a job whose spec has
    attributes (a job without them writes the tables it always wrote)."""
    base = state_format.SAVED_SCHEMA if attributes else state_format.CANONICAL_SCHEMA
    return base.append(pa.field(DELETED, pa.bool_())) if increment else base


Catalog = list[SavepointInfo]  # (inside SavepointStore, `list` names its method)


_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def _pylist(table: pa.Table) -> list[dict[str, Any]]:
    """table.to_pylist(), its UTC microsecond timestamps (the catalog's created_at) made datetimes here: pyarrow's own
    conversion of a timestamp first imports pandas, when installed, to offer a pandas.Timestamp -- half the CPU of
    `sessionctl savepoints`, which uses pandas for nothing else. The same values (an aware UTC datetime each)."""
    stamps = [field.name for field in table.schema if field.type == pa.timestamp("us", tz="UTC")]
    for name in stamps:
        index = table.schema.get_field_index(name)
        table = table.set_column(index, pa.field(name, pa.int64()), pc.cast(table.column(index), pa.int64()))
    rows = table.to_pylist()
    for row in rows:
        for name in stamps:
            if row[name] is not None:
                row[name] = _EPOCH_UTC + dt.timedelta(microseconds=row[name])
    return rows


def new_savepoint_id(batch_id: int, now: dt.datetime) -> str:
    return f"sp-{now.strftime('%Y%m%dT%H%M%S')}-b{batch_id}-{os.urandom(2).hex()}"


@dataclass(frozen=True)
class StateFiles:
    """A savepoint state table as its Delta log lists it: what the executors read (state_store.savepoint.files)."""

    uri: str
    columns: tuple[str, ...]  # the table's schema, in order (a checksum joins fields in this order)
    files: tuple[str, ...]    # absolute URIs of the data files (file:// or s3://)
    sizes: tuple[int, ...]

    @property
    def bytes(self) -> int:
        return sum(self.sizes)


@dataclass(frozen=True)
class SavepointStore:
    """The savepoint store under SESSIONS_SAVEPOINT_URI: the catalog and one state table per savepoint."""

    uri: str
    options: dict[str, str] | None = field(default=None, repr=False)  # S3 credentials: never printed
    # Failed attempts the catalog could not take when they happened (the store was down): recorded on the next
    # catalog access that works.
    pending: Path | None = None

    @classmethod
    def of(cls, config: SessionsConfig) -> SavepointStore:
        return cls(config.savepoint_uri, storage_options(config, config.savepoint_uri),
                   config.home / "pending-savepoint-failures.jsonl")

    def defer(self, row: SavepointInfo) -> None:
        """Keep a failed attempt's row locally until the catalog is reachable again (its columns as JSON)."""
        if self.pending is not None:
            self.pending.parent.mkdir(parents=True, exist_ok=True)
            with open(self.pending, "a") as handle:
                handle.write(json.dumps({name: getattr(row, name) for name in CATALOG_COLUMNS}) + "\n")

    def _flush_pending(self) -> None:
        if self.pending is None or not self.pending.exists():
            return
        # (a line an earlier release wrote holds the same columns, or fewer: the missing ones are null)
        rows = [json.loads(line) for line in self.pending.read_text().splitlines() if line.strip()]
        for row in rows:
            self._append(SavepointInfo.from_row(row))
        self.pending.unlink()

    @property
    def catalog_uri(self) -> str:
        return join(self.uri, "catalog")

    def state_uri(self, savepoint_id: str) -> str:
        return join(self.uri, "state", savepoint_id)

    @staticmethod
    def recorded_state_uri(savepoint_id: str) -> str:
        """What the catalog's `state_uri` holds: the state table relative to the store's root. A copy of the store (a
        home copied with `cp -a`, a bucket synced elsewhere) then names its own tables: an absolute path would have a
        copy's compaction delete, and its erasure rewrite, the original's."""
        return f"state/{savepoint_id}"

    def write_state(self, savepoint_id: str, table: pa.Table) -> str:
        """Write canonical rows (state_format.canonical: sorted once by the caller, schema pinned here)."""
        target = self.state_uri(savepoint_id)
        rows = state_format.conform(table)
        with s3_errors(target):
            write_deltalake(target, rows, mode="error", storage_options=self.options)
        return target

    def read_table(self, uri: str) -> pa.Table:
        with s3_errors(uri):
            return read_rows(DeltaTable(uri, storage_options=self.options))

    def read_state(self, savepoint_id: str) -> pa.Table:
        """The savepoint's state in this process (small savepoints, tests): its table as stored for a full savepoint
        (v1 or v2 rows), the chain resolved for an incremental one (canonical rows). state_store.savepoint.files reads
        it in the executors."""
        saved = self.find(savepoint_id)
        if saved is None or saved.kind != INCREMENTAL:
            return self.read_table(self.state_uri(savepoint_id))
        tables = [self.read_table(self.state_uri(i)) for i in self.chain_members(saved)]
        seen: pa.Array = pa.array([], pa.string())
        parts = []
        for table in reversed(tables):  # newest first: a user's rows come from the newest table holding them
            fresh = table.filter(pc.invert(pc.is_in(table["user_id"], value_set=seen)))
            if DELETED in table.column_names:
                fresh = fresh.filter(pc.invert(pc.fill_null(fresh[DELETED], False)))
            parts.append(state_format.conform(fresh, state_format.SAVED_SCHEMA))
            seen = pa.concat_arrays([seen, pc.unique(table["user_id"]).cast(pa.string())])
        rows = pa.concat_tables(parts)
        return rows if pc.any(pc.is_valid(rows["attributes"])).as_py() else rows.drop_columns(["attributes"])

    def exists(self, savepoint_id: str) -> bool:
        """Whether the savepoint's state table exists (a committed Delta table; half-written files are not one)."""
        uri = self.state_uri(savepoint_id)
        with s3_errors(uri):
            return bool(DeltaTable.is_deltatable(uri, storage_options=self.options))

    def data_files(self, savepoint_id: str) -> StateFiles:
        """The state table's current data files and column names, from its Delta log alone (no row is read)."""
        uri = self.state_uri(savepoint_id)
        with s3_errors(uri):
            table = DeltaTable(uri, storage_options=self.options)
            adds = pa.table(table.get_add_actions(flatten=True))
            columns = tuple(column.name for column in table.schema().fields)
            root = table.table_uri.rstrip("/")
        return StateFiles(uri, columns, tuple(f"{root}/{path}" for path in adds["path"].to_pylist()),
                          tuple(int(size) for size in adds["size_bytes"].to_pylist()))

    def table_bytes(self, uri: str) -> int:
        with s3_errors(uri):
            table = DeltaTable(uri, storage_options=self.options)
            adds = pa.table(table.get_add_actions(flatten=True))
        return int(pc.sum(adds["size_bytes"]).as_py() or 0)

    def _append(self, row: SavepointInfo) -> None:
        full = _stored_row(row)
        full["state_uri"] = self.recorded_state_uri(row.savepoint_id)  # never an absolute location
        # schema_mode="merge": a catalog written before a column was added gains it (its old rows read as null)
        write_deltalake(self.catalog_uri, pa.Table.from_pylist([full], schema=CATALOG_SCHEMA), mode="append",
                        schema_mode="merge", storage_options=self.options)

    def record(self, row: SavepointInfo) -> None:
        with s3_errors(self.catalog_uri):
            self._flush_pending()
            self._append(row)

    def forget(self, savepoint_id: str) -> None:
        """Remove a savepoint's catalog row (its state table is deleted by the caller first)."""
        with s3_errors(self.catalog_uri):
            DeltaTable(self.catalog_uri, storage_options=self.options).delete(f"savepoint_id = '{savepoint_id}'")

    def list(self) -> list[SavepointInfo]:
        """The catalog, newest first (failed attempts included, with status and error)."""
        with s3_errors(self.catalog_uri):
            self._flush_pending()
            if not DeltaTable.is_deltatable(self.catalog_uri, storage_options=self.options):
                return []
            rows = _pylist(read_rows(DeltaTable(self.catalog_uri, storage_options=self.options)))
        for row in rows:  # a row from before incremental savepoints: a full one, its own chain
            row["kind"] = row.get("kind") or FULL
            row["chain"] = row.get("chain") or row["savepoint_id"]  # ids joined by commas: SavepointInfo splits them
            # Under this store's root, whatever the row recorded: `state/<id>`, or (rows written before it was
            # relative) an absolute path that may be another home's -- this store's copy is the one it means.
            row["state_uri"] = self.state_uri(row["savepoint_id"])
        saved = [SavepointInfo.from_row(row) for row in rows]
        return sorted(saved, key=lambda s: (s.created_at or "", s.savepoint_id), reverse=True)

    def find(self, savepoint_id: str, catalog: Catalog | None = None) -> SavepointInfo | None:
        """The catalog row of a savepoint, whatever its status (None: no row names it)."""
        return next((s for s in (self.list() if catalog is None else catalog) if s.savepoint_id == savepoint_id),
                    None)

    def chain(self, saved: SavepointInfo, catalog: Catalog | None = None) -> Catalog:
        """The catalog rows of a savepoint's chain, base first (a full savepoint: itself); SavepointDamaged when a
        member is gone from the catalog or not complete (retention never deletes one a kept savepoint needs)."""
        ids = saved.chain_ids
        if len(ids) == 1:
            return [saved]
        catalog = self.list() if catalog is None else catalog
        by_id = {s.savepoint_id: s for s in catalog}
        missing = [i for i in ids[:-1] if i not in by_id or by_id[i].status != "complete"]
        if missing:
            raise SavepointDamaged(f"savepoint {saved.savepoint_id} is incremental and needs {missing[0]} of its "
                                   f"chain, which is {'not complete' if missing[0] in by_id else 'gone'}")
        return [by_id[i] for i in ids[:-1]] + [saved]

    def chain_members(self, saved: SavepointInfo, catalog: Catalog | None = None) -> builtins.list[str]:
        """The savepoints whose state tables a savepoint's state resolves from, oldest first: its chain from the
        newest full table on (a member compaction folded is full before the catalog says so:
        state_store.savepoint.fold)."""
        ids: builtins.list[str] = []
        for member in reversed(self.chain(saved, catalog)):
            ids.insert(0, member.savepoint_id)
            if not self.is_increment(self.state_uri(member.savepoint_id)):
                break
        return ids

    def is_increment(self, uri: str) -> bool:
        """Whether a state table is an increment (has the tombstone column), from its Delta log alone."""
        with s3_errors(uri):
            return DELETED in [f.name for f in DeltaTable(uri, storage_options=self.options).schema().fields]

    def update_rows(self, rows: builtins.list[SavepointInfo], columns: tuple[str, ...]) -> None:
        """Set `columns` of several catalog rows (by savepoint_id) to these rows' values in one Delta transaction:
        all or none."""
        if not rows:
            return
        names = ("savepoint_id", *columns)
        source = pa.Table.from_pylist([{k: _stored_row(row)[k] for k in names} for row in rows],
                                      schema=pa.schema([CATALOG_SCHEMA.field(k) for k in names]))
        with s3_errors(self.catalog_uri):
            (DeltaTable(self.catalog_uri, storage_options=self.options)
             .merge(source, "t.savepoint_id = s.savepoint_id", source_alias="s", target_alias="t")
             .when_matched_update(updates={k: f"s.{k}" for k in columns}).execute())

    def get(self, savepoint: str = "latest") -> SavepointInfo:
        """A complete savepoint by id, or the newest complete one ("latest"); SavepointNotFound lists the choices."""
        saved = self.list()
        complete = [s for s in saved if s.status == "complete"]
        if savepoint == "latest":
            if not complete:
                raise _not_found(f"no complete savepoint in {self.uri}", complete)
            return complete[0]
        for info in saved:
            if info.savepoint_id == savepoint:
                if info.status != "complete":
                    raise _not_found(f"savepoint {savepoint} is {info.status} ({info.error}); it cannot be restored",
                                     complete)
                return info
        raise _not_found(f"no such savepoint: {savepoint} in {self.uri}", complete)


CHOICES_SHOWN = 5  # newest complete savepoints a SavepointNotFound names


def _not_found(what: str, complete: builtins.list[SavepointInfo]) -> SavepointNotFound:
    """SavepointNotFound whose next step (in its message too) is the restorable savepoints, newest first, or how
    to take one."""
    if not complete:
        step = "take one first: `sessionctl savepoint` (or the savepoint job) once the job has committed a batch"
    else:
        shown = ", ".join(s.savepoint_id for s in complete[:CHOICES_SHOWN])
        older = len(complete) - CHOICES_SHOWN
        step = (f"name one of the complete savepoints: latest, {shown}"
                + (f" and {older} older (`sessionctl savepoints`)" if older > 0 else ""))
    return SavepointNotFound(f"{what}; {step}", step)
