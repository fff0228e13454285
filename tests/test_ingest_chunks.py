"""A landed file larger than READ_CHUNK_BYTES is ingested in several commits (ingest's memory bounded by the chunk,
not by the file): the same rows as when it is read whole, each line once with its true line number."""
from __future__ import annotations

import json

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pipelines.core.sample_data import generate_events, land
from pipelines.ingest import INGESTED_DIR, ingest
from pipelines.ingest import local as local_landing
from tests.kit.homes import make_config

pytestmark = pytest.mark.tier("pure")


def _lines() -> list[str]:
    events = generate_events(6, 2, seed=5)
    lines = [json.dumps(e) for e in events]
    lines.insert(3, "{not json")
    lines.insert(10, json.dumps({"event_id": "long", "user_id": "u-long", "event_time": events[0]["event_time"],
                                 "page": "x" * 3000}))  # longer than the small chunk below: read whole
    lines.insert(20, "")  # a blank line keeps its number
    return lines


def _rows(config) -> list[tuple]:
    table = DeltaTable(config.raw_events_table).to_pyarrow_table(
        columns=["source_file", "line_no", "event_id", "reject_reason", "ingest_seq"])
    return sorted(zip(table["source_file"].to_pylist(), table["line_no"].to_pylist(),
                      table["event_id"].to_pylist(), table["reject_reason"].to_pylist()))


def test_a_file_larger_than_a_chunk_is_read_in_rounds_with_the_rows_of_one_read(tmp_path, monkeypatch):
    lines = _lines()
    whole = make_config(tmp_path / "whole")
    land(whole.landing, "part-0.jsonl", lines)
    once = ingest(whole)
    assert once.last_seq == 1

    chunked = make_config(tmp_path / "chunked")
    land(chunked.landing, "part-0.jsonl", lines)
    monkeypatch.setattr(local_landing, "READ_CHUNK_BYTES", 1000)
    result = ingest(chunked)
    assert result.files == 1 and result.waiting == 0 and result.rows == once.rows
    assert result.last_seq > 3  # several commits, each a chunk
    assert _rows(chunked) == _rows(whole)
    seqs = DeltaTable(chunked.raw_events_table).to_pyarrow_table(columns=["ingest_seq"])["ingest_seq"]
    assert pc.min(seqs).as_py() == 1 and pc.max(seqs).as_py() == result.last_seq
    assert not (chunked.landing / "part-0.jsonl").exists()  # read to its end: archived
    assert len(list((chunked.landing / INGESTED_DIR).glob("*/part-0.jsonl"))) == 1
    # Nothing more to read: the next ingest commits nothing.
    assert ingest(chunked).rows == 0
