"""S3 down, on the real moto endpoint: every sessionctl command that touches the savepoint store answers with one
stderr line naming the endpoint and the cause -- no traceback -- whether the endpoint refuses connections (fast)
or stopped answering (after the configured timeouts). `sessionctl run` is different: it rides an outage of its
landing and its warehouse out -- one line per failure, backoff, the query restarted from its checkpoint -- and every
session and rejected line is written exactly once."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import suppress
from pathlib import Path

import boto3
import pytest

from pipelines.core.sample_data import arrival_order, generate_events, land, land_sample
from pipelines.ingest import ingest
from pipelines.job.stream import catch_up
from pipelines.storage import open_table
from state_store.lifecycle import take_savepoint
from testkit.lifecycle_expectations import expected_closed_sessions
from tests.kit.homes import REPO, config_env, free_port, make_config, tool
from tests.kit.tables import read_sessions
from tests.kit.waits import still_running, wait_until

pytestmark = pytest.mark.tier("e2e")

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


# --- `sessionctl run` rides out an S3 outage of its landing and its warehouse ------------------------------------

RIDES_OUT = "run retries by itself"                          # an ingest that failed (landing or raw_events)
RESTARTS = "run restarts the stream from its checkpoint"     # a query that the warehouse failed


def _s3_job(tmp_path, s3_endpoint, landing_on_s3: bool = True):
    prefix = f"run-{tmp_path.name}"
    config = make_config(tmp_path, SESSIONS_WAREHOUSE_URI=f"s3://warehouse/{prefix}/tables",
                         SESSIONS_LANDING_URI=f"s3://warehouse/{prefix}/landing" if landing_on_s3 else None,
                         SESSIONS_S3_TIMEOUT="5s", SESSIONS_S3_RETRY_TIMEOUT="5s", SESSIONS_S3_MAX_RETRIES="1")
    return config, prefix, config_env(config, **s3_endpoint["env"])


def _events(seed: int, parts: int) -> list[list[dict]]:
    """Events with no late one however they are split (2 minutes of disorder, 10 of lateness), in `parts` parts."""
    events = arrival_order(generate_events(50, 3, seed=seed), seed=seed, jitter_seconds=120)
    size = -(-len(events) // parts)
    return [events[i * size:(i + 1) * size] for i in range(parts)]


BAD_LINES = ["not json", '{"event_id": "no-user", "event_time": "2026-11-01T09:00:00Z"}']


def _put(s3_endpoint, key: str, lines: list[str]) -> None:
    client = boto3.client("s3", endpoint_url=s3_endpoint["env"]["AWS_ENDPOINT_URL"])
    client.put_object(Bucket="warehouse", Key=key, Body="".join(line + "\n" for line in lines).encode())


def _wait_until(predicate, seconds: float, what: str, run: subprocess.Popen, err: Path) -> None:
    def holds() -> bool:
        still_running(run, err)
        with suppress(Exception):  # a table not there yet
            return bool(predicate())
        return False

    try:
        wait_until(holds, timeout_s=seconds, interval_s=1, what=what)
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}; run's stderr: {err.read_text()[-3000:]}") from None


def _quarantined(config) -> list[tuple]:
    table = open_table(config, config.quarantine_table).to_pyarrow_table()
    return sorted(zip(table["reason"].to_pylist(), table["source_file"].to_pylist(), table["line_no"].to_pylist()))


def _stop(run: subprocess.Popen) -> None:
    if run.poll() is None:
        run.send_signal(signal.SIGINT)
    run.wait(timeout=300)


def _assert_rode_out(run: subprocess.Popen, out: Path, err: Path, endpoint: str) -> dict:
    """Exit 0, the summary, and a stderr of one-line retries: no traceback."""
    stderr = err.read_text()
    assert run.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-5000:]
    retries = [line for line in stderr.splitlines() if RIDES_OUT in line or RESTARTS in line]
    assert retries, stderr[-3000:]
    for line in retries:  # each failure its one line: what failed, where, why, and what run does about it
        assert line.startswith(f"sessionctl run: S3 at {endpoint} failed for s3://warehouse/"), line
    return json.loads(out.read_text().strip().splitlines()[-1])


def test_run_rides_out_an_s3_outage_of_landing_and_warehouse(tmp_path, s3_endpoint):
    """S3 stops answering (SIGSTOP) while `sessionctl run` works with landing and tables there, and answers again
    (SIGCONT) with its data: the run retries ingest with backoff, restarts the failed query from its checkpoint,
    goes on with what lands after, and stops cleanly; every session and every rejected line exactly once."""
    config, prefix, env = _s3_job(tmp_path, s3_endpoint)
    parts = _events(seed=41, parts=3)
    expected = expected_closed_sessions(parts, 30 * 60_000, 10 * 60_000)
    _put(s3_endpoint, f"{prefix}/landing/part-0.jsonl", [json.dumps(e) for e in parts[0]])
    out, err = tmp_path / "run.out", tmp_path / "run.err"
    endpoint, moto = s3_endpoint["env"]["AWS_ENDPOINT_URL"], s3_endpoint["process"].pid
    with out.open("w") as out_file, err.open("w") as err_file:
        run = subprocess.Popen([tool("sessionctl"), "run", "--poll-seconds", "1"], env=env, stdout=out_file,
                               stderr=err_file, cwd=tmp_path)
    try:
        _wait_until(lambda: len(read_sessions(config)) > 0, 240, "the first part's sessions", run, err)
        _put(s3_endpoint, f"{prefix}/landing/part-1.jsonl", [json.dumps(e) for e in parts[1]] + BAD_LINES)
        _wait_until(lambda: len(_quarantined(config)) == len(BAD_LINES), 120, "the second part", run, err)
        os.kill(moto, signal.SIGSTOP)  # S3 stops answering: landing and warehouse alike
        try:
            _wait_until(lambda: RIDES_OUT in err.read_text() and RESTARTS in err.read_text(), 300,
                        "a failed ingest and a failed query", run, err)
        finally:
            os.kill(moto, signal.SIGCONT)  # and answers again, with its data
        _put(s3_endpoint, f"{prefix}/landing/part-2.jsonl", [json.dumps(e) for e in parts[2]])
        _wait_until(lambda: read_sessions(config) == expected, 300, "every part's sessions", run, err)
    finally:
        _stop(run)
    summary = _assert_rode_out(run, out, err, endpoint)
    assert summary["source_errors"] >= 1 and summary["storage_errors"] >= 1, summary
    assert summary["last_storage_error"].startswith(f"S3 at {endpoint} failed for "), summary
    assert summary["ingested_files"] == 3, summary
    assert "the warehouse answers again" in err.read_text()
    assert read_sessions(config) == expected  # exactly once: no session missing, none twice
    assert _quarantined(config) == sorted([("malformed_json", "part-1.jsonl", len(parts[1]) + 1),
                                           ("missing_user_id", "part-1.jsonl", len(parts[1]) + 2)])


# The run of the next test, with S3 stopped from inside its sink: right before the quarantine append of the first
# batch that has one (after that batch's sessions append committed), so the failure is the sink's Delta commit.
SINK_OUTAGE_RUN = """
import os, signal, sys, threading
from sessionctl import install
install()
from pipelines.job import sink as tables
moto, outage_s, marker = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
real, fired = tables.commit_task_files, []
def commit(uri, files, *, app_id, version, **kwargs):
    if app_id.startswith("quarantine-") and not fired:
        fired.append(version)
        open(marker, "w").write(str(version))
        os.kill(moto, signal.SIGSTOP)
        threading.Timer(outage_s, os.kill, (moto, signal.SIGCONT)).start()
    return real(uri, files, app_id=app_id, version=version, **kwargs)
