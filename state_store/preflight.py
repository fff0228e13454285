"""Pre-flight of a restore: whether the current settings can restore a savepoint, what would be migrated, and how long
it should take -- without stopping, locking or writing anything. The real restore runs the same checks first
(`refusals`), so it is refused exactly when the pre-flight says so."""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from pipelines.config import SessionsConfig
from pipelines.coordination.job_leases import running_stream
from pipelines.core import state_format
from pipelines.core.rules import compare
from pipelines.errors import (
    JobRunning,
    RescaleRefused,
    Result,
    SavepointDamaged,
    SavepointIncompatible,
    SessionsError,
    savepoint_way_out,
)
from pipelines.job.operators import for_new_checkpoint
from pipelines.storage import open_table, s3_errors, table_exists
from state_store.results import RestoreMethod, SavepointInfo
from state_store.savepoint.catalog import SavepointStore
from state_store.savepoint.damage import savepoint_damage
from state_store.savepoint.native import native_shape

__all__ = ["RestorePlan", "migrations", "native_refusal", "plan_restore", "record_restore", "refusals"]

READABLE_SCHEMAS = (state_format.SCHEMA_ID, state_format.V1_SCHEMA_ID)
# Without a restore of its own on record, the rate of the reference run (benchmarks/results/lifecycle.json: RocksDB,
# 1M open users, 1,229,641 state rows restored in 14.4 s on 2 cores).
REFERENCE_ROWS_PER_S = 85_000.0
# A restore's cost that does not grow with the rows -- the bootstrap query's start, the state's read-back, the
# outputs' rollback -- without a restore of its own on record: a 5,936-row restore from the Dagster runbook took
# ~17 s on 2 cores (2026-11-27), almost all of it this part. Without it, a small savepoint's estimate said 0 s.
REFERENCE_FIXED_S = 17.0
# A restore from a native copy (state_store.savepoint.native): the catalog, the set-aside, the job metadata and the
# outputs' rollback (~0.1 s), then its bytes copied and hashed (benchmarks/results/lifecycle-native.json: RocksDB,
# 1M open users, 37.4 MB copied back in 0.28-0.29 s on 2 cores).
NATIVE_FIXED_S = 0.2
NATIVE_BYTES_PER_S = 125e6
HISTORY_FILE = "restore-history.jsonl"  # under SESSIONS_HOME: rows and seconds of each restore done here
_ROLLBACK = re.compile(r"written_version > (\d+)")


@dataclass(frozen=True)
class RestorePlan(Result):
    """What `sessionctl restore --dry-run` prints."""
    savepoint_id: str
    batch_id: int
    rows: int
    restorable: bool
    reasons: list[str]       # why not, one line each (empty when restorable)
    migrations: list[str]    # what the restore would change about the state or the job, one line each
    provider: str            # the checkpoint the restore would build
    partitions: int
    expected_seconds: float  # fixed_seconds + rows / rate_rows_per_s
    rate_rows_per_s: float
    rate_source: str         # "this home's restores (median of N)" or the reference run
    fixed_seconds: float = REFERENCE_FIXED_S  # the part of a restore that does not grow with its rows
    job_running: str | None = None  # the holder of the job lease, which a restore needs stopped (also in reasons)
    # "native": the savepoint's native copy would be put back (a file copy; expected_seconds is then its estimate);
    # native_note: why a native copy the savepoint has would not be used
    method: RestoreMethod = "canonical"
    native_note: str | None = None

    @property
    def savepoint_reasons(self) -> list[str]:
        """The reasons that are the savepoint's or the settings' (a running job aside: a runbook stops it first)."""
        return self.reasons[:-1] if self.job_running else self.reasons


def _abandoned_timeline(config: SessionsConfig, saved: SavepointInfo) -> SessionsError | None:
    """A savepoint taken after the version an earlier restore rolled the sessions table back to belongs to the
    timeline that restore abandoned: the sessions its batches wrote were removed then, so restoring it would lose
    them (raw_events still holds every event: an older savepoint replays them)."""
    if not table_exists(config, config.sessions_table):
        return None
    for commit in open_table(config, config.sessions_table).history():
        if commit.get("operation") != "DELETE" or int(commit.get("version", -1)) <= int(saved.sessions_version):
            continue
        found = _ROLLBACK.search(str((commit.get("operationParameters") or {}).get("predicate", "")))
        if found and int(found.group(1)) < int(saved.sessions_version):
            return SavepointIncompatible(
                f"savepoint {saved.savepoint_id} belongs to a timeline that a later restore abandoned (sessions "
                f"table version {commit['version']} rolled back to version {found.group(1)}, before this savepoint's "
                f"{saved.sessions_version}): its sessions are gone; restore the savepoint that restore used, or one "
                f"taken after it, and the events are replayed from raw_events")
    return None


