"""Whether a savepoint can be read as its catalog row and Delta logs say, checked cheaply (delta-rs and file listings,
no Spark, no row read): every table its state resolves through has a Delta log that loads, and every data file that
log lists exists with the size the log records. A savepoint that fails is damaged: restore, diff and the pre-flight
name it in one line (SavepointDamaged, with the way out), an incremental savepoint on it is taken full instead
(state_store.savepoint.policy), and erasure can skip it. Damage these checks cannot see (bytes changed in place)
shows when the rows are read: the executors' read names the file (pipelines.errors.unreadable_savepoint_file) and
a re-read's count and checksum differ from the catalog's (state_store.restore.verified_savepoint)."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable

from pipelines.errors import SavepointDamaged, savepoint_way_out
from pipelines.storage import filesystem, is_object_store_failure, object_store_errors
from state_store.results import SavepointInfo
from state_store.savepoint.catalog import DELETED, SavepointStore

__all__ = ["check_readable", "damaged_members", "savepoint_damage", "table_damage"]

FIRST_LOG_ENTRY = "_delta_log/00000000000000000000.json"


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


def _load_damage(uri: str, error: BaseException) -> str:
    """Why a state table's Delta log does not load, in the operator's words."""
    fs, root = filesystem(uri)
    found = fs.get_file_info([root, f"{root}/{FIRST_LOG_ENTRY}"])
    if found[0].type == pafs.FileType.NotFound:
        return f"its table folder {uri} is gone"
    if found[1].type == pafs.FileType.NotFound:
        return f"its Delta log entry {FIRST_LOG_ENTRY} is missing"
    return f"its Delta log does not load ({_first_line(error)})"


def table_damage(store: SavepointStore, savepoint_id: str) -> tuple[str | None, bool]:
    """(why the savepoint's own state table cannot be read -- None when it can --, whether it is an increment). An
    object store that does not answer is StorageUnavailable, never damage. A table that does not load counts as
    an increment (its chain's older tables are checked too)."""
    uri = store.state_uri(savepoint_id)
    with object_store_errors(uri):
        try:
            table = DeltaTable(uri, storage_options=store.options)
            adds = pa.table(table.get_add_actions(flatten=True))
            increment = DELETED in [f.name for f in table.schema().fields]
            root = table.table_uri.rstrip("/")
        except Exception as error:  # noqa: BLE001 -- whatever delta-rs says, the table is unreadable
            if is_object_store_failure(error):
                raise
            return _load_damage(uri, error), True
        files = [f"{root}/{path}" for path in adds["path"].to_pylist()]
        if not files:
            return None, increment
        sizes = [int(size) for size in adds["size_bytes"].to_pylist()]
        fs, _ = filesystem(files[0])
        infos = fs.get_file_info([filesystem(f)[1] for f in files])
    missing = [f for f, info in zip(files, infos) if info.type == pafs.FileType.NotFound]
    if missing:
        return f"{len(missing)} of its {len(files)} data files are gone (first: {missing[0]})", increment
    resized = [(f, info.size, size) for f, size, info in zip(files, sizes, infos) if info.size != size]
    if resized:
        first, got, recorded = resized[0]
        return (f"{len(resized)} of its {len(files)} data files are not the size its Delta log records, truncated or "
                f"overwritten (first: {first}, {got} bytes, recorded {recorded})"), increment
    return None, increment


def damaged_members(store: SavepointStore, saved: SavepointInfo, *, catalog: list[SavepointInfo] | None = None,
                    checked: dict[str, tuple[str | None, bool]] | None = None) -> dict[str, str]:
    """The savepoints whose tables `saved`'s state resolves through (itself, then back to its chain's newest full
    table) that cannot be read, oldest first: {savepoint id: why}. Empty when `saved` is readable (whatever its own
    status). An older member gone from the catalog or not complete is damaged too. `checked` (savepoint id -> table_damage) saves checking a
    table twice across calls (erasure, over every savepoint)."""
    checked = {} if checked is None else checked
    ids = saved.chain_ids
    by_id = {saved.savepoint_id: saved}
    if len(ids) > 1:
        by_id.update((s.savepoint_id, s) for s in (store.list() if catalog is None else catalog))
    found: dict[str, str] = {}
    for member in reversed(ids):
        row = by_id.get(member)
        if member != saved.savepoint_id and (row is None or row.status != "complete"):
            found[member] = "gone from the catalog" if row is None else f"{row.status}, not complete"
            continue
        if member not in checked:
            checked[member] = table_damage(store, member)
        why, increment = checked[member]
        if why is not None:
            found[member] = why
        if not increment:  # resolution starts at the newest full table (a folded member is full before the catalog)
            break
    return dict(reversed(found.items()))


def savepoint_damage(store: SavepointStore, saved: SavepointInfo, *, catalog: list[SavepointInfo] | None = None,
                     checked: dict[str, tuple[str | None, bool]] | None = None) -> SavepointDamaged | None:
    """The one line for `saved` when damaged_members finds any (naming the oldest damaged one), else None."""
    found = damaged_members(store, saved, catalog=catalog, checked=checked)
    if not found:
        return None
    member, why = next(iter(found.items()))
    through = "" if member == saved.savepoint_id else f" (savepoint {saved.savepoint_id} resolves its state through it)"
    more = f"; {len(found) - 1} more of its chain damaged" if len(found) > 1 else ""
    return SavepointDamaged(f"savepoint {member} is damaged: {why}{through}{more}: {savepoint_way_out(member)}",
                            savepoint_id=member)


def check_readable(store: SavepointStore, saved: SavepointInfo, *, catalog: list[SavepointInfo] | None = None
                   ) -> None:
    """SavepointDamaged (one line naming the damaged savepoint, with `next_step`) unless every table `saved`'s
    state resolves through loads and lists only files that are there whole."""
    damage = savepoint_damage(store, saved, catalog=catalog)
    if damage is not None:
        raise damage
