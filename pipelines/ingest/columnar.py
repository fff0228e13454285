"""The columnar fast path of raw_events rows: pyarrow's JSON reader for the lines it can prove well formed,
the per-line rules (`lines.classify_line`, the specification) for every other line, the same rows either way.

Pure: pyarrow and numpy, no Spark, no I/O. `table.line_rows` calls `row_columns`; `table.line_rows(..., per_line=True)` is
the per-line reference that tests/test_ingest_columnar.py compares this module with.

A line takes the fast path only when every step below proves that the per-line path would accept it as a valid
event with exactly the values pyarrow read; anything else -- every line that will be rejected, and every line this
module is not sure about -- goes through `classify_line` unchanged:

1. Shape (numpy over the joined lines): it starts with `{`, ends with `}` (one trailing `\\r` allowed, which the
   per-line path strips), and is at most `FAST_MAX_LINE` bytes (Python's json refuses integers of more than
   `sys.get_int_max_str_digits()` digits: a shorter line cannot hold one). Blank lines, BOMs, non-objects and
   over-long lines fail here.
2. Screen (one RE2 pass, `_FLAG`, over all lines): a line with none of the following is clean: control bytes,
   bytes >= 0x80, backslashes, a second bracket, `Inf`/`NaN`, one of the five fields with a value that is not a
   string (`null` allowed for event_type and page), one of them named twice, a three-digit exponent. A flagged line
   gets the precise check in Python (`eligible`): valid UTF-8 (pyarrow does not check it); no `\\u00xx` escape
   (it could spell a field name json.loads would see and pyarrow might not: `"event\\u005fid"`) nor a surrogate
   escape; no bare `Inf`, `-Inf`, `-NaN` (RapidJSON takes them, json.loads does not); at most `MAX_BRACKETS`
   brackets (json.loads raises RecursionError on deep nesting, RapidJSON parses iteratively); no `} {` (two objects
   on one line are two rows to pyarrow, malformed to json.loads); no exponent of three digits (`1e999`: inf to
   json.loads, an error to RapidJSON); none of the five named twice (pyarrow would refuse the line: "specified
   twice"); the typed fields as in the screen.
3. Parse: the other lines are overwritten with blanks (which the reader skips) and the buffer goes to
   `pyarrow.json.read_json` with an explicit schema of the five fields as strings (other fields ignored), in
   groups of about `GROUP_BYTES`, on a thread per core. RapidJSON is otherwise at least as strict as json.loads
   (checked by the property test). A group that fails names its bad row: that line goes to the per-line path, the
   lines before it are read again and the rest goes on (at most about twice the parse); a group that gives another
   number of rows than lines is bisected down to the line.
4. Verify the values: event_id and user_id start with a printable ASCII character (so they are strings that are not
   blank by Python's `str.strip`); event_time is in the canonical form `YYYY-MM-DD[T ]HH:MM:SS[.f{1,9}](Z|+HH:MM)`
   (offset below 24 h, year 2..9998), parsed here with numpy exactly as `parse_event_time` does (UTC, truncated to
   the millisecond), and not after the far-future limit. event_type and page are strings or null by the schema.

The lines left to the per-line rules run with Python's cyclic GC paused (`paused_gc`): with millions of lines
alive, its full collections otherwise cost more than the rules.

What always takes the per-line path (correct, only slower): rejected lines of every kind, integer ids, other
event_time forms (`+0100`, `,5`, no seconds, naive), `page` objects or lists, lines with surrogate or ASCII `\\u`
escapes, more than `MAX_BRACKETS` brackets, a three-digit exponent, a field named twice, or longer than
`FAST_MAX_LINE` bytes.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import gc
import itertools
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from pipelines.core.spec import DEFAULT_INPUT, FieldType, InputSpec, split_path
from pipelines.ingest.lines import EPOCH_UNIT_US, Lines, classify_line
from pipelines.ingest.timestamps import EPOCH, TIME_TYPE, US, parse_times

__all__ = ["FAST_MAX_LINE", "FIELD_ARROW_TYPES", "GROUP_BYTES", "MAX_BRACKETS", "MIN_FAST_LINES", "fast_max_line",
           "fast_rows", "field_schema", "paused_gc", "row_columns"]

Classified = tuple[dict[str, Any], str | None, str] | None
Classifier = Callable[[bytes, dt.datetime | None], Classified]

FIELDS = ("event_id", "user_id", "event_time", "event_type", "page")
COLUMNS = ("event_id", "user_id", "event_time", "event_type", "page", "source_file", "line_no", "reject_reason", "raw")
FAST_MAX_LINE = 4096      # longer lines take the per-line path (and at most sys.get_int_max_str_digits() bytes)
MAX_BRACKETS = 64         # json.loads recurses per nesting level: deeper than this is left to it
MIN_FAST_LINES = 64       # fewer lines than this: the per-line path is cheaper than pyarrow's reader
GROUP_BYTES = 4 << 20     # bytes per read_json call (one block: a parse error then names the line)

_SCHEMA = pa.schema([(name, pa.string()) for name in FIELDS])
_PARSE = pj.ParseOptions(explicit_schema=_SCHEMA, unexpected_field_behavior="ignore")
_ERROR_ROW = re.compile(r"in row (\d+)")

# Step 2, vectorized over lines joined with "\n" (each value ends with its "\n"): any match -> `eligible` decides.
_ANY = r"[\x00-\xff]"
_FLAG = "|".join([
    r"[\x00-\x09\x0b\x0c\x0e-\x1f\x80-\xff\\]",   # control bytes but "\n" and "\r", non-ASCII, escapes
    r"\r[^\n]",                                    # a "\r" that does not end the line
    rf"\n{_ANY}",                                  # a "\n" inside a line (a Kafka message value)
    r".[\[{]",                                     # nesting (or a second object)
    r"Inf|NaN",
    r"[0-9.][eE][+-]?[0-9]{3}",                    # an exponent RapidJSON may find too big for a double
    r'"(?:event_id|user_id|event_time)" *: *[^" ]',
    r'"(?:event_type|page)" *: *[^"n ]',
    # A field named twice: pyarrow would refuse it ("specified twice"), but each refusal costs two reads.
    *(rf'"{name}"{_ANY}*"{name}"' for name in FIELDS),
])
# Step 2, the precise check of a flagged line (bytes, its trailing "\r" stripped).
_CONTROL = re.compile(rb"[\x00-\x1f]")
_ASCII_OR_SURROGATE_ESCAPE = re.compile(rb"\\u(?:00[0-7]|[dD][89abcdefABCDEF])")
_BARE_NON_JSON = re.compile(rb"[:,\[] *(?:-?Inf|-NaN)")
_TWO_OBJECTS = re.compile(rb"\} *\{")
_BIG_EXPONENT = re.compile(rb"[0-9.][eE][+-]?[0-9]{3}")
_BAD_TYPE = re.compile(rb'"(?:event_id|user_id|event_time)" *: *[^" ]|"(?:event_type|page)" *: *[^"n ]')
_KEYS = [(name, f'"{name}"'.encode()) for name in FIELDS]

# A spec that maps the fields elsewhere (SESSIONS_SPEC): steps 1 and 2 without the five names' own screens (pyarrow
# refuses a name twice in an object it reads, and any value not of the schema's type: the line goes per-line).
_MAPPED_FLAG = "|".join([
    r"[\x00-\x09\x0b\x0c\x0e-\x1f\x80-\xff\\]",
    r"\r[^\n]",
    rf"\n{_ANY}",
    r".[\[{]",
    r"Inf|NaN",
    r"[0-9.][eE][+-]?[0-9]{3}",
])
FIELD_ARROW_TYPES: dict[FieldType, pa.DataType] = {"string": pa.string(), "long": pa.int64(), "double": pa.float64(),
                                                   "boolean": pa.bool_()}
_TIME_MIN_US = (dt.datetime(2, 1, 1, tzinfo=dt.timezone.utc) - EPOCH) // US   # the ISO path's years, 2..9998
_TIME_MAX_US = (dt.datetime(9999, 1, 1, tzinfo=dt.timezone.utc) - EPOCH) // US
_EXACT = float(1 << 53)  # below this a double holds every integer: an epoch number read as one is exact


def field_schema(spec: InputSpec) -> list[pa.Field]:
    """raw_events' columns of the spec's typed fields: `field_<name>`, nullable, of the field's Arrow type."""
    return [pa.field(f.column, FIELD_ARROW_TYPES[f.type]) for f in spec.fields]


