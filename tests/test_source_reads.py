"""The stream's source (`sessions_raw`, the operator jar's RawEvents) on its own: a stream over a raw_events table the
test wrote hands over exactly the well-formed rows of each batch's ingest_seq range -- checked against the rows the
test wrote (rejected lines stay out: the sink takes them from raw_events) --, clock rows as markers, a checkpoint
resumed after its last position, and offsets in the text the offset logs of existing checkpoints hold."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, WriterProperties, write_deltalake

from pipelines.ingest.table import CLOCK_KIND, TABLE_SCHEMA
from pipelines.job.source import SOURCE_NAME
from pipelines.storage import s3_options

pytestmark = pytest.mark.tier("spark")

T0 = dt.datetime(2026, 11, 1, 10, tzinfo=dt.timezone.utc)
COLUMNS = ("event_id", "ingest_seq", "line_key", "origin")


def _commit(uri: str, seq: int, n: int, rejected_every: int, row_group: int, clock: bool = False) -> list[dict]:
    """One ingest commit of n lines (every `rejected_every`-th one rejected), written in row groups of `row_group`,
    with ingest_seq in its commit's metadata as the ingest writes it."""
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
                    writer_properties=WriterProperties(max_row_group_size=row_group),
                    commit_properties=CommitProperties(custom_metadata={"ingest_seq": str(seq)}))
    return rows


def _expected(rows: list[dict], low: int, high: int) -> list[tuple]:
    return sorted(((r["event_id"], r["ingest_seq"], r["line_key"], "marker" if r["row_kind"] else "event")
                   for r in rows if low < r["ingest_seq"] <= high and r["reject_reason"] is None), key=str)


