"""What one setting is: its declaration as a field of SessionsConfig (`setting_field`: default, one-line description,
bounds, whether it is secret or environment only), read back as a `Setting`, and its variable (`env_name`).

The settings themselves (SessionsConfig, SETTINGS) are in pipelines/config.py; the Dagster resource
(assets/resources.py) and README.md's table (pipelines/settings_table.py) are made from these declarations."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipelines.config_checks import MAX_FLOAT, MAX_INT

__all__ = ["Setting", "env_name", "setting_field"]


def env_name(setting: str) -> str:
    """A setting's variable: SESSIONS_ and its name in capitals (the one rule; no setting names its own)."""
    return "SESSIONS_" + setting.upper()


@dataclass(frozen=True)
class Setting:
    """A setting as its SessionsConfig field declares it (SETTINGS holds them all, in the fields' order)."""

    name: str      # the field, the Dagster resource's field and, in capitals after SESSIONS_, the variable (env)
    default: Any   # the field's default; MISSING for home, which from_env always derives
    about: str     # one line: what it does (Dagster's field description, README's table)
    shown: str     # the default as an operator reads it ("$SESSIONS_HOME/savepoints", "60")
    kind: type     # how the variable's text is read: int, float, bool or str
    minimum: float  # numbers: at least (a float: more than, unless inclusive)
    maximum: float
    inclusive: bool
    secret: bool    # may hold credentials: out of the repr, never Dagster run config (run storage keeps it)
    env_only: bool  # never Dagster run config, for another reason (ENV_ONLY_SETTINGS)

    @property
    def env(self) -> str:
        return env_name(self.name)

    @property
    def in_run_config(self) -> bool:
        """A field of the Dagster resource (SessionsResource), so a launchpad may set it."""
        return not (self.secret or self.env_only)

    @property
    def description(self) -> str:
        return f"{self.env}: {self.about} (default: {self.shown})"


def _shown(default: Any) -> str:
    if isinstance(default, bool):
        return str(default).lower()  # as the variable takes it
    if isinstance(default, float):
        return f"{default:g}"
    return str(default) if default not in ("", None) else "unset"


def setting_field(default: Any, about: str, *, shown: str | None = None, minimum: float = 1, kind: type | None = None,
                  secret: bool = False, inclusive: bool = False, maximum: float | None = None,
                  env_only: bool = False) -> Any:
    """The field of a setting read from SESSIONS_<NAME> (env_name): its default, what it does (`about`, one line) and,
    where the default is not the value an operator sees, `shown`. `minimum` and `maximum` bound numbers (a float must
    exceed the minimum unless `inclusive`; the maximum defaults to MAX_INT or MAX_FLOAT); a `secret` one (it may hold
    credentials) stays out of the config's repr; neither it nor an `env_only` one is Dagster run config."""
    kind = kind or type(default)
    spec = {"about": about, "shown": shown or _shown(default), "kind": kind, "minimum": minimum,
            "maximum": maximum if maximum is not None else MAX_FLOAT if kind is float else MAX_INT,
            "inclusive": inclusive, "secret": secret, "env_only": env_only}
    return field(default=default, repr=not secret, metadata=spec)  # Setting(name, default, **metadata)
