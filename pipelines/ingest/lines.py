"""The rules for one landed line: what parses, what is rejected and why; and `Lines`, a source's lines in one buffer
(pure: no I/O, no Spark, no Delta)."""
from __future__ import annotations

import datetime as dt
import itertools
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from pipelines.core.spec import DEFAULT_INPUT, FieldSpec, InputSpec, TimeFormat, split_path

__all__ = ["BOM", "EPOCH_UNIT_US", "Lines", "classify_line", "epoch_micros", "field_value", "is_json_object",
           "parse_event_time", "parse_line", "path_value", "split_lines"]

MAX_LINE_BYTES = 1 << 20        # longer lines are quarantined (line_too_long) with a preview, not parsed
RAW_PREVIEW_BYTES = 4096
BOM = b"\xef\xbb\xbf"


def _storable(text: str) -> bool:
    # json.loads turns a lone "\ud800" escape into a surrogate that no UTF-8 column can hold.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _identifier(record: Mapping[str, Any], name: str) -> tuple[str | None, str | None]:
    """(value, reject_reason): absent, null or blank is `missing_<name>`; anything but a string or an integer
    (679.5, true, a list) is `invalid_<name>`. Integers are kept as their decimal text."""
    return _identifier_value(record.get(name), name)


def _identifier_value(value: object, name: str) -> tuple[str | None, str | None]:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None, f"missing_{name}"
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None, f"invalid_{name}"
    text = str(value)
    return (text, None) if _storable(text) else (None, "invalid_utf8")


