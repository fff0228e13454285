"""A checkpoint's location, seen from Python without a JVM: a local path, or a directory on HDFS or S3.

Spark reads and writes a checkpoint through Hadoop's filesystems (`hdfs://`, `s3a://`); the driver's own reads --
the offset and commit logs, the job metadata, the restore marker, a restore's set-aside -- go through fsspec here:
HDFS through the NameNode's WebHDFS REST API (no libhdfs, no JVM: light commands stay light), S3 through pyarrow's
S3 filesystem (the AWS_* variables, as everywhere). A `RemotePath` offers the few pathlib operations the checkpoint's
readers use, so they take a local `Path` or a `RemotePath` alike. pyarrow's S3 filesystem of this process (its
credentials and request limits) is made here too, for every S3 reader (pipelines.storage).

HDFS is reached through pipelines.webhdfs only, whose failures are typed one-line errors. Before the first WebHDFS
call to a NameNode, this process also checks that its RPC address (the hdfs:// host and port, which Spark's Hadoop
client uses) takes connections: a wrong port there would otherwise surface only in Spark, after its client retried
for minutes. Messages name the setting an hdfs:// location came from (`name_hdfs_location`, SessionsConfig's).

What each store promises a checkpoint. HDFS: create-if-absent and rename are atomic on the NameNode, as on a local
disk. S3: writes are atomic and read-after-write consistent, but a rename is a copy and a delete -- Spark's
checkpoint file manager for object stores writes each log file in place instead (see pipelines.job.runtime), and a
restore's set-aside of a whole checkpoint is a copy under the restore marker (a kill there is finished by running
the restore again).
"""
from __future__ import annotations

import datetime as dt
import getpass
import os
import shutil
import socket
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from pipelines.errors import StorageUnavailable

if TYPE_CHECKING:  # fsspec and pyarrow are imported only where they are used: `sessionctl --help` stays light
    import pyarrow.fs as pafs
    from fsspec import AbstractFileSystem

__all__ = ["HADOOP_SCHEMES", "S3_LIMITS", "CheckpointPath", "RemotePath", "checkpoint_path", "hdfs_outage",
           "hdfs_setting", "is_remote", "move", "name_hdfs_location", "remove_tree", "s3_client", "s3_filesystem"]

HADOOP_SCHEMES = ("hdfs", "s3a", "s3")
NAMENODE_RPC_PORT = 8020  # the NameNode's RPC port when hdfs:// names none (Hadoop 3: fs.defaultFS)
RPC_CHECK_TIMEOUT_S = 10.0


def is_remote(uri: str) -> bool:
    return urlparse(uri).scheme in HADOOP_SCHEMES


# The WebHDFS address each NameNode (host:port of hdfs://) was given with, in this process: a checkpoint's URI handed
# on as text (a set-aside checkpoint, an erasure's scan, the lease store) reaches the same NameNode's HTTP API.
_WEBHDFS_OF: dict[str, str] = {}
# The setting each hdfs:// location came from (its URI without a trailing slash), for messages.
_HDFS_SETTINGS: dict[str, str] = {}
# The NameNodes (RPC host:port) that took a connection in this process: checked once.
_RPC_ANSWERED: set[str] = set()


def name_hdfs_location(uri: str, *, setting: str, webhdfs: str = "") -> None:
    """Remember that the hdfs:// location `uri` is `setting`'s (its failures name it) and, when given, the HTTP address
    (WebHDFS) of its NameNode."""
    _HDFS_SETTINGS[uri.rstrip("/")] = setting
    if webhdfs:
        _WEBHDFS_OF[urlparse(uri).netloc] = webhdfs


def hdfs_setting(uri: str) -> str:
    """`SETTING=location` for the named hdfs:// location `uri` lies in (the closest), else `uri` itself."""
    found = [(location, setting) for location, setting in _HDFS_SETTINGS.items()
             if uri == location or uri.startswith(location + "/")]
    if not found:
        return uri
    location, setting = max(found, key=lambda item: len(item[0]))
    return f"{setting}={location}"


def _check_rpc(netloc: str, uri: str) -> None:
    """StorageUnavailable unless the NameNode's RPC address takes a TCP connection (once per process and NameNode)."""
    if netloc in _RPC_ANSWERED:
        return
    host, _, port = netloc.rpartition(":") if ":" in netloc else (netloc, "", str(NAMENODE_RPC_PORT))
    try:
        socket.create_connection((host, int(port)), timeout=RPC_CHECK_TIMEOUT_S).close()
    except (OSError, ValueError) as error:
        cause = ("connection refused" if isinstance(error, ConnectionRefusedError) else
                 "timed out" if isinstance(error, TimeoutError) else
                 "not a port number" if isinstance(error, ValueError) else error.strerror or str(error))
        raise StorageUnavailable(f"{hdfs_setting(uri)}: the NameNode's RPC address {host}:{port} does not answer "
                                 f"({cause}): check the host and port there (the NameNode's fs.defaultFS, port "
                                 f"{NAMENODE_RPC_PORT} by default) and that the NameNode runs") from None
    _RPC_ANSWERED.add(netloc)


