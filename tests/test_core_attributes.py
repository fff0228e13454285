"""Session attributes in the pure core (pipelines.core.sessionize with `attributes`) against the independent oracle
(testkit/oracle.py, `run_oracle(..., attributes=...)`) -- no Spark.

The harness drives `advance` batch by batch as the job does (tests/test_core.py's drive: watermark = max event_time
seen - lateness, state carried between calls, one empty step at the final watermark), over streams with duplicates
(whose copies carry other fields: the first accepted copy's count), out-of-order and late events, logouts, random
micro-batch splits and several users; fields of every type with nulls, missing columns, doubles a float sum would get
wrong, longs beyond a double's precision and at a long's limits (sums out of range on the way or at the end). Every
closed session's attributes, and every open session's (open_sessions), must be the oracle's. Between batches the
partials can go through their stored text (partials_to_json/from_json), and an attribute can be added mid-stream:
sessions holding a row stored before it get null, later sessions its value.
"""
from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tests.test_core as core_tests
from pipelines.core.attributes import UNKNOWN, partials_from_json, partials_to_json
from pipelines.core.sessionize import SESSION_FIELDS, advance, empty_rows, open_sessions, rewalk
from pipelines.core.spec import Attribute, parse_spec
from pipelines.core.state_format import STORE_SCHEMA
from testkit.oracle import oracle_session_id, run_oracle, split_events
from tests.kit.datagen import BASE_MS, adversarial_events, event_streams, random_split

pytestmark = pytest.mark.tier("pure")

GAP = 30 * 60_000
LATE = 10 * 60_000
MIN = 60_000
MODES = ["every", "touched"]

FIELDS = {"page": {"path": "properties.url", "type": "string"},
          "revenue": {"path": "properties.revenue", "type": "double"},
          "items": {"path": "properties.items", "type": "long"},
          "flag": {"path": "context.flag", "type": "boolean"}}
DEFINITIONS = {
    "landing_page": {"first": "page"}, "exit_page": {"last": "page"},
    "clicks": {"count_if": {"event_type": ["click", "logout"]}}, "views": {"count_if": {"event_type": "page_view"}},
    "revenue": {"sum": "revenue"}, "top_order": {"max": "revenue"}, "low_order": {"min": "revenue"},
    "items": {"sum": "items"}, "max_items": {"max": "items"}, "min_items": {"min": "items"},
    "first_flag": {"first": "flag"}, "last_flag": {"last": "flag"}, "first_revenue": {"first": "revenue"},
    "last_items": {"last": "items"},
}
ATTRIBUTES = parse_spec(json.dumps({"input": {"fields": FIELDS}, "attributes": DEFINITIONS})).attributes
NAMES = [a.name for a in ATTRIBUTES]
ROW_COLUMNS = STORE_SCHEMA.names

# Values a float sum gets wrong (0.1 + 0.2 + 0.3, cancellation of huge magnitudes), longs beyond 2**53, and longs at
# a long's limits: a sum that leaves the 64-bit range and comes back is exact, one that ends outside it is null.
DOUBLES = st.one_of(st.none(), st.none(), st.sampled_from([0.1, 0.2, 0.3, 1e16, -1e16, 1e300, -1e300, -0.0, 2.5]),
                    st.floats(-1e300, 1e300, allow_nan=False))
LONGS = st.one_of(st.none(), st.none(), st.sampled_from([2**53 + 1, -(2**53) - 1, 0, 7]), st.integers(-2**55, 2**55),
                  st.sampled_from([2**62, 2**63 - 1, -(2**63), -(2**63) + 1, 1, -1]))
FIELD_VALUES = st.fixed_dictionaries({
    "page": st.one_of(st.none(), st.sampled_from(["/", "/a", "/cart", "", "/é"])),
    "revenue": DOUBLES, "items": LONGS, "flag": st.one_of(st.none(), st.booleans())})