def parse_event_time(value: object) -> dt.datetime | None:
    """ISO-8601 with Z or an offset, to UTC at millisecond precision; None when not parseable."""
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.strip())
        if parsed.tzinfo is None:
            return None  # no offset: ambiguous, refuse rather than guess a zone
        parsed = parsed.astimezone(dt.timezone.utc)
    except (ValueError, OverflowError):  # OverflowError: 9999-12-31T23:00-05:00 is past the end of time in UTC
        return None
    return parsed.replace(microsecond=parsed.microsecond // 1000 * 1000)


def parse_line(line: str, future_limit: dt.datetime | None = None,
               spec: InputSpec = DEFAULT_INPUT) -> tuple[dict[str, Any], str | None]:
    """Return (fields, reject_reason). reject_reason is None for a valid event; a rejected line keeps the fields
    read before the reason was found (for the quarantine row). An event_time after future_limit is
    `future_event_time`. With a spec other than the default the fields are read where it maps them, and its typed
    fields are `field_<name>` (SESSIONS_SPEC)."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: thousands of nested brackets
        return {}, "malformed_json"
    if not isinstance(record, dict):
        return {}, "not_an_object"
    if spec is not DEFAULT_INPUT and spec != DEFAULT_INPUT:
        return _parse_mapped(record, spec, future_limit)
    event_id, reason = _identifier(record, "event_id")
    if reason:
        return {}, reason
    user_id, reason = _identifier(record, "user_id")
    if reason:
        return {"event_id": event_id}, reason
    fields_: dict[str, Any] = {"event_id": event_id, "user_id": user_id}
    if record.get("event_time") in (None, ""):
        return fields_, "missing_event_time"
    event_time = parse_event_time(record.get("event_time"))
    if event_time is None:
        return fields_, "unparseable_event_time"
    fields_["event_time"] = event_time
    event_type, page = record.get("event_type"), record.get("page")
    if event_type is not None and not isinstance(event_type, str):
        return fields_, "invalid_event_type"  # it decides sessions (logout, page_view): never guessed
    if page is not None and not isinstance(page, str):
        page = json.dumps(page, separators=(",", ":"))  # informational only: kept, as JSON text
    if not _storable(event_type or "") or not _storable(page or ""):
        return fields_, "invalid_utf8"
    fields_.update(event_type=event_type, page=page)
    if future_limit is not None and event_time > future_limit:
        return fields_, "future_event_time"
    return fields_, None


# Microseconds per unit of an epoch event_time (SESSIONS_SPEC input.event_time.format).
EPOCH_UNIT_US: dict[TimeFormat, int] = {"epoch_s": 1_000_000, "epoch_ms": 1_000, "epoch_us": 1}
_EPOCH_UNIT_FLOAT = {name: float(unit) for name, unit in EPOCH_UNIT_US.items()}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def path_value(record: Mapping[str, Any], steps: tuple[str, ...]) -> Any:
    """The value at a dotted path's keys in nested objects; None when a key is absent or a step is no object."""
    value: Any = record
    for step in steps:
        if not isinstance(value, dict):
            return None
        value = value.get(step)
    return value


def _first(record: Mapping[str, Any], paths: tuple[tuple[str, ...], ...]) -> Any:
    """The first of the paths' values that is present and not null."""
    for steps in paths:
        value = path_value(record, steps)
        if value is not None:
            return value
    return None


def epoch_micros(value: object, time_format: TimeFormat) -> int | None:
    """An epoch number (int or float; not a boolean, not a string) -> UTC microseconds truncated to the millisecond
    as parse_event_time truncates, or None when it is no number or no time a datetime holds. An integer is exact;
    a float is multiplied out in floating point (the columnar path does the same)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        micros = math.floor(value * _EPOCH_UNIT_FLOAT[time_format])
    else:
        micros = value * EPOCH_UNIT_US[time_format]
    micros = micros // 1000 * 1000
    try:
        _EPOCH + dt.timedelta(microseconds=micros)
    except OverflowError:
        return None
    return micros


def field_value(value: object, spec: FieldSpec) -> tuple[Any, bool]:
    """(the value as its declared type, ok): None is a missing field (ok); a value of another type is not ok. An
    integer is a double too; a float is no long (3.0 included: the producer said double); a long is 64 bits."""
    if value is None:
        return None, True
    kind = spec.type
    if kind == "string":
        return (value, True) if isinstance(value, str) else (None, False)
    if kind == "boolean":
        return (value, True) if isinstance(value, bool) else (None, False)
    if isinstance(value, bool):
        return None, False
    if kind == "long":
        return (value, True) if isinstance(value, int) and -(1 << 63) <= value < (1 << 63) else (None, False)
    if isinstance(value, int):
        try:
            return float(value), True
        except OverflowError:
            return None, False
    return (value, True) if isinstance(value, float) and math.isfinite(value) else (None, False)


def _parse_mapped(record: dict[str, Any], spec: InputSpec,
                  future_limit: dt.datetime | None) -> tuple[dict[str, Any], str | None]:
    """parse_line's rules with the fields where the spec maps them (`_paths` of InputSpec), in the same order of
    reasons; then the typed fields (`invalid_field:<name>`)."""
    event_id, reason = _identifier_value(_first(record, _steps(spec.event_id)), "event_id")
    if reason:
        return {}, reason
    user_id, reason = _identifier_value(_first(record, _steps(spec.user_id)), "user_id")
    if reason:
        return {"event_id": event_id}, reason
    fields_: dict[str, Any] = {"event_id": event_id, "user_id": user_id}
    raw_time = _first(record, _steps(spec.event_time.paths))
    if raw_time in (None, ""):
        return fields_, "missing_event_time"
    if spec.event_time.format == "iso8601":
        event_time = parse_event_time(raw_time)
    else:
        micros = epoch_micros(raw_time, spec.event_time.format)
        event_time = None if micros is None else _EPOCH + dt.timedelta(microseconds=micros)
    if event_time is None:
        return fields_, "unparseable_event_time"
    fields_["event_time"] = event_time
    event_type, page = _first(record, _steps(spec.event_type)), record.get("page")
    if event_type is not None and not isinstance(event_type, str):
        return fields_, "invalid_event_type"
    if page is not None and not isinstance(page, str):
        page = json.dumps(page, separators=(",", ":"))
    if not _storable(event_type or "") or not _storable(page or ""):
        return fields_, "invalid_utf8"
    fields_.update(event_type=event_type, page=page)
    for field_spec in spec.fields:
        value, ok = field_value(path_value(record, split_path(field_spec.path)), field_spec)
        if not ok:
            return fields_, f"invalid_field:{field_spec.name}"
        if isinstance(value, str) and not _storable(value):
            return fields_, "invalid_utf8"
        fields_[field_spec.column] = value
    if future_limit is not None and event_time > future_limit:
        return fields_, "future_event_time"
    return fields_, None


_STEPS: dict[tuple[str, ...], tuple[tuple[str, ...], ...]] = {}


def _steps(paths: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """The paths' keys, split once per process (a spec has a handful of paths)."""
    found = _STEPS.get(paths)
    if found is None:
        found = _STEPS[paths] = tuple(split_path(path) for path in paths)
    return found


def classify_line(raw: bytes, future_limit: dt.datetime | None = None,
                  spec: InputSpec = DEFAULT_INPUT) -> tuple[dict[str, Any], str | None, str] | None:
    """One landed line (without its newline) -> (fields, reject_reason, text), or None for a blank line."""
    line = raw.rstrip(b"\r")
    if line.startswith(BOM):  # a BOM opens files written by some Windows tools (and lines of concatenated ones)
        line = line[len(BOM):]
    if not line.strip():
        return None
    if len(line) > MAX_LINE_BYTES:
        preview = line[:RAW_PREVIEW_BYTES].decode("utf-8", errors="backslashreplace")
        return {}, "line_too_long", f"{preview}... [cut: the line has {len(line)} bytes]"
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        # Never guess: the bytes stay readable as backslash escapes (b"\xff" -> "\\xff").
        return {}, "invalid_utf8", line.decode("utf-8", errors="backslashreplace")
    fields_, reason = parse_line(text, future_limit, spec)
    return fields_, reason, text


def is_json_object(tail: bytes) -> bool:
    """Whether an unterminated final line is complete already: a whole JSON object (a cut-off one never is)."""
    try:
        return isinstance(json.loads(tail.removeprefix(BOM).decode("utf-8")), dict)
    except (ValueError, RecursionError):
        return False


class Lines:
    """Complete lines in one buffer (a file's body, an object, a Kafka partition's messages): line k is
    data[starts[k]:ends[k]] without its newline, numbered numbers[k]. Each line but possibly the last is followed by a
    newline and the next line starts right after it, so the buffer is the lines as landed: the columnar path reads it
    whole, and no per-line object exists unless a line is taken one at a time (`line`, iteration)."""

    __slots__ = ("data", "ends", "numbers", "starts")

    def __init__(self, data: bytes, starts: np.ndarray, ends: np.ndarray, numbers: np.ndarray):
        self.data, self.starts, self.ends, self.numbers = data, starts, ends, numbers

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[int, bytes]]) -> Lines:
        """(line_no, bytes without the newline) pairs, e.g. Kafka messages (offset, value), joined with newlines."""
        items = list(pairs)
        lengths = np.fromiter((len(raw) for _, raw in items), np.int64, len(items))
        starts = np.zeros(len(items), np.int64)
        np.cumsum(lengths[:-1] + 1, out=starts[1:])
        numbers = np.fromiter((no for no, _ in items), np.int64, len(items))
        data = b"".join(itertools.chain.from_iterable((raw, b"\n") for _, raw in items))  # one copy of each value
        return cls(data, starts, starts + lengths, numbers)

    @classmethod
    def concat(cls, parts: Sequence[Lines]) -> Lines:
        """The parts' lines in one buffer, each followed by a newline (a part's unterminated last line gets one):
        one copy, none when a single part already ends with its newline."""
        parts = [part for part in parts if len(part)]
        if not parts:
            return cls(b"", *(np.zeros(0, np.int64) for _ in range(3)))
        if len(parts) == 1 and parts[0].starts[0] == 0 and len(parts[0].data) == parts[0].ends[-1] + 1:
            return parts[0]  # the whole buffer is the lines, the last one with its newline
        chunks: list[memoryview | bytes] = []
        bases, base = [], 0
        for part in parts:
            first, end = int(part.starts[0]), int(part.ends[-1])
            bases.append(base - first)
            chunks += [memoryview(part.data)[first:end], b"\n"]
            base += end - first + 1
        return cls(b"".join(chunks), np.concatenate([p.starts + b for p, b in zip(parts, bases, strict=True)]),
                   np.concatenate([p.ends + b for p, b in zip(parts, bases, strict=True)]),
                   np.concatenate([p.numbers for p in parts]))

    def __len__(self) -> int:
        return len(self.starts)

    def line(self, k: int) -> bytes:
        return self.data[int(self.starts[k]):int(self.ends[k])]

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        """(line_no, bytes without the newline), one object per line: the per-line path's view."""
        for k in range(len(self)):
            yield int(self.numbers[k]), self.line(k)


NEWLINE_SCAN_BYTES = 1 << 24    # the newline scan's chunk: a bool array this big, not one the size of the file


def split_lines(body: bytes, lines_before: int, open_before: bool) -> tuple[Lines, int, bool]:
    """Complete lines of body numbered on from lines_before -> (lines, lines consumed, last line unterminated).
    After an unterminated line (taken as a whole JSON object) the newline that follows closes that same line."""
    if not body:
        return Lines(body, *(np.zeros(0, np.int64) for _ in range(3))), lines_before, open_before
    view = np.frombuffer(body, np.uint8)
    newlines = np.concatenate([np.zeros(0, np.int64)] + [
        np.flatnonzero(view[at:at + NEWLINE_SCAN_BYTES] == ord("\n")) + at
        for at in range(0, len(body), NEWLINE_SCAN_BYTES)])
    terminated = body.endswith(b"\n")
    ends = newlines if terminated else np.append(newlines, len(body))
    starts = np.zeros(len(ends), np.int64)
    starts[1:] = ends[:-1] + 1
    first = lines_before if open_before else lines_before + 1
    return Lines(body, starts, ends, np.arange(first, first + len(ends), dtype=np.int64)), \
        first + len(ends) - 1, not terminated