@cache
def _webhdfs(rpc: str, http: str, user: str) -> AbstractFileSystem:
    """The WebHDFS client of the NameNode at `rpc` (hdfs:// host:port) whose HTTP address is `http` (given, else its
    default); its failures name the setting a location came from (hdfs_setting)."""
    from pipelines.webhdfs import WEBHDFS_PORT, NameNode, WebHdfs  # fsspec and requests: only where HDFS is used

    namenode = NameNode(rpc, http or f"{rpc.split(':')[0]}:{WEBHDFS_PORT}", bool(http))
    return WebHdfs(namenode, user=user, where=hdfs_setting)


def _s3() -> AbstractFileSystem:
    from fsspec.implementations.arrow import ArrowFSWrapper  # fsspec: only where S3 is used

    return ArrowFSWrapper(s3_filesystem())


# The S3 request limits of pyarrow's filesystem (per request: seconds, attempts) for the code in a `s3_limits`
# block; pyarrow's defaults (30 s, 3 attempts) elsewhere -- e.g. on an executor, which has no configuration.
S3_LIMITS: ContextVar[tuple[float, int | None]] = ContextVar("s3_limits", default=(30.0, None))


def s3_filesystem() -> pafs.S3FileSystem:
    """pyarrow's S3 filesystem from this process's standard AWS_* variables (driver or executor alike: executors
    get them through spark.executorEnv, see pipelines.job.shipping); request limits from pipelines.storage.s3_limits."""
    import pyarrow.fs as pafs  # pyarrow's S3 filesystem: only where S3 is used

    env = os.environ
    endpoint = env.get("AWS_ENDPOINT_URL", "")
    scheme, _, host = endpoint.partition("://") if "://" in endpoint else ("https", "", endpoint)
    request_timeout_s, max_attempts = S3_LIMITS.get()
    retries = {} if max_attempts is None else {
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=max(1, max_attempts))}
    return pafs.S3FileSystem(
        access_key=env.get("AWS_ACCESS_KEY_ID"), secret_key=env.get("AWS_SECRET_ACCESS_KEY"),
        session_token=env.get("AWS_SESSION_TOKEN"),
        region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
        endpoint_override=host or None, scheme=scheme, connect_timeout=5, request_timeout=request_timeout_s,
        **retries)


def s3_client(*, read_timeout_s: float = 60.0, attempts: int = 3) -> Any:
    """A boto3 S3 client from the same standard AWS_* variables, for what pyarrow's filesystem does not do
    (conditional writes, server-side copies)."""
    import boto3  # boto3: only where S3 is used
    from botocore.config import Config

    env = os.environ
    return boto3.client("s3", endpoint_url=env.get("AWS_ENDPOINT_URL") or None,
                        region_name=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
                        config=Config(connect_timeout=5, read_timeout=read_timeout_s,
                                      retries={"max_attempts": attempts, "mode": "standard"}))


