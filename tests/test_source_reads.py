"""The stream source's read plan, without Spark: a large raw_events file is read by one task per row group, and the
union of those reads is exactly the batch's well-formed rows -- the same as a whole-file read, checked against the
rows the test wrote (rejected lines stay out: the sink takes them from raw_events)."""
from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from deltalake import WriterProperties, write_deltalake

from pipelines.ingest.table import CLOCK_KIND, TABLE_SCHEMA
from pipelines.job import source
from pipelines.job.source import RawEventsStreamReader
from pipelines.storage import s3_options

pytestmark = pytest.mark.tier("pure")

T0 = dt.datetime(2026, 11, 1, 10, tzinfo=dt.timezone.utc)


def _commit(uri: str, seq: int, n: int, rejected_every: int, row_group: int, clock: bool = False) -> list[dict]:
    """One ingest commit of n lines (every `rejected_every`-th one rejected), written in row groups of `row_group`."""
    rows = []
    for i in range(n):
        bad = i % rejected_every == 0
        rows.append({
            "event_id": f"s{seq}-e{i}", "user_id": None if bad else f"u{i % 7}",
            "event_time": T0 + dt.timedelta(seconds=seq * 1000 + i), "event_type": "page_view", "page": "/",
            "source_file": f"f{seq}.jsonl", "line_no": i + 1, "ingest_seq": seq,
            "reject_reason": "missing_user_id" if bad else None, "raw": "{...}" if bad else None,
            "line_key": i + 1, "ingested_at": T0, "row_kind": None})
    if clock:
        rows.append({**rows[1], "event_id": None, "user_id": None, "source_file": "_clock", "line_no": 0,
                     "line_key": n + 1, "row_kind": CLOCK_KIND, "reject_reason": None, "raw": None})
    write_deltalake(uri, pa.Table.from_pylist(rows, schema=TABLE_SCHEMA), mode="append", storage_options=s3_options(uri),
                    writer_properties=WriterProperties(max_row_group_size=row_group))
    return rows


def _read(reader: RawEventsStreamReader, low: int, high: int) -> tuple[int, list[tuple]]:
    """(read tasks, every row the tasks hand Spark as (event_id, ingest_seq, line_key, origin))."""
    parts = reader.partitions({"seq": low, "boot": True}, {"seq": high, "boot": True})
    rows = []
    for part in parts:
        for batch in reader.read(part):
            assert batch.schema == source._arrow_schema()
            rows += zip(*(batch.column(c).to_pylist() for c in ("event_id", "ingest_seq", "line_key", "origin")))
    return len(parts), sorted(rows, key=str)


def _expected(rows: list[dict], low: int, high: int) -> list[tuple]:
    return sorted(((r["event_id"], r["ingest_seq"], r["line_key"], "marker" if r["row_kind"] else "event")
                   for r in rows if low < r["ingest_seq"] <= high and r["reject_reason"] is None), key=str)


def test_a_large_file_is_read_by_row_group_and_only_its_well_formed_rows_reach_the_stream(tmp_path, monkeypatch):
    uri = str(tmp_path / "raw_events")
    rows = _commit(uri, 1, 400, rejected_every=9, row_group=100)
    rows += _commit(uri, 2, 250, rejected_every=5, row_group=100, clock=True)
    rows += _commit(uri, 3, 30, rejected_every=4, row_group=100)
    reader = RawEventsStreamReader({"path": uri})

    whole = _read(reader, 0, 3)
    assert whole == (3, _expected(rows, 0, 3))  # one task per file while files are small

    monkeypatch.setattr(source, "SPLIT_FILE_ROWS", 120)  # the 400- and 251-row files are "large" now
    split = _read(reader, 0, 3)
    assert split == (4 + 3 + 1, whole[1])
    assert _read(reader, 1, 2) == (3, _expected(rows, 1, 2))  # only the second commit's row groups


def test_row_groups_outside_the_batch_are_not_read(tmp_path, monkeypatch):
    """A file holding several commits (as after OPTIMIZE): row groups whose ingest_seq statistics miss the batch's
    range are skipped, the rest filtered to it."""
    uri = str(tmp_path / "raw_events")
    rows = _commit(uri, 1, 100, rejected_every=10, row_group=100) + _commit(uri, 2, 100, rejected_every=10, row_group=100)
    merged = tmp_path / "merged"
    table = pa.Table.from_pylist(rows, schema=TABLE_SCHEMA)
    write_deltalake(str(merged), table, writer_properties=WriterProperties(max_row_group_size=50))
    monkeypatch.setattr(source, "SPLIT_FILE_ROWS", 10)
    reader = RawEventsStreamReader({"path": str(merged)})
    assert _read(reader, 1, 2) == (2, _expected(rows, 1, 2))  # 4 row groups, 2 of them seq 2
    assert _read(reader, 0, 2)[0] == 4


@pytest.mark.parametrize("missing", [("line_key",), ("line_key", "row_kind")])
def test_files_written_before_line_key_and_row_kind_still_read(tmp_path, missing):
    """Tables from before those columns: line_key falls back to -line_no, every row is an event."""
    uri = str(tmp_path / "raw_events")
    schema = pa.schema([f for f in TABLE_SCHEMA if f.name not in missing])
    rows = [{"event_id": f"e{i}", "user_id": "u", "event_time": T0, "event_type": "click", "page": "/",
             "source_file": "f", "line_no": i + 1, "ingest_seq": 1, "reject_reason": None, "raw": None,
             "line_key": i + 1, "ingested_at": T0, "row_kind": None} for i in range(5)]
    write_deltalake(uri, pa.Table.from_pylist(rows, schema=schema))
    got = _read(RawEventsStreamReader({"path": uri}), 0, 1)
    assert got == (1, sorted(((f"e{i}", 1, -(i + 1) if "line_key" in missing else i + 1, "event") for i in range(5)),
                             key=str))


def test_a_large_file_on_s3_is_split_and_read_the_same(tmp_path, monkeypatch, s3_endpoint):
    """The read plan opens a large file's footer where the table lives: S3 (the moto endpoint) as well."""
    uri = f"s3://warehouse/{tmp_path.name}/raw_events"
    rows = _commit(uri, 1, 300, rejected_every=7, row_group=100) + _commit(uri, 2, 40, rejected_every=3, row_group=100)
    monkeypatch.setattr(source, "SPLIT_FILE_ROWS", 120)
    assert _read(RawEventsStreamReader({"path": uri}), 0, 2) == (3 + 1, _expected(rows, 0, 2))
