"""The one configuration object, read from the environment (see CONTRACT.md)."""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from pipelines.errors import ConfigError

__all__ = ["ConfigError", "SessionsConfig"]  # ConfigError lives with the other errors; importable from here too

REPO_ROOT = Path(__file__).resolve().parent.parent
PROVIDERS = ("rocksdb", "hdfs")


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be >= {minimum}")
    return value


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if value <= 0:
        raise ConfigError(f"{name}={raw} must be > 0")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw not in ("true", "false", "1", "0", "yes", "no"):
        raise ConfigError(f"{name}={raw!r}: expected true or false")
    return raw in ("true", "1", "yes")


@dataclass(frozen=True)
class SessionsConfig:
    home: Path
    state_store: str = "rocksdb"
    state_partitions: int = 4
    gap_minutes: int = 30
    lateness_minutes: int = 10
    savepoint_uri: str = ""
    # Sessions state is keyed by a hash bucket of user_id so one Python call handles many users
    # (see README "Performance"); the canonical savepoint form is per user and bucket-free.
    state_buckets: int = 64
    # Versions of the raw-events table per micro-batch (None = all available). Tests use 1.
    max_versions_per_batch: int | None = None
    # Spark (the CLI's session and Dagster's PySparkResource share them).
    spark_master: str = "local[2]"
    spark_driver_memory: str = "4g"
    spark_ui: bool = False
    # Savepoints are the long-term recovery points; the checkpoint keeps a short tail of versions.
    min_batches_to_retain: int = 20
    # Operations (Dagster runbook, checks and sensors).
    stop_timeout_s: float = 180.0
    state_max_age_minutes: float = 60.0
    savepoint_max_age_hours: float = 6.0
    compact_files: int = 200
    state_files: int = 2000
    auto_restore: bool = False
    # Retention (sessionctl compact, the Dagster compaction job and its schedule share them).
    keep_savepoints: int = 5            # newest complete savepoints kept
    keep_daily_days: int = 7            # plus the newest of each of these days
    vacuum_retention_hours: int = 168   # Delta VACUUM horizon for the tables
    # Hostile input: an event this far ahead of its ingest time is quarantined (contract).
    max_future_minutes: int = 60
    # A landed file's last line without a newline counts once the file has not changed for this long (a line
    # that parses as a JSON object counts at once); see pipelines/ingest.py.
    ingest_settle_seconds: int = 60
    # S3 (delta-rs/object_store): fail in seconds, not after the default 10 retries over 3 minutes.
    s3_max_retries: int = 3
    s3_retry_timeout: str = "15s"
    s3_timeout: str = "30s"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SessionsConfig:
        env = dict(os.environ if env is None else env)
        if "SESSIONS_HOME" in env and not env["SESSIONS_HOME"].strip():
            # An empty value is a broken deployment template, not a wish for the repo's .data.
            raise ConfigError("SESSIONS_HOME is set but empty: unset it (data under the repo's .data) or give a path")
        home = Path(env.get("SESSIONS_HOME") or REPO_ROOT / ".data").resolve()
        provider = (env.get("SESSIONS_STATE_STORE") or "rocksdb").strip().lower()
        if provider not in PROVIDERS:
            raise ConfigError(f"SESSIONS_STATE_STORE={provider!r}: expected one of {', '.join(PROVIDERS)}")
        return cls(
            home=home,
            state_store=provider,
            state_partitions=_int(env, "SESSIONS_STATE_PARTITIONS", 4),
            gap_minutes=_int(env, "SESSIONS_GAP_MINUTES", 30),
            lateness_minutes=_int(env, "SESSIONS_LATENESS_MINUTES", 10, minimum=0),
            savepoint_uri=env.get("SESSIONS_SAVEPOINT_URI") or str(home / "savepoints"),
            state_buckets=_int(env, "SESSIONS_STATE_BUCKETS", 64),
            max_versions_per_batch=_int(env, "SESSIONS_MAX_VERSIONS_PER_BATCH", 0, minimum=0) or None,
            spark_master=env.get("SESSIONS_SPARK_MASTER") or "local[2]",
            spark_driver_memory=env.get("SESSIONS_SPARK_DRIVER_MEMORY") or "4g",
            spark_ui=_bool(env, "SESSIONS_SPARK_UI", False),
            min_batches_to_retain=_int(env, "SESSIONS_MIN_BATCHES_TO_RETAIN", 20),
            stop_timeout_s=_float(env, "SESSIONS_STOP_TIMEOUT_S", 180.0),
            state_max_age_minutes=_float(env, "SESSIONS_STATE_MAX_AGE_MINUTES", 60.0),
            savepoint_max_age_hours=_float(env, "SESSIONS_SAVEPOINT_MAX_AGE_HOURS", 6.0),
            compact_files=_int(env, "SESSIONS_COMPACT_FILES", 200),
            state_files=_int(env, "SESSIONS_STATE_FILES", 2000),
            auto_restore=_bool(env, "SESSIONS_AUTO_RESTORE", False),
            keep_savepoints=_int(env, "SESSIONS_KEEP_SAVEPOINTS", 5),
            keep_daily_days=_int(env, "SESSIONS_KEEP_DAILY_DAYS", 7, minimum=0),
            vacuum_retention_hours=_int(env, "SESSIONS_VACUUM_RETENTION_HOURS", 168, minimum=0),
            max_future_minutes=_int(env, "SESSIONS_MAX_FUTURE_MINUTES", 60, minimum=0),
            ingest_settle_seconds=_int(env, "SESSIONS_INGEST_SETTLE_SECONDS", 60, minimum=0),
            s3_max_retries=_int(env, "SESSIONS_S3_MAX_RETRIES", 3, minimum=0),
            s3_retry_timeout=env.get("SESSIONS_S3_RETRY_TIMEOUT") or "15s",
            s3_timeout=env.get("SESSIONS_S3_TIMEOUT") or "30s",
        )

    def with_(self, **changes: object) -> SessionsConfig:
        return replace(self, **changes)

    # Paths under the data root.
    @property
    def landing(self) -> Path:
        return self.home / "landing"

    @property
    def checkpoint(self) -> Path:
        return self.home / "checkpoints" / "sessions"

    @property
    def warehouse(self) -> Path:
        return self.home / "warehouse"

    @property
    def raw_events_table(self) -> str:
        return str(self.warehouse / "raw_events")

    @property
    def sessions_table(self) -> str:
        return str(self.warehouse / "sessions")

    @property
    def quarantine_table(self) -> str:
        return str(self.warehouse / "quarantine")

    @property
    def lock_dir(self) -> Path:
        return self.home / "locks"

    @property
    def gap_ms(self) -> int:
        return self.gap_minutes * 60_000

    @property
    def lateness_ms(self) -> int:
        return self.lateness_minutes * 60_000

    @property
    def max_future_ms(self) -> int:
        return self.max_future_minutes * 60_000
