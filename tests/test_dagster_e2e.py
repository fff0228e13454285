"""End to end on the production shape of the Dagster deployment: a code server started with the user-code
image's command (Dockerfile CMD), a webserver and a daemon, three processes sharing one instance --
deploy/dagster.yaml as shipped, on a real PostgreSQL 15 (tests/conftest.py::postgres_server). Driven over
GraphQL as the UI does, checked in Postgres directly, then looked at in headless Chromium (screenshots kept in
tests/artifacts/)."""
from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg2
import pytest
import requests
import yaml
from dagster import DagsterRunStatus
from dagster_graphql import DagsterGraphQLClient
from deltalake import DeltaTable
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

from assets.tables import state_version
from pipelines.config import SessionsConfig
from pipelines.coordination.job_leases import job_lock
from pipelines.core.sample_data import land_sample
from pipelines.job.checkpoint import inspect_checkpoint, read_job_metadata
from state_store.savepoint.catalog import SavepointStore
from tests.kit.homes import free_port, tool
from tests.kit.servers import PostgresServer
from tests.kit.waits import wait_until

pytestmark = [pytest.mark.tier("e2e"), pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "tests" / "artifacts"
INSTANCE_YAML = REPO / "deploy" / "dagster.yaml"
DOCKERFILE = REPO / "Dockerfile"
LOCATION = "assets.definitions"
CHROMIUM = shutil.which("chromium")
FINISHED = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
# How often a wait looks again (a run's status over GraphQL, a checkpoint file, a row in Postgres): each look is a few
# milliseconds, and what is waited for (a run, a batch, a sensor tick) takes seconds to minutes.
POLL_S = 0.5


@dataclass(frozen=True)
class DagsterStack:
    port: int
    client: DagsterGraphQLClient
    config: SessionsConfig
    dagster_home: Path
    postgres: PostgresServer
    database: str

    def sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows straight from the instance's Postgres database (not through Dagster)."""
        env = self.postgres.dagster_env(self.database)
        with closing(psycopg2.connect(host=env["DAGSTER_PG_HOST"], port=int(env["DAGSTER_PG_PORT"]),
                                      user=env["DAGSTER_PG_USER"], password=env["DAGSTER_PG_PASSWORD"],
                                      dbname=self.database)) as connection, connection.cursor() as cursor:
            cursor.execute(query, params)
            return list(cursor.fetchall())


def code_server_command(host: str, port: int) -> list[str]:
    """The image's CMD (exec form in the Dockerfile), served on this host and port instead of 0.0.0.0:4000."""
    line = next(line for line in DOCKERFILE.read_text().splitlines() if line.startswith("CMD ["))
    command: list[str] = json.loads(line[len("CMD "):])
    assert command[:3] == ["dagster", "code-server", "start"], command
    for flag, value in (("-h", host), ("-p", str(port))):
        command[command.index(flag) + 1] = value
    return [tool("dagster"), *command[1:]]


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:  # the child keeps its own descriptor
        return subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group (Dagster maps it to a clean shutdown), SIGKILL if it hangs."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _wait_until(ready: Callable[[], bool], seconds: float, what: str, processes: dict[str, subprocess.Popen[bytes]],
                logs: Path) -> None:
    def failed(why: str) -> RuntimeError:
        tails = "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-2500:]}" for log in sorted(logs.glob("*.log")))
        return RuntimeError(f"{what}: {why}\n{tails}")

    def ready_or_dead() -> bool:
        dead = [name for name, process in processes.items() if process.poll() is not None]
        if dead:
            raise failed("exited: " + ", ".join(dead))
        return ready()

    try:
        wait_until(ready_or_dead, timeout_s=seconds, what=what, interval_s=POLL_S)
    except AssertionError as timed_out:
        raise failed(str(timed_out)) from None


LOCATION_STATUS = """
query { workspaceOrError { ... on Workspace { locationEntries {
  name locationOrLoadError { __typename ... on PythonError { message } } } } } }"""
RELOAD_LOCATION = """
mutation Reload($name: String!) { reloadRepositoryLocation(repositoryLocationName: $name) { __typename } }"""