def with_fields(events: list[dict], values: list[dict]) -> list[dict]:
    """Each arrival (a duplicate's copy too) with its own fields."""
    return [{**event, "fields": dict(fields)} for event, fields in zip(events, values)]


@st.composite
def attributed_streams(draw, gap_ms: int = GAP, lateness_ms: int = LATE, max_users: int = 3, max_events: int = 12):
    events, split = draw(event_streams(gap_ms, lateness_ms, max_users=max_users, max_events=max_events))
    values = draw(st.lists(FIELD_VALUES, min_size=len(events), max_size=len(events)))
    return with_fields(events, values), split


# ---- the frames the job hands advance -----------------------------------------------------------------------------

def frame(events: list[dict], style: str, omit_null_columns: bool) -> pd.DataFrame:
    """The new events of one call: the core columns and a field_<name> column per field, typed as `style` says --
    "typed": float64 with NaN, nullable Int64 and boolean; "object": Python values and None. A column whose values
    are all null is left out when `omit_null_columns` (a missing column is all null)."""
    columns: dict[str, Any] = {
        "user_id": np.array([e["user_id"] for e in events], dtype=object),
        "event_id": np.array([e["event_id"] for e in events], dtype=object),
        "event_time_ms": np.array([int(e["event_time_ms"]) for e in events], dtype="int64"),
        "event_type": np.array([e.get("event_type") for e in events], dtype=object),
    }
    typed = {"page": object, "revenue": "float64", "items": "Int64", "flag": "boolean"}
    for name in FIELDS:
        values = [e.get("fields", {}).get(name) for e in events]
        if omit_null_columns and all(v is None for v in values):
            continue
        if style == "typed" and typed[name] == "float64":
            columns[f"field_{name}"] = np.array([np.nan if v is None else v for v in values], dtype="float64")
        elif style == "typed":
            columns[f"field_{name}"] = pd.array(values, dtype=typed[name])
        else:
            columns[f"field_{name}"] = np.array(values, dtype=object)
    return pd.DataFrame(columns)


def stored(attributes: list[Attribute], rows: dict, now: list[Attribute]) -> dict:
    """Open rows through their stored text: written with `attributes`, read back with `now`."""
    texts = [partials_to_json(attributes, p) for p in rows["partials"]]
    back = np.empty(len(texts), dtype=object)
    for i, text in enumerate(texts):
        back[i] = partials_from_json(now, text)
    return {**rows, "partials": back}


def _core(closed: pd.DataFrame) -> list[tuple]:
    return sorted(zip(*(closed[name].tolist() for name in SESSION_FIELDS)))


def _by_session(sessions: pd.DataFrame, attributes: list[Attribute]) -> list[tuple[str, dict[str, Any]]]:
    columns = {a.name: sessions[a.name].tolist() for a in attributes}
    return [(sid, {name: values[i] for name, values in columns.items()})
            for i, sid in enumerate(sessions["session_id"].tolist())]


class Run:
    """What a drive wrote: closed sessions (id -> attribute values, and the batch index they were written at) and the
    open sessions at the end (id -> attribute values)."""

    def __init__(self) -> None:
        self.closed: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        self.open: dict[str, list[dict[str, Any]]] = {}