tables.commit_task_files = commit
from sessionctl.cli import main
sys.exit(main(["run", "--poll-seconds", "1"]))
"""


def test_a_warehouse_outage_inside_a_batch_restarts_the_query_and_writes_each_row_once(tmp_path, s3_endpoint):
    config, _, env = _s3_job(tmp_path, s3_endpoint, landing_on_s3=False)
    env["PYTHONPATH"] = str(REPO)
    parts = _events(seed=43, parts=2)
    expected = expected_closed_sessions(parts, 30 * 60_000, 10 * 60_000)
    land(config.landing, "part-0.jsonl", [json.dumps(e) for e in parts[0]] + BAD_LINES)
    out, err, marker = tmp_path / "run.out", tmp_path / "run.err", tmp_path / "outage-at-batch"
    endpoint, moto = s3_endpoint["env"]["AWS_ENDPOINT_URL"], s3_endpoint["process"].pid
    with out.open("w") as out_file, err.open("w") as err_file:
        run = subprocess.Popen([sys.executable, "-c", SINK_OUTAGE_RUN, str(moto), "25", str(marker)], env=env,
                               stdout=out_file, stderr=err_file, cwd=tmp_path)
    try:
        _wait_until(marker.exists, 240, "the sink's quarantine append", run, err)
        _wait_until(lambda: RESTARTS in err.read_text(), 120, "the failed query", run, err)
        _wait_until(lambda: len(_quarantined(config)) == len(BAD_LINES), 240, "the batch again", run, err)
        land(config.landing, "part-1.jsonl", [json.dumps(e) for e in parts[1]])
        _wait_until(lambda: read_sessions(config) == expected, 240, "both parts' sessions", run, err)
    finally:
        with suppress(ProcessLookupError):
            os.kill(moto, signal.SIGCONT)
        _stop(run)
    summary = _assert_rode_out(run, out, err, endpoint)
    stderr = err.read_text()
    failed = [line for line in stderr.splitlines() if RESTARTS in line]
    # the first failed start names the table the sink was committing to
    assert f"failed for {config.quarantine_table} (" in failed[0], failed
    assert "the warehouse answers again" in stderr and summary["storage_errors"] >= 1, summary
    assert read_sessions(config) == expected  # the batch ran twice; its sessions were appended once
    assert _quarantined(config) == sorted([("malformed_json", "part-0.jsonl", len(parts[0]) + 1),
                                           ("missing_user_id", "part-0.jsonl", len(parts[0]) + 2)])


@pytest.mark.tier("pure")
def test_run_summary_counts_each_batch_that_ran_once_in_constant_memory():
    """RunSummary keeps a high-water mark per query run, not every batch id: a restarted query (a new run id) is
    counted from its own progress, and an idle trigger's report (the id of a batch that did not run) is not."""
    from types import SimpleNamespace

    from pipelines.job.run_summary import RunSummary

    def progress(batch: int, rows: int, ran: bool = True, at: int = 0) -> SimpleNamespace:
        phases = {"addBatch": 5, "triggerExecution": 9} if ran else {"latestOffset": 1, "triggerExecution": 1}
        return SimpleNamespace(batchId=batch, numInputRows=rows, durationMs=phases, timestamp=f"t{batch}-{at}")

    def query(run_id: str, reports: list) -> SimpleNamespace:
        return SimpleNamespace(runId=run_id, recentProgress=reports[-100:],
                               lastProgress=reports[-1] if reports else None)

    summary = RunSummary()
    reports = [progress(0, 10), progress(1, 0), progress(2, 0, ran=False)]  # batch 2: an idle trigger's report
    assert summary.absorb_progress(query("a", reports))
    assert (summary.batches, summary.input_rows) == (2, 10)
    assert not summary.absorb_progress(query("a", reports))  # nothing new: not read again
    reports += [progress(2, 7), progress(3, 1)]  # batch 2 ran after all
    assert summary.absorb_progress(query("a", reports))
    assert (summary.batches, summary.input_rows) == (4, 18)
    reports += [progress(b, 1) for b in range(4, 1000)]  # more than Spark keeps (its last 100)
    assert summary.absorb_progress(query("a", reports))
    assert (summary.batches, summary.input_rows) == (4 + 100, 18 + 100)  # the ones Spark still had
    # the query failed in batch 1000 and was started again: a new run, whose first batch is 1000 again
    assert summary.absorb_progress(query("b", [progress(1000, 4, at=1)]))
    assert (summary.batches, summary.input_rows) == (105, 122)
    assert set(vars(summary)) - set(summary.to_dict()) == {"_query_run", "_counted_batch", "_last_report"}