def _graphql(port: int, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    answer = requests.post(f"http://127.0.0.1:{port}/graphql", timeout=60,
                           json={"query": query, "variables": variables or {}})
    answer.raise_for_status()
    result: dict[str, Any] = answer.json()
    return result


def _location_loaded(port: int) -> bool:
    try:
        if not requests.get(f"http://127.0.0.1:{port}/server_info", timeout=2).ok:
            return False
        entries = _graphql(port, LOCATION_STATUS)["data"]["workspaceOrError"]["locationEntries"]
    except requests.RequestException:
        return False
    entry = next((e for e in entries if e["name"] == LOCATION), None)
    if entry and entry["locationOrLoadError"] and entry["locationOrLoadError"]["__typename"] == "RepositoryLocation":
        return True
    _graphql(port, RELOAD_LOCATION, {"name": LOCATION})  # asked before the code server finished loading
    return False


@pytest.fixture(scope="module")
def dagster_stack(tmp_path_factory: pytest.TempPathFactory, postgres_server: PostgresServer) -> Iterator[DagsterStack]:
    root = tmp_path_factory.mktemp("e2e")
    home, dagster_home, logs = root / "sessions", root / "dagster_home", root / "logs"
    dagster_home.mkdir()
    logs.mkdir()
    # The shipped instance config, unchanged: its connection comes from the DAGSTER_PG_* variables.
    shutil.copy(INSTANCE_YAML, dagster_home / "dagster.yaml")
    database = postgres_server.create_database("dagster_e2e")
    code_port, web_port = free_port(), free_port()
    workspace = root / "workspace.yaml"
    workspace.write_text(yaml.safe_dump({"load_from": [{"grpc_server": {
        "host": "127.0.0.1", "port": code_port, "location_name": LOCATION}}]}))
    env = {**os.environ, **postgres_server.dagster_env(database), "SESSIONS_HOME": str(home),
           # The maintenance sensor (stopped until a test starts it) asks for a savepoint whenever it ticks.
           "SESSIONS_SAVEPOINT_MAX_AGE_HOURS": "0.0001",
           "DAGSTER_HOME": str(dagster_home), "PYSPARK_PYTHON": sys.executable,
           # This checkout's code, also when the venv's editable install points at another worktree.
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    stack = DagsterStack(port=web_port, client=DagsterGraphQLClient("127.0.0.1", port_number=web_port),
                         config=SessionsConfig.from_env({"SESSIONS_HOME": str(home)}), dagster_home=dagster_home,
                         postgres=postgres_server, database=database)
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        # A new database gets its tables once, before the processes start (as deploy/dagster.yaml says): the code
        # server and the webserver starting together on an empty one race to create them ("type jobs already exists").
        migrated = subprocess.run([tool("dagster"), "instance", "migrate"], env=env, capture_output=True, text=True,
                                  timeout=300)
        assert migrated.returncode == 0, migrated.stderr[-2000:]
        # The code server and the webserver load the code location while the CLI below makes the state: neither
        # reads it (the daemon's sensors and the runs do), and the daemon starts only once the CLI is done.
        processes["code-server"] = _start(code_server_command("127.0.0.1", code_port), env, logs / "code-server.log")
        processes["webserver"] = _start([tool("dagster-webserver"), "-w", str(workspace), "-h", "127.0.0.1",
                                         "-p", str(web_port)], env, logs / "webserver.log")
        # As after `make demo`: state made by the CLI before Dagster runs anything (the UI must show it by itself).
        land_sample(home / "landing", users=60, sessions_per_user=3, files=2, seed=3)
        cli = subprocess.run([tool("sessionctl"), "catch-up"], capture_output=True, text=True, timeout=600,
                             env={**os.environ, "SESSIONS_HOME": str(home), "PYSPARK_PYTHON": sys.executable,
                                  "PYTHONPATH": env["PYTHONPATH"]})
        assert cli.returncode == 0, cli.stderr[-2000:]
        land_sample(home / "landing", users=120, sessions_per_user=3, files=4)
        _wait_until(lambda: _location_loaded(web_port), 180, "the webserver did not load the code location",
                    processes, logs)
        processes["daemon"] = _start([tool("dagster-daemon"), "run", "-w", str(workspace)], env, logs / "daemon.log")
        _wait_until(lambda: bool(stack.sql("SELECT 1 FROM daemon_heartbeats WHERE daemon_type = %s",
                                           ("QUEUED_RUN_COORDINATOR",))),
                    120, "the daemon did not start dequeuing runs", processes, logs)
        yield stack
    finally:
        for name in ("webserver", "daemon", "code-server"):
            if name in processes:
                _stop(processes[name])


def _submit(client: DagsterGraphQLClient, job: str, run_config: dict[str, Any] | None = None) -> str:
    return client.submit_job_execution(job, repository_location_name=LOCATION, run_config=run_config or {})


def _wait(client: DagsterGraphQLClient, run_id: str, job: str, timeout: float = 300,
          expect: DagsterRunStatus = DagsterRunStatus.SUCCESS) -> str:
    status = wait_until(lambda: _finished(client, run_id), timeout_s=timeout, what=f"{job} run {run_id} to end",
                        interval_s=POLL_S)
    assert status == expect, f"{job} run {run_id} ended {status}"
    return run_id


def _finished(client: DagsterGraphQLClient, run_id: str) -> DagsterRunStatus | None:
    status = client.get_run_status(run_id)
    return status if status in FINISHED else None


def _run(client: DagsterGraphQLClient, job: str, run_config: dict[str, Any] | None = None) -> str:
    return _wait(client, _submit(client, job, run_config), job)


def json_files_pending(config: SessionsConfig) -> bool:
    return any(config.landing.glob("*.jsonl"))


def pipeline_batches(config: SessionsConfig) -> int:
    """Micro-batches committed since the restore (its checkpoint starts again at batch 0)."""
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


def _state_passes(stack: DagsterStack) -> list[dict[str, Any]]:
    """The session_state observations in Postgres that carry a state pass's open_sessions."""
    found = []
    for (event,) in stack.sql("SELECT event FROM event_logs WHERE dagster_event_type = 'ASSET_OBSERVATION' "
                              "AND asset_key = %s ORDER BY id", (json.dumps(["session_state"]),)):
        text = event if isinstance(event, str) else json.dumps(event)
        if "open_sessions" in text:
            found.append(json.loads(text))
    return found


@pytest.mark.skipif(CHROMIUM is None or shutil.which("chromedriver") is None,
                    reason="Debian chromium/chromium-driver are not installed (make test installs them as root)")
def test_state_is_observed_after_startup_without_running_a_job(dagster_stack: DagsterStack) -> None:
    """The observation sensor (running by default) observes what the CLI made before Dagster started and asks for
    one pass over the state; the asset page shows its figures and the plot. Nobody launched anything."""
    wait_until(lambda: _state_passes(dagster_stack), timeout_s=240, interval_s=POLL_S,
               what="a state observation with open_sessions after startup")
    launched_by_hand = dagster_stack.sql("SELECT pipeline_name FROM runs WHERE pipeline_name <> 'observe_state'")
    assert launched_by_hand == [], launched_by_hand
    expected = ("open_sessions", "open_events", "state_bytes_on_disk", "recent_batches", "open sessions",
                "watermark_lag")
    driver = _browser()
    try:
        driver.set_window_size(1400, 2200)
        deadline = time.monotonic() + 150  # the sensor's next tick carries the pass's figures to the newest observation
        while True:
            driver.get(f"http://127.0.0.1:{dagster_stack.port}/assets/session_state")
            # the page renders in a second or two; then loaded again for a newer tick
            _page_shows(driver, lambda: all(text in driver.page_source for text in expected), seconds=8)
            _dismiss_onboarding(driver)
            if all(text in driver.page_source for text in expected) or time.monotonic() > deadline:
                break
        _shoot(driver, "state-asset", docs=True)
        assert all(text in driver.page_source for text in expected), \
            [text for text in expected if text not in driver.page_source]
    finally:
        driver.quit()


def test_catch_up_backfill_restore_and_stream_on_postgres(dagster_stack: DagsterStack) -> None:
    client, config = dagster_stack.client, dagster_stack.config
    catch_up_run = _run(client, "session_catch_up")
    sessions = DeltaTable(config.sessions_table).to_pandas()
    assert len(sessions) > 0 and sessions["session_id"].is_unique

    days = sorted(sessions["session_start"].dt.strftime("%Y-%m-%d").unique())
    first = dt.date.fromisoformat(days[0])
    wanted = [(first + dt.timedelta(days=i)).isoformat() for i in range(3)]
    answer = _graphql(dagster_stack.port, BACKFILL, {"params": {
        "partitionNames": wanted, "assetSelection": [{"path": ["daily_session_metrics"]}]}})
    assert answer["data"]["launchPartitionBackfill"]["__typename"] == "LaunchBackfillSuccess", answer
    backfill_id = answer["data"]["launchPartitionBackfill"]["backfillId"]

    # Submitted back to back: the queue's sessions/lifecycle limit holds the restore until the savepoint ended,
    # so "latest" is this savepoint (checked in Postgres below).
    savepoint_run = _submit(client, "savepoint")
    restore_run = _submit(client, "restore_from_snapshot", {"ops": {"validate_savepoint_op": {"config": {
        "savepoint": "latest", "partitions": 3, "dry_run": False}}}})
    _wait(client, savepoint_run, "savepoint")
    _wait(client, restore_run, "restore_from_snapshot")
    assert DeltaTable(config.sessions_table).to_pandas()["session_id"].sort_values().tolist() == \
        sessions["session_id"].sort_values().tolist()

    # session_stream is long-running: it picks up a new file, then stops cleanly when cancelled.
    stream_run = _submit(client, "session_stream", {"ops": {"stream_op": {"config": {"poll_seconds": 1.0}}}})
    land_sample(config.landing, users=30, sessions_per_user=2, files=1, seed=99)

    def processed() -> bool:
        assert client.get_run_status(stream_run) in (DagsterRunStatus.STARTING, DagsterRunStatus.STARTED,
                                                     DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED)
        return not json_files_pending(config) and pipeline_batches(config) >= 1

    wait_until(processed, timeout_s=240, interval_s=POLL_S, what="the stream run to process the new file")
    client.terminate_run(stream_run)
    wait_until(lambda: client.get_run_status(stream_run) == DagsterRunStatus.CANCELED, timeout_s=120,
               interval_s=POLL_S, what="the stream run to be canceled")
    with job_lock(config, "test"):  # released: the query stopped and the run process let go
        pass

    metrics_uri = config.table_uri("daily_session_metrics")
    wait_until(lambda: DeltaTable.is_deltatable(metrics_uri)
               and set(DeltaTable(metrics_uri).to_pandas()["day"]) >= set(wanted),
               timeout_s=300, interval_s=POLL_S, what="the daemon to run the backfill")
    metrics = DeltaTable(metrics_uri).to_pandas().set_index("day")
    for day in wanted:
        assert metrics.loc[day, "sessions"] == int((sessions["session_start"].dt.strftime("%Y-%m-%d") == day).sum())

    _assert_history_in_postgres(dagster_stack, catch_up=catch_up_run, savepoint=savepoint_run,
                                restore=restore_run, stream=stream_run, backfill_id=backfill_id, days=wanted)


def _assert_history_in_postgres(stack: DagsterStack, catch_up: str, savepoint: str, restore: str, stream: str,
                                backfill_id: str, days: list[str]) -> None:
    """What the UI showed is what the instance's Postgres holds: runs, their events, the queue's work."""
    runs = {run_id: (job, status, start, end) for run_id, job, status, start, end in stack.sql(
        "SELECT run_id, pipeline_name, status, start_time, end_time FROM runs")}
    assert runs[catch_up][:2] == ("session_catch_up", "SUCCESS")
    assert runs[savepoint][:2] == ("savepoint", "SUCCESS")
    assert runs[restore][:2] == ("restore_from_snapshot", "SUCCESS")
    assert runs[stream][:2] == ("session_stream", "CANCELED")
    # The lifecycle tag limit (1) held: the restore started only after the savepoint had ended.
    assert runs[restore][2] >= runs[savepoint][3], (runs[savepoint], runs[restore])

    def events(run_id: str, kind: str) -> list[tuple[Any, ...]]:
        return stack.sql("SELECT asset_key, partition FROM event_logs WHERE run_id = %s AND dagster_event_type = %s",
                         (run_id, kind))

    # The catch-up's new versions (files landed after the CLI's catch-up: every table but maybe quarantine grew);
    # the restore's new state and the sessions table rolled back.
    # Each table's current version and the state's batch materialized exactly once -- by the run that wrote it or by
    # the observation sensor, whichever looked first -- with the version as its data version.
    current = {"raw_events": DeltaTable(stack.config.raw_events_table).version(),
               "sessions": DeltaTable(stack.config.sessions_table).version(),
               "quarantine": DeltaTable(stack.config.quarantine_table).version(),
               "session_state": state_version(stack.config,
                                              inspect_checkpoint(stack.config.checkpoint).last_committed_batch)}

    def times_reported(name: str, version: int | str) -> int:
        tagged = (f'"dagster/data_version": "{version}"', f'"dagster/data_version", "{version}"')
        return sum(1 for (event,) in stack.sql(
            "SELECT event FROM event_logs WHERE dagster_event_type = 'ASSET_MATERIALIZATION' AND asset_key = %s",
            (json.dumps([name]),)) if any(tag in (event if isinstance(event, str) else json.dumps(event))
                                          for tag in tagged))

    wait_until(lambda: all(times_reported(name, version) for name, version in current.items()), timeout_s=150,
               interval_s=POLL_S * 4, what=f"the sensor's next tick to report the versions {current}")
    assert {name: times_reported(name, v) for name, v in current.items()} == {name: 1 for name in current}
    assert events(stream, "PIPELINE_CANCELED"), "the stream run's cancellation is an event of the run"

    backfill_runs = [run_id for (run_id,) in stack.sql(
        "SELECT run_id FROM run_tags WHERE key = 'dagster/backfill' AND value = %s", (backfill_id,))]
    assert {runs[run_id][1] for run_id in backfill_runs} == {"SUCCESS"}
    materialized_days = {partition for run_id in backfill_runs
                         for key, partition in events(run_id, "ASSET_MATERIALIZATION")
                         if json.loads(key) == ["daily_session_metrics"]}
    assert materialized_days >= set(days)

    # Every run went through the run queue (QueuedRunCoordinator): enqueued when submitted, then launched by the
    # daemon's dequeue (its STARTING event), then started by the run worker -- in this order.
    for run_id in (catch_up, savepoint, restore, stream, *backfill_runs):
        kinds = [kind for (kind,) in stack.sql(
            "SELECT dagster_event_type FROM event_logs WHERE run_id = %s ORDER BY id", (run_id,))]
        lifecycle = [kind for kind in kinds if kind in ("PIPELINE_ENQUEUED", "PIPELINE_STARTING", "PIPELINE_START")]
        assert lifecycle == ["PIPELINE_ENQUEUED", "PIPELINE_STARTING", "PIPELINE_START"], (runs[run_id], kinds)
    # Nothing fell back to the local SQLite storage.
    assert not list(stack.dagster_home.rglob("*.db")), list(stack.dagster_home.rglob("*.db"))


def _browser() -> webdriver.Chrome:
    assert CHROMIUM is not None
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync", "--window-size=1400,900"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def _wait_for_text(driver: webdriver.Chrome, texts: list[str], seconds: float = 60) -> None:
    if not _page_shows(driver, lambda: all(text in driver.page_source for text in texts), seconds=seconds):
        ARTIFACTS.mkdir(parents=True, exist_ok=True)  # what the page did show, for the message and tests/artifacts/
        driver.save_screenshot(str(ARTIFACTS / "not-shown.png"))
        shown = driver.find_element(By.TAG_NAME, "body").text
        raise AssertionError(f"{[t for t in texts if t not in driver.page_source]} not on {driver.current_url}; "
                             f"it shows: {shown[:3000]}")


def _page_shows(driver: webdriver.Chrome, condition: Callable[[], Any], *, seconds: float) -> bool:
    """Selenium's own waiter on `condition` (re-read on each look); False if it did not hold within `seconds`."""
    try:
        WebDriverWait(driver, seconds, poll_frequency=POLL_S).until(lambda _: condition())
    except TimeoutException:
        return False
    return True


def _dismiss_onboarding(driver: webdriver.Chrome) -> None:
    """An instance with nux enabled (not deploy/dagster.yaml) greets a new user with a newsletter dialog; a
    person clicks Skip."""
    for button in driver.find_elements(By.XPATH, "//button[normalize-space()='Skip']"):
        button.click()
        _page_shows(driver, lambda: not driver.find_elements(By.XPATH, "//button[normalize-space()='Skip']"),
                    seconds=5)


@dataclass(frozen=True)
class UiPage:
    """A page of the Dagster UI to screenshot (tests/artifacts/<name>.png) once all `expected` texts show."""
    name: str
    path: str
    expected: tuple[str, ...]


# Add a page here to have it checked and screenshotted.
UI_PAGES = (
    UiPage("jobs", "/jobs", ("session_stream", "session_catch_up", "savepoint", "restore_from_snapshot", "rescale",
                             "compaction")),
)
SCREENSHOTS = REPO / "docs" / "screenshots"  # the README's pictures, taken here
# They are refreshed in the tree only when asked (REFRESH_SCREENSHOTS=1): a test run leaves the checkout as
# it found it; every shot stays in tests/artifacts/ (ignored by git).
REFRESH_SCREENSHOTS = os.environ.get("REFRESH_SCREENSHOTS") == "1"
LAUNCHPAD = f"/locations/{LOCATION}/jobs/restore_from_snapshot/playground"


def _shoot(driver: webdriver.Chrome, name: str, *, docs: bool = False, laid_out: bool = True) -> None:
    """A screenshot; `laid_out=False`: the page's text is there but its layout may still move (the run log viewer)."""
    if not laid_out:
        time.sleep(2)  # the log viewer lays its lines out after their text is in the page: no condition sees layout
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))
    assert (ARTIFACTS / f"{name}.png").stat().st_size > 10_000
    if docs and REFRESH_SCREENSHOTS:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(ARTIFACTS / f"{name}.png", SCREENSHOTS / f"{name}.png")


