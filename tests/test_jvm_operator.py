"""The JVM operator (the default for a new checkpoint, jvm/operator/src/main/java/sessions/SessionsOperator.java)
against the oracle.

Its rule for one user against the Python core (the specification) on generated inputs, through py4j (the stream
against the oracle: tests/test_stream_vs_oracle.py, which runs it); a checkpoint of the retired Python
operator refused in one line, then moved to the JVM operator by a savepoint and a restore (savepoints are
operator-neutral: the canonical per-user rows); the constants Java shares with Python; its stored form
(StateCodec.java) round-trips any rows, and values written before v2 still read.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pipelines.config import ConfigError
from pipelines.core.attributes import partials_to_json
from pipelines.core.rules import SessionRules
from pipelines.core.sessionize import advance, empty_rows
from pipelines.core.spec import SessionSpec, parse_spec
from pipelines.core.state_format import DECODED_ROW_SCHEMA
from pipelines.job.operators.jvm import _ROWS_DDL, rules_json
from pipelines.job.operators.jvm import STATE_LAYOUT as JVM_STATE_LAYOUT
from pipelines.job.operators.seam import OUTPUT_COLUMNS
from pipelines.job.stream import catch_up
from testkit import oracle
from tests.kit.datagen import land_batches, stream_scenario
from tests.kit.homes import make_config
from tests.test_stream_vs_oracle import GAP_MS, LATENESS_MS, assert_matches_oracle

pytestmark = pytest.mark.tier("spark")

def test_the_python_operator_setting_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^SESSIONS_OPERATOR=python: the Python operator is retired;[^\n]*restore"):
        make_config(tmp_path, "rocksdb", SESSIONS_OPERATOR="python")


def test_the_java_side_is_held_to_the_python_seam(spark):
    """What Java and Python must agree on, compared across py4j: the state layout id a checkpoint records, the output
    columns (names in the order Java builds rows; types are handed to it from OUTPUT_SCHEMA) and the event types the
    rules know."""
    java = spark._jvm.sessions
    assert java.SessionsOperator.STATE_LAYOUT == JVM_STATE_LAYOUT
    assert list(java.SessionsOperator.OUTPUT_NAMES) == [name for name, _ in OUTPUT_COLUMNS]
    assert (java.SessionsOperator.LOGOUT, java.SessionsOperator.PAGE_VIEW) == (oracle.LOGOUT, oracle.PAGE_VIEW)


def test_the_java_state_row_is_the_state_formats(spark):
    """SessionsOperator.STATE_ROW (one row of DecodeState's result) is the state format's DECODED_ROW_SCHEMA, as
    jvm.py hands DecodeState's type to Spark: the same names and types in the same order (Java's non-null flags on
    the counts and times are its own: Arrow's schema leaves every field nullable)."""
    from pyspark.sql.types import ArrayType, StructType, _parse_datatype_string

    java = StructType.fromJson(json.loads(spark._jvm.sessions.SessionsOperator.STATE_ROW.json()))
    python = _parse_datatype_string(_ROWS_DDL)
    assert isinstance(python, ArrayType) and isinstance(python.elementType, StructType)
    assert [(f.name, f.dataType) for f in java.fields] == [(f.name, f.dataType) for f in python.elementType.fields]
    assert python.elementType.names == DECODED_ROW_SCHEMA.names


@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_rescale_keeps_the_jvm_operators_state(spark, tmp_path, provider):
    """RocksDB: Spark's offline repartition of the per-user state; HDFS: savepoint + restore. Then the stream goes on
    with 3 partitions and still equals the oracle."""
    from state_store.rescale import rescale

    batches = stream_scenario(7, 6, True, GAP_MS, LATENESS_MS)
    cut = 3
    config = make_config(tmp_path, provider)
    land_batches(config, batches[:cut])
    catch_up(config, spark)
    result = rescale(config, 3, spark=spark)
    assert (result.partitions_before, result.partitions_after) == (2, 3)
    assert result.method == ("repartition" if provider == "rocksdb" else "savepoint-restore")
    rescaled = make_config(tmp_path, provider, SESSIONS_STATE_PARTITIONS=3)
    land_batches(rescaled, batches[cut:], start=cut)
    catch_up(rescaled, spark)
    assert_matches_oracle(spark, rescaled, batches)


# ---- the Java rule vs the Python core, one user, generated inputs (no Spark job: py4j calls into the jar) --------

MINUTE = 60_000
# few ids (duplicates), two ordered differently by code point and by UTF-16 unit (ties at one ms break by id)
_IDS = [f"e{i}" for i in range(10)] + ["e\uffff", "e\U0001f600"]
_EVENT = st.tuples(st.sampled_from(_IDS),
                   st.integers(0, 30).map(lambda m: m * 5 * MINUTE)  # a 5-minute grid: ties and exact gaps
                   | st.integers(0, 150 * MINUTE),
                   st.sampled_from(["page_view", "click", "logout"]))


def _python(state: dict[str, np.ndarray], events: list[tuple], watermark: int, gap: int):
    frame = pd.DataFrame({"user_id": np.array(["u"] * len(events), dtype=object),
                          "event_id": np.array([e[0] for e in events], dtype=object),
                          "event_time_ms": np.array([e[1] for e in events], dtype="int64"),
                          "event_type": np.array([e[2] for e in events], dtype=object)})
    step = advance(state, frame, watermark, gap)
    closed = sorted(tuple(r) for r in step.closed[["session_id", "session_start_ms", "session_end_ms", "event_count",
                                                   "page_views", "end_reason"]].itertuples(index=False))
    rows = step.open_rows
    open_rows = sorted(zip(rows["session_start_ms"].tolist(), rows["event_id"].tolist(), rows["event_time_ms"].tolist(),
                           rows["event_type"].tolist(), rows["event_count"].tolist(), rows["page_views"].tolist()),
                       key=repr)
    return {"closed": closed, "open": open_rows, "late": list(step.late.index), "due": step.next_due_ms}, rows


def _java(spark, state: dict[str, np.ndarray], events: list[tuple], watermark: int, gap: int):
    request = {"user": "u", "watermark": watermark, "rules": rules_json(SessionRules(gap, 0, 0)),
               "events": [list(e) for e in events],
               "state": [list(r) for r in zip(state["session_start_ms"].tolist(), state["event_id"].tolist(),
                                              state["event_time_ms"].tolist(), state["event_type"].tolist(),
                                              state["event_count"].tolist(), state["page_views"].tolist())]}
    got = json.loads(spark._jvm.sessions.CoreHarness.advanceJson(json.dumps(request)))
    return {"closed": sorted(tuple(r) for r in got["closed"]), "open": sorted((tuple(r) for r in got["open"]), key=repr),
            "late": got["late"], "due": got["due"]}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.lists(_EVENT, min_size=1, max_size=14), second=st.lists(_EVENT, max_size=14),
       steps=st.tuples(st.integers(-1, 20 * MINUTE), st.integers(0, 60 * MINUTE),
                       st.sampled_from([0, 400 * MINUTE]) | st.integers(0, 300 * MINUTE)),
       gap=st.sampled_from([5 * MINUTE, 30 * MINUTE]))
