"""A Delta table's data files as every reader of them takes them, whichever engine wrote them.

The product reads some tables file by file, in Spark tasks (the quarantine's lines read raw_events files where they
are; savepoints read their state files). Those files may have been rewritten by anyone:
delta-rs (`forget`, `compact`, a user's DELETE or OPTIMIZE) stores strings as `string_view`; Delta Spark (OPTIMIZE,
ZORDER BY, UPDATE, DELETE) may leave rows of a file deleted by a deletion vector instead of rewriting it; either may
dictionary-encode. This module owns that: `data_files` lists a version's files with their statistics and the rows their
deletion vectors remove, `read_data_file` reads one with those rows dropped and every column in its plain Arrow type
(pipelines.arrow_types), so no caller filters, takes or concatenates a view or dictionary array (pyarrow has no kernels for
some of them) or sees a deleted row.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from pipelines.arrow_types import plain_types
from pipelines.storage import filesystem, read_rows

__all__ = ["DataFile", "data_files", "read_data_file", "row_count"]


@dataclass(frozen=True)
class DataFile:
    """One data file of a table version: its URI, its statistics as the Delta log has them (flattened names:
    `num_records`, `min.<column>`, `max.<column>`, `null_count.<column>`; a file written without statistics has none),
    and the row positions its deletion vector removes (none: every row is in the version)."""
    uri: str
    stats: Mapping[str, Any] = field(default_factory=dict)
    deleted: pa.Array | None = None  # int64 positions in the file, ascending

    @property
    def rows(self) -> int | None:
        """Rows in the file (deleted ones included), when the log says."""
        value = self.stats.get("num_records")
        return None if value is None else int(value)

    def bounds(self, column: str) -> tuple[Any, Any]:
        """(min, max) of `column` in the file, (None, None) when unknown. Loose after a deletion vector (Delta's
        `tightBounds: false`): still bounds."""
        return self.stats.get(f"min.{column}"), self.stats.get(f"max.{column}")

    def may_hold(self, column: str, low: int, high: int) -> bool:
        """Whether the file may hold a `column` value in (low, high] (True when it has no statistics)."""
        lo, hi = self.bounds(column)
        return lo is None or hi is None or (hi > low and lo <= high)

    def nulls(self, column: str) -> int | None:
        value = self.stats.get(f"null_count.{column}")
        return None if value is None else int(value)


def data_files(table: DeltaTable, *, stats_of: Sequence[str] = ()) -> list[DataFile]:
    """The loaded version's data files, with their row counts and the statistics of the columns `stats_of` (only
    those: the quarantine lists the files every micro-batch and ships each one's to its read task), and their
    deletion vectors (read only when the table has the feature: a table without it pays nothing)."""
    adds = pa.table(table.get_add_actions(flatten=True))
    root = table.table_uri.rstrip("/")
    deleted = _deleted_rows(table)
    wanted = ["num_records", *(f"{kind}.{column}" for column in stats_of for kind in ("min", "max", "null_count"))]
    columns = {name: adds[name].to_pylist() for name in wanted if name in adds.column_names}
    files = []
    for index, path in enumerate(adds["path"].to_pylist()):
        uri = f"{root}/{path}"
        stats = {name: values[index] for name, values in columns.items() if values[index] is not None}
        files.append(DataFile(uri, stats, deleted.get(_canonical(uri))))
    return files


def _canonical(uri: str) -> str:
    """A file URI as both delta-rs listings spell it (deletion_vectors says file:///, table_uri may not)."""
    return uri.removeprefix("file://").rstrip("/")


def _deleted_rows(table: DeltaTable) -> dict[str, pa.Array]:
    if "deletionVectors" not in (table.protocol().reader_features or []):
        return {}
    vectors = pa.table(table.deletion_vectors())
    found = {}
    masks = vectors["selection_vector"].combine_chunks()
    for index, uri in enumerate(vectors["filepath"].to_pylist()):
        # The keep mask (Arrow booleans, no Python list per row) may be shorter than the file: rows past it are kept.
        positions = np.flatnonzero(~masks[index].values.to_numpy(zero_copy_only=False))
        if len(positions):
            found[_canonical(uri)] = pa.array(positions, pa.int64())
    return found


def read_data_file(file: DataFile, *, columns: Sequence[str], row_groups: Sequence[int] | None = None) -> pa.Table:
    """The rows of `file` in the version (its deletion vector's rows dropped), `columns` that the file holds (a file
    written before a column existed lacks it: the caller fills it), all of `row_groups` (None: the whole file), each
    column in its plain type."""
    fs, path = filesystem(file.uri)
    with fs.open_input_file(path) as handle:
        data = pq.ParquetFile(handle)
        present = [name for name in columns if name in data.schema_arrow.names]
        rows = plain_types(data.read(columns=present) if row_groups is None
                           else data.read_row_groups(list(row_groups), columns=present))
        if file.deleted is not None and len(file.deleted):
            rows = rows.filter(_kept(data.metadata, row_groups, rows.num_rows, file.deleted))
    return rows


def _kept(meta: pq.FileMetaData, row_groups: Sequence[int] | None, count: int, deleted: pa.Array) -> pa.Array:
    """The keep mask of the rows read (of all the file, or of these row groups, in order)."""
    if row_groups is None:
        positions = np.arange(count, dtype=np.int64)
    else:
        starts = np.cumsum([0] + [meta.row_group(i).num_rows for i in range(meta.num_row_groups)])
        positions = np.concatenate([np.arange(starts[g], starts[g + 1], dtype=np.int64) for g in row_groups]
                                   or [np.empty(0, np.int64)])
    return pc.invert(pc.is_in(pa.array(positions), value_set=deleted))


def row_count(table: DeltaTable) -> int:
    """The rows of the loaded version from the log alone -- less what deletion vectors removed (delta-rs's
    `count()` counts them) --; read by a scan only when a file has no row count in its statistics."""
    files = data_files(table)
    if any(file.rows is None for file in files):
        return sum(batch.num_rows for batch in read_rows(table, columns=[table.schema().fields[0].name]).to_batches())
    return sum((file.rows or 0) - (0 if file.deleted is None else len(file.deleted)) for file in files)