def _damage(store: SavepointStore, saved: SavepointInfo) -> SavepointDamaged | None:
    """What the savepoint's metadata alone shows to be wrong: a table its state resolves through whose Delta log does
    not load or lists files that are gone or of another size (state_store.savepoint.damage: the files a restore
    reads), or rows its Delta log lists (file statistics) other than the catalog's. No data read."""

    damage = savepoint_damage(store, saved)
    # (an incremental savepoint's table holds its increment; `rows` counts the state its chain resolves to)
    if damage is not None or saved.kind == "incremental":
        return damage
    with s3_errors(saved.state_uri):
        adds = pa.table(DeltaTable(saved.state_uri, storage_options=store.options).get_add_actions(flatten=True))
        counts = adds["num_records"]
        listed = None if counts.null_count else int(pc.sum(counts).as_py() or 0)
        if listed is not None and listed != saved.rows:
            return SavepointDamaged(f"savepoint {saved.savepoint_id} is damaged: its table lists {listed} rows, the "
                                    f"catalog says {saved.rows}: {savepoint_way_out(saved.savepoint_id)}",
                                    savepoint_id=saved.savepoint_id)
    return None


def refusals(config: SessionsConfig, saved: SavepointInfo, *, partitions: int | None, migrate: bool,
             store: SavepointStore) -> list[SessionsError]:
    """Every reason the restore of `saved` would be refused under `config`, as the error the restore raises."""
    found: list[SessionsError] = []
    if saved.state_schema not in READABLE_SCHEMAS:
        found.append(SavepointIncompatible(
            f"savepoint {saved.savepoint_id} has state schema {saved.state_schema!r}; this job reads "
            f"{' or '.join(map(repr, READABLE_SCHEMAS))}"))
    if not migrate:
        found += [SavepointIncompatible(line) for line in compare(saved.rules, config.rules).refusals(
            f"savepoint {saved.savepoint_id} was taken", how=f"pass --migrate to restore savepoint "
            f"{saved.savepoint_id} under these rules (open sessions are re-walked; a changed attribute is null in them)")]
    if partitions is not None:
        bound = for_new_checkpoint().max_partitions(config.state_buckets)
        if partitions < 1 or (bound is not None and partitions > bound):
            found.append(RescaleRefused(f"--partitions must be at least 1, got {partitions}" if partitions < 1 else
                                        f"--partitions must be between 1 and {bound}, got {partitions}"))
    damage = _damage(store, saved)  # with the older tables an incremental savepoint's state resolves through
    if damage is not None:
        found.append(damage)
    abandoned = _abandoned_timeline(config, saved)
    if abandoned is not None:
        found.append(abandoned)
    return found


def migrations(config: SessionsConfig, saved: SavepointInfo, partitions: int | None) -> list[str]:
    out = []
    if saved.state_schema == state_format.V1_SCHEMA_ID:
        out.append("state schema open_events/v1 -> open_sessions/v2 (one row per open event becomes frozen prefixes)")
    out += compare(saved.rules, config.rules).migrations()
    if saved.provider and saved.provider != config.state_store:
        out.append(f"state store provider {saved.provider} -> {config.state_store}")
    target = partitions or saved.partitions or config.state_partitions
    if saved.partitions and target != saved.partitions:
        out.append(f"state partitions {saved.partitions} -> {target}")
    return out


