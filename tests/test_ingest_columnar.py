"""The columnar ingest path (pipelines/ingest/columnar.py) gives exactly the rows of the per-line path, which stays
the specification: `line_rows(...)` == `line_rows(..., per_line=True)` for mixes of well-formed and hostile lines generated
by hypothesis, plus one case per rule, each saying whether the fast path may take the line or must leave it to the
per-line rules."""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import random
from collections.abc import Iterator
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.core.sample_data import arrival_order, generate_events
from pipelines.ingest import columnar, timestamps
from pipelines.ingest.lines import Lines, parse_event_time, split_lines
from pipelines.ingest.table import RowSource, line_rows

pytestmark = pytest.mark.tier("pure")

INGESTED_AT = dt.datetime(2026, 11, 1, 12, 0, 0, 123456, tzinfo=dt.timezone.utc)
MAX_FUTURE = dt.timedelta(minutes=60)
LIMIT = INGESTED_AT + MAX_FUTURE
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


@contextlib.contextmanager
def fast_for_any_size(group_bytes: int = 256) -> Iterator[None]:
    """The fast path even for a handful of lines, in small groups (several reads, threads, error recovery)."""
    with mock.patch.object(columnar, "MIN_FAST_LINES", 0), mock.patch.object(columnar, "GROUP_BYTES", group_bytes):
        yield


def row_source(name: str, pairs: list[tuple[int, bytes]], refused: str | None = None,
               refused_raw: str | None = None) -> RowSource:
    return RowSource(name, Lines.from_pairs(pairs), refused, refused_raw)


def assert_same_rows(sources: list[RowSource]) -> pa.Table:
    expected = line_rows(sources, 7, INGESTED_AT, MAX_FUTURE, per_line=True)
    with fast_for_any_size():
        got = line_rows(sources, 7, INGESTED_AT, MAX_FUTURE)
    assert got.schema == expected.schema
    if not got.equals(expected):
        want, have = expected.to_pylist(), got.to_pylist()
        for k, (w, h) in enumerate(zip(want, have)):
            assert h == w, f"row {k} differs"
        assert len(have) == len(want)
    return got


def fast_taken(lines: list[bytes], limit: dt.datetime = LIMIT) -> set[int]:
    with fast_for_any_size():
        taken, _ = columnar.fast_rows(Lines.from_pairs(enumerate(lines)), limit)
    return set(taken.tolist())


def event(**fields: object) -> dict[str, object]:
    record: dict[str, object] = {"event_id": "e-1", "user_id": "u-1", "event_time": "2026-11-01T08:00:00Z",
                                 "event_type": "page_view", "page": "/"}
    record.update(fields)
    return {k: v for k, v in record.items() if v is not ABSENT}


ABSENT = object()


def dumps(record: dict[str, object], compact: bool = False) -> bytes:
    return json.dumps(record, separators=(",", ":") if compact else None).encode()


# --- one case per rule: (line, whether the fast path may take it) ------------------------------------------------