@dataclass(frozen=True)
class _Plan:
    """How the fast path reads one spec: pyarrow's options, the line screen and the checks of steps 2 and 4."""
    parse: pj.ParseOptions
    flag: str
    keys: tuple[bytes, ...]         # named twice: per-line (pyarrow would refuse the line, at two reads' cost)
    bad_type: re.Pattern[bytes] | None
    spec: InputSpec | None          # None: the default spec (the five top-level fields)


_DEFAULT_PLAN = _Plan(_PARSE, _FLAG, tuple(key for _, key in _KEYS), _BAD_TYPE, None)


@lru_cache(maxsize=16)
def _plan(spec: InputSpec) -> _Plan | None:
    """The plan of a mapped spec: an explicit schema of nested structs holding every path it reads (plus the
    top-level `page`), each leaf of the type the per-line rules accept; None when no schema can (a path through a
    leaf another path reads, a key that is not plain ASCII): every line then takes the per-line path."""
    time_type = pa.string() if spec.event_time.format == "iso8601" else pa.float64()
    leaves: list[tuple[tuple[str, ...], pa.DataType]] = [(("page",), pa.string())]
    leaves += [(split_path(p), pa.string()) for p in (*spec.event_id, *spec.user_id, *spec.event_type)]
    leaves += [(split_path(p), time_type) for p in spec.event_time.paths]
    leaves += [(split_path(f.path), FIELD_ARROW_TYPES[f.type]) for f in spec.fields]
    tree: dict[str, Any] = {}
    for steps, kind in leaves:
        if not all(step.isascii() and '"' not in step for step in steps):
            return None  # an escaped spelling of such a key would be another key to pyarrow than to json.loads
        node = tree
        for step in steps[:-1]:
            node = node.setdefault(step, {})
            if not isinstance(node, dict):
                return None
        if node.get(steps[-1], kind) != kind:
            return None  # read as a leaf of two types, or as a leaf and an object
        node[steps[-1]] = kind

    def fields_of(node: dict[str, Any]) -> list[pa.Field]:
        return [pa.field(k, pa.struct(fields_of(v)) if isinstance(v, dict) else v) for k, v in node.items()]

    schema = pa.schema(fields_of(tree))
    return _Plan(pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"), _MAPPED_FLAG, (), None,
                 spec)


