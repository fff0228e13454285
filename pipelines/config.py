"""The one configuration object, read from the environment: every setting declared once, beside its field --
variable (SESSIONS_<NAME>), default, one-line description. The Dagster resource (assets/resources.py) and README.md's
table ("Configuration", pipelines/settings_table.py) are made from these declarations. What one declaration holds:
pipelines/settings.py. Reading and checking a value: pipelines/config_checks.py."""
from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pipelines.config_checks import (
    check_directories,
    check_driver_memory,
    check_duration,
    check_spark_master,
    check_uri,
    checked_checkpoint_uri,
    read_bool,
    read_float,
    read_int,
    resolved_lease_uri,
)
from pipelines.core.rules import SessionRules
from pipelines.core.spec import SessionSpec
from pipelines.errors import ConfigError
from pipelines.kafka_conf import check_kafka_settings, kafka_settings
from pipelines.locations import CheckpointPath, checkpoint_path, name_hdfs_location
from pipelines.settings import Setting, env_name, setting_field
from pipelines.spec_file import read_spec

__all__ = ["ALLOW_SHORT_RETENTION", "DEFAULT_OPERATOR", "ENV_ONLY_SETTINGS", "MAX_LEASE_TTL_S", "MAX_PARTITIONS",
           "MIN_LEASE_TTL_S", "MIN_VACUUM_RETENTION_HOURS", "OPERATORS", "PATH_SETTINGS", "PROVIDERS", "REPO_ROOT",
           "SETTINGS", "URI_SETTINGS", "ConfigError", "Provider", "SessionsConfig", "check_setting",
           "kafka_settings"]  # ConfigError lives with the other errors; importable from here too

REPO_ROOT = Path(__file__).resolve().parent.parent
Provider = Literal["rocksdb", "hdfs"]  # the state store providers (SESSIONS_STATE_STORE)
PROVIDERS: tuple[Provider, ...] = ("rocksdb", "hdfs")
# SESSIONS_INGEST_BY_TASKS: on one host the ingesting process is the cheaper reader (benchmarks/README.md, "Ingest by
# Spark tasks"); a cluster's executors add cores it does not have.
INGEST_BY_TASKS = ("cluster", "always", "never")
OPERATORS = ("jvm",)  # SESSIONS_OPERATOR (pipelines.job.operators.seam; the Python operator is retired: operator_buckets)
MAX_LEASE_TTL_S = 86_400.0  # SESSIONS_LEASE_TTL_S at most (one day): the renewal thread waits TTL/3 at a time
# SESSIONS_LEASE_TTL_S at least: a holder renews every TTL/3 (pipelines.coordination.leases), so a TTL of milliseconds would have
# renewals race their own expiry (any GC pause or slow store write loses the lease) and spin the renewal thread.
MIN_LEASE_TTL_S = 1.0
# The state partitions a restore or rescale may ask for (`--partitions`): each is a Spark task, a state store instance
# and its files every batch; far above any real job, far below what overflows Spark's int.
MAX_PARTITIONS = 10_000
DEFAULT_OPERATOR = "jvm"
# Settings that delete data have floors; below them only with this variable set in the environment (never from run
# config: SessionsResource has no such field). erasure_deadline_hours is exempt: purging early is the erasure's point.
MIN_VACUUM_RETENTION_HOURS = 24
ALLOW_SHORT_RETENTION = "SESSIONS_ALLOW_SHORT_RETENTION"


# Settings that take a local path or s3://bucket/prefix (the checkpoint's is checked on its own: no s3 there).
URI_SETTINGS = ("savepoint_uri", "warehouse_uri", "landing_uri", "lease_uri", "erasure_requests_uri")
# The data locations (SESSIONS_HOME first): a local one must be a directory, or not exist yet under one.
PATH_SETTINGS = ("home", "savepoint_uri", "warehouse_uri", "landing_uri", "checkpoint_uri", "lease_uri",
                 "erasure_requests_uri")


