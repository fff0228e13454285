"""Shared test helpers: wait on observable state instead of sleeping and hoping.

``wait_until(condition, *, timeout_s, what, interval_s=0.05) -> T``
    Polls ``condition()`` until it returns a truthy value and returns that value; after ``timeout_s`` seconds an
    AssertionError names ``what`` and the last value seen. Exceptions raised by ``condition`` propagate (a condition
    that may fail while the state is being built catches what it expects itself).
``still_running(process, log=None) -> bool``
    True while ``process`` runs, else an AssertionError with its exit code and the tail of ``log`` (a path) or of
    its stderr pipe: put it first in a condition (``lambda: still_running(run) and ...``) so that a process that
    died fails the wait at once instead of after the timeout.
``stream_caught_up(config) -> bool``
    The job's last committed batch read up to the newest ingest commit of raw_events (and settled): what a stream
    has to show before a test lands more, compacts beside it, or stops it.
``iso_ms(text) -> int``
    An ISO-8601 timestamp (``...Z`` or with an offset) as epoch milliseconds.
"""
from __future__ import annotations

import datetime as dt
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")

__all__ = ["STORAGES", "checkpoint_env", "iso_ms", "s3a_session", "still_running", "stream_caught_up", "wait_until"]


def wait_until(condition: Callable[[], T], *, timeout_s: float, what: str, interval_s: float = 0.05) -> T:
    """Poll `condition` until it returns a truthy value (returned); AssertionError naming `what` after `timeout_s`."""
    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {time.monotonic() - started:.1f} s waiting for {what}; "
                                 f"last value: {value!r}")
        time.sleep(interval_s)


def still_running(process: subprocess.Popen, log: Path | str | None = None) -> bool:
    """True while `process` runs; an AssertionError with its exit code and output tail once it exited."""
    code = process.poll()
    if code is None:
        return True
    if log is not None:
        tail = Path(log).read_text(errors="replace")[-3000:] if Path(log).exists() else ""
    elif process.stderr is not None and not process.stderr.closed:
        tail = process.stderr.read()
        tail = (tail.decode(errors="replace") if isinstance(tail, bytes) else tail)[-3000:]
    else:
        tail = ""
    raise AssertionError(f"process {process.pid} ({process.args!r:.200}) exited with {code} while waited on:\n{tail}")


def stream_caught_up(config) -> bool:
    """The last committed batch's source offset is the newest ingest_seq of raw_events, settled."""
    from pipelines.ingest import latest_ingest_seq
    from pipelines.job.checkpoint import inspect_checkpoint

    offset = inspect_checkpoint(config.checkpoint).source_offset or {}
    return offset.get("seq") == latest_ingest_seq(config.raw_events_table) and bool(offset.get("settled"))


def iso_ms(text: str) -> int:
    """'2026-10-05T12:00:00.123Z' (or '+00:00', any offset) -> epoch milliseconds."""
    return int(dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def s3a_session(spark, s3_endpoint) -> None:
    """The suite's shared session (its JVM started before the S3 endpoint) pointed at it: what spark_conf sets from
    the AWS_* variables for a JVM started with them (pipelines.job.runtime.s3a_conf), plus the credentials S3A
    would read from that JVM's environment."""
    import pytest

    from pipelines.job.runtime import s3a_conf

    hadoop = spark.sparkContext._jsc.hadoopConfiguration()  # noqa: SLF001
    env = s3_endpoint["env"]
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        conf = s3a_conf()
    for key, value in {**conf, "spark.hadoop.fs.s3a.access.key": env["AWS_ACCESS_KEY_ID"],
                       "spark.hadoop.fs.s3a.secret.key": env["AWS_SECRET_ACCESS_KEY"]}.items():
        hadoop.set(key.removeprefix("spark.hadoop."), value)


# Where the Spark checkpoint lives: a local path; the real HDFS (tests/hdfs_cluster.py: the state store's files and
# logs written through Hadoop's HDFS client, the driver's reads through WebHDFS); S3 (Hadoop's S3A against the
# suite's S3 endpoint, the driver's reads through pyarrow).
STORAGES = ["local", pytest.param("hdfs", marks=pytest.mark.tier("e2e")), pytest.param("s3", marks=pytest.mark.tier("e2e"))]


def checkpoint_env(request, spark, storage: str, tmp_path) -> dict[str, str]:
    """The settings that put the checkpoint on `storage` (none for a local path). A remote checkpoint's state store
    providers are unloaded from the shared session when the test ends: left loaded, their maintenance thread goes on
    uploading to HDFS or S3 after the test, and one caught in a later test's injected outage (a SIGSTOPped endpoint)
    held a restore's unload of the state stores (Spark waits up to its maintenance shutdown timeout, 300 s)."""
    if storage != "local":
        from pipelines.job.runtime import stop_state_stores

        request.addfinalizer(lambda: stop_state_stores(spark))
    if storage == "hdfs":  # the leases beside the checkpoint, on HDFS (no SESSIONS_LEASE_URI)
        hdfs = request.getfixturevalue("hdfs")
        return {"SESSIONS_CHECKPOINT_URI": f"{hdfs.uri}/oracle/{tmp_path.name}",
                "SESSIONS_WEBHDFS_ADDRESS": hdfs.webhdfs.removeprefix("http://")}
    if storage == "s3":
        import boto3

        s3_endpoint = request.getfixturevalue("s3_endpoint")
        s3a_session(spark, s3_endpoint)
        client = boto3.client("s3", endpoint_url=s3_endpoint["env"]["AWS_ENDPOINT_URL"])
        if "oracle" not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
            client.create_bucket(Bucket="oracle")
        return {"SESSIONS_CHECKPOINT_URI": f"s3a://oracle/{tmp_path.name}"}  # the endpoint: the fixture's AWS_* variables
    return {}