class LineSource(Protocol):
    """What table.RowSource holds: one landed file's (or Kafka partition's) lines, or one refused file."""

    @property
    def name(self) -> str: ...
    @property
    def lines(self) -> Lines: ...
    @property
    def refused(self) -> str | None: ...
    @property
    def refused_raw(self) -> str | None: ...


def fast_max_line() -> int:
    """The longest line the fast path takes: FAST_MAX_LINE, or fewer bytes when Python's integer-digit limit is
    lower (a line of at most that many bytes cannot hold an integer json.loads refuses)."""
    digits = sys.get_int_max_str_digits()
    return FAST_MAX_LINE if digits == 0 else min(FAST_MAX_LINE, digits)


def eligible(raw: bytes, max_line: int | None = None, plan: _Plan = _DEFAULT_PLAN) -> bool:
    """Whether a line may go to pyarrow's reader (step 2 of the module docstring): this and the value checks of
    step 4 are what make its row equal the per-line path's."""
    line = raw.rstrip(b"\r")
    if not (line.startswith(b"{") and line.endswith(b"}")) or len(line) > (max_line or fast_max_line()):
        return False
    if _CONTROL.search(line):
        return False
    if not line.isascii():
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            return False
    if b"\\" in line and _ASCII_OR_SURROGATE_ESCAPE.search(line):
        return False
    if (b"Inf" in line or b"NaN" in line) and _BARE_NON_JSON.search(line):
        return False
    if line.count(b"{") + line.count(b"[") > MAX_BRACKETS or (line.count(b"{") > 1 and _TWO_OBJECTS.search(line)):
        return False
    if any(line.count(key) > 1 for key in plan.keys):
        return False
    if (b"e" in line or b"E" in line) and _BIG_EXPONENT.search(line):  # 1e999: json.loads takes inf, RapidJSON fails
        return False
    return plan.bad_type is None or not plan.bad_type.search(line)


