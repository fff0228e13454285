"""A test's home and the commands an operator runs on it: `make_config` (a SessionsConfig under tmp_path),
`config_env` (the same config for a `sessionctl` process), `tool` (a console script of the venv running the tests),
`free_port`, and `assert_half_done_is_reported` (an interrupted restore or rescale as an operator meets it).

``make_config(tmp_path, provider="rocksdb", **env) -> SessionsConfig``
    SESSIONS_HOME is ``tmp_path / "home"`` (override with ``home=...``). Keyword arguments are environment variable
    names (``SESSIONS_GAP_MINUTES=5``), values are str()-ed; a value of None removes the variable. Defaults: gap 30
    min, lateness 10 min, 2 state partitions, SESSIONS_MAX_VERSIONS_PER_BATCH=1 (each ingest commit is its own
    micro-batch; pass ``SESSIONS_MAX_VERSIONS_PER_BATCH=None`` for "all available").
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


VENV_BIN = Path(sys.executable).parent  # the venv running the tests, wherever it is


def tool(name: str) -> str:
    path = VENV_BIN / name
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run `make setup` (console scripts of the test venv)")
    return str(path)


SESSIONCTL = VENV_BIN / "sessionctl"


DEFAULT_ENV = {
    "SESSIONS_STATE_PARTITIONS": "2",
    "SESSIONS_GAP_MINUTES": "30",
    "SESSIONS_LATENESS_MINUTES": "10",
    "SESSIONS_MAX_VERSIONS_PER_BATCH": "1",
    # Off unless a test turns it on (tests/test_idle_close.py): a test that runs longer than the default idle time
    # would otherwise get clock rows its oracle does not expect.
    "SESSIONS_IDLE_CLOSE_MINUTES": "0",
}


def make_config(tmp_path: Path, provider: str = "rocksdb", home: Path | str | None = None, **env):
    """A SessionsConfig rooted under tmp_path (see the module docstring for defaults)."""
    from pipelines.config import SessionsConfig

    values = {"SESSIONS_HOME": str(home or Path(tmp_path) / "home"), "SESSIONS_STATE_STORE": provider,
              **DEFAULT_ENV}
    for key, value in env.items():
        if value is None:
            values.pop(key, None)
        else:
            values[key] = str(value)
    return SessionsConfig.from_env(values)


def config_env(config, **extra) -> dict:
    """os.environ plus the SESSIONS_* variables that reproduce `config` in a subprocess (sessionctl)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONS_")}
    env.update({
        "SESSIONS_HOME": str(config.home),
        "SESSIONS_STATE_STORE": config.state_store,
        "SESSIONS_STATE_PARTITIONS": str(config.state_partitions),
        "SESSIONS_GAP_MINUTES": str(config.gap_minutes),
        "SESSIONS_LATENESS_MINUTES": str(config.lateness_minutes),
        "SESSIONS_STATE_BUCKETS": str(config.state_buckets),
        "SESSIONS_OPERATOR": config.operator,
        "SESSIONS_SAVEPOINT_URI": str(config.savepoint_uri),
        "SESSIONS_CHECKPOINT_URI": str(config.checkpoint_uri),
        "SESSIONS_WAREHOUSE_URI": str(config.warehouse_uri),
        "SESSIONS_LANDING_URI": str(config.landing_uri),
        "SESSIONS_IDLE_CLOSE_MINUTES": repr(config.rules.idle_close_ms / 60_000),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    })
    if config.max_versions_per_batch:
        env["SESSIONS_MAX_VERSIONS_PER_BATCH"] = str(config.max_versions_per_batch)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def assert_half_done_is_reported(config, status_field: str, command: str) -> None:
    """An interrupted restore/rescale, as an operator meets it: `status --json` names the command that finishes it,
    catch-up refuses in exactly one line naming it, and the Dagster check fails with it as the next step."""
    from assets.checks import no_restore_left_half_done
    from assets.resources import SessionsResource

    env = config_env(config)
    status = subprocess.run([tool("sessionctl"), "status", "--json", "--no-state"], env=env, capture_output=True,
                            text=True, timeout=120)
    assert json.loads(status.stdout)[status_field] == command
    refused = subprocess.run([tool("sessionctl"), "catch-up"], env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().count("\n") == 0 and f"finish it with `{command}`" in refused.stderr
    check = no_restore_left_half_done(SessionsResource(
        home=str(config.home), state_store=config.state_store, state_partitions=config.state_partitions,
        max_versions_per_batch=config.max_versions_per_batch))
    assert not check.passed and check.metadata["next_step"].value == command


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
