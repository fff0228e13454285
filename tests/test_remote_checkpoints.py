"""The Spark checkpoint on S3 (Hadoop's S3A against the suite's S3 endpoint, moto on loopback) and on a real HDFS
(NameNode and DataNode on loopback, tests/hdfs_cluster.py), on both state store providers: catch-up, a savepoint,
more data, a restore to the savepoint and its replay end exactly once against the oracle (tests/oracle.py), with the
driver reading the checkpoint's logs without a JVM (pipelines.locations: WebHDFS, pyarrow's S3).

The S3 cases run `sessionctl` processes: the S3A jars join Spark's class path only in a JVM started for an s3a://
checkpoint (pipelines.job.runtime), so the process boundary is the point there."""
from __future__ import annotations

import json
import subprocess

import pytest

from pipelines.job.checkpoint import inspect_checkpoint
from pipelines.locations import RemotePath
from testkit.oracle import run_oracle
from tests.conftest import SESSIONCTL, assert_late_keys, config_env, make_config, read_sessions
from tests.datagen import land_batches, stream_scenario

pytestmark = pytest.mark.tier("subprocess")

GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000


def _sessionctl(config, *args: str, env: dict[str, str]) -> dict:
    done = subprocess.run([str(SESSIONCTL), *args, "--json"] if args[0] in ("savepoint", "restore") else
                          [str(SESSIONCTL), *args], env=config_env(config, **env), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _assert_exactly_once(config, batches) -> None:
    expected = run_oracle(batches, GAP_MS, LATENESS_MS)
    got = read_sessions(config)
    assert len({row[0] for row in got}) == len(got), "a session_id was written more than once"
    assert got == sorted(expected.closed)
    assert_late_keys(config, expected)


@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_checkpoint_on_s3_catch_up_savepoint_restore_exactly_once(s3_endpoint, tmp_path, provider):
    import boto3

    bucket = f"checkpoints-{provider}"
    boto3.client("s3", endpoint_url=s3_endpoint["env"]["AWS_ENDPOINT_URL"]).create_bucket(Bucket=bucket)
    env = {"SESSIONS_CHECKPOINT_URI": f"s3://{bucket}/job", **s3_endpoint["env"]}
    config = make_config(tmp_path, provider, **env)
    assert str(config.checkpoint) == f"s3a://{bucket}/job/sessions"  # s3:// is taken as Hadoop's s3a://
    assert config.lease_uri == f"s3://{bucket}/job/_leases"  # the leases beside it, with S3's conditional writes
    batches = stream_scenario(7, 6, False, GAP_MS, LATENESS_MS)

    land_batches(config, batches[:3])
    _sessionctl(config, "catch-up", env=env)
    saved = _sessionctl(config, "savepoint", env=env)
    land_batches(config, batches[3:], start=3)
    _sessionctl(config, "catch-up", env=env)
    _assert_exactly_once(config, batches)

    restored = _sessionctl(config, "restore", "--savepoint", saved["savepoint_id"], env=env)
    assert restored["verified"] and restored["rows"] == saved["rows"]
    assert restored["previous_checkpoint"].startswith(f"s3a://{bucket}/job/sessions.replaced-")
    _sessionctl(config, "catch-up", env=env)  # replays what came after the savepoint
    _assert_exactly_once(config, batches)
    info = inspect_checkpoint(config.checkpoint)  # the driver's read of the logs on S3, no JVM
    assert isinstance(config.checkpoint, RemotePath) and info.provider == provider
    assert info.last_committed_batch is not None and info.source_offset and info.source_offset["seq"] == len(batches)
