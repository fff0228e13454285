"""The local HDFS of tests/hdfs_cluster.py (the `hdfs` fixture): Spark reads and writes hdfs://, Python reads and
writes the same namespace over WebHDFS without a JVM (fsspec's client in a pyarrow filesystem), and the data lives
through a NameNode restart and a DataNode stop/restart."""
from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from tests.hdfs_cluster import CLIENT_RETRY_CONF

pytestmark = pytest.mark.tier("e2e")

SCHEMA = "id long, v string"
# Every Spark read and write here: the Hadoop client retry policy (CLIENT_RETRY_CONF, what a client that lives through
# a NameNode restart needs), outside Hadoop's FileSystem cache. A cached client of the session's Spark without it would
# keep an RPC connection that test_namenode_restart_between_two_writes leaves stale: the next call on it, in a later
# test of the run, would fail with EOFException.
SPARK_OPTIONS = {**CLIENT_RETRY_CONF, "fs.hdfs.impl.disable.cache": "true"}


def rows(start: int, n: int = 50) -> list[tuple[int, str]]:
    return [(i, f"v{i}") for i in range(start, start + n)]


def write(spark, uri: str, data: list[tuple[int, str]]) -> None:
    spark.createDataFrame(data, SCHEMA).coalesce(1).write.options(**SPARK_OPTIONS).parquet(uri)


def read(spark, uri: str) -> list[tuple[int, str]]:
    return sorted(tuple(r) for r in spark.read.options(**SPARK_OPTIONS).parquet(uri).collect())


def read_arrow(fs: pafs.FileSystem, path: str) -> list[tuple[int, str]]:
    table = pq.read_table(path, filesystem=fs)
    return sorted(zip(table["id"].to_pylist(), table["v"].to_pylist()))


# Two WebHDFS operations pyarrow's filesystem API cannot express through fsspec: its open(path, "wb") always sends
# overwrite=true, and its mv() ignores the {"boolean": false} with which HDFS refuses a rename onto an existing path.
def create_if_absent(webhdfs, path: str, data: bytes) -> None:
    """Creates `path` with `data` unless it exists (FileExistsError): atomic on the NameNode. WebHDFS creates in two
    steps: the NameNode redirects to a DataNode, whose create call to the NameNode (overwrite=false) decides."""
    redirect = webhdfs._call("CREATE", "put", path, redirect=False, overwrite="false")
    done = webhdfs.session.put(redirect.headers["Location"], data=data,
                               headers={"content-type": "application/octet-stream"})
    if done.status_code == 403 and "FileAlreadyExistsException" in done.text:
        raise FileExistsError(path)
    done.raise_for_status()


def rename_if_absent(webhdfs, source: str, target: str) -> None:
    """Renames atomically, or raises FileExistsError when `target` exists (HDFS rename with options NONE)."""
    try:
        webhdfs._call("RENAME", "put", source, destination=target, renameoptions="NONE")
    except RuntimeError as e:  # fsspec's mapping of the NameNode's FileAlreadyExistsException
        if "already exists" in str(e):
            raise FileExistsError(target) from e
        raise


@pytest.fixture(scope="module")
def spark_wrote(spark, hdfs) -> str:
    """hdfs://.../smoke/x: 50 rows written by Spark as one Parquet file."""
    uri = f"{hdfs.uri}/smoke/x"
    write(spark, uri, rows(0))
    return uri


def test_spark_writes_and_reads_parquet(spark, spark_wrote):
    assert spark_wrote.startswith("hdfs://127.0.0.1:")
    assert read(spark, spark_wrote) == rows(0)


def test_python_reads_and_writes_over_webhdfs(spark, hdfs, spark_wrote):
    fs = hdfs.arrow_filesystem(user="sessions")
    webhdfs = fs.handler.fs

    listed = sorted(fs.get_file_info(pafs.FileSelector("/smoke/x")), key=lambda info: info.base_name)
    assert [info.base_name for info in listed][0] == "_SUCCESS" and len(listed) == 2
    success, part = listed
    assert success.type == pafs.FileType.File and success.size == 0
    assert re.fullmatch(r"part-00000-.+\.parquet", part.base_name) and part.size > 0
    assert read_arrow(fs, part.path) == rows(0)

    # Python writes, Spark reads.
    pq.write_table(pa.table({"id": pa.array(range(7), pa.int64()), "v": [f"v{i}" for i in range(7)]}),
                   "/py/table/part.parquet", filesystem=fs)
    assert read(spark, f"{hdfs.uri}/py/table") == rows(0, 7)

    create_if_absent(webhdfs, "/py/marker", b"first")
    with pytest.raises(FileExistsError):
        create_if_absent(webhdfs, "/py/marker", b"second")
    with fs.open_input_stream("/py/marker") as f:
        assert f.read() == b"first"

    fs.move("/py/marker", "/py/renamed")
    assert fs.get_file_info("/py/marker").type == pafs.FileType.NotFound
    with fs.open_input_stream("/py/renamed") as f:
        assert f.read() == b"first"

    # Onto an existing file: pyarrow's move through fsspec changes nothing and raises nothing; rename_if_absent says so.
    create_if_absent(webhdfs, "/py/other", b"other")
    fs.move("/py/other", "/py/renamed")
    with pytest.raises(FileExistsError):
        rename_if_absent(webhdfs, "/py/other", "/py/renamed")
    assert [fs.open_input_stream(p).read() for p in ("/py/other", "/py/renamed")] == [b"other", b"first"]


def test_namenode_restart_between_two_writes(spark, hdfs):
    write(spark, f"{hdfs.uri}/restart/one", rows(0))
    hdfs.restart_namenode()  # same ports; the first call on the driver's connection then fails and is retried
    write(spark, f"{hdfs.uri}/restart/two", rows(100))

    assert read(spark, f"{hdfs.uri}/restart/one") == rows(0)
    assert read(spark, f"{hdfs.uri}/restart/two") == rows(100)
    fs = hdfs.arrow_filesystem()
    assert [read_arrow(fs, f"/restart/{name}") for name in ("one", "two")] == [rows(0), rows(100)]


def test_datanode_stop_and_restart(spark, hdfs):
    write(spark, f"{hdfs.uri}/dn/before", rows(0))
    fs = hdfs.arrow_filesystem()
    hdfs.stop_datanode(0)
    try:
        # The only DataNode is dead on the NameNode: nowhere to put a block.
        with pytest.raises(RuntimeError, match="Failed to find datanode"):
            create_if_absent(fs.handler.fs, "/dn/while-down", b"x")
    finally:
        hdfs.restart_datanode(0)

    write(spark, f"{hdfs.uri}/dn/after", rows(100))
    assert read(spark, f"{hdfs.uri}/dn/after") == rows(100)
    assert read(spark, f"{hdfs.uri}/dn/before") == rows(0)
    assert read_arrow(fs, "/dn/before") == rows(0)
    assert fs.get_file_info("/dn/while-down").type == pafs.FileType.NotFound