@dataclass(frozen=True)
class RemotePath:
    """A file or directory on HDFS (`hdfs://namenode:port/path`) or S3 (`s3a://bucket/key`; `s3://` is the same).
    `str()` is the URI Spark's Hadoop filesystem takes; `webhdfs` the NameNode's HTTP address (host:port)."""
    uri: str
    webhdfs: str = ""

    @property
    def _parts(self) -> tuple[str, str, str]:
        parsed = urlparse(self.uri)
        return parsed.scheme, parsed.netloc, parsed.path.rstrip("/") or "/"

    @property
    def fs(self) -> AbstractFileSystem:
        scheme, netloc, _ = self._parts
        if scheme == "hdfs":
            given = self.webhdfs or _WEBHDFS_OF.get(netloc) or os.environ.get("SESSIONS_WEBHDFS_ADDRESS") or ""
            _check_rpc(netloc, str(self))
            return _webhdfs(netloc, given, os.environ.get("HADOOP_USER_NAME") or getpass.getuser())
        return _s3()

    @property
    def key(self) -> str:
        """The path inside its filesystem (fsspec's form)."""
        scheme, netloc, path = self._parts
        return path if scheme == "hdfs" else f"{netloc}{path}"

    def __str__(self) -> str:
        scheme, netloc, path = self._parts
        return f"{'s3a' if scheme == 's3' else scheme}://{netloc}{path}"

    def __truediv__(self, name: str) -> RemotePath:
        return RemotePath(f"{str(self).rstrip('/')}/{name}", self.webhdfs)

    @property
    def name(self) -> str:
        return self._parts[2].rsplit("/", 1)[-1]

    @property
    def parent(self) -> RemotePath:
        scheme, netloc, path = self._parts
        return RemotePath(f"{scheme}://{netloc}{path.rsplit('/', 1)[0] or '/'}", self.webhdfs)

    def with_name(self, name: str) -> RemotePath:
        return self.parent / name

    def exists(self) -> bool:
        return bool(self.fs.exists(self.key))

    def read_text(self) -> str:
        try:
            return bytes(self.fs.cat_file(self.key)).decode()
        except FileNotFoundError:
            raise FileNotFoundError(str(self)) from None

    def write_text(self, text: str) -> None:
        """The whole file in one write (S3: one PUT, atomic; HDFS: one create, visible whole once closed)."""
        self.fs.pipe_file(self.key, text.encode())

    def iterdir(self) -> Iterator[RemotePath]:
        try:
            names = self.fs.ls(self.key, detail=False)
        except FileNotFoundError:
            return
        for name in names:
            yield self / str(name).rstrip("/").rsplit("/", 1)[-1]

    def unlink(self, *, missing_ok: bool = False) -> None:
        try:
            self.fs.rm_file(self.key)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def rename(self, target: RemotePath) -> RemotePath:
        """HDFS: one atomic rename on the NameNode (refused when `target` exists). S3: a copy of every object, then
        their deletion -- not atomic (see the module's docstring)."""
        if self._parts[0] == "hdfs":
            if not self.fs.rename_new(self.key, target.key):  # pipelines.webhdfs
                raise OSError(f"HDFS refused to rename {self} to {target} (the target exists or the source is gone)")
        else:
            self.fs.copy(self.key, target.key, recursive=True)
            self.fs.rm(self.key, recursive=True)
        return target

    def mtime(self) -> float:
        info: dict[str, Any] = self.fs.info(self.key)
        if "modificationTime" in info:  # WebHDFS: milliseconds
            return float(info["modificationTime"]) / 1000
        moment = info.get("mtime")
        return moment.timestamp() if isinstance(moment, dt.datetime) else float(moment or 0)

    def tree_size(self) -> tuple[int, int]:
        """(files, bytes) under this directory."""
        try:
            found = self.fs.find(self.key, detail=True)
        except FileNotFoundError:
            return 0, 0
        sizes = [int(info.get("size") or 0) for info in found.values() if info.get("type") == "file"]
        return len(sizes), sum(sizes)


CheckpointPath = Path | RemotePath


def checkpoint_path(uri: str, *, webhdfs: str = "") -> CheckpointPath:
    """A checkpoint URI (a local path, file://, hdfs://, s3a:// or s3://) as the path its readers take."""
    if is_remote(uri):
        if webhdfs:
            _WEBHDFS_OF[urlparse(uri).netloc] = webhdfs
        return RemotePath(uri.rstrip("/"), webhdfs)
    return Path(uri.removeprefix("file://"))


def move(source: CheckpointPath, target: CheckpointPath) -> None:
    """A checkpoint directory moved within its filesystem (a restore's set-aside and its undo)."""
    if isinstance(source, Path) and isinstance(target, Path):
        source.rename(target)
        return
    if isinstance(source, RemotePath) and isinstance(target, RemotePath):
        source.rename(target)
        return
    raise ValueError(f"cannot move {source} to {target}: another filesystem")


def set_aside(path: CheckpointPath, suffix: str) -> CheckpointPath | None:
    """A checkpoint directory moved beside itself as `<name><suffix><UTC time>` (a restore's replaced or half-built
    checkpoint, kept for an undo or a post-mortem); None when there is none."""
    if not path.exists():
        return None
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    target = path.with_name(path.name + suffix + stamp)
    move(path, target)
    return target


def remove_tree(path: CheckpointPath) -> None:
    """A directory and everything under it, gone (nothing when it is gone already)."""
    if isinstance(path, Path):
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.fs.rm(path.key, recursive=True)


# What an HDFS client's failure says when the filesystem, not the job, is at fault: no DataNode to write to, a block
# no live DataNode holds, a NameNode that does not answer or is still in safe mode.
_HDFS_OUTAGE = (("could only be written to 0 of the", "no DataNode to write to"),
                ("Could not obtain block", "a block no live DataNode holds"),
                ("BlockMissingException", "a block no live DataNode holds"),
                ("SafeModeException", "the NameNode is in safe mode"),
                ("failed on connection exception", "the NameNode does not answer"),
                ("Connection refused", "connection refused"))


def hdfs_outage(checkpoint: CheckpointPath, error: BaseException | str) -> str | None:
    """The one line of a failure an HDFS outage caused (the checkpoint on `hdfs://`), None for any other."""
    if not (isinstance(checkpoint, RemotePath) and str(checkpoint).startswith("hdfs://")):
        return None
    text = str(error)
    for marker, cause in _HDFS_OUTAGE:
        if marker in text:
            return (f"{hdfs_setting(str(checkpoint))}: HDFS at {urlparse(str(checkpoint)).netloc} failed for the "
                    f"checkpoint {checkpoint} ({cause}): bring the NameNode and DataNodes back, then run the command "
                    "again")
    return None