# Edges by name, besides the generated ones: a tie at one ms broken by ids that code point and UTF-16 order
# disagree on (here it decides whether the logout ends the session), and two events exactly a gap apart.
@example(first=[("e\U0001f600", 0, "logout"), ("e\uffff", 0, "page_view")], second=[],
         steps=(-1, 0, 400 * MINUTE), gap=30 * MINUTE)
@example(first=[("e0", 0, "page_view"), ("e1", 30 * MINUTE, "click")], second=[("e2", 90 * MINUTE, "click")],
         steps=(-1, 20 * MINUTE, 400 * MINUTE), gap=30 * MINUTE)
def test_the_java_rule_equals_the_python_core(spark, first, second, steps, gap):
    """Three steps of one user at rising watermarks: `first` (mostly above the watermark), `second` (some late, some
    joining or splitting open sessions), then no events (closing what is due) -- each over the state the step before
    left (the Python core's; the Java rule's own equals it while the steps agree). Closed sessions with their ids, the
    open rows after the stored form's round trip (frozen prefixes included), late events and the due time."""
    watermark, state = steps[0], empty_rows()
    for events, rise in ((first, 0), (second, steps[1]), ([], steps[2])):
        watermark += rise
        expected, state_after = _python(state, events, watermark, gap)
        assert _java(spark, state, events, watermark, gap) == expected
        state = state_after


# ---- the session spec's attributes: the Java partials and merges vs the Python core's ---------------------------

_ATTR_SPEC = parse_spec(json.dumps({
    "input": {"fields": {"page": {"path": "page", "type": "string"}, "revenue": {"path": "r", "type": "double"},
                         "items": {"path": "n", "type": "long"}, "member": {"path": "m", "type": "boolean"}}},
    "attributes": {"landing_page": {"first": "page"}, "exit_page": {"last": "page"},
                   "clicks": {"count_if": {"event_type": ["click"]}}, "revenue": {"sum": "revenue"},
                   "top": {"max": "revenue"}, "fewest": {"min": "items"}, "items": {"sum": "items"},
                   "member": {"last": "member"}}}))
