"""Where leases (and stop requests) are kept: a directory on a filesystem every host shares, or an S3 prefix.

A store is a flat namespace of small objects with the few operations pipelines.coordination.leases needs: put-if-absent
(`create`), compare-and-swap (`swap`: replace an object only if it is still the version read), an atomic
whole-object replace, a read that tells an object's age and version, a listing by name prefix, and a delete.
Local: `create` is a hard link of a fully written temporary file (atomic, and never leaves a half-written lease;
O_CREAT | O_EXCL where the filesystem has no hard links), `replace` a rename, `swap` a compare and a rename under the
directory's lock file (POSIX record locks, `fcntl.lockf`: NFS v4 carries them; the version is the bytes' SHA-256).
S3: `create` is a conditional PUT (`If-None-Match: *`), `swap` a conditional PUT on the ETag read (`If-Match`),
`replace` a plain PUT (S3 writes are atomic and read-after-write consistent).

What a store must give. A shared path: an atomic create that fails when the name exists (a hard link of a fully
written temporary file; O_CREAT | O_EXCL where the filesystem has no hard links), an atomic rename over an existing
file, POSIX record locks that hold between hosts, and listings that show another host's new file within a small part
of the TTL (NFS: no long attribute or directory caching). S3: conditional PUTs (`If-None-Match: *`, `If-Match`) and
strong read-after-write consistency for PUT and LIST. Both: host clocks that agree to well within the TTL (expiry is
a wall-clock time written by the holder)."""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pipelines.errors import StorageUnavailable

__all__ = ["LeaseStore", "Record", "store_for"]


@dataclass(frozen=True)
class Record:
    data: bytes
    mtime: float  # when it was last written (epoch seconds): an unreadable lease expires a TTL after it
    version: str = ""  # what `swap` compares: the S3 ETag, a local file's SHA-256


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
        from pipelines.locations import s3_client

        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        self.uri, self.bucket, self.prefix = uri.rstrip("/"), bucket, prefix.strip("/")
        self.client: Any = s3_client(read_timeout_s=15)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _failed(self, what: str, name: str, error: Exception) -> StorageUnavailable:
        from pipelines.storage import s3_endpoint

        return StorageUnavailable(f"S3 at {s3_endpoint()} failed to {what} the lease object {self.where(name)} "
                                  f"({type(error).__name__}: {' '.join(str(error).split())[:160]}): check the "
                                  "endpoint and the AWS_* credentials, then run the command again")

    def create(self, name: str, data: bytes) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

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
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data)
        except (BotoCoreError, ClientError) as error:
            raise self._failed("write", name, error) from None

    def swap(self, name: str, data: bytes, version: str) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

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
        from botocore.exceptions import BotoCoreError, ClientError

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
        from botocore.exceptions import BotoCoreError, ClientError

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
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(name))
        except (BotoCoreError, ClientError) as error:
            raise self._failed("delete", name, error) from None

    def where(self, name: str) -> str:
        return f"{self.uri}/{name}"


_S3_STORES: dict[tuple[str, ...], tuple[float, S3Store]] = {}
_S3_CLIENT_MAX_AGE_S = 600.0


def store_for(location: LeaseStore | Path | str) -> LeaseStore:
    """The store at `location`: s3://bucket/prefix, or a local (shared) directory."""
    if not isinstance(location, (str, Path)):
        return location
    text = str(location)
    if text.startswith("s3:/") and not text.startswith("s3://"):
        text = "s3://" + text[len("s3:/"):]  # Path(config.lease_uri) of an s3:// lease URI (config.lease_dir)
    if not text.startswith("s3://"):
        return LocalStore(Path(text.removeprefix("file://")))
    key = (text, *(os.environ.get(k, "") for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_PROFILE")))
    cached = _S3_STORES.get(key)
    if cached is None or time.monotonic() - cached[0] > _S3_CLIENT_MAX_AGE_S:
        cached = _S3_STORES[key] = (time.monotonic(), S3Store(text))
    return cached[1]
