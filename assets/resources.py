"""Dagster resources: the one configuration object (SessionsResource) and dagster-pyspark's session (SessionsSpark)."""
from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from dagster import ConfigurableResource, Failure, InitResourceContext, MetadataValue
from dagster_pyspark import LazyPySparkResource
from dagster_pyspark.resources import spark_session_from_config
from pydantic import Field, PrivateAttr

from pipelines.config import PATH_SETTINGS, SETTINGS, SessionsConfig
from pipelines.errors import ConfigError, NextStepError, SessionsError
from pipelines.job.runtime import spark_conf
from pipelines.settings import env_name

__all__ = ["SessionsResource", "SessionsSpark", "expected_errors", "pyspark_resource"]

T = TypeVar("T")
P = ParamSpec("P")


def _setting(name: str) -> Any:
    """A SessionsResource field for setting `name`: optional (unset: from the environment), described as the setting
    is (pipelines.config.SETTINGS, the one declaration; tests/test_settings_table.py checks names, order and kinds)."""
    return Field(default=None, description=_SETTINGS[name].description)


_SETTINGS = {setting.name: setting for setting in SETTINGS}


# Unparametrised, as Dagster's own resources subclass it (the parameter is the resource value: the resource itself).
class SessionsResource(ConfigurableResource):  # type: ignore[type-arg]
    """Every setting of pipelines.config.SessionsConfig but the secret ones (SESSIONS_KAFKA_CONF, SESSIONS_ERASURE_KEY:
    from the environment or a secret store only, so never stored in Dagster's run storage) and the environment-only
    ones (ENV_ONLY_SETTINGS: SESSIONS_SPARK_MASTER, which receives the AWS credentials), as an optional field of
    the same name and kind, in the same order, described as the setting is (made from SETTINGS). A field left unset
    (None) comes from its SESSIONS_<NAME> environment variable, and from SessionsConfig's default when that is unset
    too (README.md, "Configuration"); set one in the launchpad, or with dagster.EnvVar in the Definitions.
    SessionsConfig alone validates the values; the data locations (PATH_SETTINGS) the launchpad may only repeat, not
    change (config())."""

    # One field per setting run config may set (Setting.in_run_config), in SessionsConfig's order.
    home: str | None = _setting("home")
    state_store: str | None = _setting("state_store")
    state_partitions: int | None = _setting("state_partitions")
    gap_minutes: int | None = _setting("gap_minutes")
    lateness_minutes: int | None = _setting("lateness_minutes")
    savepoint_uri: str | None = _setting("savepoint_uri")
    warehouse_uri: str | None = _setting("warehouse_uri")
    landing_uri: str | None = _setting("landing_uri")
    checkpoint_uri: str | None = _setting("checkpoint_uri")
    webhdfs_address: str | None = _setting("webhdfs_address")
    lease_ttl_s: float | None = _setting("lease_ttl_s")
    lease_uri: str | None = _setting("lease_uri")
    lease_wait_s: float | None = _setting("lease_wait_s")
    state_buckets: int | None = _setting("state_buckets")
    operator: str | None = _setting("operator")
    max_versions_per_batch: int | None = _setting("max_versions_per_batch")
    spark_driver_memory: str | None = _setting("spark_driver_memory")
    spark_ui: bool | None = _setting("spark_ui")
    rocksdb_changelog: bool | None = _setting("rocksdb_changelog")
    min_batches_to_retain: int | None = _setting("min_batches_to_retain")
    savepoint_full_every: int | None = _setting("savepoint_full_every")
    savepoint_chain_share: float | None = _setting("savepoint_chain_share")
    savepoint_native: bool | None = _setting("savepoint_native")
    beside_stream_nice: int | None = _setting("beside_stream_nice")
    stop_timeout_s: float | None = _setting("stop_timeout_s")
    state_max_age_minutes: float | None = _setting("state_max_age_minutes")
    savepoint_max_age_hours: float | None = _setting("savepoint_max_age_hours")
    compact_files: int | None = _setting("compact_files")
    state_files: int | None = _setting("state_files")
    auto_restore: bool | None = _setting("auto_restore")
    observe_state_minutes: float | None = _setting("observe_state_minutes")
    keep_savepoints: int | None = _setting("keep_savepoints")
    keep_daily_days: int | None = _setting("keep_daily_days")
    vacuum_retention_hours: int | None = _setting("vacuum_retention_hours")
    erasure_deadline_hours: float | None = _setting("erasure_deadline_hours")
    erasure_drops_newer: bool | None = _setting("erasure_drops_newer")
    erasure_requests_uri: str | None = _setting("erasure_requests_uri")
    max_future_minutes: int | None = _setting("max_future_minutes")
    ingest_settle_seconds: int | None = _setting("ingest_settle_seconds")
    ingest_task_mib: int | None = _setting("ingest_task_mib")
    ingest_by_tasks: str | None = _setting("ingest_by_tasks")
    s3_max_retries: int | None = _setting("s3_max_retries")
    s3_retry_timeout: str | None = _setting("s3_retry_timeout")
    s3_timeout: str | None = _setting("s3_timeout")
    kafka_bootstrap: str | None = _setting("kafka_bootstrap")
    kafka_topic: str | None = _setting("kafka_topic")
    kafka_commit_messages: int | None = _setting("kafka_commit_messages")
    idle_close_minutes: float | None = _setting("idle_close_minutes")
    spec: str | None = _setting("spec")

    # What the run's own run config (the launchpad) set on this resource, seen at setup_for_execution: the settings
    # by name, and whether there is a run at all.
    _launched: dict[str, Any] = PrivateAttr(default_factory=dict)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        run = getattr(context, "run", None)  # None outside a run (a sensor's or a test's context)
        run_config: Any = getattr(run, "run_config", None)
        resources = run_config.get("resources") if isinstance(run_config, dict) else None
        resources = resources if isinstance(resources, dict) else {}
        mine = getattr(context, "resource_def", None)
        keys = [key for key, definition in (getattr(context, "all_resource_defs", None) or {}).items()
                if definition is mine] or list(resources)
        given: set[str] = set()
        for key in keys:
            entry = resources.get(key)
            settings = entry.get("config") if isinstance(entry, dict) else None
            given |= {name for name, value in (settings or {}).items() if value is not None}
        self._launched.update(run=run is not None, settings=given & set(type(self).model_fields))

    def config(self) -> SessionsConfig:
        """The environment, overridden by the fields set here; validated by SessionsConfig alone (floors of the
        settings that delete data, the Kafka allowlist: the CLI's rules). A data location (PATH_SETTINGS) set in a
        run's run config must be the environment's own: a deployment fixes them by environment, and the launchpad
        must not point a run at another data root, savepoint store or checkpoint. In a run, a refused setting is a
        Failure whose description is its one line."""
        try:
            env = dict(os.environ)
            for name, value in self.model_dump().items():
                if value is not None:
                    env[env_name(name)] = str(value).lower() if isinstance(value, bool) else str(value)
            config = SessionsConfig.from_env(env)
            launched = [name for name in PATH_SETTINGS if name in self._launched.get("settings", ())]
            if launched:
                fixed = SessionsConfig.from_env(os.environ)
                for name in launched:
                    if getattr(config, name) != getattr(fixed, name):
                        raise ConfigError(f"run config sets {name} to {str(getattr(config, name))!r}, not the "
                                          f"deployment's {str(getattr(fixed, name))!r}: data locations come from the "
                                          f"environment ({env_name(name)}), never from run config; remove {name} "
                                          "from the run config's resources.sessions.config")
            return config
        except ConfigError as error:
            if not self._launched.get("run"):
                raise
            raise Failure(description=str(error), metadata={"error": MetadataValue.text(type(error).__name__)},
                          allow_retries=False) from None


