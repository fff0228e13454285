"""Cluster mode on a real Spark standalone cluster (a master and two workers on loopback, separate JVMs), with
landing, tables and savepoints on the real S3 endpoint (moto server): one driver runs catch-up -> savepoint ->
more -> restore -> rescale -> catch-up (tests/cluster_driver.py, the library), then `sessionctl run` and `sessionctl
compact` with SESSIONS_SPARK_MASTER set, and the sessions equal the oracle, each exactly once. The checkpoint is on the
real HDFS (tests/hdfs_cluster.py): the executors write the state store's files through Hadoop's HDFS client."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from pipelines.storage import open_table
from testkit.lifecycle_expectations import expected_closed_sessions
from tests.kit.datagen import in_order_chunks
from tests.kit.homes import config_env, make_config, tool
from tests.kit.savepoint_expectations import oracle_of, state_sessions
from tests.kit.tables import read_sessions
from tests.kit.waits import still_running, wait_until

pytestmark = [pytest.mark.tier("e2e"), pytest.mark.timeout(1800)]

GAP_MIN, LATENESS_MIN = 30, 10


def _sessionctl(env: dict, *args: str) -> dict:
    done = subprocess.run([tool("sessionctl"), *args], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _library_on_the_cluster(tmp_path: Path, config, env: dict, chunks: list[list[dict]]) -> None:
    """catch-up -> savepoint -> more -> restore -> rescale -> catch-up: the library in one driver on the cluster
    (tests/cluster_driver.py, parts 0-3), checked against the oracle."""
    spec = tmp_path / "driver.json"
    spec.write_text(json.dumps({"bucket": "warehouse", "prefix": tmp_path.name,
                                "parts": [[json.dumps(e) for e in chunk] for chunk in chunks[:4]]}))
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("cluster_driver.py")), str(spec)], env=env,
                          capture_output=True, text=True, timeout=900, cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = json.loads(done.stdout.strip().splitlines()[-1])
    print("driver seconds by step:", steps["seconds"])  # (shown with -rP: where a slow run spent its time)
    assert steps["savepoint"]["uri"].startswith("s3://savepoints/")
    # The savepoint's rows re-read from S3 and what the restore of it rolled back, against the oracle: the open
    # sessions after parts 0-1, and the sessions part 2's batch closed.
    gap_ms, lateness_ms = GAP_MIN * 60_000, LATENESS_MIN * 60_000
    at_savepoint = oracle_of([chunks[0] + chunks[1]], gap_ms, lateness_ms)
    saved_rows = open_table(config, steps["savepoint"]["uri"]).to_pyarrow_table()
    assert state_sessions(saved_rows) == sorted(at_savepoint.open_sessions)
    assert (steps["restore"]["savepoint_id"], steps["restore"]["rows"]) == \
        (steps["savepoint"]["savepoint_id"], saved_rows.num_rows)
    assert steps["restore"]["rolled_back"]["sessions"] == \
        len(oracle_of([chunks[0] + chunks[1], chunks[2]], gap_ms, lateness_ms).closed) - len(at_savepoint.closed) > 0
    assert steps["rescale"]["partitions_after"] == 3


def test_lifecycle_on_a_standalone_cluster(tmp_path, spark_cluster, s3_endpoint, hdfs):
    prefix = f"s3://warehouse/{tmp_path.name}"
    checkpoint = {"SESSIONS_CHECKPOINT_URI": f"{hdfs.uri}/cluster/{tmp_path.name}",
                  "SESSIONS_WEBHDFS_ADDRESS": hdfs.webhdfs.removeprefix("http://"),
                  "SESSIONS_LEASE_URI": str(tmp_path / "leases")}
    config = make_config(tmp_path, "rocksdb", SESSIONS_SPARK_MASTER=spark_cluster["master"],
                         SESSIONS_SAVEPOINT_URI=f"s3://savepoints/{tmp_path.name}", SESSIONS_STATE_PARTITIONS=2,
                         SESSIONS_WAREHOUSE_URI=f"{prefix}/tables", SESSIONS_LANDING_URI=f"{prefix}/landing",
                         SESSIONS_MAX_VERSIONS_PER_BATCH=None, **checkpoint)
    s3 = boto3.client("s3", endpoint_url=s3_endpoint["env"]["AWS_ENDPOINT_URL"])
    env = config_env(config, SESSIONS_SPARK_MASTER=spark_cluster["master"], **s3_endpoint["env"], **checkpoint)
    chunks = in_order_chunks(120, seed=21, parts=5)

    def land_part(i: int, pad: int = 0) -> None:  # an S3 put is atomic: the object appears complete (the rename-in)
        body = "".join(json.dumps({**e, "props": "x" * pad} if pad else e) + "\n" for e in chunks[i]).encode()
        s3.put_object(Bucket="warehouse", Key=f"{tmp_path.name}/landing/part-{i:04d}.jsonl", Body=body)

    _library_on_the_cluster(tmp_path, config, env, chunks)
    # `run` on the cluster: picks up part 4 as it lands, stops cleanly on Ctrl-C; then compaction.
    expected = sorted(expected_closed_sessions([chunks[0] + chunks[1], chunks[2], chunks[3], chunks[4]],
                                               GAP_MIN * 60_000, LATENESS_MIN * 60_000))
    # Part 4 lands padded past SESSIONS_INGEST_TASK_MIB=1 (an extra field, ignored by the line rules): the executors
    # read it from S3 and write its raw_events files (pipelines.job.ingest_tasks), the run's process commits them.
    run = subprocess.Popen([tool("sessionctl"), "run", "--poll-seconds", "1"], env={**env, "SESSIONS_INGEST_TASK_MIB": "1"},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        land_part(4, pad=-(-(1 << 20) // len(chunks[4])) + 100)
        wait_until(lambda: still_running(run) and read_sessions(config) == expected, timeout_s=240, interval_s=0.5,
                   what="run to process part 4")  # (a read of the sessions table on S3: milliseconds)
    finally:
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=180)
    assert run.returncode == 0, err[-2000:]
    assert json.loads(out.strip().splitlines()[-1])["files_read_by_tasks"] == 1
    assert _sessionctl(env, "compact")["dry_run"] is False

    listed = [o for o in s3.list_objects_v2(Bucket="warehouse", Prefix=f"{tmp_path.name}/landing/")["Contents"]
              if not o["Key"].endswith("/")]  # pyarrow's directory markers
    assert sorted(o["Key"].rsplit("/", 1)[1] for o in listed) == [f"part-{i:04d}.jsonl" for i in range(len(chunks))]
    assert all("/_ingested/" in o["Key"] for o in listed), "every landed object was archived"
    got = read_sessions(config)
    assert len({row[0] for row in got}) == len(got), "a session was written twice"
    assert got == expected
    # Both workers ran executors of these applications, each with the shipped code zip.
    for worker in ("worker-1", "worker-2"):
        shipped = list(Path(spark_cluster["dir"], worker).glob("app-*/*/sessions-code-*.zip"))
        assert shipped, f"{worker} ran no executor with the shipped code"


def test_the_library_on_a_standalone_cluster_with_the_checkpoint_on_s3(tmp_path, spark_cluster, s3_endpoint):
    """The same driver sequence with the Spark checkpoint on S3 (Hadoop's S3A in the executors, which write the state
    store's files, and in the driver; the leases beside it on S3), the HDFS-backed provider: savepoint, restore and
    a rescale by savepoint+restore against the oracle, then every part's sessions exactly once."""
    prefix = f"s3://warehouse/{tmp_path.name}"
    checkpoint = {"SESSIONS_CHECKPOINT_URI": f"s3a://warehouse/{tmp_path.name}/checkpoint"}
    config = make_config(tmp_path, "hdfs", SESSIONS_SPARK_MASTER=spark_cluster["master"],
                         SESSIONS_SAVEPOINT_URI=f"s3://savepoints/{tmp_path.name}", SESSIONS_STATE_PARTITIONS=2,
                         SESSIONS_WAREHOUSE_URI=f"{prefix}/tables", SESSIONS_LANDING_URI=f"{prefix}/landing",
                         SESSIONS_MAX_VERSIONS_PER_BATCH=None, **checkpoint)
    assert config.lease_uri == f"s3://warehouse/{tmp_path.name}/checkpoint/_leases"
    env = config_env(config, SESSIONS_SPARK_MASTER=spark_cluster["master"], **s3_endpoint["env"], **checkpoint)
    chunks = in_order_chunks(120, seed=21, parts=4)
    _library_on_the_cluster(tmp_path, config, env, chunks)
    got = read_sessions(config)
    assert len({row[0] for row in got}) == len(got), "a session was written twice"
    assert got == sorted(expected_closed_sessions([chunks[0] + chunks[1], chunks[2], chunks[3]],
                                                  GAP_MIN * 60_000, LATENESS_MIN * 60_000))
    state = [key for key in boto3.client("s3", endpoint_url=s3_endpoint["env"]["AWS_ENDPOINT_URL"]).list_objects_v2(
        Bucket="warehouse", Prefix=f"{tmp_path.name}/checkpoint/sessions/state/")["Contents"]]
    assert state, "the executors wrote the state store's files to S3"
