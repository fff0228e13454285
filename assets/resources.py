"""Dagster resources: the one configuration object (SessionsResource) and dagster-pyspark's session."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING, Any, TypeVar

from dagster import ConfigurableResource, Failure, MetadataValue
from dagster_pyspark import PySparkResource
from pydantic import create_model

from pipelines.config import SessionsConfig, env_name
from pipelines.errors import NextStepError, SessionsError
from pipelines.runtime import spark_conf

T = TypeVar("T")


def _settings() -> dict[str, Any]:
    """One optional field per SessionsConfig field, of its setting's kind (`home`, a path, as a string)."""
    return {setting.name: (setting.metadata.get("kind", str) | None, None) for setting in fields(SessionsConfig)}


if TYPE_CHECKING:
    _Settings = ConfigurableResource[Any]
else:
    # Derived, not copied: a setting added to SessionsConfig is a field here too (launchpad, EnvVar) at once.
    _Settings = create_model("SessionsSettings", __base__=ConfigurableResource, **_settings())


class SessionsResource(_Settings):
    """Every setting of SessionsConfig, as an optional field of the same name (derived from its fields). A field
    left unset comes from its SESSIONS_<NAME> environment variable (README.md, "Configuration"); set one in the
    launchpad, or with dagster.EnvVar in the Definitions."""

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
