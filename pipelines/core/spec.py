"""The session spec (`SESSIONS_SPEC`, the contract's "Session spec"): where each event field is in an incoming JSON
object (`InputSpec`) and which extra columns the sessions carry (`Attribute`), parsed and validated once from the
spec's text into one immutable `SessionSpec`.

Pure: no Spark, no I/O (the file is read by pipelines.config). Every refusal is one ConfigError line naming the key:
`SESSIONS_SPEC attributes.revenue: sum needs a field of type long or double, got string`.

`SessionSpec.to_json` is the canonical form -- paths always as lists, fields and attributes by name, keys sorted --
so that two specs that mean the same are equal and compare in one place (checkpoint metadata, savepoint catalog
rows); the canonical JSON is itself a valid spec text (`parse_spec(spec.to_json()) == spec`).
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, cast, get_args

import yaml

from pipelines.errors import ConfigError

__all__ = ["SpecChanges", "changed_refusal", "spec_changes", "AGGREGATES", "DEFAULT_INPUT", "DEFAULT_SPEC", "FIELD_COLUMN_PREFIX", "FIELD_TYPES", "SESSION_COLUMNS",
           "TIME_FORMATS", "Aggregate", "Attribute", "EventTime", "FieldSpec", "FieldType", "InputSpec",
           "SessionSpec", "TimeFormat", "parse_spec", "split_path"]

TimeFormat = Literal["iso8601", "epoch_s", "epoch_ms", "epoch_us"]
FieldType = Literal["string", "long", "double", "boolean"]
Aggregate = Literal["first", "last", "count_if", "sum", "min", "max"]
TIME_FORMATS: tuple[TimeFormat, ...] = get_args(TimeFormat)
FIELD_TYPES: tuple[FieldType, ...] = get_args(FieldType)
AGGREGATES: tuple[Aggregate, ...] = get_args(Aggregate)
FIELD_COLUMN_PREFIX = "field_"  # a typed field's raw_events column: field_<name>
# The sessions table's own columns: an attribute may not take one of their names (Delta names are case-insensitive).
SESSION_COLUMNS = ("session_id", "user_id", "session_start", "session_end", "event_count", "page_views", "end_reason")
_NUMERIC: tuple[FieldType, ...] = ("long", "double")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")  # a column name every engine takes unquoted
_INPUT_KEYS = ("event_id", "user_id", "event_type", "event_time", "fields")

Paths = tuple[str, ...]  # one or more dotted paths: the first present and not null is the value


def split_path(path: str) -> tuple[str, ...]:
    """A dotted path's keys: "context.page.referrer" -> ("context", "page", "referrer")."""
    return tuple(path.split("."))


def _fail(key: str, message: str) -> ConfigError:
    return ConfigError(f"SESSIONS_SPEC {key}: {message}")


@dataclass(frozen=True)
class EventTime:
    paths: Paths
    format: TimeFormat = "iso8601"


@dataclass(frozen=True)
class FieldSpec:
    """A typed extra field the attributes use: stored in raw_events as `field_<name>`."""
    name: str
    path: str
    type: FieldType

    @property
    def column(self) -> str:
        return f"{FIELD_COLUMN_PREFIX}{self.name}"


