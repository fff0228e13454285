"""Reading a Structured Streaming checkpoint without Spark: its logs, provider and our job metadata -- on a local path,
HDFS or S3 (pipelines.locations)."""
from __future__ import annotations

import datetime as dt
import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from pipelines.core.rules import SessionRules
from pipelines.errors import CheckpointDamaged, NoCommittedBatch
from pipelines.locations import CheckpointPath

__all__ = ["BOOTSTRAP_FILE", "PROVIDER_CLASSES", "CheckpointInfo", "CommittedBatch", "JOB_FILE", "JobMetadata", "batch_source_range", "clear_restore_marker", "committed_checkpoint", "directory_size", "inspect_checkpoint", "last_commit_age_seconds", "read_bootstrap", "read_job_metadata", "read_restore_marker", "rescale_command", "restore_marker", "write_job_metadata", "write_restore_marker"]

PROVIDER_CLASSES = {
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
}
JOB_FILE = "_job.json"
BOOTSTRAP_FILE = "_bootstrap.json"  # written into a fresh checkpoint by a restore: its source position and marker


def provider_name(provider_class: str) -> str:
    for name, cls in PROVIDER_CLASSES.items():
        if cls == provider_class:
            return name
    return provider_class


@dataclass(frozen=True)
class JobMetadata:
    """Written when a checkpoint is created. The incarnation names the sink's idempotency keys, so a
    restored checkpoint (batch ids from 0 again) never collides with its predecessor's. The session rules the job
    last ran with are stored as their parts (`rules` puts them together): gap and lateness, the spec's canonical text
    (None: the default spec, and checkpoints made before specs existed) and the idle close (None: the default, so
    that a checkpoint of default rules reads in the releases before these were recorded). A run compares them with
    its own (pipelines.core.rules.compare)."""
    incarnation: str
    gap_ms: int
    lateness_ms: int
    buckets: int
    created_from: str | None = None  # savepoint id for a restored checkpoint
    # Layout of the operator's state (pipelines.job.operators.seam: StateOperator.layout); None: the JSON layout of
    # builds before open_sessions/v2, which this build cannot run on.
    state_layout: str | None = None
    spec: str | None = None
    idle_close_ms: int | None = None

    @classmethod
    def new(cls, rules: SessionRules, buckets: int, *, state_layout: str, created_from: str | None = None
            ) -> JobMetadata:
        return cls(uuid.uuid4().hex, rules.gap_ms, rules.lateness_ms, buckets, created_from, state_layout,
                   rules.spec_text, rules.idle_close_recorded)

    @classmethod
    def from_json(cls, text: str) -> JobMetadata:
        """A stored JOB_FILE; keys a later release added are left out, so that a rollback still reads it."""
        stored = json.loads(text)
        return cls(**{f.name: stored[f.name] for f in fields(cls) if f.name in stored})

    @property
    def rules(self) -> SessionRules:
        return SessionRules.recorded(gap_ms=self.gap_ms, lateness_ms=self.lateness_ms,
                                     idle_close_ms=self.idle_close_ms, spec=self.spec)

    def with_rules(self, rules: SessionRules) -> JobMetadata:
        """The same checkpoint under rules that need no migration (pipelines.core.rules.RulesChanges)."""
        return replace(self, spec=rules.spec_text, idle_close_ms=rules.idle_close_recorded)


def read_job_metadata(checkpoint: CheckpointPath) -> JobMetadata | None:
    try:
        return JobMetadata.from_json((checkpoint / JOB_FILE).read_text())
    except FileNotFoundError:
        return None


