"""Native savepoints: the checkpoint's own files for a savepoint's batch, kept beside its canonical rows.

A canonical savepoint (state_store.savepoint.take) is portable -- another provider, partition count or operator --,
queryable, diffable and erasable, and costs a read of the whole state and a bootstrap batch to restore. A native copy
(`sessionctl savepoint --native`) also keeps the files Spark itself would load to resume at batch N: the offset and
commit logs up to N, the query's metadata and sources, the state operator's metadata and schema, and per state
partition the version chain of state version N+1 (the HDFS-backed provider's newest `.snapshot` at or below it and
the `.delta` files after it; RocksDB's newest `.zip` at or below it, the SST files it names and the `.changelog`
files after it). A restore to the same provider, partition count and operator layout (state_store.restore) copies
them into a fresh checkpoint and the stream resumes at N+1 -- no Spark job at all; any other restore uses the
canonical rows.

Layout under SESSIONS_SAVEPOINT_URI: `native/<savepoint id>/` holds the files at their paths relative to the
checkpoint, and `_native.json` their manifest (path, size, SHA-256 of each). The catalog row records the manifest's
own SHA-256, the files' count and bytes: a copy is trusted only when its manifest hashes to the catalog's value and
every file to the manifest's, checked while it is copied back. With the checkpoint and the savepoints both on S3 each
file is copied by S3 itself (CopyObject, which also computes the copy's SHA-256: no byte through this process);
otherwise it streams through this process (local, HDFS through WebHDFS, S3 through pyarrow). Either way several
files at a time.

The same selection of files pins a batch that a savepoint reads beside a running stream (`pin_copy`,
state_store.savepoint.pin): a private checkpoint beside the live one, hard links on a local filesystem.

Erasure: a native copy is opaque (RocksDB's SST files may keep a removed user's older values until a compaction),
so `forget` drops every native copy and the savepoints stay restorable from their erased canonical rows."""
from __future__ import annotations

import base64
import contextvars
import hashlib
import io
import json
import os
import re
import shutil
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError
from fsspec.implementations.local import LocalFileSystem

from pipelines.errors import SavepointDamaged
from pipelines.job.checkpoint import JOB_FILE, JobMetadata
from pipelines.locations import CheckpointPath, RemotePath, checkpoint_path, remove_tree, s3_client
from pipelines.storage import join

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

__all__ = ["NativeCopy", "NativeGone", "NativeShape", "NativeUnavailable", "PinnedCopy", "copy_in", "copy_out", "drop",
           "folders", "native_shape", "native_uri", "pin_copy"]

NATIVE_DIR = "native"
MANIFEST = "_native.json"
_CHUNK = 8 << 20
_PARALLEL = 8  # files copied at a time: the copies wait on storage, not on this process
_SERVER_SIDE_MAX = 5 << 30  # S3's limit for one CopyObject; a larger file streams
_VERSIONED = re.compile(r"^(\d+)\.(delta|snapshot|zip|changelog)$")


class NativeUnavailable(Exception):
    """The checkpoint's files cannot make a native copy of this batch (say why); the savepoint stays canonical."""


class NativeGone(NativeUnavailable):
    """A file the batch needs is gone from the checkpoint: Spark's retention removed it (a stream committing batches
    meanwhile). A newer batch can still be copied."""


@dataclass(frozen=True)
class NativeFile:
    path: str  # relative to the checkpoint
    size: int
    sha256: str


@dataclass(frozen=True)
class NativeCopy:
    """A native copy as written: where, its files, and the SHA-256 of its manifest (the catalog's native_checksum).
    With `changes_after`, the folder also holds the older delta or changelog files the state change feed
    (changes_after, batch] reads (`change_files`, not in the manifest: a restore never needs them)."""
    uri: str
    files: tuple[NativeFile, ...]
    checksum: str
    changes_after: int | None = None
    change_files: tuple[str, ...] = ()

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


def native_uri(store_uri: str, savepoint_id: str) -> str:
    return join(store_uri, NATIVE_DIR, savepoint_id)


def _fs(path: CheckpointPath) -> tuple[AbstractFileSystem, str]:
    if isinstance(path, RemotePath):
        return path.fs, path.key

    return LocalFileSystem(), str(path)