def _launch_from_launchpad(driver: webdriver.Chrome, base: str, *, config_yaml: str | None = None) -> str:
    """Open the restore runbook's launchpad, optionally replace its config as a person would (the editor's text),
    click Launch Run; the run id the UI went to."""
    driver.get(base + LAUNCHPAD)
    _wait_for_text(driver, ["validate_savepoint_op", "Launch Run"])
    _dismiss_onboarding(driver)
    assert "extraClassPath" not in driver.page_source and "SharedArchiveFile" not in driver.page_source
    if config_yaml is not None:
        driver.execute_script("document.querySelector('.CodeMirror').CodeMirror.setValue(arguments[0]);", config_yaml)
        time.sleep(2)  # the launchpad validates the new text; the button shows enabled (stale) until it did
    button = driver.find_element(By.XPATH, "//button[normalize-space()='Launch Run']")
    assert _page_shows(driver, button.is_enabled, seconds=30), "Launch Run stayed disabled"
    button.click()
    assert _page_shows(driver, lambda: "/runs/" in driver.current_url, seconds=60), \
        f"the launch did not open its run ({driver.current_url})"
    return driver.current_url.split("/runs/")[1].split("?")[0].split("/")[0]


TABLES_WITH_DATA = ("raw_events", "sessions", "quarantine", "session_state", "savepoint_catalog")


