"""Session attributes as partial aggregates (pipelines.core.attributes) against the oracle's reading of the contract
(testkit/oracle.py `session_attributes`, written from its words): however a session's events are cut into runs --
frozen prefixes and the events above them --, merging the runs' partials gives the oracle's value, for every
aggregate kind; a row from before the attribute existed makes it null. And the oracle itself on a hand-worked stream:
duplicates keep the first copy's fields, late events count for nothing."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.core.attributes import UNKNOWN, event_partial, fold, merge, result
from pipelines.core.spec import parse_spec
from testkit.oracle import oracle_session_id, run_oracle, session_attributes

pytestmark = pytest.mark.tier("pure")

FIELDS = {"page": {"path": "properties.url", "type": "string"},
          "revenue": {"path": "properties.revenue", "type": "double"},
          "items": {"path": "properties.items", "type": "long"},
          "first_visit": {"path": "context.first", "type": "boolean"}}
ATTRIBUTES = {"landing_page": {"first": "page"}, "exit_page": {"last": "page"},
              "purchases": {"count_if": {"event_type": ["purchase", "order_completed"]}},
              "revenue": {"sum": "revenue"}, "top_order": {"max": "revenue"}, "smallest_basket": {"min": "items"},
              "items": {"sum": "items"}, "was_first_visit": {"first": "first_visit"},
              "last_flag": {"last": "first_visit"}}
SPEC = parse_spec(json.dumps({"input": {"fields": FIELDS}, "attributes": ATTRIBUTES}))

events = st.lists(st.tuples(
    st.sampled_from(["page_view", "purchase", "order_completed", "logout", None]),
    st.fixed_dictionaries({}, optional={
        "page": st.one_of(st.none(), st.sampled_from(["/", "/a", "/cart"])),
        "revenue": st.one_of(st.none(), st.floats(-1e300, 1e300, allow_nan=False), st.sampled_from([0.1, 0.2, 0.3])),
        "items": st.one_of(st.none(), st.integers(-2**40, 2**40),
                           st.sampled_from([2**62, 2**63 - 1, -(2**63), 1, -1])),  # sums out of a long's range
        "first_visit": st.one_of(st.none(), st.booleans())})), max_size=12)


def _runs(values: list, cuts: list[int]) -> list[list]:
    edges = sorted({min(c, len(values)) for c in cuts} | {0, len(values)})
    return [values[a:b] for a, b in zip(edges, edges[1:])]


@settings(max_examples=300, deadline=None)
@given(events, st.lists(st.integers(0, 12), max_size=4))
def test_merged_runs_equal_the_oracle_whatever_the_cuts(session, cuts):
    expected = session_attributes([(kind, fields) for kind, fields in session], ATTRIBUTES)
    for attribute in SPEC.attributes:
        partials = [event_partial(attribute, event_type=kind, fields=fields) for kind, fields in session]
        runs = [fold(attribute, run) for run in _runs(partials, cuts)]  # each run: a frozen prefix or one event
        got = result(fold(attribute, runs))
        assert got == expected[attribute.name], (attribute, runs)
        assert type(got) is type(expected[attribute.name]), attribute  # a sum of longs stays an int


def test_a_double_sum_is_rounded_once_whatever_the_cuts():
    revenue = next(a for a in SPEC.attributes if a.name == "revenue")
    values = [0.1, 0.2, 0.3, 1e16, -1e16]
    partials = [event_partial(revenue, event_type=None, fields={"revenue": v}) for v in values]
    whole = result(fold(revenue, partials))
    assert whole == 0.6 == session_attributes([(None, {"revenue": v}) for v in values],
                                                             {"r": {"sum": "revenue"}})["r"]
    assert result(merge(revenue, fold(revenue, partials[:2]), fold(revenue, partials[2:]))) == whole
    assert sum(values) != whole  # left to right in floats it is not (0.0 here)


@settings(max_examples=200, deadline=None)
@given(st.lists(events, min_size=3, max_size=3))
def test_merge_is_associative(three):
    for attribute in SPEC.attributes:
        a, b, c = (fold(attribute, [event_partial(attribute, event_type=k, fields=f) for k, f in run])
                   for run in three)
        assert result(merge(attribute, merge(attribute, a, b), c)) == result(merge(attribute, a, merge(attribute, b, c)))


def test_a_row_from_before_the_attribute_makes_it_null():
    revenue = next(a for a in SPEC.attributes if a.name == "revenue")
    purchases = next(a for a in SPEC.attributes if a.name == "purchases")
    assert result(fold(revenue, [UNKNOWN, (3.5,), (1.0,)])) is None
    assert result(fold(purchases, [1, UNKNOWN])) is None
    assert result(fold(revenue, [None, (3.5,), None, (1.0,)])) == 4.5
    assert result(fold(purchases, [])) == 0 and result(fold(revenue, [])) is None


def test_a_long_sum_is_exact_on_the_way_and_null_when_it_ends_out_of_range():
    """Worked by hand: MAX + 1 - 1 is MAX whatever the order and cuts; MAX + 1 and MIN - 1 are null (the contract's
    `sum` of a long is a long); a boolean's partial is not a long sum."""
    items = next(a for a in SPEC.attributes if a.name == "items")
    top, bottom = 2**63 - 1, -(2**63)
    for values in ([top, 1, -1], [1, top, -1], [-1, 1, top], [bottom, -1, 1]):
        partials = [event_partial(items, event_type=None, fields={"items": v}) for v in values]
        for cut in range(len(values) + 1):
            got = result(merge(items, fold(items, partials[:cut]), fold(items, partials[cut:])))
            assert (got, type(got)) == (sum(values), int), (values, cut)
    assert result(fold(items, [top, 1])) is None and result(fold(items, [bottom, -1])) is None
    assert result(fold(items, [top, top, bottom, bottom])) == -2
    assert result(top) == top and result(bottom) == bottom and result(True) is True
    assert session_attributes([(None, {"items": top}), (None, {"items": 1})], {"s": {"sum": "items"}}) == {"s": None}


def _event(user: str, event_id: str, minute: int, kind: str, **fields) -> dict:
    return {"user_id": user, "event_id": event_id, "event_time_ms": minute * 60_000, "event_type": kind,
            "fields": fields}


def test_the_oracle_on_a_hand_worked_stream():
    gap, lateness = 30 * 60_000, 10 * 60_000
    batches = [
        [_event("u", "e2", 5, "page_view", page="/b"), _event("u", "e1", 1, "page_view", page="/a", revenue=None),
         _event("u", "e3", 7, "purchase", revenue=20.0, items=2)],
        # a duplicate of e3 with other fields (the first copy counts), an order, then far ahead: e1..e4 close
        [_event("u", "e3", 7, "purchase", revenue=99.0), _event("u", "e4", 9, "order_completed", revenue=5.5,
                                                                 items=3, page="/done"),
         _event("u", "e9", 200, "page_view", page="/later")],
        # late (at or below 200 - 10 minutes): counts for nothing
        [_event("u", "late", 8, "purchase", revenue=1000.0)],
    ]
    run = run_oracle(batches, gap, lateness, attributes=ATTRIBUTES)
    first = oracle_session_id("u", 60_000)
    assert run.attributes[first] == {
        "landing_page": "/a", "exit_page": "/done", "purchases": 2, "revenue": 25.5, "top_order": 20.0,
        "smallest_basket": 2, "items": 5, "was_first_visit": None, "last_flag": None}
    assert run.attributes[oracle_session_id("u", 200 * 60_000)]["landing_page"] == "/later"
    assert run.late_keys == [("u", "late", 8 * 60_000)] and run.duplicates == 1
