"""The one configuration object, as a Dagster resource (env vars by default, overridable per run)."""
from __future__ import annotations

import os
import sys

from dagster import ConfigurableResource, Failure

from pipelines.config import SessionsConfig
from pipelines.errors import SessionsError

# Spark's Python workers must use this environment's interpreter (pandas, pyarrow, the pipeline).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


class SessionsResource(ConfigurableResource):
    """Settings of the session-tracking job; unset fields come from SESSIONS_* environment variables."""

    home: str | None = None
    state_store: str | None = None
    savepoint_uri: str | None = None

    def config(self) -> SessionsConfig:
        env = dict(os.environ)
        for key, value in (("SESSIONS_HOME", self.home), ("SESSIONS_STATE_STORE", self.state_store),
                           ("SESSIONS_SAVEPOINT_URI", self.savepoint_uri)):
            if value:
                env[key] = value
        return SessionsConfig.from_env(env)


def expected_errors(fn, *args, **kwargs):
    """Run a library call; an expected operator error becomes a clean Dagster Failure."""
    try:
        return fn(*args, **kwargs)
    except SessionsError as error:
        raise Failure(description=str(error)) from None


def pyspark_resource():
    """dagster-pyspark's resource, configured with the job's own Spark settings."""
    from dagster_pyspark import PySparkResource

    from pipelines.job import spark_conf

    return PySparkResource(spark_config=spark_conf(SessionsConfig.from_env()))
