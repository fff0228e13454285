"""Every HDFS configuration error is one line, exit 1, naming the setting and the address it tried -- never a traceback
(a wrong WebHDFS port was a 40-line one ending in requests' ConnectionError). The real `sessionctl` against the
suite's HDFS (tests/hdfs_cluster.py), with one thing wrong each time: the NameNode's RPC port, its HTTP (WebHDFS)
address, WebHDFS turned off, a directory the user may not write. Each is refused before a JVM starts: the RPC port is
checked before the first WebHDFS call (pipelines.locations), the others are WebHDFS's own answers (pipelines.webhdfs),
met by `status` reading the checkpoint or by `catch-up` taking its job lease beside it.
"""
from __future__ import annotations

import http.server
import os
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kit.homes import free_port, tool

pytestmark = pytest.mark.tier("subprocess")


def _sessionctl(tmp_path: Path, *argv: str, **settings: str) -> str:
    """`sessionctl argv` with these settings (the others unset); asserts exit 1 and one line, and returns that line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SESSIONS_", "HADOOP_USER_NAME"))}
    env.update({"SESSIONS_HOME": str(tmp_path / "home"), "SESSIONS_IDLE_CLOSE_MINUTES": "0", **settings})
    done = subprocess.run([tool("sessionctl"), *argv], env=env, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 1, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"sessionctl {argv[0]}: "), done.stderr[-3000:]
    return lines[0]


def _http(hdfs) -> str:
    return hdfs.webhdfs.removeprefix("http://")


def test_a_namenode_rpc_port_that_does_not_answer(hdfs, tmp_path):
    """The hdfs:// port is wrong (or the NameNode down) while its WebHDFS answers: said before Spark's Hadoop client
    would retry it for minutes."""
    checkpoint = f"hdfs://127.0.0.1:{free_port()}/jobs/rpc"
    line = _sessionctl(tmp_path, "status", "--json", SESSIONS_CHECKPOINT_URI=checkpoint,
                       SESSIONS_WEBHDFS_ADDRESS=_http(hdfs))
    port = checkpoint.split(":")[2].split("/")[0]
    assert f"SESSIONS_CHECKPOINT_URI={checkpoint}: the NameNode's RPC address 127.0.0.1:{port} does not answer " \
           "(connection refused)" in line, line


def test_a_webhdfs_address_that_does_not_answer(hdfs, tmp_path):
    """SESSIONS_WEBHDFS_ADDRESS on a port where nothing listens; and unset, where the NameNode's HTTP port is not the
    default 9870 (the suite's is ephemeral): `catch-up` says to set it, as it takes its job lease beside the checkpoint."""
    checkpoint = f"{hdfs.uri}/jobs/http"
    wrong = f"127.0.0.1:{free_port()}"
    line = _sessionctl(tmp_path, "status", "--json", SESSIONS_CHECKPOINT_URI=checkpoint, SESSIONS_WEBHDFS_ADDRESS=wrong)
    assert f"SESSIONS_WEBHDFS_ADDRESS={wrong} does not answer (connection refused): set SESSIONS_WEBHDFS_ADDRESS to " \
           "the NameNode's HTTP address" in line, line
    assert line.startswith(f"sessionctl status: SESSIONS_CHECKPOINT_URI={checkpoint}: "), line
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 9870)) == 0:
            pytest.skip("something listens on 127.0.0.1:9870 (WebHDFS's default port) here")
    line = _sessionctl(tmp_path, "catch-up", SESSIONS_CHECKPOINT_URI=checkpoint)
    assert "the NameNode's HTTP address 127.0.0.1:9870 (SESSIONS_WEBHDFS_ADDRESS unset: the hdfs:// host, port 9870) " \
           "does not answer (connection refused): set SESSIONS_WEBHDFS_ADDRESS" in line, line


class _NoWebHdfs(http.server.BaseHTTPRequestHandler):
    """A NameNode's HTTP server with dfs.webhdfs.enabled=false: its pages, but 404 on /webhdfs/v1."""

    def _not_found(self) -> None:
        body = b"<html><body><h2>HTTP ERROR 404 Not Found</h2></body></html>"
        self.send_response(404)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_DELETE = _not_found

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def no_webhdfs() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NoWebHdfs)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_webhdfs_turned_off(hdfs, no_webhdfs, tmp_path):
    """An HTTP server answers at the address, but not WebHDFS: WebHDFS off, or another service's port -- the
    NameNode's RPC port, whose Hadoop IPC server answers HTTP with a 404 page, is the same line."""
    checkpoint = f"{hdfs.uri}/jobs/off"
    for address in (no_webhdfs, hdfs.uri.removeprefix("hdfs://")):
        line = _sessionctl(tmp_path, "status", "--json", SESSIONS_CHECKPOINT_URI=checkpoint,
                           SESSIONS_WEBHDFS_ADDRESS=address)
        assert line.startswith(f"sessionctl status: SESSIONS_WEBHDFS_ADDRESS={address} answers HTTP 404 on "
                               f"/webhdfs/v1, not WebHDFS (for SESSIONS_CHECKPOINT_URI={checkpoint}): turn WebHDFS on "
                               "in the NameNode (dfs.webhdfs.enabled=true)"), line


def test_a_directory_the_user_may_not_write(hdfs, tmp_path):
    """The checkpoint under an HDFS directory of another user (mode 755): `catch-up` is refused where it first writes,
    its job lease beside the checkpoint, naming the user, the directory and the setting."""
    denied = f"/denied-{uuid.uuid4().hex[:8]}"
    webhdfs = hdfs.arrow_filesystem().handler.fs  # a superuser of the suite's HDFS (tests/hdfs_cluster.py)
    webhdfs.mkdir(denied)
    webhdfs.chmod(denied, "755")
    checkpoint = f"{hdfs.uri}{denied}/job"
    line = _sessionctl(tmp_path, "catch-up", SESSIONS_CHECKPOINT_URI=checkpoint, SESSIONS_WEBHDFS_ADDRESS=_http(hdfs),
                       HADOOP_USER_NAME="alice")
    assert line.startswith(f"sessionctl catch-up: SESSIONS_CHECKPOINT_URI={checkpoint}: HDFS refused the user alice "
                           f"(Permission denied: user=alice, access=WRITE, inode=\"{denied}\":sessions:supergroup:"
                           "drwxr-xr-x): give alice access there"), line
    assert webhdfs.ls(denied) == []  # nothing written