RULES = [
    ("plain", dumps(event()), True),
    ("compact separators", dumps(event(), compact=True), True),
    ("other key order, extra fields", b'{"page": "/x", "extra": 1, "user_id": "u", "event_time": '
                                      b'"2026-11-01T08:00:00Z", "more": "x", "event_id": "e"}', True),
    ("nested extra field", dumps(event(props={"a": [1, {"b": None}], "c": "d"})), True),
    ("page null", dumps(event(page=None)), True),
    ("page missing", dumps(event(page=ABSENT)), True),
    ("event_type null", dumps(event(event_type=None)), True),
    ("event_type missing", dumps(event(event_type=ABSENT)), True),
    ("trailing CR", dumps(event()) + b"\r", True),
    ("two trailing CRs", dumps(event()) + b"\r\r", False),
    ("non-ASCII UTF-8 page", json.dumps(event(page="/caf\u00e9/\u6f22"), ensure_ascii=False).encode(), True),
    ("non-ASCII escaped page", json.dumps(event(page="/caf\u00e9")).encode(), True),
    ("emoji as surrogate pair escape", json.dumps(event(page="/\U0001f600")).encode(), False),
    ("lone surrogate escape", dumps(event()).replace(b'"/"', b'"\\ud800"'), False),
    ("ASCII escape in a key", dumps(event()).replace(b'"event_id"', b'"event\\u005fid"'), False),
    ("duplicate event_id: last wins", b'{"event_id": "a", "event_id": "b", "user_id": "u", '
                                      b'"event_time": "2026-11-01T08:00:00Z"}', False),
    ("duplicate page, null then string", b'{"page": null, "event_id": "a", "user_id": "u", '
                                         b'"event_time": "2026-11-01T08:00:00Z", "page": "/p"}', False),
    ("duplicate event_type, compact", b'{"event_type":"a","event_id":"a","user_id":"u",'
                                      b'"event_time":"2026-11-01T08:00:00Z","event_type":"logout"}', False),
    ("duplicate extra key", b'{"x": 1, "x": {"y": 2}, "event_id": "a", "user_id": "u", '
                            b'"event_time": "2026-11-01T08:00:00Z"}', True),
    ("BOM", b"\xef\xbb\xbf" + dumps(event()), False),
    ("invalid UTF-8", dumps(event()).replace(b'"/"', b'"/\xff"'), False),
    ("overlong UTF-8", dumps(event()).replace(b'"/"', b'"/\xc0\xaf"'), False),
    ("UTF-8 encoded surrogate", dumps(event()).replace(b'"/"', b'"/\xed\xa0\x80"'), False),
    ("blank", b"", False),
    ("whitespace", b" \t ", False),
    ("not JSON", b"not json", False),
    ("cut off", dumps(event())[:-5], False),
    ("braces, not JSON", b"{not json}", False),
    ("two objects on a line", dumps(event()) + b' {"x": 1}', False),
    ("two objects, no space", dumps(event()) + b"{}", False),
    ("non-object", b'["a"]', False),
    ("event_id missing", dumps(event(event_id=ABSENT)), False),
    ("event_id null", dumps(event(event_id=None)), False),
    ("event_id blank", dumps(event(event_id=" ")), False),
    ("event_id unicode blank", json.dumps(event(event_id="\u2003"), ensure_ascii=False).encode(), False),
    ("event_id starting with a space", dumps(event(event_id=" x")), False),
    ("event_id integer", dumps(event(event_id=12345678901234567890)), False),
    ("event_id float", dumps(event(event_id=679.5)), False),
    ("event_id bool", dumps(event(event_id=True)), False),
    ("user_id list", dumps(event(user_id=["u"])), False),
    ("user_id missing", dumps(event(user_id=ABSENT)), False),
    ("event_time missing", dumps(event(event_time=ABSENT)), False),
    ("event_time empty", dumps(event(event_time="")), False),
    ("event_time number", dumps(event(event_time=1793520000000)), False),
    ("event_time naive", dumps(event(event_time="2026-11-01T08:00:00")), False),
    ("event_time offset", dumps(event(event_time="2026-11-01T08:00:00+05:30")), True),
    ("event_time negative offset", dumps(event(event_time="2026-11-01T08:00:00-03:00")), True),
    ("event_time space separator", dumps(event(event_time="2026-11-01 08:00:00Z")), True),
    ("event_time fraction 1", dumps(event(event_time="2026-11-01T08:00:00.5Z")), True),
    ("event_time fraction 6 + offset", dumps(event(event_time="2026-11-01T08:00:00.123456+01:00")), True),
    ("event_time fraction 9", dumps(event(event_time="2026-11-01T08:00:00.123456789Z")), True),
    ("event_time fraction 12", dumps(event(event_time="2026-11-01T08:00:00.123456789123Z")), False),
    ("event_time compact offset", dumps(event(event_time="2026-11-01T08:00:00+0100")), False),
    ("event_time hour offset", dumps(event(event_time="2026-11-01T08:00:00+01")), False),
    ("event_time lowercase t", dumps(event(event_time="2026-11-01t08:00:00Z")), False),
    ("event_time comma fraction", dumps(event(event_time="2026-11-01T08:00:00,5Z")), False),
    ("event_time no seconds", dumps(event(event_time="2026-11-01T08:00Z")), False),
    ("event_time padded", dumps(event(event_time=" 2026-11-01T08:00:00Z ")), False),
    ("event_time Feb 29 leap", dumps(event(event_time="2024-02-29T00:00:00Z")), True),
    ("event_time Feb 29 not leap", dumps(event(event_time="2026-02-29T00:00:00Z")), False),
    ("event_time leap second", dumps(event(event_time="2026-11-01T23:59:60Z")), False),
    ("event_time hour 24", dumps(event(event_time="2026-11-01T24:00:00Z")), False),
    ("event_time offset 24h", dumps(event(event_time="2026-11-01T08:00:00+24:00")), False),
    ("event_time year 1", dumps(event(event_time="0001-01-01T00:00:00Z")), False),
    ("event_time before year 1 in UTC", dumps(event(event_time="0001-01-01T00:30:00+01:00")), False),
    ("event_time after 9999 in UTC", dumps(event(event_time="9999-12-31T23:00:00-05:00")), False),
    ("event_time garbage", dumps(event(event_time="yesterday")), False),
    ("far future", dumps(event(event_time="2026-11-01T13:00:01Z")), False),
    ("at the future limit", dumps(event(event_time="2026-11-01T13:00:00.123999Z")), True),
    ("just past the future limit", dumps(event(event_time="2026-11-01T13:00:00.124Z")), False),
    ("event_type list", dumps(event(event_type=["logout"])), False),
    ("event_type number", dumps(event(event_type=3)), False),
    ("page object", dumps(event(page={"path": "/x"})), False),
    ("page number", dumps(event(page=1.5)), False),
    ("bare NaN extra (both parsers take it)", dumps(event(x=float("nan"))), True),
    ("Infinity extra", dumps(event(x=float("inf"))), False),
    ("bare Inf (RapidJSON only)", dumps(event()).replace(b"}", b', "x": Inf}'), False),
    ("bare -NaN (RapidJSON only)", dumps(event()).replace(b"}", b', "x": -NaN}'), False),
    ("Inf inside a string", dumps(event(page="/Info")), True),
    ("number too big for a double", dumps(event()).replace(b"}", b', "x": 1e999}'), False),
    ("three-digit exponent", dumps(event()).replace(b"}", b', "x": 1.5e-100}'), False),
    ("e and digits in a string", dumps(event(page="/page100")), True),
    ("exponent-like text in a string (left to the per-line rules)", dumps(event(page="/v1e100")), False),
    ("big integer extra", dumps(event(x=10 ** 60)), True),
    ("integer of 5000 digits", dumps(event()).replace(b"}", b', "x": ' + b"9" * 5000 + b"}"), False),
    ("nested 40 deep", dumps(event(x=json.loads("[" * 40 + "]" * 40))), True),
    ("nested 2000 deep", dumps(event()).replace(b"}", b', "x": ' + b"[" * 2000 + b"]" * 2000 + b"}"), False),
    ("line over 4 KiB", dumps(event(x="y" * 5000)), False),
    ("line over 1 MiB", dumps(event(x="y" * (1 << 20))), False),
    ("control byte in a string", dumps(event()).replace(b'"/"', b'"/\x01"'), False),
    ("tab between tokens", dumps(event()).replace(b", ", b",\t"), False),
    ("newline inside a Kafka value", dumps(event()).replace(b", ", b",\n", 1), False),
    ("quote-escaped field name in a value", dumps(event(page='"event_id": 5')), True),
    ("field name nested in an extra object", dumps(event(meta={"event_id": 5})), False),
    ("event_type value 'page' (a field name twice: left to the per-line rules)", dumps(event(event_type="page")),
     False),
]


