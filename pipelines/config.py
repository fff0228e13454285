"""The one configuration object, read from the environment (the settings: README.md, "Configuration")."""
from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from pipelines.errors import ConfigError
from pipelines.kafka_conf import check_kafka_settings, kafka_settings

__all__ = ["ConfigError", "SessionsConfig", "kafka_settings"]  # ConfigError lives with the other errors; importable from here too

REPO_ROOT = Path(__file__).resolve().parent.parent
Provider = Literal["rocksdb", "hdfs"]  # the state store providers (SESSIONS_STATE_STORE)
PROVIDERS: tuple[Provider, ...] = ("rocksdb", "hdfs")
OPERATORS = ("jvm",)  # SESSIONS_OPERATOR (pipelines.job.operators.seam; the Python operator is retired: operator_buckets)
MAX_LEASE_TTL_S = 86_400.0  # SESSIONS_LEASE_TTL_S at most (one day): the renewal thread waits TTL/3 at a time
# SESSIONS_LEASE_TTL_S at least: a holder renews every TTL/3 (pipelines.coordination.leases), so a TTL of milliseconds would have
# renewals race their own expiry (any GC pause or slow store write loses the lease) and spin the renewal thread.
MIN_LEASE_TTL_S = 1.0
# The state partitions a restore or rescale may ask for (`--partitions`): each is a Spark task, a state store instance
# and its files every batch; far above any real job, far below what overflows Spark's int.
MAX_PARTITIONS = 10_000
DEFAULT_OPERATOR = "jvm"
# Upper bounds of every number setting unless it declares its own: a Java int (several go to Spark as one), and for
# seconds, minutes and hours a billion (a wait of that many seconds still fits Python's thread timeouts).
MAX_INT = 2**31 - 1
MAX_FLOAT = 1e9
# Settings that delete data have floors; below them only with this variable set in the environment (never from run
# config: SessionsResource has no such field). erasure_deadline_hours is exempt: purging early is the erasure's point.
MIN_VACUUM_RETENTION_HOURS = 24
ALLOW_SHORT_RETENTION = "SESSIONS_ALLOW_SHORT_RETENTION"
# Settings only the environment sets, never Dagster run config (SessionsResource has no field for them): the Spark
# master receives the executors' AWS credentials (spark.executorEnv.AWS_*, pipelines.job.runtime), so a launchpad that
# could name one could send them to any host.
ENV_ONLY_SETTINGS = ("spark_master",)


def _int(env: Mapping[str, str], name: str, default: int | None, minimum: float = 1,
         maximum: float = MAX_INT) -> int | None:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be >= {minimum:g}")
    if value > maximum:
        raise ConfigError(f"{name}={value} must be <= {int(maximum)}")
    return value


def _float(env: Mapping[str, str], name: str, default: float | None, minimum: float = 0,
           inclusive: bool = False, maximum: float = MAX_FLOAT) -> float | None:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"{name}={raw!r} is not a finite number")
    if value < minimum or (value == minimum and not inclusive):
        raise ConfigError(f"{name}={raw} must be {'>=' if inclusive else '>'} {minimum:g}")
    if value > maximum:
        raise ConfigError(f"{name}={raw} must be <= {maximum:g}")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw not in ("true", "false", "1", "0", "yes", "no"):
        raise ConfigError(f"{name}={raw!r}: expected true or false")
    return raw in ("true", "1", "yes")


def _setting(default: Any, minimum: float = 1, kind: type | None = None, secret: bool = False,
             inclusive: bool = False, maximum: float | None = None) -> Any:
    """A setting read from SESSIONS_<NAME> (see env_name); `minimum` and `maximum` bound numbers (a float must exceed
    the minimum unless `inclusive`; the maximum defaults to MAX_INT or MAX_FLOAT); a `secret` one (it may hold
    credentials) stays out of the config's repr."""
    kind = kind or type(default)
    return field(default=default, repr=not secret,
                 metadata={"minimum": minimum, "kind": kind, "inclusive": inclusive,
                           "maximum": maximum if maximum is not None else MAX_FLOAT if kind is float else MAX_INT})


