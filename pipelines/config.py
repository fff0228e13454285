"""The one configuration object, read from the environment (see CONTRACT.md)."""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROVIDERS = ("rocksdb", "hdfs")


class ConfigError(ValueError):
    """A setting that cannot work; the message says which and why."""


def _int(env: dict, name: str, default: int, minimum: int = 1) -> int:
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

    @classmethod
    def from_env(cls, env: dict | None = None) -> "SessionsConfig":
        env = dict(os.environ if env is None else env)
        home = Path(env.get("SESSIONS_HOME") or REPO_ROOT / ".data").resolve()
        provider = (env.get("SESSIONS_STATE_STORE") or "rocksdb").strip().lower()
        if provider not in PROVIDERS:
            raise ConfigError(f"SESSIONS_STATE_STORE={provider!r}: expected one of {', '.join(PROVIDERS)}")
        max_versions = env.get("SESSIONS_MAX_VERSIONS_PER_BATCH")
        return cls(
            home=home,
            state_store=provider,
            state_partitions=_int(env, "SESSIONS_STATE_PARTITIONS", 4),
            gap_minutes=_int(env, "SESSIONS_GAP_MINUTES", 30),
            lateness_minutes=_int(env, "SESSIONS_LATENESS_MINUTES", 10, minimum=0),
            savepoint_uri=env.get("SESSIONS_SAVEPOINT_URI") or str(home / "savepoints"),
            state_buckets=_int(env, "SESSIONS_STATE_BUCKETS", 64),
            max_versions_per_batch=int(max_versions) if max_versions else None,
        )

    def with_(self, **changes) -> "SessionsConfig":
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
