"""End to end through the real Dagster webserver + daemon (`dagster dev` on loopback), driven over
GraphQL as the UI does, then looked at in headless Chromium (screenshots kept in tests/artifacts/)."""
from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from dagster import DagsterRunStatus
from dagster_graphql import DagsterGraphQLClient
from deltalake import DeltaTable

from pipelines.config import SessionsConfig
from pipelines.sample_data import land_sample
from tests.conftest import tool

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "tests" / "artifacts"
LOCATION = "assets.definitions"
CHROMIUM = shutil.which("chromium")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def dagster_dev(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    home, dagster_home = root / "sessions", root / "dagster_home"
    dagster_home.mkdir()
    land_sample(home / "landing", users=120, sessions_per_user=3, files=4)
    port = _free_port()
    env = {**os.environ, "SESSIONS_HOME": str(home), "DAGSTER_HOME": str(dagster_home),
           "PYSPARK_PYTHON": sys.executable}
    log = open(root / "dagster-dev.log", "w")
    process = subprocess.Popen([tool("dagster"), "dev", "-w", "workspace.yaml",
                                "-h", "127.0.0.1", "-p", str(port)], cwd=REPO, env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/server_info", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"dagster dev did not come up: {(root / 'dagster-dev.log').read_text()[-3000:]}")
            time.sleep(1)
        yield {"port": port, "client": DagsterGraphQLClient("127.0.0.1", port_number=port),
               "config": SessionsConfig.from_env({"SESSIONS_HOME": str(home)})}
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


def _run(client: DagsterGraphQLClient, job: str, run_config: dict | None = None, timeout: float = 300) -> str:
    run_id = client.submit_job_execution(job, repository_location_name=LOCATION, run_config=run_config or {})
    deadline = time.monotonic() + timeout
    while True:
        status = client.get_run_status(run_id)
        if status in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED):
            assert status == DagsterRunStatus.SUCCESS, f"{job} run {run_id} ended {status}"
            return run_id
        assert time.monotonic() < deadline, f"{job} run {run_id} still {status}"
        time.sleep(2)


def json_files_pending(config) -> bool:
    return any(config.landing.glob("*.jsonl"))


def pipeline_batches(config) -> int:
    """Micro-batches committed since the restore (its checkpoint starts again at batch 0)."""
    from pipelines.checkpoint import inspect_checkpoint

    last = inspect_checkpoint(config.checkpoint).last_committed_batch
    return -1 if last is None else last - 1  # batches 0 and 1 are the restore's own


BACKFILL = """
mutation Backfill($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}"""


def test_launch_backfill_and_restore_through_graphql(dagster_dev):
    client, config = dagster_dev["client"], dagster_dev["config"]
    _run(client, "session_catch_up")
    sessions = DeltaTable(config.sessions_table).to_pandas()
    assert len(sessions) > 0 and sessions["session_id"].is_unique

    days = sorted(sessions["session_start"].dt.strftime("%Y-%m-%d").unique())
    first = dt.date.fromisoformat(days[0])
    wanted = [(first + dt.timedelta(days=i)).isoformat() for i in range(3)]
    answer = requests.post(f"http://127.0.0.1:{dagster_dev['port']}/graphql", timeout=60, json={
        "query": BACKFILL, "variables": {"params": {
            "partitionNames": wanted, "assetSelection": [{"path": ["daily_session_metrics"]}]}}}).json()
    assert answer["data"]["launchPartitionBackfill"]["__typename"] == "LaunchBackfillSuccess", answer

    _run(client, "savepoint")
    _run(client, "restore_from_snapshot", {"ops": {"validate_savepoint_op": {"config": {
        "savepoint": "latest", "partitions": 3}}}})
    assert DeltaTable(config.sessions_table).to_pandas()["session_id"].sort_values().tolist() == \
        sessions["session_id"].sort_values().tolist()

    # session_stream is long-running: it picks up a new file, then stops cleanly when cancelled.
    stream_run = client.submit_job_execution("session_stream", repository_location_name=LOCATION, run_config={
        "ops": {"stream_op": {"config": {"poll_seconds": 1.0}}}})
    land_sample(config.landing, users=30, sessions_per_user=2, files=1, seed=99)
    deadline = time.monotonic() + 240
    while json_files_pending(config) or pipeline_batches(config) < 1:
        assert client.get_run_status(stream_run) in (DagsterRunStatus.STARTING, DagsterRunStatus.STARTED,
                                                     DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED)
        assert time.monotonic() < deadline, "the stream run did not process the new file"
        time.sleep(2)
    client.terminate_run(stream_run)
    deadline = time.monotonic() + 120
    while client.get_run_status(stream_run) != DagsterRunStatus.CANCELED:
        assert time.monotonic() < deadline, f"stream run ended {client.get_run_status(stream_run)}"
        time.sleep(2)
    from pipelines.job import job_lock

    with job_lock(config, "test"):  # released: the query stopped and the run process let go
        pass

    metrics_uri = str(config.warehouse / "daily_session_metrics")
    deadline = time.monotonic() + 300
    while not (DeltaTable.is_deltatable(metrics_uri)
               and set(DeltaTable(metrics_uri).to_pandas()["day"]) >= set(wanted)):
        assert time.monotonic() < deadline, "the daemon did not run the backfill"
        time.sleep(3)
    metrics = DeltaTable(metrics_uri).to_pandas().set_index("day")
    for day in wanted:
        assert metrics.loc[day, "sessions"] == int((sessions["session_start"].dt.strftime("%Y-%m-%d") == day).sum())


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync", "--window-size=1400,900"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def _wait_for_text(driver, texts: list[str], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not all(text in driver.page_source for text in texts):
        assert time.monotonic() < deadline, f"{[t for t in texts if t not in driver.page_source]} not on {driver.current_url}"
        time.sleep(1)


def _dismiss_onboarding(driver) -> None:
    """Dagster greets a new browser profile with a newsletter dialog; a person clicks Skip."""
    from selenium.webdriver.common.by import By

    for button in driver.find_elements(By.XPATH, "//button[normalize-space()='Skip']"):
        button.click()
        time.sleep(1)


@pytest.mark.skipif(CHROMIUM is None or shutil.which("chromedriver") is None,
                    reason="Debian chromium/chromium-driver are not installed (make test installs them as root)")
def test_ui_shows_assets_and_restore_launchpad(dagster_dev):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{dagster_dev['port']}"
    pages = {
        "asset-graph": (f"{base}/asset-groups", ["daily_session_metrics", "sessions", "raw_events", "session_state"]),
        "restore-launchpad": (f"{base}/locations/{LOCATION}/jobs/restore_from_snapshot/playground",
                              ["restore_from_snapshot", "validate_savepoint_op", "stop_running_stream_op"]),
        "jobs": (f"{base}/jobs", ["session_stream", "session_catch_up", "savepoint", "restore_from_snapshot",
                                  "rescale", "compaction"]),
    }
    driver = _browser()
    try:
        for name, (url, expected) in pages.items():
            driver.get(url)
            _wait_for_text(driver, expected)
            _dismiss_onboarding(driver)
            time.sleep(2)  # let the graph finish laying out
            shot = ARTIFACTS / f"{name}.png"
            driver.save_screenshot(str(shot))
            assert shot.stat().st_size > 10_000
    finally:
        driver.quit()