def drive(batches: list[list[dict]], gap_ms: int, lateness_ms: int, mode: str, *, style: str = "object",
          omit_null_columns: bool = False, through_json: bool = False, added: Attribute | None = None,
          added_at: int = 0) -> Run:
    """Run advance over micro-batches as the job does (see tests/test_core.drive; modes "every" and "touched").
    With `added`, the attribute is added at batch `added_at`: the state goes through its stored text written without
    it and read with it. Each call is also made without attributes: that must give today's results exactly."""
    base = [a for a in ATTRIBUTES if a != added]
    run, state, plain_state = Run(), {}, {}
    watermark, max_time = 0, None
    batch_index = 0

    def attributes_now() -> list[Attribute]:
        return base if added is None or batch_index < added_at else [*base, added]

    def step(group: str, new_events: list[dict]) -> None:
        attributes = attributes_now()
        rows = state.get(group, empty_rows())
        new = frame(new_events, style, omit_null_columns)
        result = advance(rows, new, watermark, gap_ms, attributes=attributes)
        plain = advance(plain_state.get(group, empty_rows()), new[[c for c in new.columns
                                                                   if not c.startswith("field_")]], watermark, gap_ms)
        # Without attributes nothing changes; with them, the same sessions and rows plus their attributes.
        assert list(plain.closed.columns) == SESSION_FIELDS and "partials" not in plain.open_rows
        assert list(result.closed.columns) == SESSION_FIELDS + [a.name for a in attributes]
        assert _core(result.closed) == _core(plain.closed)
        for name in ROW_COLUMNS:
            assert list(result.open_rows[name]) == list(plain.open_rows[name]), name
        assert (result.late["event_id"].tolist(), result.duplicates) == (plain.late["event_id"].tolist(),
                                                                          plain.duplicates)
        partials = result.open_rows["partials"]
        assert len(partials) == len(result.open_rows["user_id"])
        assert all(isinstance(p, list) and len(p) == len(attributes) for p in partials)
        for sid, values in _by_session(result.closed, attributes):
            run.closed.setdefault(sid, []).append((batch_index, values))
        state[group], plain_state[group] = result.open_rows, plain.open_rows

    for batch_index, batch in enumerate(batches):
        if added is not None and batch_index == added_at:
            state = {group: stored(base, rows, [*base, added]) for group, rows in state.items()}
        elif through_json:
            state = {group: stored(attributes_now(), rows, attributes_now()) for group, rows in state.items()}
        if mode == "every":
            step("*", batch)
        else:
            for user in dict.fromkeys(e["user_id"] for e in batch):
                step(user, [e for e in batch if e["user_id"] == user])
        for e in batch:
            max_time = e["event_time_ms"] if max_time is None else max(max_time, e["event_time_ms"])
        if max_time is not None:
            watermark = max(watermark, max_time - lateness_ms)
    batch_index = len(batches)
    if added is not None and added_at >= len(batches):
        state = {group: stored(base, rows, [*base, added]) for group, rows in state.items()}
    for group in list(state):
        step(group, [])
    attributes = attributes_now()
    for rows in state.values():
        assert list(rewalk(rows, watermark, gap_ms, attributes=attributes)["partials"]) == list(rows["partials"])
        for sid, values in _by_session(open_sessions(rows, gap_ms, attributes=attributes), attributes):
            run.open.setdefault(sid, []).append(values)
    return run


def same(got: dict[str, Any], expected: dict[str, Any]) -> None:
    """Equal values of equal types (True == 1 and 1 == 1.0 in Python: a long sum must stay an int, a double a float)."""
    assert got.keys() == expected.keys()
    for name in got:
        assert (got[name], type(got[name])) == (expected[name], type(expected[name])), (name, got, expected)


