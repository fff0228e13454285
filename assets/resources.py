"""Dagster resources: the one configuration object (SessionsResource) and dagster-pyspark's session."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from dagster import ConfigurableResource, Failure, MetadataValue
from dagster_pyspark import PySparkResource

from pipelines.config import SessionsConfig, env_name
from pipelines.errors import NextStepError, SessionsError
from pipelines.runtime import spark_conf

T = TypeVar("T")


class SessionsResource(ConfigurableResource):
    """Every setting of SessionsConfig. A field left unset comes from its SESSIONS_<NAME> environment
    variable (CONTRACT.md); set one in the launchpad, or with dagster.EnvVar in the Definitions."""

    home: str | None = None
    state_store: str | None = None
    state_partitions: int | None = None
    gap_minutes: int | None = None
    lateness_minutes: int | None = None
    savepoint_uri: str | None = None
    state_buckets: int | None = None
    max_versions_per_batch: int | None = None
    spark_master: str | None = None
    spark_driver_memory: str | None = None
    spark_ui: bool | None = None
    min_batches_to_retain: int | None = None
    stop_timeout_s: float | None = None
    state_max_age_minutes: float | None = None
    savepoint_max_age_hours: float | None = None
    compact_files: int | None = None
    state_files: int | None = None
    auto_restore: bool | None = None
    observe_state_minutes: float | None = None
    keep_savepoints: int | None = None
    keep_daily_days: int | None = None
    vacuum_retention_hours: int | None = None
    max_future_minutes: int | None = None
    s3_max_retries: int | None = None
    s3_retry_timeout: str | None = None
    s3_timeout: str | None = None

    def config(self) -> SessionsConfig:
        """The environment, overridden by the fields set here; validated by SessionsConfig alone."""
        env = dict(os.environ)
        for name, value in self.model_dump().items():
            if value is not None:
                env[env_name(name)] = str(value).lower() if isinstance(value, bool) else str(value)
        return SessionsConfig.from_env(env)


def expected_errors(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a library call; an expected operator error becomes a Dagster Failure whose description is the
    library's one line (what happened and what to do), shown as is in the UI."""
    try:
        return fn(*args, **kwargs)
    except SessionsError as error:
        metadata = {"error": MetadataValue.text(type(error).__name__)}
        if isinstance(error, NextStepError):
            metadata["next_step"] = MetadataValue.text(error.next_step)
        raise Failure(description=str(error), metadata=metadata, allow_retries=False) from None


def pyspark_resource(config: SessionsConfig | None = None) -> PySparkResource:
    """dagster-pyspark's resource with the job's own Spark settings."""
    # The driver tells its Python workers which interpreter to run from PYSPARK_PYTHON only
    # (pyspark/core/context.py): this environment's, which has pandas, pyarrow and the pipeline.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return PySparkResource(spark_config=spark_conf(config or SessionsConfig.from_env()))
