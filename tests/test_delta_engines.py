"""Both Delta engines on every table the product writes: raw_events, sessions, quarantine, a savepoint's state table
and the catalog, and the erasure log are read by Delta Spark (the jars `make setup` fetched with Maven, on the
shared SparkSession's class path) and by delta-rs with the same rows, after an erasure has scrubbed their logs too;
then each engine appends to a copy of each table and the other reads the appended row."""
from __future__ import annotations

import shutil

import pytest
from deltalake import DeltaTable, write_deltalake

from pipelines.runtime import runtime_jars
from pipelines.stream import catch_up
from state_store.erasure import forget
from state_store.lifecycle import take_savepoint
from state_store.savepoints import SavepointStore
from tests.conftest import make_config
from tests.datagen import land_files, line, stream_scenario

pytestmark = pytest.mark.tier("spark")

GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000


def _tables(config) -> dict[str, str]:
    store = SavepointStore.of(config)
    newest = store.list()[0]
    return {"raw_events": config.raw_events_table, "sessions": config.sessions_table,
            "quarantine": config.quarantine_table, "erasure_log": config.table_uri("erasure_log"),
            "savepoint_catalog": store.catalog_uri, "savepoint_state": store.state_uri(newest.savepoint_id)}


def test_delta_spark_and_delta_rs_read_and_append_every_table(spark, tmp_path):
    if not any("delta-spark" in jar.name for jar in runtime_jars()):
        pytest.fail("build/jars holds no delta-spark jar: run `make setup` (it fetches jvm/deps/pom.xml's artifacts)")
    config = make_config(tmp_path, "rocksdb")
    batches = stream_scenario(7, 5, True, GAP_MS, LATENESS_MS)  # very late events: quarantine rows
    land_files(config, [[line(e) for e in b] + (["not json"] if i == 0 else []) for i, b in enumerate(batches[:3])])
    catch_up(config, spark)
    take_savepoint(config, spark=spark, full=True)
    forget(config, "u4", spark=spark)  # scrubbed logs, the erasure log, a restored checkpoint
    land_files(config, [[line(e) for e in b if e["user_id"] != "u4"] for b in batches[3:]], start=3)
    catch_up(config, spark)

    for name, uri in _tables(config).items():
        by_rs = DeltaTable(uri).to_pyarrow_table()
        by_spark = spark.read.format("delta").load(uri)
        assert by_rs.num_rows > 0, name
        assert by_spark.count() == by_rs.num_rows, name
        assert sorted(by_spark.columns) == sorted(by_rs.column_names), name
        # Time travel through the scrubbed log: the first version reads alike in both engines.
        first = spark.read.format("delta").option("versionAsOf", 0).load(uri).count()
        assert first == DeltaTable(uri, version=0).to_pyarrow_table().num_rows, name

        copy = str(tmp_path / "copies" / name)
        shutil.copytree(uri, copy)
        spark.read.format("delta").load(uri).limit(1).write.format("delta").mode("append").save(copy)
        assert DeltaTable(copy).to_pyarrow_table().num_rows == by_rs.num_rows + 1, name
        one = DeltaTable(uri).to_pyarrow_table().slice(0, 1)
        write_deltalake(copy, one, mode="append")
        assert spark.read.format("delta").load(copy).count() == by_rs.num_rows + 2, name