@pytest.mark.parametrize("line,fast", [pytest.param(line, fast, id=name) for name, line, fast in RULES])
def test_each_rule_same_row_and_the_fast_path_only_where_certain(line: bytes, fast: bool) -> None:
    clean = dumps(event(event_id="clean"))
    lines = [clean, line, clean]
    assert_same_rows([row_source("f.jsonl", [(k + 1, raw) for k, raw in enumerate(lines)])])
    assert fast_taken(lines) == ({0, 1, 2} if fast else {0, 2})


def test_all_rules_together_in_one_commit_with_refused_files() -> None:
    rng = random.Random(5)
    lines = [line for _, line, _ in RULES] * 3 + [dumps(event(event_id=f"e{k}")) for k in range(300)]
    rng.shuffle(lines)
    sources = [row_source("a.jsonl", [(k + 10, raw) for k, raw in enumerate(lines[:200])]),
               row_source("link.jsonl", [], refused="refused_symlink", refused_raw="symlink to /etc"),
               row_source("fifo.jsonl", [], refused="refused_special_file", refused_raw="fifo"),
               row_source("b.jsonl", [(k + 1, raw) for k, raw in enumerate(lines[200:])]),
               row_source("empty.jsonl", [])]
    table = assert_same_rows(sources)
    assert table["line_key"].to_pylist() == list(range(1, table.num_rows + 1))