def _write_whole(path: CheckpointPath, text: str) -> None:
    """A small file that readers see whole or not at all: a local one renamed into place, a remote one in one write
    (pipelines.locations)."""
    if isinstance(path, Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    else:
        path.write_text(text)


def write_job_metadata(checkpoint: CheckpointPath, meta: JobMetadata) -> None:
    _write_whole(checkpoint / JOB_FILE, json.dumps(asdict(meta)))


def _batch_files(directory: CheckpointPath) -> list[int]:
    if not directory.exists():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _log_entry(path: CheckpointPath, lines: int = 1) -> list[str]:
    """The lines of a checkpoint log file (offsets/N, commits/N), at least `lines` of them (Spark's own reader needs
    the version line, and an offset file its metadata line too): CheckpointDamaged when it is missing, empty or cut
    short -- a write a full disk or a crash cut short -- in one line naming the file and what recovers it."""
    try:
        entry = [line for line in path.read_text().splitlines() if line.strip()]
        cause = None if len(entry) >= lines else "empty" if not entry else "cut short"
    except FileNotFoundError:
        cause = "missing"
    except (OSError, UnicodeDecodeError) as error:
        cause = f"unreadable ({type(error).__name__})"
    if cause is not None:
        raise _damaged(path, cause)
    return entry


def _damaged(path: CheckpointPath, cause: str) -> CheckpointDamaged:
    checkpoint = path.parent.parent
    return CheckpointDamaged(f"the checkpoint log file {path.parent.name}/{path.name} of {checkpoint} is {cause}: "
                             "`sessionctl restore --savepoint latest` rebuilds the checkpoint from the newest savepoint "
                             "and replays what came after it")


def _log_json(path: CheckpointPath, entry: list[str], index: int) -> dict[str, Any]:
    try:
        value = json.loads(entry[index])
    except ValueError:
        raise _damaged(path, "not valid JSON") from None
    if not isinstance(value, dict):
        raise _damaged(path, "not valid JSON")
    return value


@dataclass(frozen=True)
class CheckpointInfo:
    path: str
    last_committed_batch: int | None
    source_offset: dict[str, Any] | None  # our source's offset at the last committed batch
    batch_watermark_ms: int | None   # watermark the last committed batch ran with
    next_watermark_ms: int | None    # watermark the next batch will run with
    provider: str | None
    partitions: int | None
    # Partitions of a repartition batch written after the last commit and never committed: a rescale was
    # interrupted, and Spark refuses to run (or repartition to another count) until that one is finished.
    unfinished_rescale: int | None = None


def inspect_checkpoint(checkpoint: CheckpointPath) -> CheckpointInfo:
    commits = _batch_files(checkpoint / "commits")
    if not commits:
        return CheckpointInfo(str(checkpoint), None, None, None, None, None, None)
    last = commits[-1]
    offsets_file = checkpoint / "offsets" / str(last)
    offsets = _log_entry(offsets_file, 2)
    meta = _log_json(offsets_file, offsets, 1)
    conf = meta.get("conf", {})
    unfinished = None
    pending = [batch for batch in _batch_files(checkpoint / "offsets") if batch > last]
    if pending:
        # A batch a crash left uncommitted keeps the checkpoint's partitions; only a repartition changes them.
        pending_file = checkpoint / "offsets" / str(pending[-1])
        pending_conf = _log_json(pending_file, _log_entry(pending_file, 2), 1).get("conf", {})
        count = pending_conf.get("spark.sql.shuffle.partitions")
        if count and count != conf.get("spark.sql.shuffle.partitions"):
            unfinished = int(count)
    source = _log_json(offsets_file, offsets, 2) if len(offsets) > 2 and offsets[2] != "-" else None
    commit_file = checkpoint / "commits" / str(last)
    commit = _log_entry(commit_file)
    next_wm = _log_json(commit_file, commit, 1).get("nextBatchWatermarkMs") if len(commit) > 1 else None
    provider_cls = conf.get("spark.sql.streaming.stateStore.providerClass")
    partitions = conf.get("spark.sql.shuffle.partitions")
    # Spark's offline repartition records the new count here (state-metadata may still show the old
    # one, and stale partition directories stay on disk), so the offset log is the authority.
    return CheckpointInfo(
        str(checkpoint), last, source, meta.get("batchWatermarkMs"), next_wm,
        provider_name(provider_cls) if provider_cls else None, int(partitions) if partitions else None,
        unfinished,
    )


@dataclass(frozen=True)
class CommittedBatch:
    """The last committed batch of a checkpoint and the job it belongs to: what savepoints and state reads use."""
    info: CheckpointInfo
    meta: JobMetadata

    @property
    def batch_id(self) -> int:
        assert self.info.last_committed_batch is not None  # by construction (committed_checkpoint)
        return self.info.last_committed_batch

    @property
    def watermark_ms(self) -> int | None:
        """The watermark as of the end of the batch: what the next batch runs with."""
        info = self.info
        return info.next_watermark_ms if info.next_watermark_ms is not None else info.batch_watermark_ms


def committed_checkpoint(checkpoint: CheckpointPath, nothing: str) -> CommittedBatch:
    """The last committed batch, or NoCommittedBatch saying `nothing` (e.g. "nothing to savepoint")."""
    info = inspect_checkpoint(checkpoint)
    meta = read_job_metadata(checkpoint)
    if info.last_committed_batch is None or meta is None:
        raise NoCommittedBatch(f"{nothing}: no committed batch in {checkpoint}")
    return CommittedBatch(info, meta)


def rescale_command(info: CheckpointInfo) -> str | None:
    """The command that finishes an interrupted rescale, None when none was interrupted."""
    return None if info.unfinished_rescale is None else f"sessionctl rescale --partitions {info.unfinished_rescale}"


def directory_size(path: CheckpointPath) -> tuple[int, int]:
    """(files, bytes) under a directory."""
    if not isinstance(path, Path):
        return path.tree_size()
    files = total = 0
    if not path.exists():
        return 0, 0
    for item in path.rglob("*"):
        if item.is_file():
            files += 1
            total += item.stat().st_size
    return files, total


def batch_source_range(checkpoint: CheckpointPath, batch_id: int) -> tuple[int, int]:
    """(low, high]: the raw_events ingest_seq range micro-batch `batch_id` read, from the offset log."""

    def seq_at(batch: int) -> int:
        path = checkpoint / "offsets" / str(batch)
        return int(_log_json(path, _log_entry(path, 3), 2)["seq"])

    high = seq_at(batch_id)
    if batch_id > 0 and (checkpoint / "offsets" / str(batch_id - 1)).exists():
        return seq_at(batch_id - 1), high
    bootstrap = read_bootstrap(checkpoint)
    return int(json.loads(bootstrap)["source_seq"]) if bootstrap else 0, high


def read_bootstrap(checkpoint: CheckpointPath) -> str | None:
    """A restored checkpoint's bootstrap (BOOTSTRAP_FILE: the savepoint's source position and watermark marker) as
    written, None for a checkpoint no restore made."""
    try:
        return (checkpoint / BOOTSTRAP_FILE).read_text()
    except FileNotFoundError:
        return None


def last_commit_age_seconds(checkpoint: CheckpointPath) -> float | None:
    """Seconds since the newest committed batch (None when nothing was committed)."""
    commits = _batch_files(checkpoint / "commits")
    if not commits:
        return None
    newest = checkpoint / "commits" / str(commits[-1])
    return time.time() - (newest.stat().st_mtime if isinstance(newest, Path) else newest.mtime())


# A restore replaces the checkpoint directory, so its marker lives beside it: present from before the first
# change until the restore verified, it is what a kill -9 leaves for status, catch-up and Dagster to report.
RESTORE_MARKER_SUFFIX = ".restore-in-progress.json"


def restore_marker(checkpoint: CheckpointPath) -> CheckpointPath:
    return checkpoint.with_name(checkpoint.name + RESTORE_MARKER_SUFFIX)


def write_restore_marker(checkpoint: CheckpointPath, savepoint_id: str, partitions: int | None) -> None:
    command = f"sessionctl restore --savepoint {savepoint_id}" + (f" --partitions {partitions}" if partitions else "")
    _write_whole(restore_marker(checkpoint), json.dumps({
        "savepoint_id": savepoint_id, "partitions": partitions, "command": command,
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat()}))


def read_restore_marker(checkpoint: CheckpointPath) -> dict[str, Any] | None:
    try:
        return dict(json.loads(restore_marker(checkpoint).read_text()))
    except FileNotFoundError:
        return None


def clear_restore_marker(checkpoint: CheckpointPath) -> None:
    restore_marker(checkpoint).unlink(missing_ok=True)