def _printable_start(strings: pa.Array) -> np.ndarray:
    """Whether each value is a non-null string whose first byte is printable ASCII ("!".."~"): then it is a string
    that Python's str.strip does not empty."""
    n = len(strings)
    valid = strings.is_valid().to_numpy(zero_copy_only=False)
    offsets = np.frombuffer(strings.buffers()[1], np.int32)[strings.offset:strings.offset + n + 1]
    data_buffer = strings.buffers()[2]
    if data_buffer is None or data_buffer.size == 0:
        return np.zeros(n, bool)
    data = np.frombuffer(data_buffer, np.uint8)
    nonempty = offsets[1:] > offsets[:-1]
    first = data[np.minimum(offsets[:-1], len(data) - 1)]
    return valid & nonempty & (first >= 0x21) & (first <= 0x7E)


def _read(buffer: pa.Buffer, parse: pj.ParseOptions = _PARSE) -> pa.Table:
    reader = pa.BufferReader(buffer)
    return pj.read_json(reader, read_options=pj.ReadOptions(use_threads=False, block_size=buffer.size + 1),
                        parse_options=parse)


def _parse_group(buffer: pa.Buffer, starts: np.ndarray, ends: np.ndarray, lo: int,
                 hi: int, parse: pj.ParseOptions = _PARSE) -> tuple[list[tuple[int, pa.Table]], list[int]]:
    """Lines lo..hi of the buffer (line k = bytes starts[k]..ends[k], newline included; what lies between lines is
    blanks, which the reader skips) -> (parsed pieces as (first line, table), lines pyarrow refused). A failing read
    names its bad row: the lines before it are read again, the line goes to the refused, the rest goes on; a read
    giving another number of rows than lines is bisected."""
    pieces: list[tuple[int, pa.Table]] = []
    refused: list[int] = []
    todo = [(lo, hi)]
    while todo:
        a, b = todo.pop()
        if a >= b:
            continue
        start = int(starts[a])
        try:
            table = _read(buffer.slice(start, int(ends[b - 1]) - start), parse)
        except pa.ArrowException as error:
            found = _ERROR_ROW.search(str(error))
            row = int(found.group(1)) if found else -1
            if b - a == 1:
                refused.append(a)
            elif 0 <= row < b - a:
                refused.append(a + row)
                todo += [(a + row + 1, b), (a, a + row)]
            else:
                todo += [((a + b) // 2, b), (a, (a + b) // 2)]
            continue
        if table.num_rows == b - a:
            pieces.append((a, table))
        elif b - a == 1:
            refused.append(a)
        else:
            todo += [((a + b) // 2, b), (a, (a + b) // 2)]
    return pieces, refused


def _groups(starts: np.ndarray, group_bytes: int) -> list[tuple[int, int]]:
    """Consecutive line ranges of about group_bytes each."""
    n = len(starts)
    bounds = np.searchsorted(starts, np.arange(int(starts[0]), int(starts[-1]) + 1, max(1, group_bytes)))
    cuts = sorted(set(bounds.tolist()) | {0, n})
    return [(a, b) for a, b in itertools.pairwise(cuts) if a < b]


def fast_rows(lines: Lines, future_limit: dt.datetime,
              spec: InputSpec = DEFAULT_INPUT) -> tuple[np.ndarray, dict[str, pa.Array]]:
    """The lines proven valid events -> (their indices into lines, ascending; their event_id, user_id, event_time,
    event_type and page columns, and the spec's `field_<name>` columns). Every other line is left to the per-line
    path. Every line must be followed by its newline (`Lines.concat` makes sure of it)."""
    n = len(lines)
    empty = np.zeros(0, np.int64)
    if n == 0:
        return empty, {}
    plan = _DEFAULT_PLAN if spec == DEFAULT_INPUT else _plan(spec)
    if plan is None:
        return empty, {}
    max_line = fast_max_line()
    starts, ends = lines.starts, lines.ends
    lengths = ends - starts
    offsets = np.append(starts, ends[-1] + 1)  # each value with its "\n": the lines are contiguous
    joined = bytearray(lines.data)  # the copy the other lines are blanked in (lines.data stays as landed)
    data = np.frombuffer(joined, np.uint8)
    last, before_last = data[np.maximum(ends - 1, 0)], data[np.maximum(ends - 2, 0)]
    shaped = (lengths >= 2) & (lengths <= max_line) & (data[starts] == ord("{"))
    shaped &= (last == ord("}")) | ((last == ord("\r")) & (before_last == ord("}")))
    values = pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(joined)])
    flagged = _match(values, plan.flag) & shaped
    ok = shaped & ~flagged
    for k in np.flatnonzero(flagged).tolist():
        ok[k] = eligible(lines.line(k), max_line, plan)
    chosen = np.flatnonzero(ok)
    if len(chosen) == 0:
        return empty, {}
    for k in np.flatnonzero(~ok).tolist():  # the other lines become blanks, which the reader skips
        data[starts[k]:ends[k]] = 0x20
    chosen_starts, chosen_ends = starts[chosen], ends[chosen] + 1
    buffer = pa.py_buffer(joined)
    groups = _groups(chosen_starts, GROUP_BYTES)
    workers = max(1, min(len(groups), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:  # pyarrow releases the GIL while it parses
        results = list(pool.map(lambda g: _parse_group(buffer, chosen_starts, chosen_ends, g[0], g[1], plan.parse),
                                groups))
    pieces = sorted((piece for found, _ in results for piece in found), key=lambda piece: piece[0])
    if not pieces:
        return empty, {}
    parsed = np.concatenate([np.arange(first, first + t.num_rows) for first, t in pieces])
    table = pa.concat_tables([t for _, t in pieces]).combine_chunks()
    if plan.spec is not None:
        valid, out = _mapped_values(table, plan.spec, future_limit)
        return chosen[parsed[valid]], out
    columns = {name: table.column(name).chunk(0) if table.column(name).num_chunks else pa.array([], pa.string())
               for name in FIELDS}
    limit_us = (future_limit - EPOCH) // US
    time_ok, micros = parse_times(columns["event_time"])
    valid = _printable_start(columns["event_id"]) & _printable_start(columns["user_id"]) & time_ok
    valid &= micros <= limit_us
    keep = pa.array(valid)
    out = {name: columns[name].filter(keep) for name in ("event_id", "user_id", "event_type", "page")}
    out["event_time"] = pa.array(micros[valid], TIME_TYPE)
    return chosen[parsed[valid]], out


def _leaf(table: pa.Table, path: str) -> pa.Array:
    """A dotted path's values (null where an object on the way is null or absent)."""
    steps = split_path(path)
    column = table.column(steps[0])
    array = column.chunk(0) if column.num_chunks else pa.array([], column.type)
    return pc.struct_field(array, list(steps[1:])) if len(steps) > 1 else array


def _first_of(table: pa.Table, paths: tuple[str, ...]) -> pa.Array:
    """The first of the paths' values that is not null (the per-line rules' "first present and not null")."""
    arrays = [_leaf(table, path) for path in paths]
    return arrays[0] if len(arrays) == 1 else pc.coalesce(*arrays)


def _epoch_times(values: pa.Array, unit_us: int) -> tuple[np.ndarray, np.ndarray]:
    """(ok, UTC microseconds truncated to the millisecond) of epoch numbers read as doubles: ok where the number is
    whole and its microseconds below 2**53 (then the double is the number json.loads read, int or float, and both
    rules compute the same exact product) and in the ISO path's years; every other number is left per-line."""
    numbers = pc.fill_null(values, np.nan).to_numpy(zero_copy_only=False)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(numbers) & (np.floor(numbers) == numbers) & (np.abs(numbers) * unit_us < _EXACT)
    micros = np.where(ok, numbers, 0).astype(np.int64) * unit_us // 1000 * 1000
    ok &= (micros >= _TIME_MIN_US) & (micros < _TIME_MAX_US)
    return ok, micros


def _mapped_values(table: pa.Table, spec: InputSpec, future_limit: dt.datetime) -> tuple[np.ndarray, dict[str, pa.Array]]:
    """Step 4 for a mapped spec: (rows that are valid events, their columns)."""
    event_id, user_id = _first_of(table, spec.event_id), _first_of(table, spec.user_id)
    times = _first_of(table, spec.event_time.paths)
    if spec.event_time.format == "iso8601":
        time_ok, micros = parse_times(times)
    else:
        time_ok, micros = _epoch_times(times, EPOCH_UNIT_US[spec.event_time.format])
    valid = _printable_start(event_id) & _printable_start(user_id) & time_ok
    valid &= micros <= (future_limit - EPOCH) // US
    columns = {f.column: _leaf(table, f.path) for f in spec.fields}
    for f in spec.fields:
        if f.type == "double":  # 2e308 reads as inf; json.loads' inf is no double of the per-line rules
            column = columns[f.column]
            valid &= pc.fill_null(pc.is_finite(column), True).to_numpy(zero_copy_only=False)
    keep = pa.array(valid)
    out = {"event_id": event_id.filter(keep), "user_id": user_id.filter(keep),
           "event_type": _first_of(table, spec.event_type).filter(keep), "page": _leaf(table, "page").filter(keep),
           "event_time": pa.array(micros[valid], TIME_TYPE)}
    out.update({name: column.filter(keep) for name, column in columns.items()})
    return valid, out


def _match(lines: pa.Array, pattern: str) -> np.ndarray:
    """match_substring_regex over the lines, in two halves on two threads when there are cores for it."""
    n = len(lines)
    halves = 2 if (os.cpu_count() or 1) > 1 and n >= 4096 else 1
    parts = [lines.slice(k * n // halves, (k + 1) * n // halves - k * n // halves) for k in range(halves)]
    with ThreadPoolExecutor(halves) as pool:
        found = list(pool.map(lambda part: pc.match_substring_regex(part, pattern), parts))
    return np.concatenate([f.to_numpy(zero_copy_only=False) for f in found]).astype(bool)


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Python's cyclic garbage collector off for a loop that allocates many short-lived containers (json.loads'
    dicts, the row lists) while millions of objects (the commit's lines) are alive: each full collection walks all
    of them, which cost the per-line rules more than the rules themselves (10x on 200k lines beside 2M: see
    benchmarks/README.md). Nothing in the loop makes reference cycles; refcounting frees everything it drops."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def row_columns(sources: Sequence[LineSource], future_limit: dt.datetime,
                classify: Classifier | None = None, *, spec: InputSpec = DEFAULT_INPUT) -> dict[str, pa.Array]:
    """The raw_events columns of COLUMNS, then the spec's `field_<name>` columns, for the sources' lines (and refused
    files), in the per-line path's row order: each source's refused row, then its lines; blank lines dropped.
    line_key, ingest_seq and ingested_at are the caller's. `classify`: the per-line rules (classify_line with the
    spec)."""
    if classify is None:
        classify = classify_line if spec == DEFAULT_INPUT else partial(classify_line, spec=spec)
    extra = field_schema(spec)
    fields_read = FIELDS + tuple(f.name for f in extra)
    names = [source.name for source in sources]
    counts = [len(source.lines) for source in sources]
    lines = Lines.concat([source.lines for source in sources])
    line_nos = lines.numbers
    line_source = np.repeat(np.arange(len(sources), dtype=np.int64), counts)
    if len(lines) >= MIN_FAST_LINES:
        fast, fast_columns = fast_rows(lines, future_limit, spec)
    else:
        fast, fast_columns = np.zeros(0, np.int64), {}
    slow_mask = np.ones(len(lines), bool)
    slow_mask[fast] = False
    # The per-line path for everything else; each source's refused row comes before its first line.
    slow: dict[str, list[Any]] = {name: [] for name in COLUMNS + tuple(f.name for f in extra)}
    slow_keys: list[int] = []
    slow_source: list[int] = []
    first_line = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    for s, source in enumerate(sources):
        if source.refused is not None:
            for name in fields_read:
                slow[name].append(None)
            slow["line_no"].append(0)
            slow["reject_reason"].append(source.refused)
            slow["raw"].append(source.refused_raw)
            slow_keys.append(2 * int(first_line[s]))
            slow_source.append(s)
    with paused_gc():
        for k in np.flatnonzero(slow_mask).tolist():
            classified = classify(lines.line(k), future_limit)
            if classified is None:  # blank lines carry nothing to keep (they keep their numbers)
                continue
            fields_, reason, text = classified
            for name in fields_read:
                slow[name].append(fields_.get(name))
            slow["line_no"].append(int(line_nos[k]))
            slow["reject_reason"].append(reason)
            slow["raw"].append(text if reason else None)
            slow_keys.append(2 * k + 1)
            slow_source.append(int(line_source[k]))
    n_fast, n_slow = len(fast), len(slow_keys)
    keys = np.concatenate([2 * fast + 1, np.array(slow_keys, np.int64)])
    order = np.argsort(keys, kind="stable")
    in_order = order if n_slow else None
    sources_of_rows = np.concatenate([line_source[fast], np.array(slow_source, np.int64)])
    line_no = np.concatenate([line_nos[fast], np.array(slow["line_no"], np.int64)])

    def column(name: str, kind: pa.DataType, fast_part: pa.Array | None) -> pa.Array:
        parts = [fast_part if fast_part is not None else pa.nulls(n_fast, kind), pa.array(slow[name], kind)]
        whole = pa.concat_arrays([p for p in parts if len(p)]) if n_fast + n_slow else pa.array([], kind)
        return whole.take(pa.array(in_order)) if in_order is not None else whole

    out = {name: column(name, pa.string(), fast_columns.get(name) if n_fast else None)
           for name in ("event_id", "user_id", "event_type", "page", "reject_reason", "raw")}
    out["event_time"] = column("event_time", TIME_TYPE, fast_columns.get("event_time") if n_fast else None)
    rows_order = order if n_slow else np.arange(n_fast + n_slow)
    out["source_file"] = pa.array(names, pa.string()).take(pa.array(sources_of_rows[rows_order]))
    out["line_no"] = pa.array(line_no[rows_order], pa.int64())
    for f in extra:
        out[f.name] = column(f.name, f.type, fast_columns.get(f.name) if n_fast else None)
    return {name: out[name] for name in COLUMNS + tuple(f.name for f in extra)}