def _graph_node(driver: webdriver.Chrome, name: str) -> str:
    """The text of asset `name`'s node in the lineage graph: the smallest element holding its name and its rows."""
    found = driver.find_elements(By.XPATH, f"//*[normalize-space(text())='{name}']"
                                           f"/ancestor::*[contains(normalize-space(.), 'Latest event')][1]")
    texts = [element.text for element in found]
    return min(texts, key=len) if texts else ""


def _checks_not_run(nodes: dict[str, str]) -> list[str]:
    """The assets with checks whose node counts some not evaluated ("0 / 1 Passed": none ran)."""
    return [name for name in ("sessions", "session_state") if re.search(r"\b0 / \d+ Passed", nodes[name])]


def _loaded(driver: webdriver.Chrome, name: str) -> bool:
    text = _graph_node(driver, name)
    return bool(text) and "Loading" not in text


def _step_events(stack: DagsterStack, run_id: str) -> dict[str, str]:
    return {step: kind for step, kind in stack.sql(
        "SELECT step_key, dagster_event_type FROM event_logs WHERE run_id = %s AND dagster_event_type IN "
        "('STEP_SUCCESS', 'STEP_SKIPPED', 'STEP_FAILURE')", (run_id,))}


@pytest.mark.skipif(CHROMIUM is None or shutil.which("chromedriver") is None,
                    reason="Debian chromium/chromium-driver are not installed (make test installs them as root)")