_ATTRS = _ATTR_SPEC.attributes
_FIELDS = st.fixed_dictionaries({}, optional={
    "field_page": st.none() | st.sampled_from(["/", "/a", "/cart"]),
    "field_revenue": st.none() | st.sampled_from([0.1, 0.2, 0.3, 1e16, -1e16, 2.5]),
    # a long's limits: sums that leave the 64-bit range and come back (exact), or end outside it (null)
    "field_items": st.none() | st.integers(-5, 5) | st.sampled_from([2**62, 2**63 - 1, -(2**63)]),
    "field_member": st.none() | st.booleans()})
_ATTR_EVENT = st.tuples(st.sampled_from(_IDS), st.integers(0, 30).map(lambda m: m * 5 * MINUTE),
                        st.sampled_from(["page_view", "click", "logout"]), _FIELDS)


def _python_attrs(state: dict, events: list[tuple], watermark: int, gap: int):
    frame = pd.DataFrame({"user_id": np.array(["u"] * len(events), dtype=object),
                          "event_id": np.array([e[0] for e in events], dtype=object),
                          "event_time_ms": np.array([e[1] for e in events], dtype="int64"),
                          "event_type": np.array([e[2] for e in events], dtype=object),
                          **{f.column: np.array([e[3].get(f.column) for e in events], dtype=object)
                             for f in _ATTR_SPEC.input.fields}})
    step = advance(state, frame, watermark, gap, attributes=_ATTRS)
    names = [a.name for a in _ATTRS]
    closed = sorted(((*r[:6], *json.loads(json.dumps([_plain(v) for v in r[6:]]))) for r in
                    step.closed[["session_id", "session_start_ms", "session_end_ms", "event_count", "page_views",
                                 "end_reason", *names]].itertuples(index=False)), key=_order)
    rows = step.open_rows
    open_rows = sorted(((*r[:6], json.loads(partials_to_json(_ATTRS, r[6]))) for r in zip(
        rows["session_start_ms"].tolist(), rows["event_id"].tolist(), rows["event_time_ms"].tolist(),
        rows["event_type"].tolist(), rows["event_count"].tolist(), rows["page_views"].tolist(), rows["partials"])),
        key=repr)
    return {"closed": closed, "open": open_rows}, rows


def _plain(value):
    """A numpy scalar as its Python value; a Python int as it is (beyond 64 bits too: json keeps it exact)."""
    return value.item() if hasattr(value, "item") else value


def _order(row: tuple) -> tuple:
    """A sort key for closed rows: two sessions may tie on every field but an attribute that is null in one (two
    logouts in one millisecond), and None does not compare with a value."""
    return tuple((True, 0) if v is None else
                 (False, json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else _plain(v)) for v in row)


def _java_attrs(spark, state: dict, events: list[tuple], watermark: int, gap: int):
    request = {"user": "u", "watermark": watermark,
               "rules": rules_json(SessionRules(gap, 0, 0, SessionSpec(attributes=tuple(_ATTRS)))),
               "events": [[e[0], e[1], e[2], e[3]] for e in events],
               "state": [[*r[:6], partials_to_json(_ATTRS, r[6])] for r in zip(
                   state["session_start_ms"].tolist(), state["event_id"].tolist(), state["event_time_ms"].tolist(),
                   state["event_type"].tolist(), state["event_count"].tolist(), state["page_views"].tolist(),
                   state.get("partials", [None] * len(state["event_id"])))]}
    got = json.loads(spark._jvm.sessions.CoreHarness.advanceJson(json.dumps(request)))
    return {"closed": sorted((tuple(r) for r in got["closed"]), key=_order),
            "open": sorted(((*r[:6], json.loads(r[6])) for r in got["open"]), key=repr)}


_MAX_PLUS_ONE = [(_IDS[0], 0, "page_view", {"field_items": 2**63 - 1}), (_IDS[1], 5 * MINUTE, "click",
                                                                      {"field_items": 1})]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.lists(_ATTR_EVENT, min_size=1, max_size=12), second=st.lists(_ATTR_EVENT, max_size=12),
       steps=st.tuples(st.integers(-1, 20 * MINUTE), st.integers(0, 60 * MINUTE),
                       st.sampled_from([0, 400 * MINUTE]) | st.integers(0, 300 * MINUTE)),
       gap=st.sampled_from([5 * MINUTE, 30 * MINUTE]))
@example(first=[(_IDS[0], 0, "logout", {"field_items": 1}), (_IDS[1], 0, "logout", {})], second=[],
         steps=(0, 0, 0), gap=5 * MINUTE)  # two sessions tied on all but a null attribute (sorted by _order)
# MAX + 1 frozen into one prefix (2**63: stored beyond 64 bits), then -1 (MAX again) or 2**62 (null when it closes)
@example(first=_MAX_PLUS_ONE, second=[(_IDS[2], 10 * MINUTE, "click", {"field_items": -1})],
         steps=(-1, 6 * MINUTE, 400 * MINUTE), gap=30 * MINUTE)