def _relative(root: str, found: dict[str, Any]) -> dict[str, int]:
    """fsspec's `find(detail=True)` as relative path -> size."""
    prefix = root.rstrip("/") + "/"
    return {(p.removeprefix(prefix) if p.startswith(prefix) else p.split(prefix.lstrip("/"), 1)[-1]): int(info["size"])
            for p, info in ((str(f), i) for f, i in found.items())}


def _chain(names: list[str], version: int, snapshot_ext: str, delta_ext: str) -> list[str]:
    """The files that load state version `version` of one partition: the newest snapshot at or below it and every
    delta after it (NativeUnavailable when one is missing)."""
    by_kind: dict[str, set[int]] = {snapshot_ext: set(), delta_ext: set()}
    for name in names:
        match = _VERSIONED.match(name)
        if match and match.group(2) in by_kind:
            by_kind[match.group(2)].add(int(match.group(1)))
    base = max((v for v in by_kind[snapshot_ext] if v <= version), default=0)
    missing = [v for v in range(base + 1, version + 1) if v not in by_kind[delta_ext]]
    if missing:
        raise NativeGone(f"state version {version} needs {missing[0]}.{delta_ext}, which is gone")
    return ([f"{base}.{snapshot_ext}"] if base else []) + [f"{v}.{delta_ext}" for v in range(base + 1, version + 1)]


def _listing(checkpoint: CheckpointPath) -> dict[str, int]:
    """Every file of the checkpoint (relative path -> size), .crc files aside."""
    fs, root = _fs(checkpoint)
    sizes = _relative(root, fs.find(root, detail=True))
    return {p: size for p, size in sizes.items() if not p.rsplit("/", 1)[-1].startswith(".")}


def _partition_names(every: dict[str, int], folder: str) -> list[str]:
    return [p.removeprefix(folder) for p in every if p.startswith(folder) and "/" not in p.removeprefix(folder)]


def _operators(every: dict[str, int]) -> list[str]:
    return sorted({p.split("/")[1] for p in every if p.startswith("state/") and p.count("/") >= 2})


def _checkpoint_files(checkpoint: CheckpointPath, batch_id: int, partitions: int, provider: str, *,
                      listed: dict[str, int] | None = None) -> dict[str, int]:
    """What Spark loads to resume after batch `batch_id`, relative to the checkpoint, with each file's size as
    listed (`listed`: the checkpoint's _listing, when the caller has it)."""
    fs, root = _fs(checkpoint)
    sizes = _listing(checkpoint) if listed is None else listed
    every = sorted(sizes)
    chosen = [p for p in every if p in ("metadata", JOB_FILE) or p.startswith("sources/")]
    for log in ("offsets", "commits"):
        chosen += [p for p in every if p.startswith(f"{log}/") and p.split("/")[1].isdigit()
                   and int(p.split("/")[1]) <= batch_id]
    if not any(p == f"commits/{batch_id}" for p in chosen):
        raise NativeGone(f"batch {batch_id} has no commit in the checkpoint")
    operators = _operators(sizes)
    version = batch_id + 1  # the state version batch N commits
    snapshot_ext, delta_ext = ("zip", "changelog") if provider == "rocksdb" else ("snapshot", "delta")
    for op in operators:
        base = f"state/{op}/"
        # The operator's metadata and schemas (`_metadata/`, `_stateSchema/`, a partition's `_metadata/`).
        chosen += [p for p in every if p.startswith(base) and any(part.startswith("_") for part in p.split("/")[2:-1])
                   and (p.split("/")[2].startswith("_") or int(p.split("/")[2]) < partitions)]
        for partition in range(partitions):
            folder = f"{base}{partition}/"
            names = _partition_names(sizes, folder)
            if any("_" in name for name in names if name[:1].isdigit()):
                raise NativeUnavailable("the state store writes checkpoint format v2 (unique ids): not copied natively")
            files = _chain(names, version, snapshot_ext, delta_ext)
            chosen += [folder + name for name in files]
            if provider == "rocksdb" and files and files[0].endswith(".zip"):
                chosen += [f"{folder}SSTs/{sst}" for sst in _referenced_ssts(fs, f"{root}/{folder}{files[0]}")]
    return {path: sizes.get(path, -1) for path in sorted(set(chosen))}  # -1: named by a zip, not listed: gone


