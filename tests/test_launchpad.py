"""A safe launchpad: what Dagster's run config may set, and what it may not.

- Settings that delete data have floors, in SessionsConfig's validation, so the CLI and Dagster agree:
  SESSIONS_VACUUM_RETENTION_HOURS >= 24 unless SESSIONS_ALLOW_SHORT_RETENTION=true is in the environment (never run
  config: no such field), SESSIONS_KEEP_SAVEPOINTS >= 1; SESSIONS_ERASURE_DEADLINE_HOURS is exempt.
- Data locations (home, savepoint, checkpoint, warehouse, landing, leases) set in a run's run config must be the
  environment's own: SessionsResource.config().
- librdkafka settings pass an allowlist (pipelines.kafka_conf), refused in one line naming the key, never the value.
- Secrets (SESSIONS_KAFKA_CONF, SESSIONS_ERASURE_KEY) are no fields: Dagster refuses them in run config, so they never
  reach its run storage. Nor is SESSIONS_SPARK_MASTER (it receives the executors' AWS keys): environment only.
No JVM: the jobs run in process up to their first op, which refuses before any data is touched.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import pytest
from dagster import DagsterInvalidConfigError, job, op

from assets.jobs import compaction, session_stream, state_lookup
from assets.resources import SessionsResource, pyspark_resource
from pipelines.config import PATH_SETTINGS, ConfigError, SessionsConfig, check_setting

pytestmark = pytest.mark.tier("pure")
REPO = Path(__file__).resolve().parent.parent


@op
def probe_op(sessions: SessionsResource) -> dict[str, Any]:
    config = sessions.config()
    return {"home": str(config.home), "vacuum_retention_hours": config.vacuum_retention_hours,
            "checkpoint_uri": config.checkpoint_uri, "gap_minutes": config.gap_minutes}


@job
def probe() -> None:
    probe_op()


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The deployment's environment: SESSIONS_HOME only (the data locations follow from it)."""
    for name in [name for name in os.environ if name.startswith("SESSIONS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SESSIONS_HOME", str(tmp_path / "home"))
    return {"SESSIONS_HOME": str(tmp_path / "home")}


def _run(job_def: Any, sessions: dict[str, Any] | None = None, ops: dict[str, Any] | None = None,
         **resources: Any) -> Any:
    run_config: dict[str, Any] = {}
    if sessions is not None:
        run_config["resources"] = {"sessions": {"config": sessions}}
    if ops is not None:
        run_config["ops"] = ops
    return job_def.execute_in_process(resources={"sessions": SessionsResource(), **resources}, run_config=run_config,
                                      raise_on_error=False)


def _failure(result: Any) -> str:
    """The step failure's description: the one line (a dagster Failure, no traceback of ours)."""
    assert not result.success
    [failure] = [event.step_failure_data for event in result.all_events if event.is_step_failure]
    assert failure.user_failure_data is not None, failure.error.to_string() if failure.error else failure
    description = failure.user_failure_data.description
    assert "\n" not in description and "Traceback" not in description
    return description


# --- floors of the settings that delete data (SessionsConfig: the CLI and Dagster alike) ---------------------------

def test_settings_that_delete_data_have_floors(env):
    for hours in ("0", "23"):
        with pytest.raises(ConfigError, match=f"SESSIONS_VACUUM_RETENTION_HOURS={hours} is below 24.*"
                                              "SESSIONS_ALLOW_SHORT_RETENTION=true"):
            SessionsConfig.from_env({**env, "SESSIONS_VACUUM_RETENTION_HOURS": hours})
    assert SessionsConfig.from_env({**env, "SESSIONS_VACUUM_RETENTION_HOURS": "24"}).vacuum_retention_hours == 24
    assert SessionsConfig.from_env(env).vacuum_retention_hours == 168
    forced = SessionsConfig.from_env({**env, "SESSIONS_VACUUM_RETENTION_HOURS": "0",
                                      "SESSIONS_ALLOW_SHORT_RETENTION": "true"})
    assert forced.vacuum_retention_hours == 0
    with pytest.raises(ConfigError, match="SESSIONS_ALLOW_SHORT_RETENTION='maybe': expected true or false"):
        SessionsConfig.from_env({**env, "SESSIONS_VACUUM_RETENTION_HOURS": "0",
                                 "SESSIONS_ALLOW_SHORT_RETENTION": "maybe"})
    with pytest.raises(ConfigError, match="SESSIONS_KEEP_SAVEPOINTS=0 must be >= 1"):
        SessionsConfig.from_env({**env, "SESSIONS_KEEP_SAVEPOINTS": "0"})
    with pytest.raises(ConfigError, match="--keep-last=0 must be >= 1"):  # the CLI's override: the same bound
        check_setting("keep_savepoints", 0, "--keep-last")
    with pytest.raises(ConfigError, match="SESSIONS_KEEP_DAILY_DAYS=1000000 must be <= 36500"):
        SessionsConfig.from_env({**env, "SESSIONS_KEEP_DAILY_DAYS": "1000000"})
    # The erasure's deadline is exempt: purging older versions at once is what it is for.
    assert SessionsConfig.from_env({**env, "SESSIONS_ERASURE_DEADLINE_HOURS": "0"}).erasure_deadline_hours == 0


def test_the_launchpad_cannot_lower_a_floor_nor_lift_it(env, monkeypatch):
    refused = _failure(_run(compaction, {"vacuum_retention_hours": 0}))  # the compaction job itself: nothing vacuumed
    assert refused.startswith("SESSIONS_VACUUM_RETENTION_HOURS=0 is below 24")
    assert _failure(_run(compaction, {"keep_savepoints": 0})).startswith("SESSIONS_KEEP_SAVEPOINTS=0 must be >= 1")
    # The force setting is the environment's: run config has no such field.
    assert "allow_short_retention" not in SessionsResource.model_fields
    with pytest.raises(DagsterInvalidConfigError, match="allow_short_retention"):
        _run(probe, {"allow_short_retention": True, "vacuum_retention_hours": 0})
    monkeypatch.setenv("SESSIONS_ALLOW_SHORT_RETENTION", "true")  # an operator's deliberate deployment setting
    result = _run(probe, {"vacuum_retention_hours": 0})
    assert result.success and result.output_for_node("probe_op")["vacuum_retention_hours"] == 0


# --- data locations come from the environment -----------------------------------------------------------------------

@pytest.mark.parametrize("setting", PATH_SETTINGS)
def test_run_config_cannot_point_a_run_at_another_data_location(env, tmp_path, setting):
    elsewhere = str(tmp_path / "elsewhere") if setting != "savepoint_uri" else "s3://someone-elses-bucket/savepoints"
    said = _failure(_run(probe, {setting: elsewhere}))
    assert said.startswith(f"run config sets {setting} to ") and "never from run config" in said
    own = getattr(SessionsConfig.from_env(os.environ), setting)  # the environment's own value may be repeated
    result = _run(probe, {setting: str(own), "gap_minutes": 45})
    assert result.success and result.output_for_node("probe_op")["gap_minutes"] == 45


def test_a_resource_configured_in_code_keeps_its_locations(env, tmp_path):
    """Definitions (or a test) that build the resource with a home: that is code, reviewed and deployed, not the
    launchpad -- allowed."""
    home = tmp_path / "other-home"
    result = probe.execute_in_process(resources={"sessions": SessionsResource(home=str(home))}, raise_on_error=False)
    assert result.success and result.output_for_node("probe_op")["home"] == str(home.resolve())
    assert SessionsResource(checkpoint_uri=str(tmp_path / "ck")).config().checkpoint_uri == str(tmp_path / "ck")


# --- secrets and Kafka settings ------------------------------------------------------------------------------------

@pytest.mark.parametrize("secret", ["kafka_conf", "erasure_key"])
def test_secrets_are_not_run_config(env, secret):
    assert secret not in SessionsResource.model_fields
    with pytest.raises(DagsterInvalidConfigError, match=f'unexpected config entry "{secret}"'):
        _run(probe, {secret: "hunter2"})


def test_the_spark_master_is_not_run_config(env, monkeypatch):
    """The master gets the executors' AWS keys (spark.executorEnv.AWS_*): run config cannot name one, the
    environment still does."""
    assert "spark_master" not in SessionsResource.model_fields
    with pytest.raises(DagsterInvalidConfigError, match='unexpected config entry "spark_master"'):
        _run(probe, {"spark_master": "spark://attacker.example:7077"})
    monkeypatch.setenv("SESSIONS_SPARK_MASTER", "local[1]")
    assert SessionsResource().config().spark_master == "local[1]"


def test_kafka_settings_pass_the_allowlist_in_a_run_too(env, monkeypatch):
    monkeypatch.setenv("SESSIONS_KAFKA_CONF", "security.protocol=SASL_SSL,plugin.library.paths=/tmp/evil.so")
    said = _failure(_run(probe))
    assert "'plugin.library.paths' is not an allowed consumer setting" in said and "/tmp/evil.so" not in said
    monkeypatch.setenv("SESSIONS_KAFKA_CONF", '{"isolation.level": "read_uncommitted", "sasl.password": "hunter2"}')
    said = _failure(_run(probe))
    assert "isolation.level may only be read_committed" in said and "hunter2" not in said
    monkeypatch.setenv("SESSIONS_KAFKA_CONF", "security.protocol=SASL_SSL,sasl.password=hunter2,group.id=g")
    assert _run(probe).success


# --- op config -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("poll", [0.0, -1.0])
def test_a_stream_that_would_spin_is_refused(env, poll):
    result = _run(session_stream, ops={"stream_op": {"config": {"poll_seconds": poll}}}, pyspark=MagicMock())
    assert _failure(result) == f"poll_seconds={poll} must be > 0"


def test_a_negative_top_is_refused(env):
    result = _run(state_lookup, ops={"lookup_state_op": {"config": {"top": -3}}}, pyspark=MagicMock())
    assert "set exactly one of user_id and top" in _failure(result)


def test_a_lookup_without_user_or_top_fails_before_spark_starts(env):
    """The launchpad's defaults (neither user_id nor top) are refused by the op before it asks for the session:
    the real Spark resource, lazy, never started a JVM."""
    spark = pyspark_resource()
    result = _run(state_lookup, ops={"lookup_state_op": {"config": {}}}, pyspark=spark)
    assert "set exactly one of user_id and top" in _failure(result)
    assert spark._spark_session is None
    (failure,) = [event.step_failure_data for event in result.all_events if event.is_step_failure]
    assert "lookup_state_op" in failure.user_failure_data.metadata["next_step"].value


def test_no_launchpad_holds_machine_specific_spark_settings():
    """The definitions' resources carry no Spark setting of this machine (class paths, the class archive, log4j):
    the session resource reads them from the environment when a step starts Spark."""
    from dagster._config import post_process_config

    from assets.definitions import defs

    for job_def in defs.jobs:  # the resources' config a launchpad opens with: every default filled in
        scaffold = post_process_config(job_def.run_config_schema.config_type.fields["resources"].config_type, {})
        assert scaffold.success, job_def.name
        shown = str(scaffold.value)
        assert not any(word in shown for word in ("extraClassPath", "SharedArchiveFile", "log4j", str(REPO))), \
            (job_def.name, shown[:500])
    assert defs.resources["pyspark"].spark_config == {}  # what the launchpads would show of the session resource


def test_every_launchpad_field_is_described():
    from assets.definitions import defs

    missing = []
    for job_def in defs.jobs:
        for node in job_def.graph.node_defs:
            schema = getattr(node, "config_schema", None)
            fields = getattr(getattr(schema, "config_type", None), "fields", None) or {}
            missing += [f"{job_def.name}.{node.name}.{name}" for name, field in fields.items() if not field.description]
    assert missing == []


def test_the_restore_runbook_launched_unchanged_is_a_dry_run():
    from assets.runbook import RestoreConfig

    assert RestoreConfig().dry_run is True