def check(batches: list[list[dict]], gap_ms: int = GAP, lateness_ms: int = LATE, mode: str = "every",
          **options: Any) -> Run:
    """Drive the core and hold every session it wrote or holds open to the oracle."""
    added: Attribute | None = options.get("added")
    added_at = options.get("added_at", 0)
    definitions = dict(DEFINITIONS)
    if added is not None:
        # A marker the oracle sums over the events accepted before the attribute was added: they are the rows stored
        # without it, so a session holding one carries null for it.
        definitions["_old"] = {"sum": "_old"}
        batches = [[{**e, "fields": {**e["fields"], "_old": 1 if k < added_at else None}} for e in batch]
                   for k, batch in enumerate(batches)]
    expected = run_oracle(batches, gap_ms, lateness_ms, attributes=definitions)
    run = drive(batches, gap_ms, lateness_ms, mode, **options)
    # test_core's xfail: two sessions of one id (events of the logout's millisecond). The oracle lists them as two
    # rows, or as one when the rows are equal; the core then writes both in one call, or holds both open.
    sessions = [row[0] for row in expected.closed] + [row[0] for row in expected.open_sessions]
    ambiguous = {sid for sid in sessions if sessions.count(sid) > 1}
    ambiguous |= {sid for sid, written in run.closed.items() if len({k for k, _ in written}) < len(written)}
    ambiguous |= {sid for sid, held in run.open.items() if len(held) > 1}
    assert set(run.closed) == {row[0] for row in expected.closed}
    assert set(run.open) == {row[0] for row in expected.open_sessions}

    def want(sid: str, names: list[str]) -> dict[str, Any]:
        values = {name: expected.attributes[sid][name] for name in names}
        if added is not None and added.name in values and expected.attributes[sid]["_old"] is not None:
            values[added.name] = None
        return values

    for sid, written in run.closed.items():
        assert len(written) == 1 or sid in ambiguous, "a session was closed twice"
        if sid not in ambiguous:
            (_, values), = written
            same(values, want(sid, list(values)))
    for sid, held in run.open.items():
        if sid not in ambiguous:
            same(held[0], want(sid, list(held[0])))
    return run


# ---- generated streams ----------------------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=attributed_streams(), mode=st.sampled_from(MODES), style=st.sampled_from(["object", "typed"]),
       omit=st.booleans(), through_json=st.booleans())
def test_attributes_match_oracle(data, mode, style, omit, through_json):
    events, split = data
    check(split_events(events, split), mode=mode, style=style, omit_null_columns=omit, through_json=through_json)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=attributed_streams(5 * MIN, 2 * MIN, max_users=2, max_events=16), mode=st.sampled_from(MODES))
def test_attributes_match_oracle_short_gap(data, mode):
    """More sessions per user, more frozen prefixes (the watermark passes events sooner)."""
    events, split = data
    check(split_events(events, split), 5 * MIN, 2 * MIN, mode=mode, through_json=True)


@st.composite
def near_watermark_batches(draw):
    batches = draw(core_tests.near_watermark_streams())
    return [with_fields(batch, draw(st.lists(FIELD_VALUES, min_size=len(batch), max_size=len(batch))))
            for batch in batches]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=near_watermark_batches(), mode=st.sampled_from(MODES), through_json=st.booleans())
def test_frozen_prefixes_carry_partials(batches, mode, through_json):
    """Events at and 1 ms above the watermark, copies of frozen and unfrozen events: a frozen prefix's partials are
    the fold of what it collapsed, an earlier prefix's included."""
    check(batches, mode=mode, through_json=through_json)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=attributed_streams(), added=st.sampled_from(ATTRIBUTES), at=st.integers(0, 6),
       mode=st.sampled_from(MODES))
def test_an_attribute_added_mid_stream(data, added, at, mode):
    """Sessions holding a row stored before the attribute existed close (and show) null for it; the others carry it;
    the other attributes are unaffected."""
    events, split = data
    batches = split_events(events, split)
    check(batches, mode=mode, added=added, added_at=min(at, len(batches)))


@pytest.mark.parametrize("seed", range(2))
def test_adversarial_streams(seed):
    rng = random.Random(seed)
    events = adversarial_events(seed, users=4, events_per_user=25)
    pages = ["/", "/a", "/b", None]
    for e in events:
        e["fields"] = {"page": rng.choice(pages), "revenue": rng.choice([None, 0.1, 0.2, 0.3, 1e300, -1e300, 3.75]),
                       "items": rng.choice([None, 2**53 + 1, -5, 10, 2**63 - 1, -(2**63)]),
                       "flag": rng.choice([None, True, False])}
    for parts in (1, 7, 30):
        check(split_events(events, random_split(len(events), parts, rng)), mode=MODES[parts % 2], through_json=True)


# ---- hand-worked cases ------------------------------------------------------------------------------------------------

