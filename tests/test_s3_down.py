"""S3 down, on the real moto endpoint: every sessionctl command that touches the savepoint store answers with one
stderr line naming the endpoint and the cause -- no traceback -- whether the endpoint refuses connections (fast)
or stopped answering (after the configured timeouts)."""
from __future__ import annotations

import os
import signal
import subprocess

import pytest

from pipelines.ingest import ingest
from pipelines.sample_data import land_sample
from pipelines.stream import catch_up
from state_store.lifecycle import take_savepoint
from tests.conftest import config_env, free_port, make_config, tool

COMMANDS = (("savepoints", "--json"), ("restore", "--savepoint", "latest"), ("compact",), ("savepoint", "--json"))


@pytest.fixture(scope="module")
def job_with_a_savepoint(tmp_path_factory, spark, s3_endpoint):
    tmp = tmp_path_factory.mktemp("s3down")
    config = make_config(tmp, SESSIONS_SAVEPOINT_URI=f"s3://savepoints/{tmp.name}")
    land_sample(config.landing, users=30, sessions_per_user=2, files=1)
    ingest(config)
    catch_up(config, spark)
    take_savepoint(config, spark=spark)
    return config


def _one_line(env: dict, *args: str) -> str:
    done = subprocess.run([tool("sessionctl"), *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, (args, done.stdout, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, (args, done.stderr[-3000:])
    lines = [line for line in done.stderr.splitlines() if line.startswith("sessionctl ")]
    assert len(lines) == 1, (args, done.stderr[-3000:])
    return lines[0]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0])
def test_endpoint_refusing_connections(job_with_a_savepoint, s3_endpoint, args):
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    env = config_env(job_with_a_savepoint, **{**s3_endpoint["env"], "AWS_ENDPOINT_URL": endpoint})
    line = _one_line(env, *args)
    assert endpoint in line and ("unreachable" in line or "refused" in line), line


def test_endpoint_not_answering(job_with_a_savepoint, s3_endpoint):
    env = config_env(job_with_a_savepoint, **s3_endpoint["env"])
    os.kill(s3_endpoint["process"].pid, signal.SIGSTOP)
    try:
        for args in COMMANDS[:2]:
            line = _one_line(env, *args)
            assert s3_endpoint["env"]["AWS_ENDPOINT_URL"] in line, line
    finally:
        os.kill(s3_endpoint["process"].pid, signal.SIGCONT)