def _change_files(listed: dict[str, int], after_batch: int, batch_id: int, partitions: int, provider: str
                  ) -> dict[str, int] | None:
    """The files Spark's state change feed of batches (after_batch, batch_id] reads: per state partition the delta
    (HDFS-backed) or changelog (RocksDB) file of every state version after_batch + 2 .. batch_id + 1 (batch b commits
    version b + 1); None when one of them is gone (retention reached it)."""
    ext = "changelog" if provider == "rocksdb" else "delta"
    wanted = {}
    for op in _operators(listed):
        for partition in range(partitions):
            for version in range(after_batch + 2, batch_id + 2):
                path = f"state/{op}/{partition}/{version}.{ext}"
                if path not in listed:
                    return None
                wanted[path] = listed[path]
    return wanted


def _referenced_ssts(fs: AbstractFileSystem, zip_path: str) -> list[str]:
    """The SST files (their names under SSTs/) a RocksDB snapshot zip's `metadata` names."""
    try:
        with fs.open(zip_path, "rb") as handle, zipfile.ZipFile(io.BytesIO(handle.read())) as archive:
            text = archive.read("metadata").decode()
    except FileNotFoundError:
        raise NativeGone(f"{zip_path.rsplit('/', 1)[-1]} was removed while it was read") from None
    metadata = json.loads(text.split("\n", 1)[1])  # "v1\n{json}"
    return [str(sst["dfsSstFileName"]) for sst in metadata.get("sstFiles", [])]