def _estimate(config: SessionsConfig) -> tuple[float, float, str]:
    """(fixed seconds, rows per second, where they come from): a restore takes fixed + rows / rate. With restores on
    record here, the fixed part is the median of what each took beyond its rows at the reference rate (a home's
    restores are mostly small: their rows alone say little about a rate)."""
    path = config.home / HISTORY_FILE
    fixed = []
    if path.exists():
        for line in path.read_text().splitlines()[-20:]:
            try:
                entry = json.loads(line)
                if entry["rows"] >= 0 and entry["seconds"] > 0:
                    fixed.append(max(0.0, entry["seconds"] - entry["rows"] / REFERENCE_ROWS_PER_S))
            except (ValueError, KeyError, TypeError):
                continue  # a torn line of a killed restore: the others still count
    if fixed:
        return (statistics.median(fixed), REFERENCE_ROWS_PER_S,
                f"this home's restores (median of {len(fixed)}) and the reference run's rate")
    return REFERENCE_FIXED_S, REFERENCE_ROWS_PER_S, "the reference runs (benchmarks/results/lifecycle.json)"


def record_restore(home: Path, rows: int, seconds: float) -> None:
    """Remember a finished restore's size and duration for later estimates (a failure to write is not the
    restore's failure)."""
    try:
        with open(home / HISTORY_FILE, "a") as handle:
            handle.write(json.dumps({"rows": rows, "seconds": seconds}) + "\n")
    except OSError:
        pass


def native_refusal(config: SessionsConfig, store: SavepointStore, saved: SavepointInfo, *, partitions: int | None,
                    migrate: bool, canonical: bool) -> str | None:
    """Why the savepoint's native copy cannot be this restore's (None: it can): only the same provider, partition
    count, operator layout and settings resume from the checkpoint's own files."""
    if canonical or not saved.native_checksum:
        return ""  # not asked for, or none: nothing to say
    layout = for_new_checkpoint().layout
    checks = (("--migrate asks for the canonical rows", migrate),
              (f"the provider is {config.state_store} (it has {saved.provider})", config.state_store != saved.provider),
              ("other gap, lateness or bucket settings",
               compare(saved.rules, config.rules).timing or saved.buckets != config.state_buckets),
              ("an older state schema", saved.state_schema != state_format.SCHEMA_ID))
    said = next((why for why, refused in checks if refused), None)
    if said is not None:
        return said
    try:
        shape = native_shape(store.uri, saved.savepoint_id, saved.native_checksum)
    except (SavepointDamaged, OSError) as damage:
        return f"its native copy cannot be read ({damage})"
    wanted = partitions or saved.partitions  # a copy prepared for a rescale has the new count (its manifest says)
    if wanted != shape.partitions:
        asked = f"--partitions {partitions}" if partitions else f"the savepoint's {wanted} partitions"
        return f"{asked} (its native copy has {shape.partitions})"
    return None if shape.layout == layout else f"another operator layout ({shape.layout}; this build writes {layout})"


def plan_restore(config: SessionsConfig, savepoint: str = "latest", *, partitions: int | None = None,
                 migrate: bool = False, canonical: bool = False) -> RestorePlan:
    """The pre-flight: reads the catalog, the savepoint's Delta log and the sessions table's history; nothing else."""
    store = SavepointStore.of(config)
    saved = store.get(savepoint)
    reasons = [str(error) for error in refusals(config, saved, partitions=partitions, migrate=migrate, store=store)]
    stream = running_stream(config)
    holder = stream.describe() if stream is not None else None
    if stream is not None:
        reasons.append(str(JobRunning(f"the job is running: {stream.describe()} holds the job lease; restore needs "
                                      f"it stopped: stop it with `sessionctl stop`", stream.describe(), "")))
    fixed, rate, source = _estimate(config)
    expected = fixed + saved.rows / rate
    note = native_refusal(config, store, saved, partitions=partitions, migrate=migrate, canonical=canonical)
    if note is None:  # a file copy: its bytes at the reference rate, not the rows
        fixed, source = NATIVE_FIXED_S, "a native copy: its bytes at the reference run's copy rate"
        expected = fixed + (saved.native_bytes or 0) / NATIVE_BYTES_PER_S
    return RestorePlan(
        savepoint_id=saved.savepoint_id, batch_id=saved.batch_id, rows=saved.rows, restorable=not reasons,
        reasons=reasons, migrations=migrations(config, saved, partitions), provider=config.state_store,
        partitions=partitions or saved.partitions or config.state_partitions,
        expected_seconds=round(expected, 1), rate_rows_per_s=round(rate), rate_source=source,
        fixed_seconds=round(fixed, 1), job_running=holder, method="native" if note is None else "canonical",
        native_note=note or None)