@dataclass(frozen=True)
class SessionsConfig:
    """Every setting of the product; `from_env` reads each from SESSIONS_<NAME> (README.md, "Configuration")."""

    home: Path = setting_field(MISSING, "the data root: the data locations default to directories in it; set but "
                               "empty is refused", shown="the repo's .data", kind=str)
    state_store: str = setting_field("rocksdb", "the state store provider: rocksdb or hdfs")
    state_partitions: int = setting_field(4, "state store partitions of a new checkpoint")
    gap_minutes: int = setting_field(30, "inactivity that ends a session")
    lateness_minutes: int = setting_field(10, "how far behind the newest event the watermark trails", minimum=0)
    savepoint_uri: str = setting_field("", "where savepoints live: a path or s3://bucket/prefix",
                                       shown="$SESSIONS_HOME/savepoints")
    warehouse_uri: str = setting_field("", "where the Delta tables live: a path or s3://bucket/prefix",
                                       shown="$SESSIONS_HOME/warehouse")
    landing_uri: str = setting_field("", "where event files land: a path or s3://bucket/prefix",
                                     shown="$SESSIONS_HOME/landing")
    # One filesystem for every host that runs the job; the driver reads the checkpoint's logs itself
    # (pipelines.locations: HDFS through WebHDFS, S3 through pyarrow).
    checkpoint_uri: str = setting_field("", "the Spark checkpoint's parent (the leases' too): a local or mounted path "
                                        "every host shares, hdfs://namenode:port/path or s3a://bucket/prefix",
                                        shown="$SESSIONS_HOME/checkpoints")
    webhdfs_address: str = setting_field("", "the NameNode's HTTP address (host:port) for an hdfs:// checkpoint or "
                                         "lease location: the driver reads the checkpoint's logs and keeps the leases "
                                         "through WebHDFS; needed when that port is not 9870",
                                         shown="the NameNode's host, port 9870")
    # Leases (pipelines/coordination/leases.py): a holder that lost its lease is fenced from then on.
    lease_ttl_s: float = setting_field(60.0, f"a lease not renewed for this long may be taken over: {MIN_LEASE_TTL_S:g} s "
                                       f"to {MAX_LEASE_TTL_S:g} s, a day (holders renew every TTL/3)", minimum=0, maximum=math.inf)  # MIN_/MAX_LEASE_TTL_S: from_env
    lease_uri: str = setting_field("", "where the leases and stop and erasure requests live: a shared path, "
                                   "s3://bucket/prefix or hdfs://namenode:port/path", shown="_leases beside the checkpoint")
    lease_wait_s: float = setting_field(300.0, "the longest ingest waits for the ingest lease", minimum=0, inclusive=True)
    # Only the retired Python operator's state was keyed by hash buckets of user_id (pipelines.job.operators.buckets).
    state_buckets: int = setting_field(64, "recorded in a new checkpoint's metadata; only the retired Python operator's "
                                       "checkpoints are keyed by hash buckets (read with the count they recorded)")
    # The JVM operator: jvm/operator/src/main/java/sessions/SessionsOperator.java (flatMapGroupsWithState, per user).
    operator: str = setting_field("", "the stateful operator: jvm, the only one (python is refused in one line: that "
                                  "operator is retired; its checkpoints move over with a savepoint and a restore)",
                                  shown="unset (jvm)")
    max_versions_per_batch: int | None = setting_field(None, "raw_events commits per micro-batch at most",
                                                       shown="all available", kind=int)
    # Spark (the CLI's session and Dagster's PySparkResource share them); the master: ENV_ONLY_SETTINGS says why.
    spark_master: str = setting_field("local[2]", "the Spark master: local, local[N], local[*], local[N,F], "
                                      "spark://host:port[,host:port], k8s://https://host:port or yarn; it receives the "
                                      "executors' AWS credentials", env_only=True)
    spark_driver_memory: str = setting_field("4g", "the Spark driver's memory as the JVM's -Xmx takes it: a number and k, "
                                             "m, g or t, from 512m (Spark's floor) to 64t")
    spark_ui: bool = setting_field(False, "Spark's web UI on")
    # Changelog: the commit's fixed cost per batch (benchmarks/README.md); snapshots are uploaded in the background.
    rocksdb_changelog: bool = setting_field(True, "RocksDB changelog checkpointing (Spark's default is off); switching "
                                            "either way keeps the state")
    # Savepoints are the long-term recovery points; the checkpoint keeps a short tail of versions.
    min_batches_to_retain: int = setting_field(20, "checkpoint versions Spark keeps; a savepoint beside the stream pins "
                                               "the batch it reads first, whatever this is")
    # Incremental savepoints: state_store/savepoint/policy.py.
    savepoint_full_every: int = setting_field(10, "every Nth savepoint of a lineage is full, the others incremental where "
                                              "they can be (1: always full)")
    savepoint_chain_share: float = setting_field(0.5, "a savepoint is full once its chain's increments would hold more rows "
                                                 "than this share of the chain's full one", minimum=0)
    savepoint_native: bool = setting_field(False, "every savepoint also keeps a native copy (the checkpoint's own files of "
                                           "its batch; sessionctl savepoint --native asks for one)")
    # On one host the stream and a savepoint beside it share the cores; a nice value makes the savepoint give way.
    beside_stream_nice: int = setting_field(10, "the CPU priority (nice, 0-19) that a savepoint or compaction started "
                                            "beside a stream running on the same host lowers itself to before its JVM "
                                            "starts, so that the stream's batches keep their pace; 0: none",
                                            minimum=0, maximum=19)
    # Operations (Dagster runbook, checks and sensors).
    stop_timeout_s: float = setting_field(180.0, "how long stopping the query may take; sessionctl stop waits twice this "
                                          "for the answer", minimum=0)
    state_max_age_minutes: float = setting_field(60.0, "the state_is_fresh check's limit", minimum=0)
    savepoint_max_age_hours: float = setting_field(6.0, "the savepoint policy: the maintenance sensor asks for a savepoint "
                                                   "when the newest is older", minimum=0)
    compact_files: int = setting_field(200, "a table with more data files is due for compaction")
    state_files: int = setting_field(2000, "a checkpoint with more state files is due for compaction")
    auto_restore: bool = setting_field(False, "the stream failure sensor starts the restore runbook")
    observe_state_minutes: float = setting_field(5.0, "at most one Spark pass over the state (an observe_state run) per "
                                                 "this", minimum=0)
    # Retention (sessionctl compact, the Dagster compaction job and its schedule share them).
    keep_savepoints: int = setting_field(5, "newest complete savepoints compaction keeps (sessionctl compact --keep-last "
                                         "overrides it)")
    keep_daily_days: int = setting_field(7, "plus the newest savepoint of each of these days (sessionctl compact "
                                         "--keep-daily-days overrides it)", minimum=0, maximum=36_500)
    vacuum_retention_hours: int = setting_field(168, f"Delta VACUUM horizon of the tables: at least "
                                                f"{MIN_VACUUM_RETENTION_HOURS} unless {ALLOW_SHORT_RETENTION}=true (an "
                                                "environment variable only)", minimum=0)
    # Forget purges what is older; compaction then vacuums with at most this horizon while erasures are recorded.
    erasure_deadline_hours: float = setting_field(0.0, "sessionctl forget: older table versions holding an erased user are "
                                                  "purged within this many hours (0: at once)", minimum=0, inclusive=True)
    # A secret: from the environment or a secret store, never run config.
    erasure_key: str = setting_field("", "the key of the erasure log's keyed hash of user ids (HMAC-SHA256)",
                                     shown="a key generated once in $SESSIONS_HOME/erasure.key", secret=True)
    # Unset, an erased user's events newer than the erasure are new data (the user came back); set, a user who asked
    # never to be tracked again stays untracked. Events at or before the erasure are dropped either way.
    erasure_drops_newer: bool = setting_field(False, "the standing erasure also drops an erased user's events newer than "
                                              "the erasure (unset: those are kept as new data)")
    # A compliance workflow's inbox (state_store/erasure_requests.py): request files, erased in batches.
    erasure_requests_uri: str = setting_field("", "where erasure requests are dropped: a path or s3://bucket/prefix; "
                                              "each file named *.users lists user ids, one per line",
                                              shown="$SESSIONS_HOME/erasure_requests")
    # Hostile input (contract).
    max_future_minutes: int = setting_field(60, "an event this far ahead of its ingest time is quarantined", minimum=0)
    # A last line that parses as a JSON object counts at once; see pipelines/ingest/local.py.
    ingest_settle_seconds: int = setting_field(60, "a landed file's unfinished last line counts once the file has not "
                                               "changed for this long", minimum=0)
    # Large landed files are read by Spark tasks where the Spark job runs (pipelines/job/ingest_tasks.py).
    ingest_task_mib: int = setting_field(64, "a landed file with at least this many new MiB is read and parsed by Spark "
                                         "tasks (catch-up and run; see SESSIONS_INGEST_BY_TASKS)", minimum=1)
    ingest_by_tasks: str = setting_field("cluster", "when Spark tasks read large landed files: cluster (a master that is "
                                         "not local), always, or never")
    # S3 (delta-rs/object_store): fail in seconds, not after the default 10 retries over 3 minutes.
    s3_max_retries: int = setting_field(3, "S3 retries of a request", minimum=0)
    s3_retry_timeout: str = setting_field("15s", "S3 retries give up after this (a duration: 30s, 500ms, 2min, 1h)")
    s3_timeout: str = setting_field("30s", "one S3 request gives up after this (a duration)")
    # Kafka as the source instead of landing files (pipelines/ingest/kafka.py).
    kafka_bootstrap: str = setting_field("", "host:port,... of the Kafka brokers to ingest from; with SESSIONS_KAFKA_TOPIC, "
                                         "both or neither", shown="unset (landing files)")
    kafka_topic: str = setting_field("", "the Kafka topic to ingest from; with SESSIONS_KAFKA_BOOTSTRAP")
    kafka_conf: str = setting_field("", "librdkafka consumer settings (security.protocol, the sasl and ssl ones, "
                                    "group.id, ...), key=value,... or a JSON object, on an allowlist: nothing that loads "
                                    "code or runs a command", shown="none", secret=True)
    kafka_commit_messages: int = setting_field(100_000, "messages per ingest commit at most (read by Spark tasks: per partition)")
    # Idle close (README "Idle close"): the lateness is the longest that never makes an event late (SessionRules.default_idle_close_ms).
    idle_close_minutes: float | None = setting_field(None, "wall-clock minutes without an event before ingest appends a "
                                                     "clock row to raw_events; 0 turns it off; fractions allowed",
                                                     shown="the lateness (the gap when the lateness is 0)", minimum=0,
                                                     kind=float, inclusive=True)
    # The session spec (pipelines/core/spec.py, docs/session-spec.md): read and checked once, by from_env.
    spec: str = setting_field("", "the session spec: a YAML or JSON file (a path or s3://bucket/key) saying where "
                              "event_id, user_id, event_time, event_type and typed extra fields are in each event, and "
                              "the sessions' attributes: extra columns of sessions (first, last, count_if, sum, min, max "
                              "over the session's events; docs/session-spec.md); a running stream takes a changed "
                              "spec between two batches", shown="unset (the contract's five fields, no attributes)")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SessionsConfig:
        env = dict(os.environ if env is None else env)
        if "SESSIONS_HOME" in env and not env["SESSIONS_HOME"].strip():
            # An empty value is a broken deployment template, not a wish for the repo's .data.
            raise ConfigError("SESSIONS_HOME is set but empty: unset it (data under the repo's .data) or give a path")
        home = Path(env.get("SESSIONS_HOME") or REPO_ROOT / ".data").resolve()
        values: dict[str, Any] = {}
        for setting in SETTINGS:
            if setting.name == "home":
                continue
            name = setting.env
            if setting.kind is bool:
                values[setting.name] = read_bool(env, name, setting.default)
            elif setting.kind is int:
                values[setting.name] = read_int(env, name, setting.default, setting.minimum, setting.maximum)
            elif setting.kind is float:
                values[setting.name] = read_float(env, name, setting.default, setting.minimum, setting.inclusive,
                                                  setting.maximum)
            else:
                values[setting.name] = (env.get(name) or "").strip() or setting.default
        values["state_store"] = values["state_store"].lower()
        if values["state_store"] not in PROVIDERS:
            raise ConfigError(f"SESSIONS_STATE_STORE={values['state_store']!r}: expected one of {', '.join(PROVIDERS)}")
        values["ingest_by_tasks"] = values["ingest_by_tasks"].lower()
        if values["ingest_by_tasks"] not in INGEST_BY_TASKS:
            raise ConfigError(f"SESSIONS_INGEST_BY_TASKS={values['ingest_by_tasks']!r}: expected one of "
                              f"{', '.join(INGEST_BY_TASKS)}")
        values["operator"] = values["operator"].lower()
        if values["operator"] == "python":
            raise ConfigError("SESSIONS_OPERATOR=python: the Python operator is retired; unset SESSIONS_OPERATOR (its "
                              "checkpoints move to the JVM operator with `sessionctl savepoint` and `sessionctl "
                              "restore --savepoint latest`)")
        if values["operator"] and values["operator"] not in OPERATORS:
            raise ConfigError(f"SESSIONS_OPERATOR={values['operator']!r}: expected one of {', '.join(OPERATORS)}")
        for setting_name in URI_SETTINGS:  # as given: before a default or resolved_lease_uri's clean-up changes it
            check_uri(name=env_name(setting_name), raw=values[setting_name], hdfs=setting_name == "lease_uri")
        values["savepoint_uri"] = values["savepoint_uri"] or str(home / "savepoints")
        values["warehouse_uri"] = (values["warehouse_uri"] or str(home / "warehouse")).rstrip("/")
        values["landing_uri"] = (values["landing_uri"] or str(home / "landing")).rstrip("/")
        values["erasure_requests_uri"] = (values["erasure_requests_uri"] or str(home / "erasure_requests")).rstrip("/")
        values["checkpoint_uri"] = checked_checkpoint_uri(values["checkpoint_uri"], home=home)
        if values["lease_ttl_s"] > MAX_LEASE_TTL_S:
            raise ConfigError(f"SESSIONS_LEASE_TTL_S={values['lease_ttl_s']:g} is too long: at most {MAX_LEASE_TTL_S:g} "
                              "(one day; a holder that died blocks the job for this long)")
        if values["lease_ttl_s"] < MIN_LEASE_TTL_S:
            raise ConfigError(f"SESSIONS_LEASE_TTL_S={values['lease_ttl_s']:g} is too short: at least "
                              f"{MIN_LEASE_TTL_S:g} s (a holder renews every TTL/3; shorter, any pause or slow write "
                              "loses the lease)")
        lease_given = bool(values["lease_uri"])
        values["lease_uri"] = resolved_lease_uri(values["lease_uri"], values["checkpoint_uri"])
        # HDFS's failures name the setting of the location they hit; SESSIONS_WEBHDFS_ADDRESS is the checkpoint's
        # NameNode's (the leases' when only they are on HDFS).
        webhdfs = values["webhdfs_address"]
        if values["checkpoint_uri"].startswith("hdfs://"):
            name_hdfs_location(values["checkpoint_uri"], setting="SESSIONS_CHECKPOINT_URI", webhdfs=webhdfs)
            webhdfs = ""
        if values["lease_uri"].startswith("hdfs://") and lease_given:
            name_hdfs_location(values["lease_uri"], setting="SESSIONS_LEASE_URI", webhdfs=webhdfs)
        check_directories(env=env, locations={env_name(name): str(home if name == "home" else values[name])
                                              for name in PATH_SETTINGS})
        check_spark_master(values["spark_master"])
        check_driver_memory(values["spark_driver_memory"])
        for duration in ("s3_timeout", "s3_retry_timeout"):  # object_store reads them at the first S3 request
            check_duration(name=env_name(duration), value=values[duration])
        if values["vacuum_retention_hours"] < MIN_VACUUM_RETENTION_HOURS and not read_bool(env, ALLOW_SHORT_RETENTION,
                                                                                           False):
            raise ConfigError(f"SESSIONS_VACUUM_RETENTION_HOURS={values['vacuum_retention_hours']} is below "
                              f"{MIN_VACUUM_RETENTION_HOURS}: VACUUM would delete table files a reader, a restore or "
                              f"the stream may still need; at least {MIN_VACUUM_RETENTION_HOURS}, or set "
                              f"{ALLOW_SHORT_RETENTION}=true in the environment")
        if bool(values["kafka_bootstrap"]) != bool(values["kafka_topic"]):
            given, missing = (("SESSIONS_KAFKA_BOOTSTRAP", "SESSIONS_KAFKA_TOPIC") if values["kafka_bootstrap"]
                              else ("SESSIONS_KAFKA_TOPIC", "SESSIONS_KAFKA_BOOTSTRAP"))
            raise ConfigError(f"{given} is set but {missing} is not: set both to ingest from Kafka, or neither to "
                              "ingest landing files")
        check_kafka_settings(kafka_settings(values["kafka_conf"]))  # refused now, in one line, not at the first ingest
        config = cls(home=home, **values)
        _ = config.session_spec  # the spec file is read and checked now: a bad one is refused in one line
        return config

    def with_(self, **changes: Any) -> SessionsConfig:
        return replace(self, **changes)

    @property
    def new_checkpoint_operator(self) -> str:
        """The operator a new checkpoint (a fresh start or a restore) is made with."""
        return self.operator or DEFAULT_OPERATOR

    # Paths under the data root.
    @property
    def landing(self) -> Path:
        """The landing directory when it is local (S3 landing is listed through pipelines.storage)."""
        return Path(self.landing_uri.removeprefix("file://"))

    @property
    def checkpoint(self) -> CheckpointPath:
        """The Spark checkpoint: a local Path, or a RemotePath on HDFS or S3 (pipelines.locations)."""
        return checkpoint_path(self.checkpoint_uri, webhdfs=self.webhdfs_address) / "sessions"

    @property
    def lease_dir(self) -> Path:
        """Where leases live when lease_uri is a path (beside the checkpoint by default, on the filesystem every host
        shares); for an s3:// or hdfs:// lease_uri, pass lease_uri itself to pipelines.coordination.leases."""
        return Path(self.lease_uri)

    def table_uri(self, name: str) -> str:
        return f"{self.warehouse_uri}/{name}"

    @property
    def raw_events_table(self) -> str:
        return self.table_uri("raw_events")

    @property
    def sessions_table(self) -> str:
        return self.table_uri("sessions")

    @property
    def quarantine_table(self) -> str:
        return self.table_uri("quarantine")

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    @cached_property
    def rules(self) -> SessionRules:
        """The session rules of these settings and SESSIONS_SPEC (pipelines.core.rules), made once per
        configuration. The idle close unset is the lateness (SessionRules.default_idle_close_ms); 0 turns it off."""
        gap, lateness = self.gap_minutes * 60_000, self.lateness_minutes * 60_000
        idle = (SessionRules.default_idle_close_ms(gap, lateness) if self.idle_close_minutes is None
                else round(self.idle_close_minutes * 60_000))
        return SessionRules(gap, lateness, idle, self.session_spec)

    @property
    def max_future_ms(self) -> int:
        return self.max_future_minutes * 60_000

    @property
    def large_files_by_tasks(self) -> bool:
        """Whether catch-up and run have Spark tasks read large landed files (SESSIONS_INGEST_BY_TASKS)."""
        return self.ingest_by_tasks == "always" or (
            self.ingest_by_tasks == "cluster" and not self.spark_master.strip().lower().startswith("local"))

    @property
    def uses_kafka(self) -> bool:
        """Ingest reads the Kafka topic (SESSIONS_KAFKA_BOOTSTRAP and SESSIONS_KAFKA_TOPIC), not landing files."""
        return bool(self.kafka_bootstrap and self.kafka_topic)

    @cached_property
    def session_spec(self) -> SessionSpec:
        """SESSIONS_SPEC's spec, read once per configuration (the default spec when unset)."""
        return read_spec(self.spec)

    @property
    def kafka_consumer_settings(self) -> dict[str, str]:
        """SESSIONS_KAFKA_CONF parsed (see kafka_settings)."""
        return kafka_settings(self.kafka_conf)


SETTINGS: tuple[Setting, ...] = tuple(Setting(name=setting.name, default=setting.default, **setting.metadata)
                                      for setting in fields(SessionsConfig))
# Settings only the environment sets, never Dagster run config (SessionsResource has no field for them): the Spark
# master receives the executors' AWS credentials (spark.executorEnv.AWS_*, pipelines.job.runtime), so a launchpad that
# could name one could send them to any host.
ENV_ONLY_SETTINGS = tuple(setting.name for setting in SETTINGS if setting.env_only)


def check_setting(setting: str, value: object, label: str) -> Any:
    """`value` (a number or its text) for the setting named `setting`, checked against the bounds SESSIONS_<NAME> has
    (an override such as `sessionctl compact --keep-last`); a ConfigError naming `label` otherwise."""
    spec = next(spec for spec in SETTINGS if spec.name == setting)
    env = {label: str(value)}
    if spec.kind is float:
        return read_float(env, label, None, spec.minimum, spec.inclusive, spec.maximum)
    return read_int(env, label, None, spec.minimum, spec.maximum)