def _copy(source: AbstractFileSystem, source_path: str, target: AbstractFileSystem, target_path: str) -> tuple[int, str]:
    """One file copied through this process; (bytes, SHA-256)."""
    digest, size = hashlib.sha256(), 0
    parent = target_path.rsplit("/", 1)[0]
    if parent:
        target.makedirs(parent, exist_ok=True)
    with source.open(source_path, "rb") as reader, target.open(target_path, "wb") as writer:
        while chunk := reader.read(_CHUNK):
            digest.update(chunk)
            writer.write(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _s3_object(path: CheckpointPath) -> tuple[str, str] | None:
    """(bucket, key) of a path on S3; None elsewhere."""
    if isinstance(path, RemotePath) and str(path).startswith("s3a://"):
        bucket, _, key = path.key.partition("/")
        return bucket, key
    return None


Copy = Callable[[str, int], tuple[int, str]]


def _link(source: Path, target: Path) -> tuple[int, str]:
    """One local file pinned by a hard link (Spark never rewrites a checkpoint file in place: deleting the original
    leaves the link whole); copied when the two are on different devices. (bytes, "": no SHA-256 is computed)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except FileNotFoundError:
        raise
    except OSError:  # another device, or a filesystem without hard links
        shutil.copyfile(source, target)
    return target.stat().st_size, ""


def _copier(source: CheckpointPath, target: CheckpointPath, *, link: bool = False) -> Copy:
    """How one file (its path relative to both roots, its size as listed or recorded) is copied: (bytes, SHA-256 of
    what was written); raises FileNotFoundError when the source file is gone. With `link`, local files are hard
    linked where they can be (no SHA-256 then)."""
    if link and isinstance(source, Path) and isinstance(target, Path):
        return lambda path, _: _link(source / path, target / path)
    source_fs, source_root = _fs(source)
    target_fs, target_root = _fs(target)
    source_s3, target_s3 = _s3_object(source), _s3_object(target)
    if source_s3 is None or target_s3 is None:
        return lambda path, _: _copy(source_fs, f"{source_root}/{path}", target_fs, f"{target_root}/{path}")


    client = s3_client()

    def server_side(path: str, size: int) -> tuple[int, str]:
        # The size comes from the listing (copy_out) or the manifest (copy_in, where the SHA-256 S3 computes is
        # what tells a changed file).
        if size < 0 or size > _SERVER_SIDE_MAX:
            return _copy(source_fs, f"{source_root}/{path}", target_fs, f"{target_root}/{path}")
        bucket, key = source_s3[0], f"{source_s3[1]}/{path}"
        try:
            copied = client.copy_object(Bucket=target_s3[0], Key=f"{target_s3[1]}/{path}", ChecksumAlgorithm="SHA256",
                                        CopySource={"Bucket": bucket, "Key": key})
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                raise FileNotFoundError(key) from None
            raise
        return size, base64.b64decode(copied["CopyObjectResult"]["ChecksumSHA256"]).hex()

    return server_side


def _copy_all(copy: Copy, files: dict[str, int]) -> list[tuple[int, str]]:
    """Every file (path -> size) copied, several at a time; (bytes, SHA-256) in the order of `files` ((-1, "") for
    one gone)."""
    def one(item: tuple[str, int]) -> tuple[int, str]:
        try:
            return copy(*item)
        except FileNotFoundError:
            return -1, ""

    with ThreadPoolExecutor(max_workers=_PARALLEL) as pool:
        # each copy in a copy of this thread's context: the S3 request limits of the command (s3_limits) hold there too
        copies = [pool.submit(contextvars.copy_context().run, one, item) for item in files.items()]
        return [copy.result() for copy in copies]


@dataclass(frozen=True)
class _Copied:
    files: tuple[NativeFile, ...]        # the batch's files (what Spark loads to resume after it)
    change_files: tuple[str, ...]        # the older delta or changelog files of the change feed, beside them
    changes_after: int | None            # the change feed (changes_after, batch] is whole in the copy; None: not


def _copy_batch(checkpoint: CheckpointPath, target: CheckpointPath, batch_id: int, partitions: int, provider: str,
                changes_after: int | None, *, link: bool = False) -> _Copied:
    """The batch's files (and, with `changes_after`, its change feed's) copied from `checkpoint` to `target`:
    NativeGone when one the batch needs was removed meanwhile (the change feed's files are only dropped then)."""
    listed = _listing(checkpoint)
    paths = _checkpoint_files(checkpoint, batch_id, partitions, provider, listed=listed)
    changes = None if changes_after is None else _change_files(listed, changes_after, batch_id, partitions, provider)
    extra = {path: size for path, size in (changes or {}).items() if path not in paths}
    copied = _copy_all(_copier(checkpoint, target, link=link), {**paths, **extra})  # in that order
    gone = [path for path, (size, _) in zip(paths, copied) if size < 0]
    if gone:  # Spark's maintenance removed it between the listing and the copy
        raise NativeGone(f"{gone[0]} was removed while it was copied")
    extra_copied = [path for path, (size, _) in zip(extra, copied[len(paths):]) if size >= 0]
    whole = changes is not None and len(extra_copied) == len(extra)
    return _Copied(tuple(NativeFile(path, size, sha) for path, (size, sha) in zip(paths, copied)),
                   tuple(extra_copied), changes_after if whole else None)


def _storage_failure(error: BaseException) -> NativeUnavailable | None:
    if isinstance(error, (OSError, BotoCoreError, ClientError)):  # storage, not the savepoint: it stays canonical
        return NativeUnavailable(f"the copy failed ({type(error).__name__}: "
                                 f"{' '.join(str(error).split())[:200]})")
    return None


def copy_out(checkpoint: CheckpointPath, batch_id: int, *, partitions: int, provider: str, store_uri: str,
             savepoint_id: str, changes_after: int | None = None) -> NativeCopy:
    """The checkpoint's files for batch `batch_id` copied under the store's native/<savepoint id>/, with their
    manifest (NativeUnavailable when the checkpoint cannot give them, NativeGone when Spark's retention removed one
    meanwhile; nothing left behind on any failure). With `changes_after`, the change feed's files beside them
    (NativeCopy.change_files)."""
    uri = native_uri(store_uri, savepoint_id)
    target = checkpoint_path(uri)
    target_fs, target_root = _fs(target)
    try:
        copied = _copy_batch(checkpoint, target, batch_id, partitions, provider, changes_after)
        manifest = json.dumps({"batch_id": batch_id, "provider": provider, "partitions": partitions,
                               "files": [f.__dict__ for f in copied.files]}, sort_keys=True).encode()
        target_fs.pipe_file(f"{target_root}/{MANIFEST}", manifest)
    except BaseException as error:
        with suppress(Exception):  # a folder left behind is an orphan: compaction removes it
            remove_tree(target)
        failure = _storage_failure(error)
        if failure is not None:
            raise failure from None
        raise
    return NativeCopy(uri, copied.files, hashlib.sha256(manifest).hexdigest(), copied.changes_after,
                      copied.change_files)


@dataclass(frozen=True)
class PinnedCopy:
    """A private copy of one batch's files (no manifest): a checkpoint Spark's state data source reads as the live
    one at that batch, whatever the stream's retention deletes meanwhile."""
    checkpoint: CheckpointPath
    files: int
    bytes: int
    changes_after: int | None  # it also holds the change feed (changes_after, batch]; None: not


def pin_copy(checkpoint: CheckpointPath, batch_id: int, *, partitions: int, provider: str, target: CheckpointPath,
             changes_after: int | None = None) -> PinnedCopy:
    """The checkpoint's files for batch `batch_id` (and its change feed's after `changes_after`) pinned at
    `target`, a directory beside the checkpoint: hard links on a local filesystem, server-side copies on S3, copies
    through this process on HDFS. NativeGone / NativeUnavailable as copy_out; nothing left behind on a failure."""
    try:
        copied = _copy_batch(checkpoint, target, batch_id, partitions, provider, changes_after, link=True)
    except BaseException as error:
        with suppress(Exception):
            remove_tree(target)
        failure = _storage_failure(error)
        if failure is not None:
            raise failure from None
        raise
    return PinnedCopy(target, len(copied.files) + len(copied.change_files), sum(f.size for f in copied.files),
                      copied.changes_after)


def _manifest(store_uri: str, savepoint_id: str, checksum: str) -> dict[str, Any]:
    target = checkpoint_path(native_uri(store_uri, savepoint_id))
    fs, root = _fs(target)
    try:
        data = bytes(fs.cat_file(f"{root}/{MANIFEST}"))
    except FileNotFoundError:
        raise SavepointDamaged(f"savepoint {savepoint_id}'s native copy has no manifest",
                               savepoint_id=savepoint_id) from None
    if hashlib.sha256(data).hexdigest() != checksum:
        raise SavepointDamaged(f"savepoint {savepoint_id}'s native manifest does not hash to the catalog's value",
                               savepoint_id=savepoint_id)
    return dict(json.loads(data))


@dataclass(frozen=True)
class NativeShape:
    """What a native copy fits: the operator layout of the checkpoint it came from (its job metadata; None when it
    has none), its state partitions and provider (the manifest's: a copy prepared for a rescale has the new count,
    not the savepoint's)."""
    layout: str | None
    partitions: int
    provider: str


def native_shape(store_uri: str, savepoint_id: str, checksum: str) -> NativeShape:
    """The shape of a savepoint's native copy, its manifest verified against the catalog's hash."""
    manifest = _manifest(store_uri, savepoint_id, checksum)
    layout = None
    if any(f["path"] == JOB_FILE for f in manifest["files"]):
        fs, root = _fs(checkpoint_path(native_uri(store_uri, savepoint_id)))
        layout = JobMetadata.from_json(bytes(fs.cat_file(f"{root}/{JOB_FILE}")).decode()).state_layout
    return NativeShape(layout, int(manifest["partitions"]), str(manifest["provider"]))


def copy_in(store_uri: str, savepoint_id: str, checksum: str, checkpoint: CheckpointPath) -> int:
    """A native copy's files into `checkpoint` (an empty or absent directory), each checked against its manifest
    while copied (SavepointDamaged on the first that differs; the caller discards the checkpoint). The job metadata
    is not copied: the restored checkpoint gets its own incarnation. Returns the bytes copied."""
    manifest = _manifest(store_uri, savepoint_id, checksum)
    entries = [entry for entry in manifest["files"] if entry["path"] != JOB_FILE]
    copied = _copy_all(_copier(checkpoint_path(native_uri(store_uri, savepoint_id)), checkpoint),
                       {entry["path"]: int(entry["size"]) for entry in entries})
    for entry, (size, sha) in zip(entries, copied):
        if (size, sha) != (entry["size"], entry["sha256"]):
            raise SavepointDamaged(f"savepoint {savepoint_id}'s native file {entry['path']} is "
                                   f"{'gone' if size < 0 else 'not the one copied'}", savepoint_id=savepoint_id)
    return sum(size for size, _ in copied)


def folders(store_uri: str) -> set[str]:
    """Savepoint ids with a folder under native/ (complete copies or orphans)."""
    fs, root = _fs(checkpoint_path(join(store_uri, NATIVE_DIR)))
    try:
        return {str(p).rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)}
    except FileNotFoundError:
        return set()


def drop(store_uri: str, savepoint_id: str) -> None:
    """A savepoint's native copy, gone (nothing when there is none)."""
    remove_tree(checkpoint_path(native_uri(store_uri, savepoint_id)))
