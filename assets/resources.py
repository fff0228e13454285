"""Dagster resources: the one configuration object (SessionsResource) and dagster-pyspark's session."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from dagster import ConfigurableResource, Failure, InitResourceContext, MetadataValue
from dagster_pyspark import PySparkResource
from pydantic import Field, PrivateAttr

from pipelines.config import PATH_SETTINGS, SessionsConfig, env_name
from pipelines.errors import ConfigError, NextStepError, SessionsError
from pipelines.job.runtime import spark_conf

T = TypeVar("T")


# Unparametrised, as Dagster's own resources subclass it (the parameter is the resource value: the resource itself).
class SessionsResource(ConfigurableResource):  # type: ignore[type-arg]
    """Every setting of pipelines.config.SessionsConfig but the secret ones (SESSIONS_KAFKA_CONF, SESSIONS_ERASURE_KEY:
    from the environment or a secret store only, so never stored in Dagster's run storage) and the environment-only
    ones (ENV_ONLY_SETTINGS: SESSIONS_SPARK_MASTER, which receives the AWS credentials), as an optional field of
    the same name and kind, in the same order (tests/test_config.py keeps the two in step). A field left unset (None) comes from its SESSIONS_<NAME>
    environment variable, and from SessionsConfig's default when that is unset too (README.md, "Configuration"); set
    one in the launchpad, or with dagster.EnvVar in the Definitions. SessionsConfig alone validates the values; the
    data locations (PATH_SETTINGS) the launchpad may only repeat, not change (config())."""

    home: str | None = Field(default=None, description="SESSIONS_HOME: the data root (default: the repo's .data)")
    state_store: str | None = Field(default=None, description="SESSIONS_STATE_STORE: rocksdb (default) or hdfs")
    state_partitions: int | None = Field(
        default=None, description="SESSIONS_STATE_PARTITIONS: state store partitions of a new checkpoint (default 4)")
    gap_minutes: int | None = Field(
        default=None, description="SESSIONS_GAP_MINUTES: inactivity that ends a session (default 30)")
    lateness_minutes: int | None = Field(
        default=None, description="SESSIONS_LATENESS_MINUTES: how far behind the newest event the watermark trails "
                                  "(default 10)")
    savepoint_uri: str | None = Field(
        default=None, description="SESSIONS_SAVEPOINT_URI: a path or s3://bucket/prefix (default: "
                                  "$SESSIONS_HOME/savepoints)")
    warehouse_uri: str | None = Field(
        default=None, description="SESSIONS_WAREHOUSE_URI: where the Delta tables live, a path or s3://bucket/prefix "
                                  "(default: $SESSIONS_HOME/warehouse)")
    landing_uri: str | None = Field(
        default=None, description="SESSIONS_LANDING_URI: where event files land, a path or s3://bucket/prefix "
                                  "(default: $SESSIONS_HOME/landing)")
    checkpoint_uri: str | None = Field(
        default=None, description="SESSIONS_CHECKPOINT_URI: the Spark checkpoint's parent, a path every host shares "
                                  "(default: $SESSIONS_HOME/checkpoints)")
    lease_ttl_s: float | None = Field(
        default=None, description="SESSIONS_LEASE_TTL_S: a lease not renewed for this long may be taken over "
                                  "(default 60, at most one day)")
    lease_uri: str | None = Field(
        default=None, description="SESSIONS_LEASE_URI: where leases and stop requests live, a shared path or "
                                  "s3://bucket/prefix (default: _leases beside the checkpoint)")
    lease_wait_s: float | None = Field(
        default=None, description="SESSIONS_LEASE_WAIT_S: the longest ingest waits for the ingest lease (default 300)")
    state_buckets: int | None = Field(
        default=None, description="SESSIONS_STATE_BUCKETS: recorded in a new checkpoint's metadata (default 64)")
    operator: str | None = Field(
        default=None, description="SESSIONS_OPERATOR: the stateful operator, jvm (the only one; default unset: jvm)")
    max_versions_per_batch: int | None = Field(
        default=None, description="SESSIONS_MAX_VERSIONS_PER_BATCH: raw_events commits per micro-batch at most "
                                  "(default: all available)")
    # No spark_master: SESSIONS_SPARK_MASTER comes from the environment only (pipelines.config.ENV_ONLY_SETTINGS) --
    # the master gets the executors' AWS credentials, so run config must not be able to name one.
    spark_driver_memory: str | None = Field(
        default=None, description="SESSIONS_SPARK_DRIVER_MEMORY: the Spark driver's memory (default 4g)")
    spark_ui: bool | None = Field(default=None, description="SESSIONS_SPARK_UI: Spark's web UI on (default false)")
    rocksdb_changelog: bool | None = Field(
        default=None, description="SESSIONS_ROCKSDB_CHANGELOG: RocksDB changelog checkpointing (default true)")
    min_batches_to_retain: int | None = Field(
        default=None, description="SESSIONS_MIN_BATCHES_TO_RETAIN: checkpoint versions Spark keeps; a savepoint beside "
                                  "the stream must finish within this many batches (default 20)")
    savepoint_full_every: int | None = Field(
        default=None, description="SESSIONS_SAVEPOINT_FULL_EVERY: every Nth savepoint of a lineage is full, the others "
                                  "incremental where they can be (default 10; 1: always full)")
    savepoint_chain_share: float | None = Field(
        default=None, description="SESSIONS_SAVEPOINT_CHAIN_SHARE: a savepoint is full once its chain's increments "
                                  "would hold more rows than this share of the chain's full one (default 0.5)")
    stop_timeout_s: float | None = Field(
        default=None, description="SESSIONS_STOP_TIMEOUT_S: how long stopping the query may take (default 180)")
    state_max_age_minutes: float | None = Field(
        default=None, description="SESSIONS_STATE_MAX_AGE_MINUTES: the state_is_fresh check's limit (default 60)")
    savepoint_max_age_hours: float | None = Field(
        default=None, description="SESSIONS_SAVEPOINT_MAX_AGE_HOURS: the maintenance sensor asks for a savepoint when "
                                  "the newest is older (default 6)")
    compact_files: int | None = Field(
        default=None, description="SESSIONS_COMPACT_FILES: a table with more data files is due for compaction "
                                  "(default 200)")
    state_files: int | None = Field(
        default=None, description="SESSIONS_STATE_FILES: a checkpoint with more state files is due for compaction "
                                  "(default 2000)")
    auto_restore: bool | None = Field(
        default=None, description="SESSIONS_AUTO_RESTORE: the stream failure sensor starts the restore runbook "
                                  "(default false)")
    observe_state_minutes: float | None = Field(
        default=None, description="SESSIONS_OBSERVE_STATE_MINUTES: at most one Spark pass over the state per this "
                                  "(default 5)")
    keep_savepoints: int | None = Field(
        default=None, description="SESSIONS_KEEP_SAVEPOINTS: newest complete savepoints compaction keeps (default 5)")
    keep_daily_days: int | None = Field(
        default=None, description="SESSIONS_KEEP_DAILY_DAYS: plus the newest savepoint of each of these days "
                                  "(default 7)")
    vacuum_retention_hours: int | None = Field(
        default=None, description="SESSIONS_VACUUM_RETENTION_HOURS: Delta VACUUM horizon of the tables (default 168)")
    erasure_deadline_hours: float | None = Field(
        default=None, description="SESSIONS_ERASURE_DEADLINE_HOURS: older table versions holding an erased user are "
                                  "purged within this many hours (default 0: at once)")
    erasure_drops_newer: bool | None = Field(
        default=None, description="SESSIONS_ERASURE_DROPS_NEWER: the standing erasure also drops an erased user's "
                                  "events newer than the erasure (default false: those are kept as new data)")
    max_future_minutes: int | None = Field(
        default=None, description="SESSIONS_MAX_FUTURE_MINUTES: an event this far ahead of its ingest time is "
                                  "quarantined (default 60)")
    ingest_settle_seconds: int | None = Field(
        default=None, description="SESSIONS_INGEST_SETTLE_SECONDS: a landed file's unfinished last line counts once "
                                  "the file has not changed for this long (default 60)")
    s3_max_retries: int | None = Field(default=None, description="SESSIONS_S3_MAX_RETRIES: S3 retries (default 3)")
    s3_retry_timeout: str | None = Field(
        default=None, description="SESSIONS_S3_RETRY_TIMEOUT: S3 retries give up after this (default 15s)")
    s3_timeout: str | None = Field(default=None, description="SESSIONS_S3_TIMEOUT: one S3 request (default 30s)")
    kafka_bootstrap: str | None = Field(
        default=None, description="SESSIONS_KAFKA_BOOTSTRAP: host:port,... to ingest from Kafka (with "
                                  "kafka_topic; default unset: landing files)")
    kafka_topic: str | None = Field(default=None, description="SESSIONS_KAFKA_TOPIC: the topic (with kafka_bootstrap)")
    kafka_commit_messages: int | None = Field(
        default=None, description="SESSIONS_KAFKA_COMMIT_MESSAGES: messages per ingest commit at most (default 100000)")
    idle_close_minutes: float | None = Field(
        default=None, description="SESSIONS_IDLE_CLOSE_MINUTES: wall-clock minutes without an event before ingest "
                                  "appends a clock row; 0 turns it off (default: the lateness, the gap when that is 0)")

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
