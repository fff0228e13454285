"""The session spec's input half (SESSIONS_SPEC, docs/session-spec.md): parsing and every refusal (one line naming the
key), Segment-shaped lines read by the contract's example spec, the four time formats, typed fields and
`invalid_field:<name>`, the per-line rules and the columnar reader giving the same rows (a property over generated
Segment-shaped lines, mutated as tests/test_ingest_columnar.py mutates its lines), raw_events gaining a field's column
by schema evolution, and specs compared in one place. Streams of Segment-shaped events against the oracle: in
tests/test_session_attributes.py."""
from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.core.spec import DEFAULT_INPUT, DEFAULT_SPEC, SessionSpec, parse_spec
from pipelines.errors import ConfigError
from pipelines.ingest import columnar
from pipelines.ingest.lines import Lines, classify_line
from pipelines.ingest.table import RowSource, line_rows, raw_schema
from testkit.specs import CONTRACT_EXAMPLE
from tests.kit.homes import make_config
from tests.test_ingest_columnar import INGESTED_AT, LIMIT, MAX_FUTURE, _mutate, fast_for_any_size

pytestmark = pytest.mark.tier("pure")

EXAMPLE = CONTRACT_EXAMPLE  # the contract's example spec, word for word
# Epoch-millisecond times, and every field type.
EPOCH_MS = """\
input:
  event_id: messageId
  user_id: [userId, anonymousId]
  event_time: {path: sentAt, format: epoch_ms}
  event_type: event
  fields:
    page: {path: properties.url, type: string}
    revenue: {path: properties.revenue, type: double}
    quantity: {path: properties.quantity, type: long}
    member: {path: context.traits.member, type: boolean}
"""


def segment(i: int, **changes: Any) -> dict[str, Any]:
    """A Segment track/page call."""
    record: dict[str, Any] = {
        "type": "track", "messageId": f"m-{i}", "userId": f"u-{i % 4}", "anonymousId": f"anon-{i}",
        "timestamp": "2026-11-01T08:00:00.250Z", "sentAt": 1_793_520_000_250 + i, "event": "page_view",
        "properties": {"url": f"/p/{i}", "revenue": 1.25 * i, "quantity": i},
        "context": {"page": {"url": "https://shop.example/", "referrer": "https://search.example/"},
                    "traits": {"member": i % 2 == 0}, "library": {"name": "analytics.js"}}}
    record.update(changes)
    return record


def rows(lines: list[bytes], spec_text: str, *, per_line: bool = True) -> list[dict[str, Any]]:
    spec = parse_spec(spec_text).input
    sources = [RowSource("f.jsonl", Lines.from_pairs(enumerate(lines, 1)))]
    return line_rows(sources, 1, INGESTED_AT, MAX_FUTURE, per_line=per_line, spec=spec).to_pylist()


def one(record: object, spec_text: str = EXAMPLE) -> dict[str, Any]:
    return rows([json.dumps(record).encode()], spec_text)[0]


# --- the spec value ---------------------------------------------------------------------------------------------------

def test_the_contract_example_parses_into_one_canonical_value() -> None:
    spec = parse_spec(EXAMPLE)
    assert spec.input.event_id == ("messageId",) and spec.input.user_id == ("userId", "anonymousId")
    assert spec.input.event_time.format == "iso8601" and spec.input.event_time.paths == ("timestamp",)
    assert [(f.name, f.path, f.type) for f in spec.input.fields] == [
        ("page", "properties.url", "string"), ("referrer", "context.page.referrer", "string"),
        ("revenue", "properties.revenue", "double")]
    assert {a.name: (a.aggregate, a.field, a.event_types) for a in spec.attributes} == {
        "landing_page": ("first", "page", ()), "exit_page": ("last", "page", ()),
        "referrer": ("first", "referrer", ()), "purchases": ("count_if", None, ("purchase", "order_completed")),
        "revenue": ("sum", "revenue", ()), "top_order": ("max", "revenue", ())}
    # The canonical JSON is a spec text itself, and equal specs (any key order, a path or a one-path list) say it alike.
    assert parse_spec(spec.to_json()) == spec
    reordered = json.loads(spec.to_json())
    reordered = {"attributes": dict(reversed(list(reordered["attributes"].items()))), "input": {
        **reordered["input"], "event_id": "messageId", "event_type": ["event"]}}
    assert parse_spec(json.dumps(reordered)) == spec
    assert parse_spec(json.dumps(reordered)).to_json() == spec.to_json()
    assert hash(spec) == hash(parse_spec(spec.to_json()))
    assert SessionSpec.from_text(EXAMPLE) == spec and not spec.is_default