def test_sample_clickstream_is_all_fast_and_equal() -> None:
    events = arrival_order(generate_events(300, 3, seed=11), seed=11)
    lines = [json.dumps(e).encode() for e in events]
    ingested_at = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
    assert fast_taken(lines, ingested_at + MAX_FUTURE) == set(range(len(lines)))
    sources = [row_source("s.jsonl", [(k + 1, raw) for k, raw in enumerate(lines)])]
    expected = line_rows(sources, 3, ingested_at, MAX_FUTURE, per_line=True)
    assert expected["reject_reason"].null_count == expected.num_rows
    with fast_for_any_size(64 << 10):
        assert line_rows(sources, 3, ingested_at, MAX_FUTURE).equals(expected)


def test_a_parse_error_costs_only_its_line() -> None:
    """A line that passes every screen but that pyarrow refuses (here two values without a comma: malformed to both
    parsers) goes alone to the per-line path; its neighbours stay on the fast path."""
    good = [dumps(event(event_id=f"e{k}")) for k in range(200)]
    bad = dumps(event()).replace(b', "user_id"', b' "user_id"')
    lines = good[:50] + [bad] + good[50:120] + [bad, bad] + good[120:] + [bad]
    taken = fast_taken(lines)
    assert taken == set(range(len(lines))) - {50, 121, 122, 203}
    assert_same_rows([row_source("f.jsonl", [(k + 1, raw) for k, raw in enumerate(lines)])])


def test_the_integer_digit_limit_bounds_the_fast_lines() -> None:
    import sys
    limit = sys.get_int_max_str_digits()
    try:
        sys.set_int_max_str_digits(640)
        line = dumps(event()).replace(b"}", b', "x": ' + b"9" * 700 + b"}")
        assert fast_taken([line]) == set()
        assert_same_rows([row_source("f.jsonl", [(1, line)])])
    finally:
        sys.set_int_max_str_digits(limit)


# --- event_time: the numpy parser against parse_event_time ---------------------------------------------------------

def _time_text(year: int, month: int, day: int, hour: int, minute: int, second: int, fraction: str, sep: str,
               zone: str) -> str:
    return f"{year:04d}-{month:02d}-{day:02d}{sep}{hour:02d}:{minute:02d}:{second:02d}{fraction}{zone}"


zones = st.one_of(st.sampled_from(["Z", "z", "", "+00:00", "-00:00", "+05:30", "-03:00", "+0100", "+01", " Z"]),
                  st.builds(lambda s, h, m: f"{s}{h:02d}:{m:02d}", st.sampled_from("+-"), st.integers(0, 25),
                            st.integers(0, 61)))
fractions = st.one_of(st.just(""), st.builds(lambda n, d: "." + str(d).zfill(n)[:n], st.integers(1, 12),
                                             st.integers(0, 10 ** 12)), st.sampled_from([".", ",5", ".5 "]))
time_texts = st.one_of(
    st.builds(_time_text, st.one_of(st.integers(2020, 2030), st.sampled_from([1, 2, 1000, 9998, 9999]),
                                    st.integers(0, 9999)),
              st.integers(0, 13), st.integers(0, 32), st.integers(0, 25), st.integers(0, 61), st.integers(0, 61),
              fractions, st.sampled_from(["T", " ", "t", "x"]), zones),
    st.text(alphabet="0123456789-:T.Z+ ", max_size=36),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(time_texts, min_size=1, max_size=20))