def test_ui_walk_of_a_new_user_lineage_dry_run_restore_next_step(dagster_stack: DagsterStack) -> None:
    """What a new user does after `make demo`, in a browser: the lineage shows every table with data as
    materialized; the restore launchpad, launched unchanged, is a dry run and says so (tagged, its restore steps
    skipped); a real restore, made by changing the launchpad's config, ends by saying the next step."""
    base, client = f"http://127.0.0.1:{dagster_stack.port}", dagster_stack.client
    driver = _browser()
    try:
        driver.set_window_size(1600, 1000)
        # The lineage: the observation sensor (running by default) reported what the CLI wrote before Dagster ran.
        deadline = time.monotonic() + 150
        while True:
            driver.get(base + "/asset-groups")
            _wait_for_text(driver, list(TABLES_WITH_DATA))
            # the graph's nodes load their latest events after their names
            _page_shows(driver, lambda: all(_loaded(driver, name) for name in TABLES_WITH_DATA), seconds=15)
            nodes = {name: _graph_node(driver, name) for name in TABLES_WITH_DATA}
            if all(_loaded(driver, name) and "Never materialized" not in text for name, text in nodes.items()) \
                    and not _checks_not_run(nodes) or time.monotonic() > deadline:
                break
        _dismiss_onboarding(driver)
        _shoot(driver, "asset-graph", docs=True)
        assert all(_loaded(driver, name) for name in TABLES_WITH_DATA), nodes
        assert not [name for name, text in nodes.items() if "Never materialized" in text], nodes
        assert not _checks_not_run(nodes), nodes  # evaluated by the product (the sensor), none waiting for a click

        # Launched unchanged: a dry run, visibly one.
        dry = _launch_from_launchpad(driver, base)
        _wait(client, dry, "restore_from_snapshot")
        assert _step_events(dagster_stack, dry) == {
            "validate_savepoint_op": "STEP_SUCCESS", "report_dry_run_op": "STEP_SUCCESS",
            "stop_running_stream_op": "STEP_SKIPPED", "restore_op": "STEP_SKIPPED", "verify_restore_op": "STEP_SKIPPED"}
        assert dagster_stack.sql("SELECT value FROM run_tags WHERE run_id = %s AND key = 'sessions/dry_run'",
                                 (dry,)) == [("true",)]
        driver.get(f"{base}/runs/{dry}?logs=step%3Areport_dry_run_op")
        _wait_for_text(driver, ["dry run: nothing was stopped or changed", "dry_run: false"])
        _shoot(driver, "restore-dry-run", docs=True, laid_out=False)
        driver.find_element(By.XPATH, "//button[normalize-space()='View tags and config']").click()
        _wait_for_text(driver, ["sessions/dry_run"])

        # A real restore: the launchpad's config changed on purpose.
        real = _launch_from_launchpad(driver, base, config_yaml=(
            "ops:\n  validate_savepoint_op:\n    config:\n      savepoint: latest\n      dry_run: false\n"))
        _wait(client, real, "restore_from_snapshot", timeout=400)
        assert _step_events(dagster_stack, real) == {
            "validate_savepoint_op": "STEP_SUCCESS", "report_dry_run_op": "STEP_SKIPPED",
            "stop_running_stream_op": "STEP_SUCCESS", "restore_op": "STEP_SUCCESS", "verify_restore_op": "STEP_SUCCESS"}
        driver.get(f"{base}/runs/{real}?logs=step%3Averify_restore_op")
        _wait_for_text(driver, ["resume the stream: launch session_stream"], seconds=90)
        _shoot(driver, "restore-next-step", docs=True, laid_out=False)

        for page in UI_PAGES:
            driver.get(base + page.path)
            _wait_for_text(driver, list(page.expected))
            _shoot(driver, page.name)
    finally:
        driver.quit()