def test_unset_empty_or_spelled_out_default_is_the_default() -> None:
    assert DEFAULT_SPEC.input == DEFAULT_INPUT and DEFAULT_SPEC.attributes == ()
    assert parse_spec("").is_default and parse_spec("{}").is_default
    spelled = "input: {event_id: event_id, user_id: [user_id], event_type: event_type, event_time: event_time}"
    assert parse_spec(spelled).is_default
    assert parse_spec("input:\n  event_time: {path: event_time, format: iso8601}\n").input.is_default


@pytest.mark.parametrize(("text", "message"), [
    ("input: {fields: {p: {path: a, type: string}}}\nattributes: {revenue: {sum: p}}",
     "SESSIONS_SPEC attributes.revenue: sum needs a field of type long or double, got string"),
    ("attributes: {top: {max: nope}}", "SESSIONS_SPEC attributes.top: max needs a field of input.fields, got 'nope'"),
    ("attributes: {x: {median: a}}", "SESSIONS_SPEC attributes.x: 'median': expected one of first, last, count_if"),
    ("attributes: {x: {first: a, last: a}}", "SESSIONS_SPEC attributes.x: expected one of first"),
    ("attributes: {x: {count_if: [a]}}", "SESSIONS_SPEC attributes.x: count_if needs {event_type: [types...]}"),
    ("attributes: {x: {count_if: {event_type: []}}}", "SESSIONS_SPEC attributes.x.count_if.event_type: expected"),
    ("attributes: {user_id: {count_if: {event_type: a}}}", "SESSIONS_SPEC attributes.user_id: 'user_id' is a column"),
    ("attributes: {bad-name: {count_if: {event_type: a}}}", "SESSIONS_SPEC attributes.bad-name: 'bad-name' is not"),
    ("attributes: [1]", "SESSIONS_SPEC attributes: expected a mapping"),
    ("input: {event_time: {path: t, format: epoch}}",
     "SESSIONS_SPEC input.event_time.format: 'epoch': expected one of iso8601, epoch_s, epoch_ms, epoch_us"),
    ("input: {event_time: {format: epoch_ms}}", "SESSIONS_SPEC input.event_time.path: missing"),
    ("input: {event_time: {path: t, zone: utc}}", "SESSIONS_SPEC input.event_time.zone: unknown key"),
    ("input: {user_id: []}", "SESSIONS_SPEC input.user_id: an empty list"),
    ("input: {user_id: [a, a]}", "SESSIONS_SPEC input.user_id: a path is listed twice"),
    ("input: {event_id: 'a..b'}", "SESSIONS_SPEC input.event_id: 'a..b' is not a dotted path"),
    ("input: {event_id: 3}", "SESSIONS_SPEC input.event_id: expected a dotted path (a non-empty string), got a number"),
    ("input: {user_id: [a, '']}", "SESSIONS_SPEC input.user_id[1]: expected a dotted path"),
    ("input: {session: a}", "SESSIONS_SPEC input.session: unknown key (expected event_id, user_id"),
    ("input: {fields: {p: {path: a}}}", "SESSIONS_SPEC input.fields.p.type: missing (one of string, long, double"),
    ("input: {fields: {p: {path: a, type: int}}}",
     "SESSIONS_SPEC input.fields.p.type: 'int': expected one of string, long, double, boolean"),
    ("input: {fields: {p: {type: long}}}", "SESSIONS_SPEC input.fields.p.path: missing"),
    ("input: {fields: {p: a.b}}", "SESSIONS_SPEC input.fields.p: expected {path, type}, got a string"),
    ("input: {fields: {Page: {path: a, type: long}, page: {path: b, type: long}}}",
     "SESSIONS_SPEC input.fields.page: another field has this name but for case"),
    ("output: {}", "SESSIONS_SPEC output: unknown key (expected input, attributes)"),
    ("[1, 2]", "SESSIONS_SPEC: expected a mapping with `input` and/or `attributes`, got a list"),
    ("input: {event_id: [a", "SESSIONS_SPEC: not valid YAML or JSON at line 1"),
])
def test_each_refusal_is_one_line_naming_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_spec(text)
    assert str(caught.value).startswith(message), str(caught.value)
    assert "\n" not in str(caught.value)


