"""A session's attributes (the session spec's `attributes`) as partial aggregates that merge in walk order.

Why partials: a session's events at or below the watermark are folded into one frozen prefix row and dropped one by
one (pipelines.core.sessionize), so an attribute cannot be recomputed from the session's events when it closes. Each
open row -- an event, or a frozen prefix -- carries one partial per attribute; a session's attribute is the merge of
its rows' partials in walk order (event_time, event_id). `merge` is associative, so the result is the same however
the walk was cut into prefixes: it does not depend on arrival order or micro-batch split.

The partials (`None` is "no non-null value yet" wherever the contract says "null if none"):
- `first` / `last`: the field's first / last non-null value;
- `count_if`: how many events have one of its event types (an int, never None);
- `sum` / `min` / `max`: over the non-null values. A sum of longs is kept as the exact integer, however large:
  merging stays associative, so +MAX, +1, -1 gives MAX in any order. The closed session's value is that sum when it
  fits in a signed 64-bit long, and null when it does not (an overflow: the `sessions` column is a long). A sum of
  doubles is kept exact -- the non-overlapping components of Shewchuk's summation (what `math.fsum` keeps), a few
  floats -- and rounded once when the session closes: a float sum rounded along the way would depend on where the
  walk was cut.
`UNKNOWN` is the partial of a row stored before the attribute was added to a running job: a session holding such a
row closes with null for it (the contract: a session already open when an attribute was added carries null).

Pure: no Spark, no I/O. The JVM operator implements the same merge (a test holds the two together).
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from pipelines.core.spec import Attribute

__all__ = ["UNKNOWN", "event_partial", "fold", "merge", "partials_from_json", "partials_to_json", "result"]


class _Unknown:
    """The partial of a row stored before its attribute existed (a singleton)."""

    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Final = _Unknown()


def event_partial(attribute: Attribute, *, event_type: str | None, fields: Mapping[str, Any]) -> Any:
    """One event's partial: its field's value (None when absent or null), or 1/0 for count_if."""
    if attribute.aggregate == "count_if":
        return int(event_type is not None and event_type in attribute.event_types)
    assert attribute.field is not None  # every aggregate but count_if reads a field (spec validation)
    value = fields.get(attribute.field)
    if value is not None and attribute.aggregate == "sum" and attribute.field_type == "double":
        return (float(value),)
    return value


def _exact_sum(components: tuple[float, ...], more: tuple[float, ...]) -> tuple[float, ...]:
    """Non-overlapping components whose exact sum is that of both (Shewchuk; the recipe behind `math.fsum`)."""
    out = list(components)
    for x in more:
        kept = []
        for y in out:
            if abs(x) < abs(y):
                x, y = y, x
            high = x + y
            low = y - (high - x)
            if low:
                kept.append(low)
            x = high
        kept.append(x)
        out = kept
    return tuple(out)


def merge(attribute: Attribute, earlier: Any, later: Any) -> Any:
    """The partial of two runs of a session's rows, `earlier` before `later` in walk order."""
    if earlier is UNKNOWN or later is UNKNOWN:
        return UNKNOWN
    kind = attribute.aggregate
    if kind == "count_if":
        return earlier + later
    if earlier is None:
        return later
    if later is None:
        return earlier
    if kind == "first":
        return earlier
    if kind == "last":
        return later
    if kind == "sum":
        return _exact_sum(earlier, later) if isinstance(earlier, tuple) else earlier + later
    if kind == "min":
        return min(earlier, later)
    return max(earlier, later)  # max


def fold(attribute: Attribute, partials: Iterable[Any]) -> Any:
    """The partials of consecutive rows (walk order) merged into one; the empty run's partial is the identity."""
    folded: Any = 0 if attribute.aggregate == "count_if" else None
    for partial in partials:
        folded = merge(attribute, folded, partial)
    return folded


_LONG_MIN: Final = -(2**63)
_LONG_MAX: Final = 2**63 - 1


def result(partial: Any) -> Any:
    """A closed session's column value: null when the attribute is unknown to part of the session; a double sum
    rounded once; null for a long sum beyond a signed 64-bit long (an overflow)."""
    if partial is UNKNOWN:
        return None
    if isinstance(partial, tuple):
        return math.fsum(partial)
    # a long sum past 64 bits (bool is an int in Python: a boolean's partial is left as it is)
    if isinstance(partial, int) and not isinstance(partial, bool) and not _LONG_MIN <= partial <= _LONG_MAX:
        return None
    return partial


# ---- the partials of one stored row as text (canonical state rows' `attributes` column) -------------------------
# A JSON object keyed by Attribute.key: the partial's value (null: no non-null value yet), a double sum as the list of
# its exact components, a long sum as its exact integer (beyond 64 bits too: JSON numbers have no limit). A key that
# is absent is UNKNOWN: the row was stored before that attribute existed. The JVM operator writes and reads the same
# text (StateCodec's partials, DecodeState); a row of a job without attributes has no text at all (null), so the
# default spec's canonical rows are today's.

def partials_to_json(attributes: Sequence[Attribute], partials: Sequence[Any]) -> str | None:
    """One row's partials (in `attributes` order) as text; None when there are no attributes."""
    if not attributes:
        return None
    return json.dumps({a.key: list(p) if isinstance(p, tuple) else p
                       for a, p in zip(attributes, partials) if p is not UNKNOWN},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def partials_from_json(attributes: Sequence[Attribute], text: str | None) -> list[Any]:
    """A row's text -> its partials in `attributes` order (UNKNOWN for a key it does not hold)."""
    stored = json.loads(text) if text else {}
    out: list[Any] = []
    for attribute in attributes:
        if attribute.key not in stored:
            out.append(UNKNOWN)
            continue
        value = stored[attribute.key]
        out.append(tuple(float(x) for x in value) if isinstance(value, list) else value)
    return out