def test_a_wrong_savepoint_fails_in_one_line_with_the_choices(dagster_stack: DagsterStack) -> None:
    failed = _submit(dagster_stack.client, "restore_from_snapshot", {"ops": {"validate_savepoint_op": {"config": {
        "savepoint": "sp-does-not-exist"}}}})
    _wait(dagster_stack.client, failed, "restore_from_snapshot", expect=DagsterRunStatus.FAILURE)
    (event,) = [json.loads(e) if isinstance(e, str) else e for (e,) in dagster_stack.sql(
        "SELECT event FROM event_logs WHERE run_id = %s AND dagster_event_type = 'STEP_FAILURE'", (failed,))]
    text = json.dumps(event)
    assert "no such savepoint: sp-does-not-exist" in text and "name one of the complete savepoints: latest" in text


START_SENSOR = """
mutation Start($selector: SensorSelector!) {
  startSensor(sensorSelector: $selector) { __typename ... on Sensor { sensorState { status } } ... on PythonError { message } }
}"""
RESET_SENSOR = """
mutation Reset($selector: SensorSelector!) { resetSensor(sensorSelector: $selector) { __typename } }
"""


def _stream_run(client: DagsterGraphQLClient, config: SessionsConfig, seed: int) -> str:
    """A session_stream run that has committed a batch of a newly landed file."""
    run = _submit(client, "session_stream", {"ops": {"stream_op": {"config": {"poll_seconds": 1.0}}}})
    _stream_run_takes(client, config, run, seed)
    return run


