"""A real HDFS on loopback for tests: a NameNode and DataNodes (Hadoop's MiniDFSCluster) in one JVM,
jvm/hdfs/src/sessions/hdfs/LocalHdfs.java, driven over its stdin/stdout (one command a line, one answer a line).

``LocalHdfs(base_dir).start()`` waits until the NameNode is out of safe mode with every DataNode registered; then
``uri`` (``hdfs://127.0.0.1:<rpc>``) is for Spark and ``webhdfs`` (``http://127.0.0.1:<http>``) for Python without a
JVM (``arrow_filesystem()``). ``restart_namenode()``, ``stop_datanode(i)`` and ``restart_datanode(i)`` return once
the cluster is in that state. The JVM ends on ``stop()``, and by itself when this process dies (EOF on its stdin).

The ``hdfs`` fixture (session scope) is one such cluster for the whole test run (one per pytest-xdist worker). A test
that stops a DataNode restarts it before it ends: later tests share the cluster. Permissions are checked, but this
process's user and ``sessions`` are superusers and / is world-writable: only another user name (HADOOP_USER_NAME)
meets a directory it may not write (tests/test_hdfs_errors.py).
"""
from __future__ import annotations

import os
import queue
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HDFS_BUILD = REPO / "build" / "hdfs"  # make setup: the minicluster jar and local-hdfs.jar

# Hadoop client settings (Spark: `spark.hadoop.<key>`, or per read/write as DataFrame options) for a client that must
# live through a NameNode restart. A client keeps an idle RPC connection open for 10 s (ipc.client.connection.maxidletime):
# the first call on a connection opened before the restart fails with java.io.EOFException, and a non-HA client does
# not retry by default. With the retry policy on it retries that call on a new connection (after ~100 ms, up to 50
# times), and also waits out safe mode.
CLIENT_RETRY_CONF = {"dfs.client.retry.policy.enabled": "true", "dfs.client.retry.policy.spec": "100,50"}


class HdfsCommandError(RuntimeError):
    """The JVM answered ERROR to a command, died, or did not answer in time."""


def class_path() -> str:
    import pyspark

    if not (HDFS_BUILD / "local-hdfs.jar").exists():
        raise FileNotFoundError(f"{HDFS_BUILD / 'local-hdfs.jar'} not found: run `make setup`")
    # pyspark's jars hold the Hadoop client (hadoop-client-api/runtime 3.5.0) the minicluster jar builds on.
    return f"{HDFS_BUILD}/*{os.pathsep}{Path(pyspark.__file__).parent / 'jars'}/*"


class LocalHdfs:
    def __init__(self, base_dir: Path | str, *, port: int = 0, http_port: int = 0, datanodes: int = 1,
                 heap: str = "384m") -> None:
        self.base_dir = Path(base_dir)
        self.args = ["--dir", str(self.base_dir / "data"), "--port", str(port), "--http-port", str(http_port),
                     "--datanodes", str(datanodes)]
        self.heap = heap
        self.process: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.port = self.http_port = 0

    @property
    def uri(self) -> str:
        """The NameNode's RPC address for Hadoop clients (Spark): hdfs://127.0.0.1:<port>."""
        return f"hdfs://127.0.0.1:{self.port}"

    @property
    def webhdfs(self) -> str:
        """The NameNode's HTTP address (WebHDFS at /webhdfs/v1): http://127.0.0.1:<port>."""
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def log(self) -> Path:
        return self.base_dir / "hdfs.log"

    def start(self, timeout: float = 180) -> LocalHdfs:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else "java"
        (self.base_dir / "tmp").mkdir(exist_ok=True)  # Jetty's scratch dirs
        # C1 only and a small heap: a test cluster lives minutes and the machine's 2 cores are shared with Spark.
        command = [java, f"-Xmx{self.heap}", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                   f"-Djava.io.tmpdir={self.base_dir / 'tmp'}", "-Dorg.apache.logging.log4j.level=WARN",
                   "-cp", class_path(), "sessions.hdfs.LocalHdfs", *self.args]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                            text=True, bufsize=1)
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()
        ready = self._answer(timeout, "start")
        if not ready.startswith("READY "):
            self.stop()
            raise HdfsCommandError(f"local HDFS did not start: {ready!r} (log: {self.log})")
        rpc, http = ready.split()[1:]
        self.port, self.http_port = int(rpc.rsplit(":", 1)[1]), int(http.rsplit(":", 1)[1])
        return self

    def _read(self, stdout) -> None:
        for line in stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)  # EOF: the JVM is gone

    def _answer(self, timeout: float, what: str) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise HdfsCommandError(f"local HDFS: no answer to {what} in {timeout:.0f} s (log: {self.log})") from None
        if line is None:
            raise HdfsCommandError(f"local HDFS exited ({what}): see {self.log}")
        return line

    def command(self, line: str, timeout: float = 180) -> str:
        """Sends one command line and returns its OK answer; raises HdfsCommandError on ERROR."""
        assert self.process is not None and self.process.stdin is not None, "not started"
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer = self._answer(timeout, line)
        if not answer.startswith("OK "):
            raise HdfsCommandError(f"local HDFS: {line}: {answer}")
        return answer

    def restart_namenode(self) -> None:
        """Restarts the NameNode on the same ports; returns when it is out of safe mode with the DataNodes back."""
        self.command("restart-namenode")

    def stop_datanode(self, i: int = 0) -> None:
        """Stops DataNode i (0-based) and has the NameNode count it dead at once."""
        self.command(f"stop-datanode {i}")

    def restart_datanode(self, i: int = 0) -> None:
        """(Re)starts DataNode i with its storage and port; returns when the NameNode reports it live."""
        self.command(f"restart-datanode {i}")

    def stop(self, timeout: float = 60) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        try:
            process.stdin.close()  # EOF: the JVM shuts the cluster down and exits
            process.wait(timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()

    def __enter__(self) -> LocalHdfs:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def arrow_filesystem(self, user: str = "sessions"):
        """A pyarrow filesystem on this HDFS over WebHDFS (no JVM): fsspec's webhdfs client in pyarrow's
        PyFileSystem. Paths are absolute HDFS paths ("/dir/file")."""
        import fsspec
        import pyarrow.fs

        fs = fsspec.filesystem("webhdfs", host="127.0.0.1", port=self.http_port, user=user, skip_instance_cache=True)
        return pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs))


@pytest.fixture(scope="session")
def hdfs(tmp_path_factory) -> Iterator[LocalHdfs]:
    """One local HDFS (NameNode + 1 DataNode, its own temp dir, free ports) for the whole test run."""
    cluster = LocalHdfs(tmp_path_factory.mktemp("hdfs")).start()
    try:
        yield cluster
    finally:
        cluster.stop()