def test_sessions_spec_names_a_file_read_once_by_the_configuration(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(EXAMPLE)
    config = make_config(tmp_path, "rocksdb", SESSIONS_SPEC=str(path))
    assert config.session_spec == parse_spec(EXAMPLE)
    path.write_text("input: {event_id: other}")  # read once: a configuration keeps the spec it was made with
    assert config.session_spec == parse_spec(EXAMPLE)
    assert make_config(tmp_path, "rocksdb").session_spec.is_default
    (tmp_path / "spec.json").write_text(parse_spec(EXAMPLE).to_json())
    assert make_config(tmp_path, "rocksdb", SESSIONS_SPEC=str(tmp_path / "spec.json")).session_spec == config.session_spec
    with pytest.raises(ConfigError, match=r"^SESSIONS_SPEC=.*nope\.yaml: no such file$"):
        make_config(tmp_path, "rocksdb", SESSIONS_SPEC=str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match=r"^SESSIONS_SPEC=.*: a directory"):
        make_config(tmp_path, "rocksdb", SESSIONS_SPEC=str(tmp_path))
    path.write_text("attributes: {x: {sum: y}}")
    with pytest.raises(ConfigError, match=r"^SESSIONS_SPEC attributes\.x: sum needs a field of input\.fields"):
        make_config(tmp_path, "rocksdb", SESSIONS_SPEC=str(path))


# --- the per-line rules by the mapping --------------------------------------------------------------------------------

def test_segment_lines_by_the_contract_example() -> None:
    row = one(segment(1, properties={"url": "/cart", "revenue": 19.99}, event="order_completed"))
    assert (row["event_id"], row["user_id"], row["event_type"], row["reject_reason"]) == (
        "m-1", "u-1", "order_completed", None)
    assert row["event_time"] == dt.datetime(2026, 11, 1, 8, 0, 0, 250_000, tzinfo=dt.timezone.utc)
    assert (row["field_page"], row["field_referrer"], row["field_revenue"]) == (
        "/cart", "https://search.example/", 19.99)
    assert row["page"] is None  # raw_events.page is the line's top-level page, as always
    # userId null or absent: anonymousId; an integer user id is its decimal text.
    assert one(segment(2, userId=None))["user_id"] == "anon-2"
    assert one({k: v for k, v in segment(2).items() if k != "userId"})["user_id"] == "anon-2"
    assert one(segment(3, userId=1234567890123))["user_id"] == "1234567890123"
    # Missing or null fields are null; an object on the way that is null or no object is a missing field.
    bare = one(segment(4, properties=None, context="x"))
    assert (bare["reject_reason"], bare["field_page"], bare["field_referrer"], bare["field_revenue"]) == (
        None, None, None, None)
    assert one(segment(5, properties={"revenue": 3}))["field_revenue"] == 3.0  # an integer is a double too


@pytest.mark.parametrize(("changes", "reason"), [
    ({"properties": {"revenue": "19.99"}}, "invalid_field:revenue"),
    ({"properties": {"url": 3}}, "invalid_field:page"),
    ({"properties": {"url": {"path": "/"}}}, "invalid_field:page"),
    ({"properties": {"revenue": True}}, "invalid_field:revenue"),
    ({"context": {"page": {"referrer": ["a"]}}}, "invalid_field:referrer"),
    ({"messageId": None}, "missing_event_id"),
    ({"messageId": 1.5}, "invalid_event_id"),
    ({"userId": None, "anonymousId": None}, "missing_user_id"),
    ({"userId": "  "}, "missing_user_id"),  # the first present and not null is blank: not skipped
    ({"userId": False}, "invalid_user_id"),
    ({"timestamp": None}, "missing_event_time"),
    ({"timestamp": 1_793_520_000}, "unparseable_event_time"),
    ({"timestamp": "2026-11-01T08:00:00"}, "unparseable_event_time"),
    ({"timestamp": "2026-11-01T13:00:01Z"}, "future_event_time"),
    ({"event": 7}, "invalid_event_type"),
])
def test_quarantine_reasons_by_the_mapping(changes: dict[str, Any], reason: str) -> None:
    assert one(segment(1, **changes))["reject_reason"] == reason


@pytest.mark.parametrize(("time_format", "value", "expected_ms"), [
    ("epoch_ms", 1_793_520_000_250, 1_793_520_000_250),
    ("epoch_ms", 1_793_520_000_250.9, 1_793_520_000_250),
    ("epoch_ms", 1.79352000025e12, 1_793_520_000_250),
    ("epoch_s", 1_793_520_000, 1_793_520_000_000),
    ("epoch_s", 1_793_520_000.2509, 1_793_520_000_250),
    ("epoch_us", 1_793_520_000_250_999, 1_793_520_000_250),
    ("epoch_us", -1_001, -2),
    ("epoch_ms", 0, 0),
])
def test_epoch_times(time_format: str, value: float, expected_ms: int) -> None:
    spec = f"input: {{event_time: {{path: t, format: {time_format}}}}}"
    row = one({"event_id": "e", "user_id": "u", "t": value}, spec)
    assert row["reject_reason"] is None
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    assert row["event_time"] == epoch + dt.timedelta(milliseconds=expected_ms)


@pytest.mark.parametrize("value", ["1793520000250", True, None, [1], 1e300, 10 ** 30])
def test_epoch_times_refused(value: object) -> None:
    row = one({"event_id": "e", "user_id": "u", "t": value}, "input: {event_time: {path: t, format: epoch_ms}}")
    assert row["reject_reason"] == ("missing_event_time" if value is None else "unparseable_event_time")


def test_typed_fields_of_every_type_with_epoch_millisecond_times() -> None:
    lines = [json.dumps(segment(i)).encode() for i in range(3)] + [
        json.dumps(segment(3, properties={"quantity": 2.0})).encode(),
        json.dumps(segment(4, properties={"quantity": 1 << 63})).encode(),
        json.dumps(segment(5, context={"traits": {"member": "yes"}})).encode(),
        json.dumps(segment(6, properties={"quantity": -(1 << 63), "revenue": 1 << 70})).encode()]
    got = rows(lines, EPOCH_MS)
    assert [r["reject_reason"] for r in got] == [None, None, None, "invalid_field:quantity", "invalid_field:quantity",
                                                 "invalid_field:member", None]
    assert [(r["field_quantity"], r["field_member"], r["field_revenue"]) for r in got[:3]] == [
        (0, True, 0.0), (1, False, 1.25), (2, True, 2.5)]
    assert got[6]["field_quantity"] == -(1 << 63) and got[6]["field_revenue"] == float(1 << 70)
    assert got[1]["event_time"] == dt.datetime(2026, 11, 1, 8, 0, 0, 251_000, tzinfo=dt.timezone.utc)
    assert raw_schema(parse_spec(EPOCH_MS).input).names[-4:] == [
        "field_member", "field_page", "field_quantity", "field_revenue"]
    schema = raw_schema(parse_spec(EPOCH_MS).input)
    assert [schema.field(n).type for n in ("field_member", "field_quantity", "field_revenue")] == [
        pa.bool_(), pa.int64(), pa.float64()]


def test_the_default_spec_is_todays_rules() -> None:
    lines = [json.dumps({"event_id": f"e{i}", "user_id": i, "event_time": "2026-11-01T08:00:00Z", "page": {"a": i}}
                        ).encode() for i in range(80)] + [b"{", b'{"event_id": "x"}']
    sources = [RowSource("f.jsonl", Lines.from_pairs(enumerate(lines, 1)))]
    today = line_rows(sources, 1, INGESTED_AT, MAX_FUTURE)
    assert today.schema == raw_schema()
    assert line_rows(sources, 1, INGESTED_AT, MAX_FUTURE, spec=parse_spec("").input).equals(today)
    assert classify_line(lines[0], LIMIT, DEFAULT_INPUT) == classify_line(lines[0], LIMIT)


# --- the columnar reader gives the per-line rows -----------------------------------------------------------------------

ids = st.one_of(st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=8),
                st.integers(-5, 10 ** 20), st.none(), st.sampled_from(["", " ", True, 1.5]))