def test_event_time_parser_equals_parse_event_time(texts: list[str]) -> None:
    ok, micros = timestamps.parse_times(pa.array(texts, pa.string()))
    for text, fine, us in zip(texts, ok.tolist(), micros.tolist()):
        if fine:
            parsed = parse_event_time(text)
            assert parsed is not None, text
            assert (parsed - EPOCH) // dt.timedelta(microseconds=1) == us, text


def test_event_time_parser_takes_the_canonical_forms() -> None:
    texts = ["2026-11-01T08:00:00Z", "2024-02-29 23:59:59.999999-23:59", "2026-11-01T08:00:00.1+00:00", None]
    ok, micros = timestamps.parse_times(pa.array(texts, pa.string()))
    assert ok.tolist() == [True, True, True, False]
    for text, us in zip(texts[:3], micros.tolist()):
        assert us == (parse_event_time(text) - EPOCH) // dt.timedelta(microseconds=1)  # type: ignore[operator]


# --- property: random mixes of well-formed and hostile lines --------------------------------------------------------

printable_ids = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=10)
any_ids = st.one_of(printable_ids, st.text(max_size=6), st.integers(-10, 10 ** 25), st.floats(allow_nan=False),
                    st.booleans(), st.none(), st.lists(st.integers(), max_size=2), st.sampled_from([" ", "\u2003 "]))
near_limit = st.integers(-2000, 2000).map(
    lambda ms: (LIMIT + dt.timedelta(milliseconds=ms)).isoformat(timespec="microseconds").replace("+00:00", "Z"))
times = st.one_of(time_texts, near_limit, st.sampled_from(["2026-11-01T08:00:00Z", "2026-11-01T08:00:00.123+01:00"]),
                  st.integers(), st.none())
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10 ** 30, 10 ** 30), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6)
pages = st.one_of(st.text(max_size=10), st.none(), json_values)
event_types = st.one_of(st.sampled_from(["page_view", "click", "logout", "page"]), st.none(), json_values)
plain_text = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x2FF, exclude_characters="\\"),
                     max_size=12)
plain_values = st.one_of(st.none(), st.booleans(), st.integers(-10 ** 20, 10 ** 20), plain_text,
                         st.floats(allow_infinity=False), st.lists(st.integers(), max_size=3))


SEPARATORS = [(", ", ": "), (",", ":"), (" , ", " : ")]


def _render(pairs: list[tuple[str, object]], seed: int, ascii_only: bool, separators: tuple[str, str]) -> bytes:
    """An object line from (key, value) pairs (keys may repeat), shuffled, in one of the serializers' styles."""
    pairs = list(pairs)
    random.Random(seed).shuffle(pairs)
    item, key = separators
    body = item.join(f"{json.dumps(k)}{key}{json.dumps(v, ensure_ascii=ascii_only)}" for k, v in pairs)
    return ("{" + body + "}").encode("utf-8", "surrogatepass")


def _field(name: str, values: st.SearchStrategy[object]) -> st.SearchStrategy[list[tuple[str, object]]]:
    """The field with a value, or (one time in ten) absent."""
    return st.tuples(st.integers(0, 9), values).map(lambda t: [(name, t[1])] if t[0] else [])


def _object_lines(ids: st.SearchStrategy[object], times_: st.SearchStrategy[object],
                  types: st.SearchStrategy[object], pages_: st.SearchStrategy[object], extra_names: list[str],
                  extras: st.SearchStrategy[object]) -> st.SearchStrategy[bytes]:
    fields = st.tuples(_field("event_id", ids), _field("user_id", ids), _field("event_time", times_),
                       _field("event_type", types), _field("page", pages_),
                       st.lists(st.tuples(st.sampled_from(extra_names), extras), max_size=2))
    pairs = fields.map(lambda parts: [pair for part in parts for pair in part])
    return st.builds(_render, pairs, st.integers(0, 2 ** 32), st.booleans(), st.sampled_from(SEPARATORS))


