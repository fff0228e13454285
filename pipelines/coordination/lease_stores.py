"""Where leases (and stop requests) are kept: a directory on a filesystem every host shares, an S3 prefix, or a
directory on HDFS.

A store is a flat namespace of small objects with the few operations pipelines.coordination.leases needs: put-if-absent
(`create`), compare-and-swap (`swap`: replace an object only if it is still the version read), an atomic
whole-object replace, a read that tells an object's age and version, a listing by name prefix, and a delete.
Local: `create` is a hard link of a fully written temporary file (atomic, and never leaves a half-written lease;
O_CREAT | O_EXCL where the filesystem has no hard links), `replace` a rename, `swap` a compare and a rename under the
directory's lock file (POSIX record locks, `fcntl.lockf`: NFS v4 carries them; the version is the bytes' SHA-256).
S3: `create` is a conditional PUT (`If-None-Match: *`), `swap` a conditional PUT on the ETag read (`If-Match`),
`replace` a plain PUT (S3 writes are atomic and read-after-write consistent).
HDFS (through WebHDFS, pipelines.webhdfs: no JVM): the NameNode renames a file only onto a name that does not exist,
atomically, and that is all this store builds on. An object `name` is a series of version files `name.v<N>` (N
zero-padded); its value is the highest one's bytes, its version `N:<that file's modification time, ms>`. Every write
goes whole into a temporary file nobody reads, then is renamed onto its version file -- refused when that exists, so
of writers racing for one version exactly one wins. `create` writes version 1 of a name without versions; `replace`
the version after the highest it lists (again when it loses); `swap` from version N writes N+1, then holds only if
version N is still there as read (same modification time): a write removes the versions below its own oldest first,
and `delete` removes all of them oldest first, so version N still there means nobody wrote N+1 before and nobody
deleted the object; otherwise the swap removes what it wrote (never the highest then) and says False. A read lists
the directory and reads the highest version (listed again when a newer write removed it meanwhile).

What a store must give. A shared path: an atomic create that fails when the name exists (a hard link of a fully
written temporary file; O_CREAT | O_EXCL where the filesystem has no hard links), an atomic rename over an existing
file, POSIX record locks that hold between hosts, and listings that show another host's new file within a small part
of the TTL (NFS: no long attribute or directory caching). S3: conditional PUTs (`If-None-Match: *`, `If-Match`) and
strong read-after-write consistency for PUT and LIST. HDFS: a NameNode (its RPC and HTTP addresses) every host
reaches; its rename never overwrites and its listings are consistent (both are the NameNode's own). All: host clocks
that agree to well within the TTL (expiry is a wall-clock time written by the holder)."""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from pipelines.errors import StorageUnavailable
from pipelines.locations import RemotePath, s3_client
from pipelines.storage import s3_endpoint

__all__ = ["HdfsStore", "LeaseStore", "Record", "store_for"]


@dataclass(frozen=True)
class Record:
    data: bytes
    mtime: float  # when it was last written (epoch seconds): an unreadable lease expires a TTL after it
    version: str = ""  # what `swap` compares: the S3 ETag, a local file's SHA-256, HDFS's version number and mtime


class LeaseStore(Protocol):
    def create(self, name: str, data: bytes) -> bool:
        """Write `name` only if it does not exist; True when this call created it."""

    def replace(self, name: str, data: bytes) -> None:
        """Replace (or create) `name` atomically: a reader sees the old bytes or the new, never a mix."""

    def swap(self, name: str, data: bytes, version: str) -> bool:
        """Replace `name` atomically only if it is still `version` (a Record's, as read); False when another writer
        rewrote or removed it since."""

    def read(self, name: str) -> Record | None:
        """The object and its age, or None when there is none."""

    def names(self, prefix: str) -> list[str]:
        """The names that start with `prefix`."""

    def delete(self, name: str) -> None:
        """Remove `name` (no error when it is gone already)."""

    def where(self, name: str) -> str:
        """`name`'s full path or URI, for messages."""