epoch_ms = st.one_of(st.integers(1_793_400_000_000, 1_793_530_000_000), st.floats(1.7934e12, 1.79353e12),
                     st.sampled_from([1_793_523_600_123, 1_793_523_600_124, 2 ** 53, -1, "1793520000000", None, True]))
iso = st.sampled_from(["2026-11-01T08:00:00.250Z", "2026-11-01 09:00:00+01:00", "2026-11-01T08:00:00", "x", None, 5])
numbers = st.one_of(st.integers(-(2 ** 64), 2 ** 64), st.floats(allow_nan=False), st.none(), st.booleans(),
                    st.sampled_from(["1", "abc", 2.0, -0.0]))
strings = st.one_of(st.text(max_size=6), st.none(), st.integers(0, 3), st.sampled_from([{"x": 1}, ["a"]]))
booleans = st.one_of(st.booleans(), st.none(), st.sampled_from([0, 1, "true"]))


@st.composite
def segment_lines(draw: st.DrawFn) -> bytes:
    """A Segment-shaped call, its values from well formed to wrong, keys sometimes absent, sometimes null objects."""
    def maybe(value: Any) -> Any:
        return draw(st.sampled_from([value, value, value, value, _ABSENT]))

    record = {"messageId": maybe(draw(ids)), "userId": maybe(draw(ids)), "anonymousId": maybe(draw(ids)),
              "timestamp": maybe(draw(iso)), "sentAt": maybe(draw(epoch_ms)),
              "event": maybe(draw(st.one_of(st.sampled_from(["page_view", "logout", "order_completed"]), st.none(),
                                            st.integers(0, 2)))),
              "properties": draw(st.one_of(st.fixed_dictionaries({}, optional={
                  "url": strings, "revenue": numbers, "quantity": numbers, "extra": strings}), st.none(),
                  st.sampled_from(["x", [1]]))),
              "context": draw(st.one_of(st.fixed_dictionaries({"page": st.fixed_dictionaries(
                  {}, optional={"referrer": strings, "url": strings}), "traits": st.fixed_dictionaries(
                  {}, optional={"member": booleans})}), st.none())),
              "page": maybe(draw(strings))}
    pairs = [(k, v) for k, v in record.items() if v is not _ABSENT]
    random.Random(draw(st.integers(0, 1000))).shuffle(pairs)
    return ("{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in pairs) + "}").encode()