# Half the objects are built well formed (what producers send), half from any values (ids of every type, any time
# text, objects as page, fields repeated).
objects = st.one_of(
    _object_lines(printable_ids, st.sampled_from(["2026-11-01T08:00:00Z", "2026-11-01 09:30:00.5-02:00"]),
                  st.one_of(st.sampled_from(["page_view", "logout"]), st.none()), st.one_of(plain_text, st.none()),
                  ["x", "meta", "ua"], plain_values),
    _object_lines(any_ids, times, event_types, pages, ["x", "meta", "event_id", "page", "event_time"], json_values),
)

HOSTILE_TOKENS = [b"Inf", b"-Inf", b"-NaN", b"NaN", b"Infinity", b"1e999", b"01", b"9" * 5000,
                  b"[" * 1200 + b"]" * 1200,
                  b'"\\ud800"', b'"\\udc00\\ud800"', b'"\\u0000"', b'"\\u00e9"', b"tru", b'"a\\qb"']
ENDINGS = [b"\r", b"\r\r", b" ", b"\t", b' {"x": 1}', b"{}", b"}"]
INSERTS = [b"\xff", b"\x00", b"\t", b"\n", b"\\", b'"', b"{", b"[", b"\xc3", b"\xed\xa0\x80", b" ", b","]
WHOLE = [b"", b"   ", b"\t", b"\r", b"[1]", b'"x"', b"null", b"1", b"{}"]
NAMES = [b"event_id", b"user_id", b"event_time", b"page"]


def _mutate(line: bytes, kind: int, a: int, junk: bytes) -> bytes:
    """What producers, tools and transports do to lines (kind >= 12: nothing)."""
    cut = a % (len(line) + 1)
    mutations = {
        0: lambda: b"\xef\xbb\xbf" + line,
        1: lambda: line + ENDINGS[a % len(ENDINGS)],
        2: lambda: line[:cut] + INSERTS[a % len(INSERTS)] + line[cut:],
        3: lambda: line[:cut],
        4: lambda: line.replace(b'"event_id"', b'"event\\u005fid"', 1),
        5: lambda: line[:-1] + b', "x": ' + HOSTILE_TOKENS[a % len(HOSTILE_TOKENS)] + b"}",
        6: lambda: WHOLE[a % len(WHOLE)],
        7: lambda: junk,
        8: lambda: line[:-1] + b', "pad": "' + b"y" * (4000 + a % 1200) + b'"}',
        9: lambda: line[:-1] + b', "' + NAMES[a % len(NAMES)] + b'": "z"}',
        10: lambda: b" " + line,
        11: lambda: line.replace(b": ", b":\t", 1),
    }
    return mutations[kind]() if kind in mutations else line


# One line in three or so is mutated.
lines_ = st.builds(_mutate, objects, st.integers(0, 35), st.integers(0, 10 ** 6), st.binary(max_size=30))


def _sources(parts: list[tuple[list[bytes], int, str | None]]) -> list[RowSource]:
    return [row_source(f"f{s}.jsonl", [(first + k, raw) for k, raw in enumerate(lines)], refused=refused,
                      refused_raw="symlink to x" if refused else None)
            for s, (lines, first, refused) in enumerate(parts)]


line_mixes = st.lists(st.tuples(st.lists(lines_, max_size=25), st.sampled_from([1, 1, 17]),
                                st.sampled_from([None, None, None, "refused_symlink"])),
                      min_size=1, max_size=3).map(_sources)


def test_columnar_rows_equal_the_per_line_rows() -> None:
    seen = {"lines": 0, "fast": 0}

    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(line_mixes)
    def same_rows(sources: list[RowSource]) -> None:
        assert_same_rows(sources)
        lines = [raw for source in sources for _, raw in source.lines]
        seen["lines"] += len(lines)
        seen["fast"] += len(fast_taken(lines))

    same_rows()
    # Not vacuous: the fast path took a fair share of the generated lines (about a quarter over many runs).
    assert seen["fast"] >= max(20, 0.05 * seen["lines"]), seen