@pytest.mark.tier("pure")
def test_object_store_failures_are_told_from_other_failures_by_what_the_clients_say():
    from pipelines.storage import is_object_store_failure, s3_failure

    said = [  # (cause, text) as delta-rs, pyarrow (the AWS SDK) and Hadoop's S3A (the stream's source on an S3
        # warehouse: a query's failure, through py4j) say it
        ("timed out", "Kernel error -> Generic S3 error\n \x1b[31m↳\x1b[0m Error performing GET "
                      "http://h/b/t/_delta_log/_last_checkpoint in 5.0s - HTTP error\n \x1b[31m↳\x1b[0m error "
                      "sending request\n operation timed out"),
        ("connection refused", "When listing objects under key 'land/' in bucket 'b': AWS Error NETWORK_CONNECTION "
                               "during ListObjectsV2 operation: curlCode: 7, Could not connect to server"),
        ("timed out", "[STREAM_FAILED] Query [id = 1] terminated with exception: org.apache.hadoop.fs.s3a."
                      "AWSClientIOException: open s3a://b/t/_delta_log/00000000000000000003.json: software.amazon."
                      "awssdk.core.exception.SdkClientException: Unable to execute HTTP request: Read timed out"),
    ]
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or "the AWS S3 endpoint"
    for cause, text in said:
        assert is_object_store_failure(OSError(text)), text
        line = str(s3_failure(OSError(text), "s3://b/t"))
        assert line.startswith(f"S3 at {endpoint} failed for s3://b/t ({cause}): "), line
    # a Spark query that the sink failed: the Python traceback's text, through py4j
    assert is_object_store_failure("An exception was raised by the Python Proxy. Return Message: Traceback (most "
                                   "recent call last):\npipelines.errors.StorageUnavailable: S3 at http://h failed for "
                                   "s3://b/t/quarantine (timed out)")
    for other in ("Spark failed: [STREAM_FAILED] division by zero", "ValueError: bad value",
                  "[CANNOT_LOAD_STATE_STORE] An error occurred during loading state"):
        assert not is_object_store_failure(RuntimeError(other)), other