def expected_errors(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run a library call; an expected operator error becomes a Dagster Failure whose description is the
    library's one line (what happened and what to do), shown as is in the UI."""
    try:
        return fn(*args, **kwargs)
    except SessionsError as error:
        metadata = {"error": MetadataValue.text(type(error).__name__)}
        if isinstance(error, NextStepError):
            metadata["next_step"] = MetadataValue.text(error.next_step)
        raise Failure(description=str(error), metadata=metadata, allow_retries=False) from None


class SessionsSpark(LazyPySparkResource):
    """dagster-pyspark's lazy session with the job's own Spark settings, read from the environment when a step
    first asks for the session -- never stored in the definitions, so no launchpad shows this machine's class paths
    -- and never started by a run that fails its config checks first. `spark_config` adds to them (or overrides)."""

    spark_config: dict[str, Any] = Field(default_factory=dict, description=(
        "Spark settings added to the job's own, which come from the environment (SESSIONS_SPARK_MASTER, the "
        "state store settings, the class path of `make setup`'s jars): leave it empty unless a setting must differ "
        "for this run."))

    def _init_session(self) -> None:
        if self._spark_session is None:
            # pyspark's SparkContext takes SIGINT for itself (cancel the jobs, raise KeyboardInterrupt); started inside
            # a step, that would replace Dagster's handler, and a run cancelled from the UI would never hear of it.
            main = threading.current_thread() is threading.main_thread()
            dagster_handler = signal.getsignal(signal.SIGINT) if main else None
            self._spark_session = spark_session_from_config({**spark_conf(SessionsConfig.from_env()),
                                                              **self.spark_config})
            if main:
                signal.signal(signal.SIGINT, dagster_handler)


def pyspark_resource() -> SessionsSpark:
    """The session resource the definitions and the tests use."""
    # The driver tells its Python workers which interpreter to run from PYSPARK_PYTHON only
    # (pyspark/core/context.py): this environment's, which has pandas, pyarrow and the pipeline.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return SessionsSpark()