_THREADS = threading.Lock()


class LocalStore:
    """A directory (shared by every host that runs the job: the checkpoint's filesystem by default)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _tmp(self, name: str, data: bytes) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f"{name}.tmp-{uuid.uuid4().hex[:12]}"
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return tmp

    def create(self, name: str, data: bytes) -> bool:
        target = self.directory / name
        tmp = self._tmp(name, data)
        try:
            os.link(tmp, target)
            return True
        except FileExistsError:
            return False
        except OSError as error:  # no hard links here (some FUSE and SMB mounts): an exclusive create instead
            if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
                raise
            return self._create_exclusive(target, data)
        finally:
            tmp.unlink(missing_ok=True)

    @staticmethod
    def _create_exclusive(target: Path, data: bytes) -> bool:
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as handle:  # a kill before the write leaves it empty: readers expire it by mtime
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return True

    def replace(self, name: str, data: bytes) -> None:
        os.replace(self._tmp(name, data), self.directory / name)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The directory's lock (one file, never removed: a lock file removed while a process waits on it would let
        a third one lock a new file beside it). Held by every swap and delete, briefly. A POSIX record lock belongs to
        the process, not the thread, so this process's threads take turns on _THREADS first."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with _THREADS:
            fd = os.open(self.directory / ".swap.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # releases the lock

    def swap(self, name: str, data: bytes, version: str) -> bool:
        tmp = self._tmp(name, data)
        try:
            with self._locked():
                current = self.read(name)
                if current is None or current.version != version:
                    return False
                os.replace(tmp, self.directory / name)
                return True
        finally:
            tmp.unlink(missing_ok=True)

    def read(self, name: str) -> Record | None:
        path = self.directory / name
        try:
            with open(path, "rb") as handle:
                mtime = os.fstat(handle.fileno()).st_mtime
                data = handle.read()
                return Record(data, mtime, hashlib.sha256(data).hexdigest())
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def names(self, prefix: str) -> list[str]:
        try:
            return [entry for entry in os.listdir(self.directory) if entry.startswith(prefix)]
        except FileNotFoundError:
            return []

    def delete(self, name: str) -> None:
        with self._locked():  # not between a swap's compare and its rename (which would bring the object back)
            (self.directory / name).unlink(missing_ok=True)

    def where(self, name: str) -> str:
        return str(self.directory / name)


_PRECONDITION = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")


class S3Store:
    """An S3 prefix, with conditional writes (no shared filesystem needed). Credentials and the endpoint come from
    the standard AWS_* variables, as everywhere else."""

    def __init__(self, uri: str) -> None:
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        self.uri, self.bucket, self.prefix = uri.rstrip("/"), bucket, prefix.strip("/")
        self.client: Any = s3_client(read_timeout_s=15)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _failed(self, what: str, name: str, error: Exception) -> StorageUnavailable:
        return StorageUnavailable(f"S3 at {s3_endpoint()} failed to {what} the lease object {self.where(name)} "
                                  f"({type(error).__name__}: {' '.join(str(error).split())[:160]}): check the "
                                  "endpoint and the AWS_* credentials, then run the command again")

    def create(self, name: str, data: bytes) -> bool:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data, IfNoneMatch="*")
        except ClientError as error:
            code = str(error.response.get("Error", {}).get("Code", ""))
            status = str(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            if code in _PRECONDITION or status in _PRECONDITION:
                return False
            raise self._failed("create", name, error) from None
        except BotoCoreError as error:
            raise self._failed("create", name, error) from None
        # Read back: S3 itself never lets two conditional PUTs both succeed, but a store that checks and writes in
        # two steps (a test server) can; the one whose bytes are not there lost.
        found = self.read(name)
        return found is not None and found.data == data

    def replace(self, name: str, data: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data)
        except (BotoCoreError, ClientError) as error:
            raise self._failed("write", name, error) from None

    def swap(self, name: str, data: bytes, version: str) -> bool:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data, IfMatch=version)
            return True
        except ClientError as error:
            code = str(error.response.get("Error", {}).get("Code", ""))
            status = str(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            if code in _PRECONDITION or status in _PRECONDITION or code in ("NoSuchKey", "404"):
                return False  # rewritten (412) or removed since it was read
            raise self._failed("write", name, error) from None
        except BotoCoreError as error:
            raise self._failed("write", name, error) from None

    def read(self, name: str) -> Record | None:
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self._key(name))
            return Record(answer["Body"].read(), answer["LastModified"].timestamp(), str(answer["ETag"]))
        except ClientError as error:
            if str(error.response.get("Error", {}).get("Code", "")) in ("NoSuchKey", "404"):
                return None
            raise self._failed("read", name, error) from None
        except BotoCoreError as error:
            raise self._failed("read", name, error) from None

    def names(self, prefix: str) -> list[str]:
        found: list[str] = []
        strip = len(self._key(""))
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                              Prefix=self._key(prefix)):
                found.extend(item["Key"][strip:] for item in page.get("Contents", []))
        except (BotoCoreError, ClientError) as error:
            raise self._failed("list", prefix + "*", error) from None
        return [name for name in found if "/" not in name]

    def delete(self, name: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(name))
        except (BotoCoreError, ClientError) as error:
            raise self._failed("delete", name, error) from None

    def where(self, name: str) -> str:
        return f"{self.uri}/{name}"


_VERSION_FILE = re.compile(r"(?P<name>.+)\.v(?P<n>\d{12})")
_ATTEMPTS = 20              # listings a read, replace or delete makes while other writers keep changing the object
_STALE_TEMPORARY_S = 600.0  # a temporary file this old was left by a writer that died before its rename


@dataclass(frozen=True)
class _Version:
    n: int
    mtime_ms: int  # the NameNode's modification time of the version file


class HdfsStore:
    """A directory on HDFS, reached through WebHDFS (pipelines.webhdfs; its failures are typed one-line errors). The
    version files and how they make `create` and `swap` atomic: the module's docstring."""

    def __init__(self, uri: str) -> None:
        self.uri = uri.rstrip("/")
        self.directory = RemotePath(self.uri)

    def _file(self, file: str) -> str:
        return f"{self.directory.key}/{file}"

    def _versions(self) -> tuple[dict[str, list[_Version]], list[tuple[str, float]]]:
        """Every object's versions, oldest first, and the temporary files with their ages (s), in one listing."""
        try:
            entries = self.directory.fs.ls(self.directory.key, detail=True)
        except FileNotFoundError:
            return {}, []
        objects: dict[str, list[_Version]] = {}
        temporary: list[tuple[str, float]] = []
        for entry in entries:
            file, mtime_ms = str(entry["pathSuffix"]), int(entry["modificationTime"])
            found = _VERSION_FILE.fullmatch(file)
            if found and entry["type"] == "file":
                objects.setdefault(found["name"], []).append(_Version(int(found["n"]), mtime_ms))
            elif ".tmp-" in file:
                temporary.append((file, time.time() - mtime_ms / 1000))
        return {name: sorted(found, key=lambda v: v.n) for name, found in objects.items()}, temporary

    def _of(self, name: str) -> list[_Version]:
        return self._versions()[0].get(name, [])

    def _publish(self, name: str, n: int, data: bytes) -> bool:
        """Version n of `name`, written whole and renamed into place: False when version n exists."""
        temporary = self._file(f".{name}.tmp-{uuid.uuid4().hex[:12]}")
        try:
            self.directory.fs.write_new(temporary, data)
            renamed = bool(self.directory.fs.rename_new(temporary, self._file(f"{name}.v{n:012d}")))
        except BaseException:
            with suppress(Exception):  # the failure itself is what to report; `delete` sweeps what stays behind
                self.directory.fs.remove(temporary)
            raise
        if not renamed:
            self.directory.fs.remove(temporary)
        return renamed

    def _remove(self, name: str, versions: list[_Version]) -> None:
        for version in versions:  # oldest first: see the module's docstring
            self.directory.fs.remove(self._file(f"{name}.v{version.n:012d}"))

    def create(self, name: str, data: bytes) -> bool:
        return not self._of(name) and self._publish(name, 1, data)

    def replace(self, name: str, data: bytes) -> None:
        for _ in range(_ATTEMPTS):
            before = self._of(name)
            n = before[-1].n + 1 if before else 1
            if self._publish(name, n, data):
                self._remove(name, before)
                return
        raise StorageUnavailable(f"the lease object {self.where(name)} kept changing while {_ATTEMPTS} writes tried to "
                                 "replace it: run the command again")

    def swap(self, name: str, data: bytes, version: str) -> bool:
        n, _, mtime_ms = version.partition(":")
        if not (n.isdigit() and mtime_ms.isdigit()) or not self._publish(name, int(n) + 1, data):
            return False
        read = _Version(int(n), int(mtime_ms))
        below = [v for v in self._of(name) if v.n <= read.n]
        if read not in below:  # removed, or rewritten since it was read: this write is no swap (and not the highest)
            self.directory.fs.remove(self._file(f"{name}.v{read.n + 1:012d}"))
            return False
        self._remove(name, below)
        return True

    def read(self, name: str) -> Record | None:
        for _ in range(_ATTEMPTS):
            versions = self._of(name)
            if not versions:
                return None
            top = versions[-1]
            try:
                data = self.directory.fs.read_bytes(self._file(f"{name}.v{top.n:012d}"))
            except FileNotFoundError:
                continue  # a newer write removed it meanwhile
            return Record(data, top.mtime_ms / 1000, f"{top.n}:{top.mtime_ms}")
        raise StorageUnavailable(f"the lease object {self.where(name)} kept changing while {_ATTEMPTS} reads tried to "
                                 "read it: run the command again")

    def names(self, prefix: str) -> list[str]:
        return [name for name in self._versions()[0] if name.startswith(prefix)]

    def delete(self, name: str) -> None:
        for _ in range(_ATTEMPTS):  # a write that landed meanwhile is removed too (or finds its version gone)
            objects, temporary = self._versions()
            for file, age_s in temporary:
                if file.startswith(f".{name}.tmp-") and age_s > _STALE_TEMPORARY_S:
                    self.directory.fs.remove(self._file(file))
            if not objects.get(name):
                return
            self._remove(name, objects[name])

    def where(self, name: str) -> str:
        return f"{self.uri}/{name}"


_S3_STORES: dict[tuple[str, ...], tuple[float, S3Store]] = {}
_S3_CLIENT_MAX_AGE_S = 600.0


def store_for(location: LeaseStore | Path | str) -> LeaseStore:
    """The store at `location`: s3://bucket/prefix, hdfs://namenode:port/path, or a local (shared) directory."""
    if not isinstance(location, (str, Path)):
        return location
    text = str(location)
    for scheme in ("s3", "hdfs"):  # Path(config.lease_uri) of such a lease URI (config.lease_dir) lost a slash
        if text.startswith(f"{scheme}:/") and not text.startswith(f"{scheme}://"):
            text = f"{scheme}://" + text[len(f"{scheme}:/"):]
    if text.startswith("hdfs://"):
        return HdfsStore(text)
    if not text.startswith("s3://"):
        return LocalStore(Path(text.removeprefix("file://")))
    key = (text, *(os.environ.get(k, "") for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_PROFILE")))
    cached = _S3_STORES.get(key)
    if cached is None or time.monotonic() - cached[0] > _S3_CLIENT_MAX_AGE_S:
        cached = _S3_STORES[key] = (time.monotonic(), S3Store(text))
    return cached[1]