@example(first=_MAX_PLUS_ONE, second=[(_IDS[2], 10 * MINUTE, "click", {"field_items": 2**62})],
         steps=(-1, 6 * MINUTE, 400 * MINUTE), gap=30 * MINUTE)
def test_the_java_attributes_equal_the_python_cores(spark, first, second, steps, gap):
    """As above, with the session spec's attributes: each closed session's values, and each open row's partials after
    the stored form's round trip (StateCodec v3), frozen prefixes' merged ones included. The state the Python core
    left is handed to both with its partials as text (the canonical rows' form)."""
    watermark, state = steps[0], {**empty_rows(), "partials": []}
    for events, rise in ((first, 0), (second, steps[1]), ([], steps[2])):
        watermark += rise
        expected, state_after = _python_attrs(state, events, watermark, gap)
        assert _java_attrs(spark, state, events, watermark, gap) == expected
        state = state_after


# ---- the stored form (jvm/operator/src/main/java/sessions/StateCodec.java): v2 written, v1 still read -------------

def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # Java's long, as the encoder sees it
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def _v1_value(rows: list[list]) -> bytes:
    """A v1 value written from StateCodec's documented v1 layout, independently of the Java encoder (which writes only
    v2 now): what a checkpoint made before v2 holds."""
    out = bytearray([1]) + _varint(len(rows))
    for start, event_id, time, kind, count, views in rows:
        out += _varint((time << 1) ^ (time >> 63)) + _varint(time - start) + _varint(count) + _varint(views)
        out += _varint(0) if event_id is None else _varint(1 + len(event_id.encode())) + event_id.encode()
        tags = {None: 0, "page_view": 1, "logout": 2}
        out += _varint(tags[kind]) if kind in tags else _varint(3 + len(kind.encode())) + kind.encode()
    return bytes(out)


_LONG = st.integers(-(2 ** 62), 2 ** 62)
_TIME = st.integers(1_700_000_000_000, 1_900_000_000_000) | _LONG
_TEXT = st.characters(blacklist_categories=("Cs",))  # no lone surrogates: Spark's strings are UTF-8
_ID = (st.none() | st.uuids().map(str) | st.uuids().map(lambda u: str(u).upper())
       | st.sampled_from(["e-000000001", "e-000000012", "e-000000123", "", "a3-41234", "a3-41299"])
       | st.text(_TEXT, max_size=12))
_KIND = st.none() | st.sampled_from(["page_view", "logout", "click", "search", ""]) | st.text(_TEXT, max_size=6)
_ROW = st.tuples(_TIME, _ID, _TIME, _KIND, st.integers(0, 2 ** 40), st.integers(0, 2 ** 40)).map(list)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(_ROW, max_size=30))
def test_state_values_round_trip_and_v1_values_still_read(spark, rows):
    """Any rows (UUID ids in either case, shared and unrelated prefixes, unicode, nulls, repeated and new types, times
    out of order and at the extremes) come back exactly from the v2 form, and a v1 value (a checkpoint made before v2)
    reads as the same rows."""
    harness = spark._jvm.sessions.CoreHarness
    assert json.loads(harness.roundTripJson(json.dumps(rows)))["rows"] == rows
    assert json.loads(harness.decodeJson(bytearray(_v1_value(rows))))["rows"] == rows


def test_v2_values_are_smaller_on_uuid_and_shared_prefix_ids(spark):
    """The point of v2, as known figures: 30 click events of one user 7 s apart with UUID ids are 25 bytes a row
    (time delta 2, start delta <= 3, count 1, views 1, id 1 + 16, type 1) against v1's 54 (time 6, id 1 + 36, type
    1 + 5), 53-54; with sequential ids that share their prefix at most 14 bytes a row (id 1 + 1 + <= 3 bytes of
    suffix) against 25-26."""
    harness = spark._jvm.sessions.CoreHarness
    t0 = 1_793_520_000_000
    uuids = [[t0, f"{i:08x}-0000-4000-8000-{i:012x}", t0 + 7_000 * i, "click", 1, 0] for i in range(30)]
    sequential = [[t0, f"e-{i:09d}", t0 + 7_000 * i, "search", 1, 0] for i in range(30)]
    for rows, most_v2, v1 in ((uuids, 25 * 30 + 10, 53 * 30), (sequential, 14 * 30 + 15, 25 * 30)):
        v2 = json.loads(harness.roundTripJson(json.dumps(rows)))
        assert v2["rows"] == rows
        assert v2["bytes"] <= most_v2 and len(_v1_value(rows)) >= v1, (v2["bytes"], len(_v1_value(rows)))