def _stream_run_takes(client: DagsterGraphQLClient, config: SessionsConfig, run: str, seed: int) -> None:
    """The running session_stream run `run` commits a batch of a newly landed file."""
    before = inspect_checkpoint(config.checkpoint).last_committed_batch or 0
    land_sample(config.landing, users=20, sessions_per_user=2, files=1, seed=seed)

    def processed() -> bool:
        assert client.get_run_status(run) not in FINISHED, f"stream run ended {client.get_run_status(run)}"
        return not json_files_pending(config) and (inspect_checkpoint(config.checkpoint).last_committed_batch or 0) > before

    wait_until(processed, timeout_s=240, interval_s=POLL_S, what="the stream run to process the new file")


def test_savepoints_while_session_stream_runs_and_stop_with_savepoint(dagster_stack: DagsterStack) -> None:
    """With session_stream running: the maintenance sensor's savepoint run succeeds (the stream keeps running);
    the stop_stream job stops it with a savepoint of its last batch; the restore runbook does the same when asked."""
    client, config = dagster_stack.client, dagster_stack.config
    stream = _stream_run(client, config, seed=101)
    selector = {"repositoryLocationName": LOCATION, "repositoryName": "__repository__",
                "sensorName": "maintenance_sensor"}
    started = _graphql(dagster_stack.port, START_SENSOR, {"selector": selector})
    assert started["data"]["startSensor"]["__typename"] == "Sensor", started
    try:
        found = wait_until(lambda: dagster_stack.sql(
            "SELECT r.run_id FROM runs r JOIN run_tags t ON t.run_id = r.run_id WHERE r.pipeline_name = 'savepoint' "
            "AND t.key = 'dagster/sensor_name' AND t.value = 'maintenance_sensor'"),
            timeout_s=300, interval_s=POLL_S, what="the maintenance sensor to request a savepoint")
        _wait(client, found[0][0], "savepoint", timeout=400)
    finally:  # back to its default (stopped): the next ticks would ask again
        _graphql(dagster_stack.port, RESET_SENSOR, {"selector": selector})
    assert client.get_run_status(stream) == DagsterRunStatus.STARTED, "the savepoint must not stop the stream"
    newest = SavepointStore.of(config).list()[0]
    assert newest.trigger == "sensor" and newest.status == "complete"

    stop = _run(client, "stop_stream", {"ops": {"stop_stream_op": {"config": {"savepoint": True}}}})
    _wait(client, stream, "session_stream", timeout=120)  # the stream's run ends by itself, successfully
    newest = SavepointStore.of(config).list()[0]
    assert newest.trigger == "stop" and newest.batch_id == inspect_checkpoint(config.checkpoint).last_committed_batch
    assert stop

    # The runbook, asked to stop the stream with a savepoint (not online): the old state is kept as a recovery point.
    stream = _stream_run(client, config, seed=103)
    runbook = _run(client, "restore_from_snapshot", {"ops": {"validate_savepoint_op": {"config": {
        "savepoint": newest.savepoint_id, "stop_with_savepoint": True, "online": False, "dry_run": False}}}})
    _wait(client, stream, "session_stream", timeout=120)
    kept = SavepointStore.of(config).list()
    assert kept[0].trigger == "stop" and kept[0].savepoint_id != newest.savepoint_id, kept[:2]
    metadata = json.dumps(dagster_stack.sql(
        "SELECT event FROM event_logs WHERE run_id = %s AND step_key = 'stop_running_stream_op'", (runbook,)))
    assert kept[0].savepoint_id in metadata

    # The runbook beside a running stream, as launched by default (online): the stream restores in place between
    # two batches and goes on -- its run never ends, nothing is relaunched -- and the run says its downtime.
    stream = _stream_run(client, config, seed=105)
    runbook = _run(client, "restore_from_snapshot", {"ops": {"validate_savepoint_op": {"config": {
        "savepoint": newest.savepoint_id, "dry_run": False}}}})
    assert client.get_run_status(stream) == DagsterRunStatus.STARTED, "the stream must keep running"
    assert dagster_stack.sql("SELECT value FROM run_tags WHERE run_id = %s AND key = 'sessions/restored_in_place'",
                             (runbook,)) == [("true",)]
    restored = json.dumps(dagster_stack.sql(
        "SELECT event FROM event_logs WHERE run_id = %s AND step_key = 'restore_op'", (runbook,)))
    assert "went on; downtime" in restored, restored[-2000:]
    assert read_job_metadata(config.checkpoint).created_from == newest.savepoint_id
    _stream_run_takes(client, config, stream, seed=107)  # the same run processes a file landed after the restore
    client.terminate_run(stream)
    _wait(client, stream, "session_stream", timeout=120, expect=DagsterRunStatus.CANCELED)
