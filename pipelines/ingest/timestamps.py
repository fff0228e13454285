"""Canonical event_time strings (`YYYY-MM-DD[T ]HH:MM:SS[.f{1,9}](Z|+HH:MM)`) parsed with numpy, column-wise, exactly as
the per-line rule `lines.parse_event_time` parses them (UTC, truncated to the millisecond): the columnar ingest path's
step 4 (pipelines.ingest.columnar)."""
from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["EPOCH", "TIME_TYPE", "US", "parse_times"]

TIME_TYPE = pa.timestamp("us", tz="UTC")
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
US = dt.timedelta(microseconds=1)


def _digits(by_column: np.ndarray, columns: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(all ASCII digits, their decimal value) of the given byte columns; by_column[c] is column c of every value."""
    ok = np.ones(by_column.shape[1], bool)
    value = np.zeros(by_column.shape[1], np.int32)
    for column in columns:
        digit = by_column[column] - np.uint8(48)  # wraps around: anything but "0".."9" becomes > 9
        ok &= digit <= 9
        value = value * 10 + digit
    return ok, value


def _month_tables() -> tuple[np.ndarray, np.ndarray]:
    """Per month index year * 12 + month - 1 (years 0..9999): days from 1970-01-01 to its first day (proleptic
    Gregorian, H. Hinnant's days_from_civil) and its number of days."""
    index = np.arange(10000 * 12, dtype=np.int64)
    year, month = index // 12, index % 12 + 1
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * ((month + 9) % 12) + 2) // 5
    first = era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468
    leap = ((year % 4 == 0) & (year % 100 != 0)) | (year % 400 == 0)
    lengths = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], np.int64)[month - 1] + ((month == 2) & leap)
    return first, lengths


_MONTH_FIRST_DAY, _MONTH_LENGTH = _month_tables()


def _fraction(by_column: np.ndarray, length: int) -> tuple[np.ndarray | bool, np.ndarray | int]:
    """(ok, milliseconds) of the fraction `.f{1,9}` that occupies the `length` bytes after the seconds (or nothing)."""
    if length == 0:
        return True, 0
    if not 2 <= length <= 10:
        return False, 0
    ok, _ = _digits(by_column, range(20, 19 + length))
    ok &= by_column[19] == ord(".")
    _, first = _digits(by_column, range(20, 20 + min(3, length - 1)))
    return ok, first * 10 ** (3 - min(3, length - 1))


def parse_times_fixed(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of one length (a uint8 matrix) in the canonical event_time form -> (ok, UTC microseconds, truncated to
    the millisecond as parse_event_time does). Rows not ok are left to parse_event_time."""
    rows, length = matrix.shape
    if length < 20:
        return np.zeros(rows, bool), np.zeros(rows, np.int64)
    by_column = np.ascontiguousarray(matrix.T)  # one pass; then every column is contiguous

    def is_(column: int, char: str) -> np.ndarray:
        return by_column[column] == ord(char)

    fields = [_digits(by_column, columns) for columns in ((0, 1, 2, 3), (5, 6), (8, 9), (11, 12), (14, 15), (17, 18))]
    year, month, day, hour, minute, second = (value for _, value in fields)
    ok = np.logical_and.reduce([fine for fine, _ in fields])
    ok &= is_(4, "-") & is_(7, "-") & is_(13, ":") & is_(16, ":") & (is_(10, "T") | is_(10, " "))
    ok &= (year >= 2) & (year <= 9998) & (month >= 1) & (month <= 12) & (hour <= 23) & (minute <= 59)
    ok &= second <= 59
    month_index = np.clip(year.astype(np.int64) * 12 + month - 1, 0, len(_MONTH_LENGTH) - 1)
    ok &= (day >= 1) & (day <= _MONTH_LENGTH[month_index])
    # Zone: "Z", or "+HH:MM" / "-HH:MM" below 24 h; the fraction sits between the seconds and the zone.
    zulu_ok, zulu_ms = _fraction(by_column, length - 20)
    zulu = is_(length - 1, "Z") & zulu_ok
    offset_s: np.ndarray | int = 0
    milliseconds = np.where(zulu, zulu_ms, 0)
    if length >= 25:
        plus, minus = is_(length - 6, "+"), is_(length - 6, "-")
        ok_oh, offset_hours = _digits(by_column, (length - 5, length - 4))
        ok_om, offset_minutes = _digits(by_column, (length - 2, length - 1))
        numeric = (plus | minus) & is_(length - 3, ":") & ok_oh & ok_om & (offset_hours <= 23) & (offset_minutes <= 59)
        numeric_ok, numeric_ms = _fraction(by_column, length - 25)
        numeric &= numeric_ok
        offset_s = np.where(numeric, np.where(minus, -1, 1) * (offset_hours * 3600 + offset_minutes * 60), 0)
        milliseconds = np.where(numeric, numeric_ms, milliseconds)
        ok &= zulu | numeric
    else:
        ok &= zulu
    days = _MONTH_FIRST_DAY[month_index] + day - 1
    seconds = days * 86400 + (hour * 3600 + minute * 60 + second - offset_s)
    return ok, (seconds * 1000 + milliseconds) * 1000


def parse_times(times: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A string array of event_time values -> (ok, microseconds): ok where the value is in the canonical form (see
    parse_times_fixed), grouped by length so that each group is one byte matrix."""
    n = len(times)
    ok, micros = np.zeros(n, bool), np.zeros(n, np.int64)
    lengths = pc.fill_null(pc.binary_length(times), 0).to_numpy(zero_copy_only=False)
    for length in np.unique(lengths[(lengths >= 20) & (lengths <= 35)]):
        rows = np.flatnonzero(lengths == length)
        group = times if len(rows) == n else times.take(pa.array(rows))  # one length: the values are contiguous
        start = int(np.frombuffer(group.buffers()[1], np.int32)[group.offset])
        data = np.frombuffer(group.buffers()[2], np.uint8)
        matrix = data[start:start + len(rows) * int(length)].reshape(len(rows), int(length))
        ok[rows], micros[rows] = parse_times_fixed(matrix)
    return ok, micros
