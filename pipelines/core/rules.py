"""The session rules: gap, lateness, idle close and the session spec (input mapping and attributes), as one immutable
value. It is made once from the settings and the spec (pipelines.config.SessionsConfig.rules), recorded in the
checkpoint's job metadata and in every savepoint's catalog row, compared in one place (`compare`), and handed to the
operator as a whole (pipelines.job.operators.seam.StateOperator.apply).

Pure: no Spark, no I/O. Where a new rule or attribute kind goes: docs/internals.md, "The session rules".
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pipelines.core.spec import (
    DEFAULT_SPEC,
    Attribute,
    SessionSpec,
    SpecChanges,
    changed_refusal,
    parse_spec,
    spec_changes,
)

__all__ = ["RulesChanges", "SessionRules", "compare"]

_MINUTE_MS = 60_000


def _minutes(ms: int) -> str:
    return f"{ms / _MINUTE_MS:g}"


@dataclass(frozen=True)
class SessionRules:
    """What decides where a session starts and ends and what it carries.

    `gap_ms`: inactivity that ends a session; `lateness_ms`: how far the watermark trails the newest event;
    `idle_close_ms`: wall-clock silence before ingest appends a clock row (0: off; it moves the watermark, never a
    session's bounds); `spec`: where the event fields are and which attributes a session carries."""
    gap_ms: int
    lateness_ms: int
    idle_close_ms: int
    spec: SessionSpec = field(default=DEFAULT_SPEC)

    @property
    def attributes(self) -> tuple[Attribute, ...]:
        return self.spec.attributes

    @staticmethod
    def default_idle_close_ms(gap_ms: int, lateness_ms: int) -> int:
        """The idle close when none is set: the lateness, the longest that never makes an event late that is newer
        than the last one ingested (pipelines.ingest.table.IngestClock); the gap when there is no lateness."""
        return lateness_ms or gap_ms

    @classmethod
    def recorded(cls, *, gap_ms: int, lateness_ms: int, idle_close_ms: int | None, spec: str | None) -> SessionRules:
        """The rules as job metadata or a catalog row stores them: the spec as its canonical text (None: the default
        spec), the idle close as set (None: recorded before it was, so the default)."""
        return cls(gap_ms, lateness_ms,
                   cls.default_idle_close_ms(gap_ms, lateness_ms) if idle_close_ms is None else idle_close_ms,
                   parse_spec(spec) if spec else DEFAULT_SPEC)

    @property
    def spec_text(self) -> str | None:
        """The spec as it is recorded: its canonical JSON, None for the default one."""
        return None if self.spec.is_default else self.spec.to_json()

    @property
    def idle_close_recorded(self) -> int | None:
        """The idle close as it is recorded: None when it is the default (SessionRules.recorded)."""
        return None if self.idle_close_ms == self.default_idle_close_ms(self.gap_ms, self.lateness_ms) else \
            self.idle_close_ms


@dataclass(frozen=True)
class RulesChanges:
    """What differs from the rules a checkpoint or a savepoint was made with (`before`) to the ones now (`after`):
    the one comparison of two rules values.

    - gap or lateness (`timing`): the open sessions must be re-walked -- a restore with --migrate, never a run;
    - idle close: taken as it is (it only decides when ingest appends a clock row);
    - the spec: added and removed attributes and the input mapping are taken as they are; a changed attribute is a
      different one, refused unless migrated (pipelines.core.spec.SpecChanges)."""
    before: SessionRules
    after: SessionRules
    spec: SpecChanges

    @property
    def timing(self) -> bool:
        return (self.before.gap_ms, self.before.lateness_ms) != (self.after.gap_ms, self.after.lateness_ms)

    @property
    def idle_close(self) -> bool:
        return self.before.idle_close_ms != self.after.idle_close_ms

    @property
    def none(self) -> bool:
        return not (self.timing or self.idle_close) and self.spec.none

    def refusals(self, made: str, *, how: str) -> list[str]:
        """Each change that only a migration takes, as its one refusal line (none: the new rules can be taken as
        they are). `made` says where the old rules come from ("the checkpoint was made", "savepoint X was taken"),
        `how` the way out."""
        b, a = self.before, self.after
        timing = [f"{made} with gap {_minutes(b.gap_ms)} min and lateness {_minutes(b.lateness_ms)} min; the settings "
                  f"say gap {_minutes(a.gap_ms)} min and lateness {_minutes(a.lateness_ms)} min: {how}"
                  ] if self.timing else []
        return timing + [changed_refusal(b.spec, a.spec, name, how=how) for name in self.spec.changed]

    def migrations(self) -> list[str]:
        """What a restore changes in the state it puts back, each as an operator reads it (restore --dry-run's
        `migrations`). Not the idle close: ingest applies the current one whatever the state was made with."""
        b, a = self.before, self.after
        out = []
        if self.timing:
            out.append(f"gap {_minutes(b.gap_ms)} -> {_minutes(a.gap_ms)} min, lateness {_minutes(b.lateness_ms)} -> "
                       f"{_minutes(a.lateness_ms)} min (open sessions re-walked)")
        return out + [f"session spec: {line}" for line in self.spec.lines()]

    def lines(self) -> list[str]:
        """Every difference, as a run that takes the new rules logs it."""
        b, a = self.before, self.after
        idle = [f"idle close {_minutes(b.idle_close_ms)} -> {_minutes(a.idle_close_ms)} min (clock rows follow it "
                f"from now on)"] if self.idle_close else []
        return self.migrations() + idle


def compare(before: SessionRules, after: SessionRules) -> RulesChanges:
    return RulesChanges(before, after, spec_changes(before.spec, after.spec))
