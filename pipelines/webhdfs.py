"""The Python side's one way to HDFS: fsspec's WebHDFS client (the NameNode's REST API over HTTP), with its failures
typed -- each one line naming the setting and the address it tried -- and the two atomic operations the lease store
builds on (pipelines.coordination.lease_stores): a whole file written under a new name, and a rename that never
overwrites (the NameNode refuses it when the target exists).

Why WebHDFS, not pyarrow's HadoopFileSystem: that one loads libhdfs.so and starts a JVM on a Hadoop install's class
path -- neither of which the pyspark wheel ships -- in every process that touches a checkpoint, the light commands
(`status`, `savepoints`) too. WebHDFS is HTTP: no JVM, no native library.

What a failure becomes (pipelines.locations.RemotePath makes this client, once per NameNode and user):
- nothing answers at the NameNode's HTTP address: StorageUnavailable naming SESSIONS_WEBHDFS_ADDRESS (the default is
  the hdfs:// host's port 9870, which a NameNode configured otherwise does not listen on);
- an HTTP server answers there, but not WebHDFS (dfs.webhdfs.enabled=false, or another service's port): ConfigError;
- HDFS refuses the user (AccessControlException): StorageAccessDenied, naming the user, the path and the setting;
- a DataNode that does not answer, a NameNode in safe mode or standby: StorageUnavailable.
A NameNode whose RPC address (the hdfs:// host and port, Spark's) refuses connections is pipelines.locations' check.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlparse

import requests
from fsspec.implementations.webhdfs import WebHDFS

from pipelines.errors import ConfigError, StorageAccessDenied, StorageUnavailable

__all__ = ["WEBHDFS_PORT", "NameNode", "WebHdfs"]

WEBHDFS_PORT = 9870  # the NameNode's HTTP port by default (Hadoop 3: dfs.namenode.http-address)


@dataclass(frozen=True)
class NameNode:
    """An HDFS NameNode as this process reaches it: `rpc`, the host:port of hdfs:// (Spark's Hadoop client's); `http`,
    the host:port of its HTTP server (WebHDFS); `http_given`: SESSIONS_WEBHDFS_ADDRESS named it (else the default)."""
    rpc: str
    http: str
    http_given: bool = False

# Seconds to connect and to wait for an answer: requests waits forever by default, and a NameNode host that drops
# packets would hang a light command.
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 120.0

# RemoteExceptions (the NameNode's answer in JSON) by what they mean here.
_DENIED = ("AccessControlException", "SecurityException", "AuthorizationException")
_UNAVAILABLE = {"SafeModeException": "the NameNode is in safe mode", "StandbyException": "the NameNode is a standby",
                "RetriableException": "the NameNode asked to retry later"}


class _Session(requests.Session):
    """A session whose requests time out (fsspec's own file writes call the session directly, without a timeout)."""

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        kwargs.setdefault("timeout", (CONNECT_TIMEOUT_S, READ_TIMEOUT_S))
        return super().request(method, url, *args, **kwargs)


def _cause(error: requests.RequestException) -> str:
    text = str(error)
    if isinstance(error, requests.Timeout):
        return "timed out"
    for marker, cause in (("Connection refused", "connection refused"),
                          ("Name or service not known", "host not found"),
                          ("Temporary failure in name resolution", "host not found"),
                          ("No route to host", "no route to host"),
                          ("Connection reset", "connection reset")):
        if marker in text:
            return cause
    return f"{type(error).__name__}: {' '.join(text.split())[:160]}"


class WebHdfs(WebHDFS):
    """fsspec's WebHDFS client for one NameNode (`namenode`: its RPC and HTTP addresses) as `user`, whose failures are
    the typed one-line errors above. `where` names an hdfs:// URI in them (pipelines.locations.hdfs_setting: the
    setting the location came from)."""

    session: requests.Session

    def __init__(self, namenode: NameNode, *, user: str, where: Callable[[str], str] = str) -> None:
        host, _, port = namenode.http.rpartition(":")
        self.namenode = namenode
        self._name = where
        super().__init__(host, port=int(port), user=user, skip_instance_cache=True)

    def _connect(self) -> None:
        super()._connect()
        timed = _Session()
        timed.cert, timed.verify, timed.auth = self.session.cert, self.session.verify, self.session.auth
        self.session = timed

    # ---- what a failure means -------------------------------------------------------------------------------------

    def _where(self, path: str) -> str:
        return self._name(f"hdfs://{self.namenode.rpc}{path}")

    def _http_address(self) -> str:
        if self.namenode.http_given:
            return f"SESSIONS_WEBHDFS_ADDRESS={self.namenode.http}"
        return (f"the NameNode's HTTP address {self.namenode.http} (SESSIONS_WEBHDFS_ADDRESS unset: the hdfs:// host, "
                f"port {WEBHDFS_PORT})")

    def _unreachable(self, error: requests.RequestException, path: str) -> StorageUnavailable:
        url = getattr(error.request, "url", None) or ""
        answered_by = urlparse(str(url)).netloc
        if answered_by and answered_by != self.namenode.http:  # a redirect to a DataNode
            return StorageUnavailable(f"{self._where(path)}: the HDFS DataNode at {answered_by} (WebHDFS) does not "
                                      f"answer ({_cause(error)}): bring it back, or check that this host reaches the "
                                      "DataNodes' HTTP addresses")
        return StorageUnavailable(f"{self._where(path)}: {self._http_address()} does not answer ({_cause(error)}): "
                                  "set SESSIONS_WEBHDFS_ADDRESS to the NameNode's HTTP address (host:port, its "
                                  "dfs.namenode.http-address) and check that the NameNode runs")

    def _refused(self, answer: requests.Response, path: str) -> Exception:
        """The error an answer of status >= 400 stands for."""
        try:
            remote = answer.json()["RemoteException"]
            # A DataNode passes on the NameNode's exception with its Java stack after the first line.
            lines = str(remote["message"]).strip().splitlines() or [""]
            exception, message = str(remote["exception"]), " ".join(lines[0].split())
        except (ValueError, KeyError, TypeError):  # no WebHDFS answer
            answered_by, status = urlparse(answer.url).netloc, answer.status_code
            if status in (401, 403):
                return StorageAccessDenied(f"{self._where(path)}: WebHDFS at {answered_by} refused {self.user} (HTTP "
                                           f"{status} {answer.reason}): a secured HDFS (Kerberos) is not supported")
            if answered_by == self.namenode.http and (status < 500 or status == 501):
                return ConfigError(f"{self._http_address()} answers HTTP {status} on /webhdfs/v1, not "
                                   f"WebHDFS (for {self._where(path)}): turn WebHDFS on in the NameNode "
                                   "(dfs.webhdfs.enabled=true), or set SESSIONS_WEBHDFS_ADDRESS to the NameNode's HTTP "
                                   "address (host:port, its dfs.namenode.http-address)")
            return StorageUnavailable(f"{self._where(path)}: WebHDFS at {answered_by} answered HTTP {status} "
                                      f"{answer.reason} for {path}")
        if exception == "FileNotFoundException":
            return FileNotFoundError(message)
        if exception == "FileAlreadyExistsException":
            return FileExistsError(message)
        if exception in _DENIED:
            return StorageAccessDenied(f"{self._where(path)}: HDFS refused the user {self.user} ({message[:300]}): "
                                       f"give {self.user} access there, or run as a user who has it (HADOOP_USER_NAME)")
        if exception in _UNAVAILABLE:
            return StorageUnavailable(f"{self._where(path)}: {_UNAVAILABLE[exception]} ({message[:200]}): run the "
                                      "command again once it is active and out of safe mode")
        if exception in ("IllegalArgumentException", "UnsupportedOperationException"):
            return ValueError(message)
        return RuntimeError(f"{exception}: {message}")  # as fsspec's own client raises what it does not know

    # ---- calls ------------------------------------------------------------------------------------------------------

    def _call(self, op: str, method: str = "get", path: str | None = None, data: Any = None, redirect: bool = True,
              **kwargs: Any) -> requests.Response:
        """fsspec's one call to the NameNode (and, through its redirect, a DataNode), typed."""
        path = self._strip_protocol(path) if path is not None else ""
        url = self._apply_proxy(self.url + quote(path, safe="/="))
        params = {**kwargs, **self.pars, "op": op.upper()}
        try:
            answer = self.session.request(method.upper(), url, params=params, data=data, allow_redirects=redirect)
        except requests.RequestException as error:
            raise self._unreachable(error, path) from None
        if answer.status_code >= 400:
            raise self._refused(answer, path)
        return answer

    def exists(self, path: str, **kwargs: Any) -> bool:
        """fsspec's answers False for any failure: an HDFS that does not answer is not a missing file."""
        try:
            self.info(path)
        except FileNotFoundError:
            return False
        return True

    def read_bytes(self, path: str) -> bytes:
        """A whole file in one call (the NameNode redirects to a DataNode)."""
        return bytes(self._call("OPEN", path=path).content)

    def write_new(self, path: str, data: bytes) -> None:
        """Write `path` whole (FileExistsError when it exists). It is visible while the DataNode writes it: write under
        a name nobody reads, then `rename_new` it into place."""
        first = self._call("CREATE", "put", path, redirect=False, overwrite="false")
        location = first.headers.get("Location")
        if not location:
            raise StorageUnavailable(f"{self._where(path)}: WebHDFS at {self.namenode.http} named no DataNode to "
                                     f"write {path} to")
        try:
            answer = self.session.put(self._apply_proxy(location), data=data,
                                      headers={"content-type": "application/octet-stream"})
        except requests.RequestException as error:
            raise self._unreachable(error, path) from None
        if answer.status_code >= 400:
            raise self._refused(answer, path)

    def rename_new(self, source: str, target: str) -> bool:
        """Rename `source` to `target` unless `target` exists (False then): one atomic step on the NameNode."""
        return bool(self._call("RENAME", "put", source, destination=target).json().get("boolean"))

    def remove(self, path: str) -> None:
        """Delete a file (nothing when it is gone)."""
        self._call("DELETE", "delete", path, recursive="false")