def _stream(spark, uri: str, checkpoint: Path, columns: tuple[str, ...] = COLUMNS,
            **options) -> tuple[list[list[tuple]], list[str]]:
    """Run the source to the end of the table (Trigger.AvailableNow): each batch's rows as `columns` (SQL
    expressions), and each batch's offset as its offset log entry holds it."""
    batches: list[list[tuple]] = []
    reader = spark.readStream.format(SOURCE_NAME).option("path", uri)
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.load().selectExpr(*columns).writeStream.option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True)
             .foreachBatch(lambda frame, _: batches.append(sorted(map(tuple, frame.collect()), key=str))).start())
    query.awaitTermination()
    offsets = sorted((p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    return batches, [p.read_text().splitlines()[-1] for p in offsets]


def test_each_batch_is_its_ingest_seq_range_of_well_formed_rows_and_clock_rows_are_markers(spark, tmp_path):
    uri = str(tmp_path / "raw_events")
    rows = _commit(uri, 1, 400, rejected_every=9, row_group=100)
    rows += _commit(uri, 2, 250, rejected_every=5, row_group=100, clock=True)
    DeltaTable(uri).create_checkpoint()  # the log read from its checkpoint on, then the commit after it
    rows += _commit(uri, 3, 30, rejected_every=4, row_group=100)

    batches, offsets = _stream(spark, uri, tmp_path / "one", maxVersionsPerTrigger="2")
    # Two seqs per batch, then one empty batch after the data (at the watermark the data advanced).
    assert batches == [_expected(rows, 0, 2), _expected(rows, 2, 3), []]
    assert offsets == ['{"seq": 2, "boot": true, "settled": false}', '{"seq": 3, "boot": true, "settled": false}',
                       '{"seq": 3, "boot": true, "settled": true}']

    # New commits only: the same checkpoint goes on from seq 3.
    rows += _commit(uri, 4, 20, rejected_every=3, row_group=100)
    batches, _ = _stream(spark, uri, tmp_path / "one")
    assert batches == [_expected(rows, 3, 4), []]


def test_a_stream_stopped_at_a_position_resumes_after_it(spark, tmp_path):
    """A checkpoint resumes at its last offset (as a restored one resumes after the batch 0 its restore wrote at the
    savepoint's position): the rows after it, then one empty batch; the offsets in the logs' text."""
    uri = str(tmp_path / "raw_events")
    rows = [row for seq in (1, 2, 3) for row in _commit(uri, seq, 20, rejected_every=6, row_group=100)]
    checkpoint = tmp_path / "resumed"
    batches, offsets = _stream(spark, uri, checkpoint, targetSeq="1")
    assert batches == [_expected(rows, 0, 1), []]
    assert offsets == ['{"seq": 1, "boot": true, "settled": false}', '{"seq": 1, "boot": true, "settled": true}']
    batches, offsets = _stream(spark, uri, checkpoint, targetSeq="2")
    assert batches == [_expected(rows, 1, 2), []]
    assert offsets[2:] == ['{"seq": 2, "boot": true, "settled": false}', '{"seq": 2, "boot": true, "settled": true}']


def test_rows_outside_the_batch_in_a_merged_file_are_not_handed_over(spark, tmp_path):
    """A file holding several commits (as after OPTIMIZE), in small row groups: only the batch's range is handed over,
    and a table whose newest commits carry no ingest_seq (written by another writer) is read from its statistics."""
    uri = str(tmp_path / "raw_events")
    rows = _commit(str(tmp_path / "a"), 1, 100, 10, 100) + _commit(str(tmp_path / "a"), 2, 100, 10, 100)
    write_deltalake(uri, pa.Table.from_pylist(rows, schema=TABLE_SCHEMA),
                    writer_properties=WriterProperties(max_row_group_size=50))
    first, _ = _stream(spark, uri, tmp_path / "merged", targetSeq="1")
    batches, _ = _stream(spark, uri, tmp_path / "merged")
    assert (first, batches) == ([_expected(rows, 0, 1), []], [_expected(rows, 1, 2), []])


@pytest.mark.parametrize("missing", [("line_key",), ("line_key", "row_kind")])
def test_files_written_before_line_key_and_row_kind_still_read(spark, tmp_path, missing):
    """Tables from before those columns: line_key falls back to -line_no, every row is an event."""
    uri = str(tmp_path / "raw_events")
    schema = pa.schema([f for f in TABLE_SCHEMA if f.name not in missing])
    rows = [{"event_id": f"e{i}", "user_id": "u", "event_time": T0, "event_type": "click", "page": "/",
             "source_file": "f", "line_no": i + 1, "ingest_seq": 1, "reject_reason": None, "raw": None,
             "line_key": i + 1, "ingested_at": T0, "row_kind": None} for i in range(5)]
    write_deltalake(uri, pa.Table.from_pylist(rows, schema=schema))
    batches, _ = _stream(spark, uri, tmp_path / "old")
    assert batches == [sorted(((f"e{i}", 1, -(i + 1) if "line_key" in missing else i + 1, "event") for i in range(5)),
                              key=str), []]


@pytest.mark.parametrize("engine", ["delta-rs", "delta-spark-deletion-vectors"])
def test_rows_an_erasure_deleted_are_not_handed_over(spark, tmp_path, engine):
    """Rows deleted from raw_events after they landed are read as gone: files rewritten without them (delta-rs), or
    hidden by deletion vectors (Delta Spark on a table that enables them, as a user's rewrite may)."""
    uri = str(tmp_path / "raw_events")
    rows = _commit(uri, 1, 50, rejected_every=10, row_group=100) + _commit(uri, 2, 50, rejected_every=10, row_group=100)
    if engine == "delta-rs":
        DeltaTable(uri).delete("user_id = 'u3'")
    else:
        spark.sql(f"ALTER TABLE delta.`{uri}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = true)")
        spark.sql(f"DELETE FROM delta.`{uri}` WHERE user_id = 'u3'")
        assert '"deletionVector":{' in "".join(p.read_text() for p in (tmp_path / "raw_events" / "_delta_log").glob("*.json"))
    rows = [r for r in rows if r["user_id"] != "u3"]
    rows += _commit(uri, 3, 20, rejected_every=10, row_group=100)  # u3 again, after the erasure
    batches, _ = _stream(spark, uri, tmp_path / "erased")
    assert batches == [_expected(rows, 0, 3), []]


def test_a_table_on_s3_is_read_the_same(spark, tmp_path, s3_endpoint):
    """The executors read the table where it lives: S3 (the moto endpoint), through Hadoop's S3A."""
    from tests.kit.storages import s3a_session

    s3a_session(spark, s3_endpoint)
    uri = f"s3://warehouse/{tmp_path.name}/raw_events"
    rows = _commit(uri, 1, 300, rejected_every=7, row_group=100) + _commit(uri, 2, 40, rejected_every=3, row_group=100)
    batches, _ = _stream(spark, uri, tmp_path / "s3")
    assert batches == [_expected(rows, 0, 2), []]