def test_empty_and_tiny_inputs() -> None:
    assert_same_rows([])
    assert_same_rows([row_source("f.jsonl", [])])
    assert_same_rows([row_source("f.jsonl", [(1, b"")]), row_source("g.jsonl", [(3, b"  ")])])
    table = line_rows([row_source("f.jsonl", [(1, dumps(event()))])], 1, INGESTED_AT, MAX_FUTURE)  # below MIN_FAST_LINES
    assert table.num_rows == 1 and table["reject_reason"].null_count == 1
    assert np.array_equal(table["line_key"].to_numpy(), [1])


def test_the_gc_pause_of_the_fallback_ends_with_it() -> None:
    import gc

    line = dumps(event(event_id=None))
    line_rows([row_source("f.jsonl", [(1, line)] * 100)], 1, INGESTED_AT, MAX_FUTURE)
    assert gc.isenabled()

    def failing(raw: bytes, limit: dt.datetime | None) -> None:
        assert not gc.isenabled()
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        columnar.row_columns([row_source("f.jsonl", [(1, line)] * 100)], LIMIT, classify=failing)
    assert gc.isenabled()


# --- Lines: a source's lines in one buffer --------------------------------------------------------------------------

def _split_by_bytes(body: bytes, lines_before: int, open_before: bool) -> tuple[list[tuple[int, bytes]], int, bool]:
    """The definition split_lines keeps (what it was before the buffer: bytes.split): the complete lines of body,
    numbered on; after an unterminated line the next newline closes that same line."""
    if not body:
        return [], lines_before, open_before
    segments = body.split(b"\n")
    terminated = segments[-1] == b""
    if terminated:
        segments.pop()
    first = lines_before if open_before else lines_before + 1
    return [(first + k, seg) for k, seg in enumerate(segments)], first + len(segments) - 1, not terminated


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60).map(lambda b: bytes(b"\n\r{} a"[x % 6] for x in b)), st.integers(0, 5), st.booleans())
def test_split_lines_is_bytes_split(body: bytes, lines_before: int, open_before: bool) -> None:
    lines, consumed, open_after = split_lines(body, lines_before, open_before)
    expected, expected_consumed, expected_open = _split_by_bytes(body, lines_before, open_before)
    assert list(lines) == expected
    assert (consumed, open_after) == (expected_consumed, expected_open)
    assert [lines.line(k) for k in range(len(lines))] == [raw for _, raw in expected]


def test_split_lines_scans_in_chunks_across_their_borders() -> None:
    body = b"".join(dumps(event(event_id=f"e{k}")) + b"\n" for k in range(40)) + b"{}"
    with mock.patch("pipelines.ingest.lines.NEWLINE_SCAN_BYTES", 7):
        lines, consumed, open_after = split_lines(body, 0, False)
    assert list(lines) == _split_by_bytes(body, 0, False)[0] and (consumed, open_after) == (41, True)


def test_sources_read_from_files_give_the_per_line_rows() -> None:
    """Sources as the landing sources build them (split_lines over a body: CRLF, blank lines, a lone CR, a BOM, an
    unterminated last line; then another file, and Kafka-style pairs whose values hold newlines), through the fast
    path and the per-line path alike."""
    good = [dumps(event(event_id=f"e{k}")) for k in range(100)]
    first = b"\r\n".join(good[:40]) + b"\r\n\n   \n" + b"\xef\xbb\xbf" + good[40] + b"\n" + good[41][:-1] + b"\r}\n"
    second = b"\n".join(good[42:]) + b"\n" + dumps(event(event_id="last"))  # unterminated: taken as a whole line
    kafka = [(7, good[0]), (9, good[1] + b"\n" + good[2]), (12, b"")]
    sources = [RowSource("a.jsonl", split_lines(first, 0, False)[0]),
               RowSource("b.jsonl", split_lines(second, 5, True)[0]),
               RowSource("topic/0", Lines.from_pairs(kafka))]
    table = assert_same_rows(sources)
    assert table.num_rows == 42 + 59 + 2  # blank lines and the empty message dropped
    assert fast_taken([raw for source in sources for _, raw in source.lines]) >= set(range(40))