_ABSENT = object()
# Half the lines as producers send them (every value of its type, userId sometimes null), half from any values.
well_formed = st.builds(
    lambda i, user, ms, revenue, quantity: json.dumps(segment(
        i, userId=user, sentAt=ms, properties={"url": f"/p/{i}", "revenue": revenue, "quantity": quantity})).encode(),
    st.integers(0, 99), st.sampled_from(["u-1", "u-2", None]), st.integers(1_793_400_000_000, 1_793_523_600_000),
    st.one_of(st.floats(-1e9, 1e9), st.integers(-10, 10), st.none()), st.one_of(st.integers(-(2 ** 63), 2 ** 63 - 1),
                                                                             st.none()))
mutated = st.builds(_mutate, st.one_of(well_formed, segment_lines()), st.integers(0, 30), st.integers(0, 10 ** 6),
                    st.binary(max_size=30))


@pytest.mark.parametrize("spec_text", [EXAMPLE, EPOCH_MS])
def test_columnar_rows_equal_the_per_line_rows_by_the_mapping(spec_text: str) -> None:
    spec = parse_spec(spec_text).input
    seen = {"lines": 0, "fast": 0}

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(mutated, max_size=30))
    def same_rows(lines: list[bytes]) -> None:
        sources = [RowSource("f.jsonl", Lines.from_pairs(enumerate(lines, 1)))]
        expected = line_rows(sources, 7, INGESTED_AT, MAX_FUTURE, per_line=True, spec=spec)
        with fast_for_any_size():
            got = line_rows(sources, 7, INGESTED_AT, MAX_FUTURE, spec=spec)
            taken, _ = columnar.fast_rows(Lines.from_pairs(enumerate(lines, 1)), LIMIT, spec)
        assert got.schema == expected.schema
        assert got.to_pylist() == expected.to_pylist()
        seen["lines"] += len(lines)
        seen["fast"] += len(taken)

    same_rows()
    assert seen["fast"] >= max(10, 0.03 * seen["lines"]), seen  # not vacuous: the fast path read some