@dataclass(frozen=True)
class InputSpec:
    """Where each event field is in an incoming JSON object. raw_events' informational `page` column is read from the
    top-level `page` whatever the spec says (as it always was); the spec's typed `fields` get their own columns."""
    event_id: Paths = ("event_id",)
    user_id: Paths = ("user_id",)
    event_type: Paths = ("event_type",)
    event_time: EventTime = EventTime(("event_time",))
    fields: tuple[FieldSpec, ...] = ()   # by name

    @property
    def is_default(self) -> bool:
        """The contract's five fields with ISO times: ingest takes today's exact (and fastest) path."""
        return self == DEFAULT_INPUT

    def field(self, name: str) -> FieldSpec | None:
        return next((f for f in self.fields if f.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {"event_id": list(self.event_id), "user_id": list(self.user_id), "event_type": list(self.event_type),
                "event_time": {"path": list(self.event_time.paths), "format": self.event_time.format},
                "fields": {f.name: {"path": f.path, "type": f.type} for f in self.fields}}


@dataclass(frozen=True)
class Attribute:
    """One extra column of `sessions`: an aggregate over the session's events (the contract's list)."""
    name: str
    aggregate: Aggregate
    field: str | None = None                 # first, last, sum, min, max: the input field it reads
    event_types: tuple[str, ...] = ()        # count_if: the event types it counts
    field_type: FieldType | None = None      # the field's declared type (input.fields; not part of the canonical form)

    def to_dict(self) -> dict[str, Any]:
        if self.aggregate == "count_if":
            return {"count_if": {"event_type": list(self.event_types)}}
        return {self.aggregate: self.field}

    @property
    def result_type(self) -> FieldType:
        """The type of its sessions column: a count is a long, a sum keeps its field's type, the rest are the field's."""
        if self.aggregate == "count_if":
            return "long"
        assert self.field_type is not None  # parse_spec sets it for every aggregate that reads a field
        return self.field_type

    @property
    def column(self) -> str:
        """Its column in the operator's output (the sessions table's column is `name`)."""
        return f"attr_{self.name}"

    @cached_property  # read per stored row (partials' JSON): computed once
    def key(self) -> str:
        """The attribute's identity in stored state: its name, its definition and its field's type. A changed
        definition is another key (the contract: a different attribute), so a partial is never merged with one of
        another meaning; a row without the key was stored before the attribute existed (attributes.UNKNOWN)."""
        definition = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return f"{self.name}={definition}:{self.field_type or 'long'}"


@dataclass(frozen=True)
class SessionSpec:
    input: InputSpec = field(default_factory=InputSpec)
    attributes: tuple[Attribute, ...] = ()   # by name

    @property
    def is_default(self) -> bool:
        return self == DEFAULT_SPEC

    @property
    def operator_fields(self) -> tuple[FieldSpec, ...]:
        """The input fields the attributes read: the stream carries these raw_events columns to the operator."""
        used = {a.field for a in self.attributes}
        return tuple(f for f in self.input.fields if f.name in used)

    def to_dict(self) -> dict[str, Any]:
        return {"input": self.input.to_dict(), "attributes": {a.name: a.to_dict() for a in self.attributes}}

    def to_json(self) -> str:
        """The canonical form: equal specs give equal text (and it parses back to an equal spec)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_text(cls, text: str) -> SessionSpec:
        return parse_spec(text)


DEFAULT_INPUT = InputSpec()
DEFAULT_SPEC = SessionSpec()


@dataclass(frozen=True)
class SpecChanges:
    """What differs from the spec a checkpoint (or a savepoint) was made with to the one now: the one comparison of
    two specs. Adding and removing attributes and any change of the input part are allowed on a running job; a
    changed attribute (same name, another definition) is a different attribute, refused unless migrated."""
    added: tuple[str, ...] = ()      # attribute names
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()    # same name, another definition or field type
    input_changed: bool = False

    @property
    def none(self) -> bool:
        return not (self.added or self.removed or self.changed or self.input_changed)

    def lines(self) -> list[str]:
        """Each difference as an operator reads it (restore --dry-run's `migrations`, the run's log)."""
        out = [f"attribute {name} added: sessions open now carry null for it" for name in self.added]
        out += [f"attribute {name} removed: its column is no longer filled" for name in self.removed]
        out += [f"attribute {name} changed its definition" for name in self.changed]
        if self.input_changed:
            out.append("the input mapping changed: it applies to lines ingested from now on")
        return out


def spec_changes(before: SessionSpec, after: SessionSpec) -> SpecChanges:
    old = {a.name: a for a in before.attributes}
    new = {a.name: a for a in after.attributes}
    return SpecChanges(added=tuple(sorted(set(new) - set(old))), removed=tuple(sorted(set(old) - set(new))),
                       changed=tuple(sorted(n for n in set(old) & set(new) if old[n].key != new[n].key)),
                       input_changed=before.input != after.input)


def changed_refusal(before: SessionSpec, after: SessionSpec, name: str, *, how: str) -> str:
    """The one line refusing a changed attribute `name`: both definitions, and the way out (`how`)."""
    old = next(a for a in before.attributes if a.name == name)
    new = next(a for a in after.attributes if a.name == name)
    return (f"SESSIONS_SPEC attributes.{name}: its definition changed from {json.dumps(old.to_dict())} "
            f"({old.field_type or 'long'}) to {json.dumps(new.to_dict())} ({new.field_type or 'long'}); a changed "
            f"attribute is a different one: give it a new name, or {how}")


def parse_spec(text: str, *, source: str = "") -> SessionSpec:
    """A spec's YAML or JSON text (JSON is YAML) -> SessionSpec, or one ConfigError line naming the key. `source`
    names the file in a refusal of the whole text."""
    where = f"SESSIONS_SPEC={source}" if source else "SESSIONS_SPEC"
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or type(error).__name__
        raise ConfigError(f"{where}: not valid YAML or JSON{at}: {problem}") from None
    if document is None:
        return DEFAULT_SPEC  # an empty file: nothing changed from the defaults
    if not isinstance(document, Mapping):
        raise ConfigError(f"{where}: expected a mapping with `input` and/or `attributes`, got "
                          f"{_kind(document)}")
    _known(document, ("input", "attributes"), "")
    spec_input = _input(document.get("input"))
    attributes = _attributes(document.get("attributes"), spec_input)
    return SessionSpec(spec_input, attributes)


def _kind(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "a mapping"}.get(type(value), type(value).__name__)


def _known(mapping: Mapping[Any, Any], keys: tuple[str, ...], prefix: str) -> None:
    for key in mapping:
        if key not in keys:
            where = f"{prefix}.{key}" if prefix else str(key)
            raise _fail(where, f"unknown key (expected {', '.join(keys)})")


def _path(value: object, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(key, f"expected a dotted path (a non-empty string), got {_kind(value)}")
    if value != value.strip() or any(not part for part in value.split(".")):
        raise _fail(key, f"{value!r} is not a dotted path (no empty keys, no surrounding blanks)")
    return value


def _paths(value: object, key: str) -> Paths:
    """A dotted path, or a non-empty list of them (the first present and not null is the value)."""
    if isinstance(value, list):
        if not value:
            raise _fail(key, "an empty list: give at least one dotted path")
        paths = tuple(_path(item, f"{key}[{k}]") for k, item in enumerate(value))
        if len(set(paths)) != len(paths):
            raise _fail(key, "a path is listed twice")
        return paths
    return (_path(value, key),)


def _name(value: object, key: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise _fail(key, f"{value!r} is not a usable column name (a letter or _, then letters, digits or _)")
    return value


def _choice(value: object, choices: tuple[str, ...], key: str) -> str:
    if not isinstance(value, str) or value not in choices:
        raise _fail(key, f"{value!r}: expected one of {', '.join(choices)}")
    return value


def _input(value: object) -> InputSpec:
    if value is None:
        return DEFAULT_INPUT
    if not isinstance(value, Mapping):
        raise _fail("input", f"expected a mapping, got {_kind(value)}")
    _known(value, _INPUT_KEYS, "input")
    default = DEFAULT_INPUT
    event_id = _paths(value["event_id"], "input.event_id") if "event_id" in value else default.event_id
    user_id = _paths(value["user_id"], "input.user_id") if "user_id" in value else default.user_id
    event_type = _paths(value["event_type"], "input.event_type") if "event_type" in value else default.event_type
    event_time = _event_time(value["event_time"]) if "event_time" in value else default.event_time
    return InputSpec(event_id, user_id, event_type, event_time, _fields(value.get("fields")))


def _event_time(value: object) -> EventTime:
    if isinstance(value, (str, list)):  # a path alone: ISO-8601
        return EventTime(_paths(value, "input.event_time"))
    if not isinstance(value, Mapping):
        raise _fail("input.event_time", f"expected a path or {{path, format}}, got {_kind(value)}")
    _known(value, ("path", "format"), "input.event_time")
    if "path" not in value:
        raise _fail("input.event_time.path", "missing")
    time_format = _choice(value.get("format", "iso8601"), TIME_FORMATS, "input.event_time.format")
    return EventTime(_paths(value["path"], "input.event_time.path"), cast(TimeFormat, time_format))


def _fields(value: object) -> tuple[FieldSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise _fail("input.fields", f"expected a mapping of name -> {{path, type}}, got {_kind(value)}")
    found: dict[str, FieldSpec] = {}
    for name, item in value.items():
        key = f"input.fields.{name}"
        _name(name, key)
        if str(name).lower() in {other.lower() for other in found}:
            raise _fail(key, "another field has this name but for case (column names are case-insensitive)")
        if not isinstance(item, Mapping):
            raise _fail(key, f"expected {{path, type}}, got {_kind(item)}")
        _known(item, ("path", "type"), key)
        if "path" not in item:
            raise _fail(f"{key}.path", "missing")
        if "type" not in item:
            raise _fail(f"{key}.type", f"missing (one of {', '.join(FIELD_TYPES)})")
        found[name] = FieldSpec(name, _path(item["path"], f"{key}.path"),
                                cast(FieldType, _choice(item["type"], FIELD_TYPES, f"{key}.type")))
    return tuple(found[name] for name in sorted(found))


def _attributes(value: object, spec_input: InputSpec) -> tuple[Attribute, ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise _fail("attributes", f"expected a mapping of name -> {{aggregate: argument}}, got {_kind(value)}")
    found: dict[str, Attribute] = {}
    for name, item in value.items():
        key = f"attributes.{name}"
        _name(name, key)
        if str(name).lower() in SESSION_COLUMNS:
            raise _fail(key, f"{name!r} is a column of sessions already")
        if str(name).lower() in {other.lower() for other in found}:
            raise _fail(key, "another attribute has this name but for case (column names are case-insensitive)")
        if not isinstance(item, Mapping) or len(item) != 1:
            raise _fail(key, f"expected one of {', '.join(AGGREGATES)} with its argument, e.g. {{first: page}}")
        ((aggregate, argument),) = item.items()
        aggregate = _choice(aggregate, AGGREGATES, key)
        found[name] = _attribute(name, cast(Aggregate, aggregate), argument, spec_input, key)
    return tuple(found[name] for name in sorted(found))


def _attribute(name: str, aggregate: Aggregate, argument: object, spec_input: InputSpec, key: str) -> Attribute:
    if aggregate == "count_if":
        if not isinstance(argument, Mapping) or set(argument) != {"event_type"}:
            raise _fail(key, "count_if needs {event_type: [types...]}")
        types = argument["event_type"]
        types = [types] if isinstance(types, str) else types
        if not isinstance(types, list) or not types or not all(isinstance(t, str) and t for t in types):
            raise _fail(f"{key}.count_if.event_type", "expected an event type or a non-empty list of them")
        return Attribute(name, aggregate, event_types=tuple(dict.fromkeys(types)))
    if not isinstance(argument, str):
        raise _fail(key, f"{aggregate} needs the name of an input field, got {_kind(argument)}")
    source = spec_input.field(argument)
    if source is None:
        known = ", ".join(f.name for f in spec_input.fields) or "none declared"
        raise _fail(key, f"{aggregate} needs a field of input.fields, got {argument!r} (fields: {known})")
    if aggregate in ("sum", "min", "max") and source.type not in _NUMERIC:
        raise _fail(key, f"{aggregate} needs a field of type long or double, got {source.type}")
    return Attribute(name, aggregate, field=argument, field_type=source.type)