def ev(user: str, eid: str, minutes: int, kind: str | None = "page_view", **fields: Any) -> dict:
    return {"user_id": user, "event_id": eid, "event_time_ms": BASE_MS + minutes * MIN, "event_type": kind,
            "fields": fields}


def attribute(name: str) -> Attribute:
    return next(a for a in ATTRIBUTES if a.name == name)


def test_a_row_stored_before_the_attributes_makes_its_session_null():
    """Rows without partials (no column, or None): their sessions close and show null for every attribute, count_if
    too; a session started after the attributes carries them."""
    chosen = [attribute("landing_page"), attribute("clicks"), attribute("revenue"), attribute("items")]
    names = [a.name for a in chosen]
    before = advance(empty_rows(), frame([ev("u", "a", 0, revenue=1.0), ev("u", "b", 1, "click")], "object", False),
                     0, GAP)  # a job without attributes: no partials
    assert "partials" not in before.open_rows
    explicit = {**before.open_rows, "partials": np.array([None, None], dtype=object)}
    new = frame([ev("u", "c", 2, "click", page="/c", revenue=2.0), ev("v", "x", 2, "click", page="/v", revenue=0.1),
                 ev("v", "y", 3, revenue=0.2, items=2**53 + 1), ev("v", "z", 4, "click", revenue=0.3, items=1)],
                "typed", True)
    for rows in (before.open_rows, explicit):
        step = advance(rows, new, BASE_MS + 1 * MIN, GAP, attributes=chosen)  # freezes u's a, b into one prefix
        assert len(step.closed) == 0
        assert [p is None or all(x is UNKNOWN for x in p) for p in step.open_rows["partials"]].count(True) == 1
        held = open_sessions(step.open_rows, GAP, attributes=chosen).set_index("user_id")
        assert held.loc["u", names].tolist() == [None, None, None, None]
        assert held.loc["v", names].tolist() == ["/v", 2, 0.6, 2**53 + 2]
        end = advance(step.open_rows, frame([], "object", True), BASE_MS + 4 * MIN + GAP, GAP, attributes=chosen)
        closed = end.closed.set_index("user_id")
        assert closed.loc["u", ["event_count", *names]].tolist() == [3, None, None, None, None]
        assert closed.loc["v", ["event_count", *names]].tolist() == [3, "/v", 2, 0.6, 2**53 + 2]
        assert type(closed.loc["v", "items"]) is int and closed.loc["v", "revenue"] == 0.6 != 0.1 + 0.2 + 0.3
        assert len(end.open_rows["partials"]) == 0


def test_a_frozen_prefix_holds_the_fold_and_survives_storage():
    """A session frozen in two steps: the second prefix folds the first's partials with the events after it; stored
    as text and read back between the steps, the values are the same."""
    chosen = [attribute("landing_page"), attribute("exit_page"), attribute("revenue"), attribute("min_items")]
    rows = advance(empty_rows(), frame([ev("u", "a", 0, page="/a", revenue=1e300),
                                        ev("u", "b", 1, page="/b", revenue=0.1, items=3)], "object", False),
                   0, GAP, attributes=chosen).open_rows
    rows = stored(chosen, advance(rows, frame([ev("u", "c", 2, revenue=-1e300, items=-2)], "typed", True),
                                  BASE_MS + 1 * MIN, GAP, attributes=chosen).open_rows, chosen)
    assert list(rows["event_id"]) == [None, "c"]
    landing, exit_page, revenue, smallest = rows["partials"][0]
    assert (landing, exit_page, smallest) == ("/a", "/b", 3)
    assert sorted(revenue) == [0.1, 1e300]  # the text keeps an exact sum's components
    rows = advance(rows, frame([ev("u", "d", 3, page="/d")], "object", True), BASE_MS + 2 * MIN, GAP,
                   attributes=chosen).open_rows
    assert list(rows["event_id"]) == [None, "d"] and list(rows["event_count"]) == [3, 1]
    assert rows["partials"][0][:2] == ["/a", "/b"] and rows["partials"][0][3] == -2
    closed = advance(rows, frame([], "object", True), BASE_MS + 3 * MIN + GAP, GAP, attributes=chosen).closed
    assert closed[[a.name for a in chosen]].iloc[0].tolist() == ["/a", "/d", 0.1, -2]
    assert closed["session_id"].iloc[0] == oracle_session_id("u", BASE_MS)


