"""The batch a savepoint reads beside a running stream, pinned: Spark's retention cannot pull it away.

A savepoint of a running stream reads its last committed batch N through Spark's state data source, while the stream
goes on committing; Spark keeps only the last SESSIONS_MIN_BATCHES_TO_RETAIN versions, and a stream committing a
batch a second deletes version N during a read of a large state. So the files Spark loads to resume after N (the
logs up to N, the metadata, each partition's version chain: state_store.savepoint.native) -- and, for an incremental
savepoint, the delta or changelog files its change feed reads -- are first copied into a private checkpoint, which
the savepoint reads instead of the live one:

  * a local checkpoint: hard links (Spark never rewrites a checkpoint file in place), no byte copied;
  * S3: server-side copies; HDFS: copies through this process, several files at a time;
  * a native savepoint whose copy Spark can read where it is (the savepoints on the checkpoint's filesystem): that
    copy is the pinned one, no second copy.

A file of N gone during the copy itself (retention reached it before the copy did): the newest committed batch is
pinned instead (the caller starts over, at most PIN_ATTEMPTS times). The private copy is removed when the read is
over, also on a failure; one a killed savepoint leaves (`<checkpoint>.pinned-<time>` beside the checkpoint) is removed by
the next savepoint, compaction and erasure (state_store.kernel.replaced_checkpoints).

No copy when no stream runs (nothing deletes a version then) or when the caller is the stream itself between two
batches."""
from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from pipelines.config import SessionsConfig
from pipelines.job.checkpoint import CommittedBatch
from pipelines.locations import CheckpointPath, RemotePath, checkpoint_path, remove_tree
from state_store.kernel import FAILED_SUFFIX, PINNED_SUFFIX
from state_store.savepoint import native
from state_store.savepoint.native import NativeCopy

__all__ = ["PIN_ATTEMPTS", "BatchGone", "PinnedBatch", "pinned_batch"]

PIN_ATTEMPTS = 3  # a batch lost to retention during its own copy: the newest one is pinned, this many times in all
LEGACY_PINNED = f"{FAILED_SUFFIX}pinned-"  # the name earlier releases gave a pinned copy: their leftovers go too


class BatchGone(Exception):
    """Spark's retention removed a file of the batch while it was copied: pin the newest committed batch instead."""


@dataclass(frozen=True)
class PinnedBatch:
    """Where a savepoint reads its batch."""
    checkpoint: CheckpointPath         # the private copy, or the live checkpoint (no stream runs, or no copy possible)
    pinned: bool                       # a copy: nothing deletes its files during the read
    changes_after: int | None          # its change feed reaches back to this batch (a copy: None when it does not)
    native: NativeCopy | None = None   # the copy is the savepoint's native copy (its row records it)
    native_note: str | None = None     # the native copy was tried here and failed: why
    note: str | None = None            # a stream runs, but the live checkpoint is read: why
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0


def pinned_dir(config: SessionsConfig, stamp: str) -> CheckpointPath:
    """A private copy's place: beside the checkpoint, on its filesystem."""
    return config.checkpoint.parent / f"{config.checkpoint.name}{PINNED_SUFFIX}{stamp}"


def _leftovers(config: SessionsConfig) -> list[CheckpointPath]:
    parent, name = config.checkpoint.parent, config.checkpoint.name
    if not parent.exists():
        return []
    return [path for path in parent.iterdir() if path.name.startswith((name + PINNED_SUFFIX, name + LEGACY_PINNED))]


def _spark_reads(checkpoint: CheckpointPath, uri: str) -> bool:
    """Whether Spark reads a checkpoint at `uri` as it reads `checkpoint` (the same kind of filesystem: its
    executors see it, and the session is configured for it)."""
    other = checkpoint_path(uri)
    if isinstance(checkpoint, RemotePath) and isinstance(other, RemotePath):
        return str(checkpoint).split("://")[0] == str(other).split("://")[0]
    return not isinstance(checkpoint, RemotePath) and not isinstance(other, RemotePath)


def _line(error: Exception) -> str:
    return " ".join(str(error).split())[:300]


@contextmanager
def pinned_batch(config: SessionsConfig, store_uri: str, committed: CommittedBatch, savepoint_id: str, *, pin: bool,
                 changes_after: int | None, native_copy: bool) -> Iterator[PinnedBatch]:
    """Batch `committed` of the live checkpoint, pinned for the block when `pin` (a stream runs beside the caller):
    copied (with its change feed after `changes_after`, when given and still whole) into the savepoint's native copy
    when `native_copy` and Spark can read it there, else into a private checkpoint removed after the block. BatchGone
    when retention removed one of its files during the copy (nothing left behind). A copy that fails otherwise (the
    storage): the live checkpoint is read as before, and the result says why."""
    if not pin:
        yield PinnedBatch(config.checkpoint, False, changes_after)
        return
    started = time.monotonic()
    for leftover in _leftovers(config):  # a killed savepoint's (none is in use: the caller holds the lifecycle lease)
        remove_tree(leftover)
    info, batch_id = committed.info, committed.batch_id
    partitions, provider = int(info.partitions or 0), str(info.provider)
    native_note = None
    if native_copy and _spark_reads(config.checkpoint, store_uri):
        try:
            copy = native.copy_out(config.checkpoint, batch_id, store_uri=store_uri, savepoint_id=savepoint_id,
                                   changes_after=changes_after, partitions=partitions, provider=provider)
        except native.NativeGone as gone:
            raise BatchGone(str(gone)) from None
        except native.NativeUnavailable as why:  # the store refused it: a private copy instead
            native_note = f"no native copy: {why}"
        else:
            try:
                yield PinnedBatch(checkpoint_path(copy.uri), True, copy.changes_after, native=copy,
                                  files=len(copy.files) + len(copy.change_files), bytes=copy.bytes,
                                  seconds=round(time.monotonic() - started, 3))
            finally:  # the change feed's files are not part of the native copy (its manifest does not list them)
                with suppress(Exception):
                    _remove_files(checkpoint_path(copy.uri), copy.change_files)
            return
    target = pinned_dir(config, dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%f"))
    try:
        copied = native.pin_copy(config.checkpoint, batch_id, target=target, changes_after=changes_after,
                                 partitions=partitions, provider=provider)
    except native.NativeGone as gone:
        raise BatchGone(str(gone)) from None
    except native.NativeUnavailable as why:  # the storage: read in place, as before, and say so
        copied, unpinned = None, f"read in place, not pinned: {why}"
    if copied is None:
        yield PinnedBatch(config.checkpoint, False, changes_after, native_note=native_note, note=unpinned)
        return
    try:
        yield PinnedBatch(target, True, copied.changes_after, native_note=native_note, files=copied.files,
                          bytes=copied.bytes, seconds=round(time.monotonic() - started, 3))
    finally:
        remove_tree(target)


def _remove_files(root: CheckpointPath, paths: tuple[str, ...]) -> None:
    for path in paths:
        (root / path).unlink(missing_ok=True)