def test_well_formed_segment_lines_all_take_the_fast_path() -> None:
    lines = [json.dumps(segment(i)).encode() for i in range(200)]
    for spec_text in (EXAMPLE, EPOCH_MS):
        spec = parse_spec(spec_text).input
        with fast_for_any_size(4096):
            taken, _ = columnar.fast_rows(Lines.from_pairs(enumerate(lines, 1)), LIMIT, spec)
        assert len(taken) == len(lines)
        assert rows(lines, spec_text, per_line=False) == rows(lines, spec_text)


# --- raw_events gains a field's column ---------------------------------------------------------------------------------

def test_raw_events_gains_a_column_when_the_spec_gains_a_field(tmp_path: Path) -> None:
    from pipelines.ingest import ingest
    from pipelines.storage import open_table, read_rows
    from tests.kit.datagen import land_files

    config = make_config(tmp_path, "rocksdb")
    land_files(config, [[json.dumps({"event_id": "e0", "user_id": "u", "event_time": "2026-11-01T08:00:00Z"})]])
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text("input: {event_id: messageId, user_id: [userId, anonymousId], event_type: event, "
                         "event_time: {path: sentAt, format: epoch_ms}, "
                         "fields: {revenue: {path: properties.revenue, type: double}}}")
    mapped = make_config(tmp_path, "rocksdb", SESSIONS_SPEC=str(spec_path))
    land_files(mapped, [[json.dumps(segment(1)), json.dumps(segment(2, properties={"revenue": "x"}))]], start=1)
    spec_path.write_text(spec_path.read_text().replace("}}}", "}, member: {path: context.traits.member, "
                                                               "type: boolean}}}"))
    more = make_config(tmp_path, "rocksdb", SESSIONS_SPEC=str(spec_path))
    land_files(more, [[json.dumps(segment(4))]], start=2)
    assert ingest(more).rows == 0
    table = read_rows(open_table(config, config.raw_events_table))
    assert table.schema.names[-2:] == ["field_revenue", "field_member"]
    got = sorted((r["event_id"] or "", r["user_id"], r["reject_reason"], r["field_revenue"], r["field_member"])
                 for r in table.to_pylist())
    assert got == [("e0", "u", None, None, None), ("m-1", "u-1", None, 1.25, None),
                   ("m-2", "u-2", "invalid_field:revenue", None, None), ("m-4", "u-0", None, 5.0, True)]


# --- the stream of Segment-shaped events against the oracle (Spark) ---------------------------------------------------

def test_spec_changes_are_compared_in_one_place() -> None:
    from pipelines.core.spec import DEFAULT_SPEC, spec_changes

    example = parse_spec(EXAMPLE)
    assert spec_changes(example, example).none
    assert spec_changes(DEFAULT_SPEC, example) == spec_changes(DEFAULT_SPEC, example)
    grown = parse_spec(EXAMPLE.replace("  top_order: {max: revenue}\n", "  top_order: {max: revenue}\n"
                                       "  low: {min: revenue}\n").replace("  referrer: {first: referrer}\n", ""))
    changes = spec_changes(example, grown)
    assert (changes.added, changes.removed, changes.changed, changes.input_changed) == (("low",), ("referrer",), (), False)
    retyped = parse_spec(EXAMPLE.replace("revenue: {path: properties.revenue, type: double}",
                                         "revenue: {path: properties.revenue, type: long}"))
    changes = spec_changes(example, retyped)  # a sum of longs is not a sum of doubles
    assert changes.changed == ("revenue", "top_order") and changes.input_changed
    counted = parse_spec(EXAMPLE.replace("[purchase, order_completed]", "[purchase]"))
    assert spec_changes(example, counted).changed == ("purchases",)
    assert [a.key for a in parse_spec(example.to_json()).attributes] == [a.key for a in example.attributes]