def check_setting(setting: str, value: object, label: str) -> Any:
    """`value` (a number or its text) for the setting named `setting`, checked against the bounds SESSIONS_<NAME> has
    (an override such as `sessionctl compact --keep-last`); a ConfigError naming `label` otherwise."""
    meta = next(f for f in fields(SessionsConfig) if f.name == setting).metadata
    env = {label: str(value)}
    if meta["kind"] is float:
        return _float(env, label, None, meta["minimum"], meta["inclusive"], meta["maximum"])
    return _int(env, label, None, meta["minimum"], meta["maximum"])


def positive_seconds(value: object, label: str) -> float:
    """A wait or poll interval (`sessionctl run --poll-seconds`, Dagster's poll_seconds): finite, > 0 -- 0 would
    spin -- and at most MAX_FLOAT; a ConfigError naming `label` otherwise."""
    seconds = _float({label: str(value)}, label, None)
    assert seconds is not None
    return seconds


def _lease_uri(raw: str, checkpoint_uri: str) -> str:
    """SESSIONS_LEASE_URI: s3://bucket/prefix or a path (made absolute); default `_leases` beside the checkpoint."""
    uri = raw.strip().removeprefix("file://").rstrip("/")
    if not uri:
        return str(Path(checkpoint_uri) / "_leases")
    if uri.startswith("s3://"):
        if not uri[len("s3://"):].split("/", 1)[0]:
            raise ConfigError(f"SESSIONS_LEASE_URI={raw!r}: expected s3://bucket/prefix")
        return uri
    if "://" in uri:
        raise ConfigError(f"SESSIONS_LEASE_URI={raw!r}: expected a shared path or s3://bucket/prefix")
    return str(Path(uri).resolve())


