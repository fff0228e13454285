"""The one reader of a Delta table's data files (pipelines.data_files) and the plain Arrow types every read ends in
(pipelines.arrow_types), against what a writer may hand over: every string and binary layout, dictionaries, nested
views; files of several row groups whose deletion vectors cut rows (positions counted by hand here)."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from pipelines.arrow_types import plain_type, plain_types
from pipelines.data_files import DataFile, data_files, read_data_file, row_count

pytestmark = pytest.mark.tier("pure")

WORDS = ["a", "bb", None, "ccc", "a"]


@pytest.mark.parametrize("layout", [pa.string(), pa.large_string(), pa.string_view(),
                                    pa.dictionary(pa.int16(), pa.string()),
                                    pa.dictionary(pa.int8(), pa.large_string())])
def test_every_string_layout_reads_as_string_and_filters(layout):
    column = pa.array(WORDS, pa.string()).cast(layout)
    table = plain_types(pa.table({"s": column, "n": pa.array(range(5), pa.int64())}))
    assert table.schema.field("s").type == pa.string()
    # What failed on string views: a filter (array_take) and a concat with plain strings.
    kept = table.filter(pc.greater(table["n"], 1))
    assert kept["s"].to_pylist() == WORDS[2:]
    assert pa.concat_tables([kept, pa.table({"s": pa.array(["z"]), "n": pa.array([9], pa.int64())})]).num_rows == 4


@pytest.mark.parametrize("layout, plain", [
    (pa.binary_view(), pa.binary()), (pa.large_binary(), pa.binary()),
    (pa.list_(pa.string_view()), pa.list_(pa.string())),
    (pa.large_list(pa.large_string()), pa.list_(pa.string())),
    (pa.struct([("u", pa.string_view()), ("n", pa.int64())]), pa.struct([("u", pa.string()), ("n", pa.int64())])),
    (pa.map_(pa.string_view(), pa.large_binary()), pa.map_(pa.string(), pa.binary())),
    (pa.timestamp("us", tz="UTC"), pa.timestamp("us", tz="UTC")), (pa.int64(), pa.int64()),
])
def test_plain_types_of_binary_and_nested_layouts(layout, plain):
    assert plain_type(layout) == plain


def test_a_table_already_plain_is_returned_as_it_is():
    table = pa.table({"s": pa.array(WORDS), "n": pa.array(range(5), pa.int64())})
    assert plain_types(table) is table


def _file(tmp_path, rows: int, group_rows: int) -> str:
    path = tmp_path / "part.parquet"
    table = pa.table({"n": pa.array(range(rows), pa.int64()),
                      "s": pa.array([f"v{i}" for i in range(rows)], pa.string()).cast(pa.string_view())})
    pq.write_table(table, path, row_group_size=group_rows)
    assert pq.ParquetFile(path).metadata.num_row_groups == -(-rows // group_rows)
    return str(path)


def test_deleted_positions_are_dropped_from_the_whole_file_and_from_each_row_group(tmp_path):
    uri = _file(tmp_path, rows=10, group_rows=4)  # row groups: 0-3, 4-7, 8-9
    deleted = pa.array([0, 5, 6, 9], pa.int64())
    cut = DataFile(uri, {"num_records": 10}, deleted)
    whole = read_data_file(cut, columns=["n", "s", "absent"])
    assert whole.column_names == ["n", "s"] and whole.schema.field("s").type == pa.string()
    assert whole["n"].to_pylist() == [1, 2, 3, 4, 7, 8]
    assert whole["s"].to_pylist() == [f"v{i}" for i in (1, 2, 3, 4, 7, 8)]
    assert read_data_file(cut, columns=["n"], row_groups=[1])["n"].to_pylist() == [4, 7]
    assert read_data_file(cut, columns=["n"], row_groups=[2, 0])["n"].to_pylist() == [8, 1, 2, 3]
    assert read_data_file(DataFile(uri), columns=["n"], row_groups=[2])["n"].to_pylist() == [8, 9]


def test_data_files_and_row_counts_of_a_table_delta_rs_rewrote(tmp_path):
    uri = str(tmp_path / "t")
    for start in (0, 10):
        write_deltalake(uri, pa.table({"n": pa.array(range(start, start + 10), pa.int64()),
                                       "s": pa.array([f"v{i}" for i in range(start, start + 10)])}), mode="append")
    table = DeltaTable(uri)
    table.delete("n % 3 = 0")  # rewrites files: delta-rs writes string views
    table = DeltaTable(uri)
    files = data_files(table, stats_of=["n"])
    assert all(f.deleted is None for f in files)  # delta-rs rewrites; no deletion vectors
    read = pa.concat_tables([read_data_file(f, columns=["n", "s"]) for f in files])
    expected = [n for n in range(20) if n % 3]
    assert sorted(read["n"].to_pylist()) == expected and read.schema.field("s").type == pa.string()
    assert row_count(table) == len(expected)
    assert all(f.may_hold("n", 0, 19) for f in files) and not any(f.may_hold("n", 19, 30) for f in files)
