"""Shared fixtures and helpers for the pipeline tests.

Fixtures
--------
``spark``        (session scope) the one SparkSession of the test run, made by ``pipelines.job.get_spark``.
                 It serves both state store providers: the provider is chosen per query start from the
                 config passed to ``catch_up(config, spark)``.
``make_config``  the ``make_config(tmp_path, provider="rocksdb", **env)`` helper below, as a fixture.

Helpers (import them with ``from tests.conftest import ...``)
-------------------------------------------------------------
``make_config(tmp_path, provider="rocksdb", **env) -> SessionsConfig``
    SESSIONS_HOME is ``tmp_path / "home"`` (override with ``home=...``). Keyword arguments are environment
    variable names (``SESSIONS_GAP_MINUTES=5``), values are str()-ed; a value of None removes the variable.
    Defaults: gap 30 min, lateness 10 min, 2 state partitions, SESSIONS_MAX_VERSIONS_PER_BATCH=1 (each ingest
    commit is its own micro-batch; pass ``SESSIONS_MAX_VERSIONS_PER_BATCH=None`` for "all available").
``config_env(config) -> dict``  the environment for a ``sessionctl`` subprocess running the same config.
``read_sessions(config) -> list[tuple]``  the sessions table as (session_id, user_id, start_ms, end_ms,
    event_count, page_views, end_reason) tuples, sorted.
``read_quarantine(config) -> pandas.DataFrame``  the quarantine table (event_time as epoch ms in ``event_time_ms``).
``read_open_events(spark, config) -> list[tuple]``  (user_id, event_id) of every event in the state store, sorted.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

REPO = Path(__file__).resolve().parent.parent
SESSIONCTL = Path(sys.executable).parent / "sessionctl"  # the venv running the tests

DEFAULT_ENV = {
    "SESSIONS_STATE_PARTITIONS": "2",
    "SESSIONS_GAP_MINUTES": "30",
    "SESSIONS_LATENESS_MINUTES": "10",
    "SESSIONS_MAX_VERSIONS_PER_BATCH": "1",
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
        "SESSIONS_SAVEPOINT_URI": str(config.savepoint_uri),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    })
    if config.max_versions_per_batch:
        env["SESSIONS_MAX_VERSIONS_PER_BATCH"] = str(config.max_versions_per_batch)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _ms(column) -> list:
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.divide(column.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()), 1000).to_pylist()


def read_sessions(config) -> list[tuple]:
    from deltalake import DeltaTable

    table = DeltaTable(config.sessions_table).to_pyarrow_table()
    rows = zip(table["session_id"].to_pylist(), table["user_id"].to_pylist(), _ms(table["session_start"]),
               _ms(table["session_end"]), table["event_count"].to_pylist(), table["page_views"].to_pylist(),
               table["end_reason"].to_pylist())
    return sorted(tuple(r) for r in rows)


def read_quarantine(config):
    import pyarrow as pa
    from deltalake import DeltaTable

    table = DeltaTable(config.quarantine_table).to_pyarrow_table()
    frame = table.drop_columns(["event_time", "quarantined_at"]).to_pandas()
    frame["event_time_ms"] = pa.array(_ms(table["event_time"]), pa.int64()).to_pandas(integer_object_nulls=True)
    return frame


def read_open_events(spark, config) -> list[tuple]:
    from state_store.state import read_state

    rows = read_state(spark, config.checkpoint).select("user_id", "event_id").collect()
    return sorted((r["user_id"], r["event_id"]) for r in rows)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """The one SparkSession (local[2]) for the whole test run; both providers share it."""
    from pipelines.job import get_spark

    home = tmp_path_factory.mktemp("spark-home")
    session = get_spark(make_config(home))
    yield session


@pytest.fixture(name="make_config")
def _make_config_fixture():
    """The make_config(tmp_path, provider="rocksdb", **env) helper (see the module docstring)."""
    return make_config