# Settings that take a local path or s3://bucket/prefix (the checkpoint's is checked on its own: no s3 there).
URI_SETTINGS = ("savepoint_uri", "warehouse_uri", "landing_uri", "lease_uri")
_SCHEME_ONLY = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:/*")  # "s3:", "s3:/", "s3://": a scheme, nothing after it


def check_uri(*, name: str, raw: str) -> None:
    """A data location given as a URI: file://, or s3:// with a bucket; a ConfigError naming `name` otherwise. Without
    this, `s3://` loses its slashes on the way and becomes the relative path `./s3:` in the working directory, and an
    unsupported scheme (gs://, hdfs://) a local directory of that name."""
    text = raw.strip()
    scheme, separator, rest = text.partition("://")
    if not separator and not _SCHEME_ONLY.fullmatch(text):
        return  # a path
    scheme = scheme.rstrip(":/")
    if scheme == "file":
        return
    if scheme == "s3":
        if not rest.split("/", 1)[0]:
            raise ConfigError(f"{name}={raw!r} names no bucket: expected s3://bucket/prefix")
        return
    raise ConfigError(f"{name}={raw!r}: the scheme {scheme}:// is not supported; expected a local path or "
                      "s3://bucket/prefix (s3 in lower case)")


# A duration as object_store (delta-rs's S3 client) reads it: "30s", "500ms", "2min", "1h 30m" (humantime's units).
_DURATION = re.compile(r"\s*(\d+(\.\d+)?\s*(nsec|ns|usec|us|msec|ms|seconds|second|secs|sec|s|minutes|minute|mins|min|m|hours|"
                       r"hour|hrs|hr|h|days|day|d|weeks|week|w)\s*)+")


# The data locations (SESSIONS_HOME first): a local one must be a directory, or not exist yet under one.
PATH_SETTINGS = ("home", "savepoint_uri", "warehouse_uri", "landing_uri", "checkpoint_uri", "lease_uri")


def _check_directories(env: Mapping[str, str], home: Path, values: Mapping[str, Any]) -> None:
    """A local data location that names a file, or lies under one, is refused here in one line, not at the first
    write as NotADirectoryError."""
    for setting in PATH_SETTINGS:
        uri = str(home if setting == "home" else values[setting]).removeprefix("file://")
        if "://" in uri:
            continue
        name = env_name(setting)
        given = f"{name}={env[name].strip()!r}" if (env.get(name) or "").strip() else f"{name} (unset: {uri})"
        for path in (Path(uri), *Path(uri).parents):
            try:
                if not path.exists():
                    continue
                if not path.is_dir():
                    what = "is a file" if path == Path(uri) else f"lies under {path}, a file"
                    raise ConfigError(f"{given} {what}, not a directory: point it at a directory")
            except OSError:  # not readable: the command that uses it says so
                pass
            break


# Spark's masters this job runs on (a typo otherwise surfaces as "Java gateway process exited" with no hint why).
_SPARK_MASTER = re.compile(
    r"local(\[(\*|[1-9]\d*)(,\s*[1-9]\d*)?\])?"             # local, local[N], local[*], local[N,F], local[*,F]
    r"|local-cluster\[[1-9]\d*,\s*[1-9]\d*,\s*[1-9]\d*\]"   # local-cluster[workers,cores,MiB] (tests)
    r"|spark://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):\d{1,5}(,(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):\d{1,5})*"
    r"|k8s://\S+|yarn")
# The driver's heap as the JVM's -Xmx takes it (Spark passes it on as is): a unit, no "b" after it ("4gb" is an
# invalid heap size there), and a bare number would be bytes. Spark refuses a heap under 450 MiB when it starts
# (UnifiedMemoryManager), again only as "Java gateway process exited".
_MEMORY = re.compile(r"([1-9]\d*)([kmgt])")
_MEMORY_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
MIN_DRIVER_MEMORY, MAX_DRIVER_MEMORY = 512 << 20, 64 << 40


def check_spark_master(master: str) -> None:
    """SESSIONS_SPARK_MASTER: one of the masters this job runs on; a ConfigError naming the variable otherwise."""
    if not _SPARK_MASTER.fullmatch(master):
        raise ConfigError(f"SESSIONS_SPARK_MASTER={master!r} is not a Spark master: expected local, local[N], local[*], "
                          "local[N,F], spark://host:port[,host:port], k8s://https://host:port or yarn")


def check_driver_memory(memory: str) -> None:
    """SESSIONS_SPARK_DRIVER_MEMORY: a size with a unit, 512m to 64t; a ConfigError naming the variable otherwise."""
    found = _MEMORY.fullmatch(memory.strip().lower())
    if found is None:
        raise ConfigError(f"SESSIONS_SPARK_DRIVER_MEMORY={memory!r} is not a size: a positive number and a unit, such "
                          "as 4g or 4096m")
    size = int(found.group(1)) * _MEMORY_UNITS[found.group(2)]
    if not MIN_DRIVER_MEMORY <= size <= MAX_DRIVER_MEMORY:
        raise ConfigError(f"SESSIONS_SPARK_DRIVER_MEMORY={memory!r} is too {'small' if size < MIN_DRIVER_MEMORY else 'large'}"
                          ": between 512m (Spark's driver needs at least 450 MiB) and 64t")


def env_name(setting: str) -> str:
    return "SESSIONS_" + setting.upper()


@dataclass(frozen=True)
class SessionsConfig:
    """Every setting of the product; `from_env` reads each from SESSIONS_<NAME> (README.md, "Configuration")."""

    home: Path
    state_store: str = _setting("rocksdb")
    state_partitions: int = _setting(4)
    gap_minutes: int = _setting(30)
    lateness_minutes: int = _setting(10, minimum=0)
    savepoint_uri: str = _setting("")  # default: $SESSIONS_HOME/savepoints
    # Where tables and landing files live: a local path or s3://bucket/prefix (contract).
    warehouse_uri: str = _setting("")  # default: $SESSIONS_HOME/warehouse
    landing_uri: str = _setting("")    # default: $SESSIONS_HOME/landing
    # The Spark checkpoint's parent: one filesystem for every host that runs the job (it also holds the leases).
    checkpoint_uri: str = _setting("")  # default: $SESSIONS_HOME/checkpoints
    # Leases (pipelines/coordination/leases.py): a lease not renewed for lease_ttl_s may be taken over, and its holder is fenced
    # from then on; at most MAX_LEASE_TTL_S. Where they live (and stop requests): a shared path or s3://bucket/prefix.
    lease_ttl_s: float = _setting(60.0, minimum=0, maximum=math.inf)  # MIN_/MAX_LEASE_TTL_S: from_env says why
    lease_uri: str = _setting("")  # default: _leases beside the checkpoint
    lease_wait_s: float = _setting(300.0, minimum=0, inclusive=True)  # the longest ingest waits for the ingest lease
    # Recorded in a new checkpoint's metadata; only the retired Python operator's state was keyed by hash buckets of
    # user_id (pipelines.job.operators.buckets reads it with the count its checkpoint recorded).
    state_buckets: int = _setting(64)
    # The stateful operator: "jvm" (jvm/src/sessions/SessionsOperator.java, flatMapGroupsWithState, per-user state),
    # the only one; "python" is refused in one line naming the way out for its checkpoints.
    operator: str = _setting("")
    # Versions of the raw-events table per micro-batch (None = all available). Tests use 1.
    max_versions_per_batch: int | None = _setting(None, kind=int)
    # Spark (the CLI's session and Dagster's PySparkResource share them).
    spark_master: str = _setting("local[2]")
    spark_driver_memory: str = _setting("4g")
    spark_ui: bool = _setting(False)
    # RocksDB commits a changelog of the batch's puts (snapshots uploaded in the background) instead of uploading a
    # snapshot every batch: the commit's fixed cost per batch (benchmarks/README.md). Off: Spark's own default.
    rocksdb_changelog: bool = _setting(True)
    # Savepoints are the long-term recovery points; the checkpoint keeps a short tail of versions.
    min_batches_to_retain: int = _setting(20)
    # Incremental savepoints (state_store/savepoint/policy.py): a full one every Nth savepoint of a lineage (1: always
    # full), or once a chain's increments hold more rows than this share of its full savepoint's.
    savepoint_full_every: int = _setting(10)
    savepoint_chain_share: float = _setting(0.5, minimum=0)
    # Operations (Dagster runbook, checks and sensors).
    stop_timeout_s: float = _setting(180.0, minimum=0)
    state_max_age_minutes: float = _setting(60.0, minimum=0)
    savepoint_max_age_hours: float = _setting(6.0, minimum=0)  # the savepoint policy (maintenance sensor)
    compact_files: int = _setting(200)
    state_files: int = _setting(2000)
    auto_restore: bool = _setting(False)
    observe_state_minutes: float = _setting(5.0, minimum=0)  # at most one Spark pass over the state per this
    # Retention (sessionctl compact, the Dagster compaction job and its schedule share them).
    keep_savepoints: int = _setting(5)            # newest complete savepoints kept
    keep_daily_days: int = _setting(7, minimum=0, maximum=36_500)  # plus the newest of each of these days
    # Delta VACUUM horizon for the tables: at least MIN_VACUUM_RETENTION_HOURS unless ALLOW_SHORT_RETENTION.
    vacuum_retention_hours: int = _setting(168, minimum=0)
    # Erasure (sessionctl forget): older table versions holding an erased user are purged within this many hours
    # (forget purges what is older; compaction then vacuums with at most this horizon while erasures are recorded).
    erasure_deadline_hours: float = _setting(0.0, minimum=0, inclusive=True)
    # The key of the erasure log's keyed hash of user ids (HMAC-SHA256); unset: a key generated once in
    # $SESSIONS_HOME/erasure.key. A secret: from the environment or a secret store, never run config.
    erasure_key: str = _setting("", secret=True)
    # The standing erasure drops an erased user's events that arrive later with an event_time at or before the
    # erasure; with this set, newer ones too (a user who asked never to be tracked again). Unset: newer events are
    # new data (the user came back after the erasure) and are kept.
    erasure_drops_newer: bool = _setting(False)
    # Hostile input: an event this far ahead of its ingest time is quarantined (contract).
    max_future_minutes: int = _setting(60, minimum=0)
    # A landed file's last line without a newline counts once the file has not changed for this long (a line
    # that parses as a JSON object counts at once); see pipelines/ingest/local.py.
    ingest_settle_seconds: int = _setting(60, minimum=0)
    # S3 (delta-rs/object_store): fail in seconds, not after the default 10 retries over 3 minutes.
    s3_max_retries: int = _setting(3, minimum=0)
    s3_retry_timeout: str = _setting("15s")
    s3_timeout: str = _setting("30s")
    # Kafka as the source instead of landing files (pipelines/ingest/kafka.py): both or neither.
    kafka_bootstrap: str = _setting("")  # host:port,host:port
    kafka_topic: str = _setting("")
    # Consumer settings passed to librdkafka (security.protocol, sasl.*, ssl.*, group.id, ...): see kafka_settings.
    kafka_conf: str = _setting("", secret=True)
    kafka_commit_messages: int = _setting(100_000)  # messages per ingest commit at most
    # Idle close (README "Idle close"): after this much wall-clock time without an event ingested, ingest appends a
    # clock row to raw_events. Unset: the lateness (the gap when lateness is 0); 0 turns it off.
    idle_close_minutes: float | None = _setting(None, minimum=0, kind=float, inclusive=True)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SessionsConfig:
        env = dict(os.environ if env is None else env)
        if "SESSIONS_HOME" in env and not env["SESSIONS_HOME"].strip():
            # An empty value is a broken deployment template, not a wish for the repo's .data.
            raise ConfigError("SESSIONS_HOME is set but empty: unset it (data under the repo's .data) or give a path")
        home = Path(env.get("SESSIONS_HOME") or REPO_ROOT / ".data").resolve()
        values: dict[str, Any] = {}
        for setting in fields(cls):
            if setting.name == "home":
                continue
            name, kind, minimum = env_name(setting.name), setting.metadata["kind"], setting.metadata["minimum"]
            maximum = setting.metadata["maximum"]
            if kind is bool:
                values[setting.name] = _bool(env, name, setting.default)  # type: ignore[arg-type]
            elif kind is int:
                values[setting.name] = _int(env, name, setting.default, minimum, maximum)  # type: ignore[arg-type]
            elif kind is float:
                values[setting.name] = _float(env, name, setting.default, minimum,  # type: ignore[arg-type]
                                              setting.metadata["inclusive"], maximum)
            else:
                values[setting.name] = (env.get(name) or "").strip() or setting.default
        values["state_store"] = values["state_store"].lower()
        if values["state_store"] not in PROVIDERS:
            raise ConfigError(f"SESSIONS_STATE_STORE={values['state_store']!r}: expected one of {', '.join(PROVIDERS)}")
        values["operator"] = values["operator"].lower()
        if values["operator"] == "python":
            raise ConfigError("SESSIONS_OPERATOR=python: the Python operator is retired; unset SESSIONS_OPERATOR (its "
                              "checkpoints move to the JVM operator with `sessionctl savepoint` and `sessionctl "
                              "restore --savepoint latest`)")
        if values["operator"] and values["operator"] not in OPERATORS:
            raise ConfigError(f"SESSIONS_OPERATOR={values['operator']!r}: expected one of {', '.join(OPERATORS)}")
        for setting_name in URI_SETTINGS:  # as given: before a default or _lease_uri's clean-up changes it
            check_uri(name=env_name(setting_name), raw=values[setting_name])
        values["savepoint_uri"] = values["savepoint_uri"] or str(home / "savepoints")
        values["warehouse_uri"] = (values["warehouse_uri"] or str(home / "warehouse")).rstrip("/")
        values["landing_uri"] = (values["landing_uri"] or str(home / "landing")).rstrip("/")
        checkpoint_uri = values["checkpoint_uri"].removeprefix("file://")
        if "://" in checkpoint_uri:
            # The driver reads the checkpoint's logs itself (pipelines/job/checkpoint.py) and leases live beside it.
            raise ConfigError(f"SESSIONS_CHECKPOINT_URI={checkpoint_uri!r}: only a local or mounted shared path is "
                              "supported (hdfs:// would need the driver to read it through Hadoop; see deploy/spark)")
        values["checkpoint_uri"] = str(Path(checkpoint_uri).resolve()) if checkpoint_uri else str(home / "checkpoints")
        if values["lease_ttl_s"] > MAX_LEASE_TTL_S:
            raise ConfigError(f"SESSIONS_LEASE_TTL_S={values['lease_ttl_s']:g} is too long: at most {MAX_LEASE_TTL_S:g} "
                              "(one day; a holder that died blocks the job for this long)")
        if values["lease_ttl_s"] < MIN_LEASE_TTL_S:
            raise ConfigError(f"SESSIONS_LEASE_TTL_S={values['lease_ttl_s']:g} is too short: at least "
                              f"{MIN_LEASE_TTL_S:g} s (a holder renews every TTL/3; shorter, any pause or slow write "
                              "loses the lease)")
        values["lease_uri"] = _lease_uri(values["lease_uri"], values["checkpoint_uri"])
        _check_directories(env, home, values)
        check_spark_master(values["spark_master"])
        check_driver_memory(values["spark_driver_memory"])
        for duration in ("s3_timeout", "s3_retry_timeout"):  # object_store reads them at the first S3 request
            if not _DURATION.fullmatch(values[duration]):
                raise ConfigError(f"{env_name(duration)}={values[duration]!r} is not a duration: a number and a unit, "
                                  "such as 30s, 500ms, 2min or 1h")
        if values["vacuum_retention_hours"] < MIN_VACUUM_RETENTION_HOURS and not _bool(env, ALLOW_SHORT_RETENTION, False):
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
        return cls(home=home, **values)

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
    def checkpoint(self) -> Path:
        return Path(self.checkpoint_uri) / "sessions"

    @property
    def lease_dir(self) -> Path:
        """Where leases live when lease_uri is a path (beside the checkpoint by default, on the filesystem every host
        shares); for an s3:// lease_uri, pass lease_uri itself to pipelines.coordination.leases."""
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

    @property
    def gap_ms(self) -> int:
        return self.gap_minutes * 60_000

    @property
    def lateness_ms(self) -> int:
        return self.lateness_minutes * 60_000

    @property
    def idle_close_ms(self) -> int:
        """Idle time before a clock row (0 = off). The default, the lateness, is the longest that never makes an
        event late that is newer than the last one ingested (see pipelines.ingest.table.IngestClock)."""
        if self.idle_close_minutes is None:
            return self.lateness_ms or self.gap_ms
        return round(self.idle_close_minutes * 60_000)

    @property
    def max_future_ms(self) -> int:
        return self.max_future_minutes * 60_000

    @property
    def uses_kafka(self) -> bool:
        """Ingest reads the Kafka topic (SESSIONS_KAFKA_BOOTSTRAP and SESSIONS_KAFKA_TOPIC), not landing files."""
        return bool(self.kafka_bootstrap and self.kafka_topic)

    @property
    def kafka_consumer_settings(self) -> dict[str, str]:
        """SESSIONS_KAFKA_CONF parsed (see kafka_settings)."""
        return kafka_settings(self.kafka_conf)