def test_a_long_sum_out_of_range_on_the_way_is_exact_and_at_the_end_null():
    """Worked by hand: MAX + 1 is 2**63 in a frozen prefix (kept exact, also through its stored text); -1 after it
    brings the session back to MAX. Another session ends at MIN - 1: null, open and closed. The types stay ints."""
    items = [attribute("items")]
    top, bottom = 2**63 - 1, -(2**63)
    rows = advance(empty_rows(), frame([ev("u", "a", 0, items=top), ev("u", "b", 1, items=1),
                                        ev("v", "x", 0, items=bottom), ev("v", "y", 1, items=-1)], "typed", False),
                   0, GAP, attributes=items).open_rows
    rows = advance(rows, frame([ev("u", "c", 2, items=-1)], "typed", False),
                   BASE_MS + 1 * MIN, GAP, attributes=items).open_rows  # freezes u's a, b and v's x, y
    rows = stored(items, rows, items)
    assert sorted(p[0] for p, e in zip(rows["partials"], rows["event_id"]) if e is None) == [-(2**63) - 1, 2**63]
    held = open_sessions(rows, GAP, attributes=items).set_index("user_id")["items"]
    assert held.to_dict() == {"u": top, "v": None} and type(held["u"]) is int
    closed = advance(rows, frame([], "object", True), BASE_MS + 2 * MIN + GAP, GAP, attributes=items).closed
    assert closed.set_index("user_id")["items"].to_dict() == {"u": top, "v": None}


def test_late_events_and_duplicates_count_for_nothing():
    chosen = [attribute("clicks"), attribute("revenue"), attribute("last_flag")]
    first = advance(empty_rows(), frame([ev("u", "a", 20, "click", revenue=5.0, flag=True)], "object", False), 0, GAP,
                    attributes=chosen)
    step = advance(first.open_rows, frame([ev("u", "a", 20, "click", revenue=99.0, flag=False),  # duplicate
                                           ev("u", "late", 10, "click", revenue=1000.0),        # at the watermark
                                           ev("u", "b", 11, "page_view", flag=None)], "typed", False),
                   BASE_MS + 10 * MIN, GAP, attributes=chosen)
    assert step.duplicates == 1 and step.late["event_id"].tolist() == ["late"]
    held = open_sessions(step.open_rows, GAP, attributes=chosen)
    assert held[["event_count", "clicks", "revenue", "last_flag"]].iloc[0].tolist() == [2, 1, 5.0, True]


def test_without_attributes_nothing_changes():
    events = [ev("u", "a", 0, page="/a"), ev("u", "b", 1, "logout"), ev("v", "c", 0)]
    plain = advance(empty_rows(), frame(events, "typed", False), 0, GAP)
    assert list(plain.closed.columns) == SESSION_FIELDS and set(plain.open_rows) == set(STORE_SCHEMA.names)
    assert list(open_sessions(plain.open_rows, GAP).columns) == [
        "user_id", "session_id", "session_start_ms", "last_event_ms", "last_event_type", "event_count", "page_views",
        "closes_at_ms"]
    assert set(rewalk(plain.open_rows, BASE_MS, GAP)) == set(STORE_SCHEMA.names)
    empty = advance(empty_rows(), frame([], "object", True), 0, GAP, attributes=ATTRIBUTES)
    assert list(empty.closed.columns) == SESSION_FIELDS + NAMES and len(empty.open_rows["partials"]) == 0
    assert list(open_sessions(empty_rows(), GAP, attributes=ATTRIBUTES).columns)[-len(NAMES):] == NAMES
