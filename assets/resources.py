"""Dagster resources: the one configuration object (SessionsResource) and dagster-pyspark's session (SessionsSpark)."""
from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from dagster import ConfigurableResource, Failure, InitResourceContext, MetadataValue
from dagster_pyspark import LazyPySparkResource
from dagster_pyspark.resources import spark_session_from_config
from pydantic import Field, PrivateAttr, create_model

from pipelines.config import PATH_SETTINGS, SETTINGS, SessionsConfig
from pipelines.errors import ConfigError, NextStepError, SessionsError
from pipelines.job.runtime import spark_conf
from pipelines.settings import env_name

__all__ = ["SessionsResource", "SessionsSpark", "expected_errors", "pyspark_resource"]

T = TypeVar("T")
P = ParamSpec("P")


def _run_config_fields() -> dict[str, Any]:
    """One optional field per setting run config may set (Setting.in_run_config), of the setting's kind, in
    SessionsConfig's order, with its description; unset (None), the setting comes from the environment."""
    return {setting.name: (setting.kind | None, Field(default=None, description=setting.description))
            for setting in SETTINGS if setting.in_run_config}


# The fields come from the settings' one declaration (pipelines.config); the type checker sees the base without them.
if TYPE_CHECKING:
    _Settings = ConfigurableResource
else:
    _Settings = create_model("SessionsSettings", __base__=ConfigurableResource, __module__=__name__,
                             **_run_config_fields())


# Unparametrised, as Dagster's own resources subclass it (the parameter is the resource value: the resource itself).
class SessionsResource(_Settings):  # type: ignore[type-arg]
    """Every setting of pipelines.config.SessionsConfig but the secret ones (SESSIONS_KAFKA_CONF, SESSIONS_ERASURE_KEY:
    from the environment or a secret store only, so never stored in Dagster's run storage) and the environment-only
    ones (ENV_ONLY_SETTINGS: SESSIONS_SPARK_MASTER, which receives the AWS credentials), as an optional field of
    the same name and kind, in the same order, described as the setting is (made from SETTINGS). A field left unset
    (None) comes from its SESSIONS_<NAME> environment variable, and from SessionsConfig's default when that is unset
    too (README.md, "Configuration"); set one in the launchpad, or with dagster.EnvVar in the Definitions.
    SessionsConfig alone validates the values; the data locations (PATH_SETTINGS) the launchpad may only repeat, not
    change (config())."""

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
