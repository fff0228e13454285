"""Both Delta engines on every table the product writes: raw_events (also with files Spark tasks wrote), sessions,
quarantine, a savepoint's state table and the catalog, and the erasure log are read by Delta Spark (the jars `make
setup` fetched with Maven, in the job's own session, which carries Delta's extension and catalog) and by delta-rs with
the same rows -- now and at version 0 --, after an erasure has scrubbed their logs and compaction (delta-rs's OPTIMIZE
and VACUUM) rewrote them; then each engine appends to a copy of
each table and the other reads the appended row."""
from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from pipelines.core.sample_data import land
from pipelines.ingest import ingest
from pipelines.job.ingest_tasks import SparkIngestTasks
from pipelines.job.runtime import runtime_jars
from pipelines.job.stream import catch_up
from state_store.erasure import forget
from state_store.lifecycle import take_savepoint
from state_store.maintenance import compact
from state_store.savepoint.catalog import SavepointStore
from tests.kit.datagen import land_files, line, stream_scenario
from tests.kit.homes import make_config

pytestmark = pytest.mark.tier("spark")

GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000


def _tables(config) -> dict[str, str]:
    store = SavepointStore.of(config)
    newest = next(s for s in store.list() if s.kind == "full" and s.status == "complete" and s.rows)
    return {"raw_events": config.raw_events_table, "sessions": config.sessions_table,
            "quarantine": config.quarantine_table, "erasure_log": config.table_uri("erasure_log"),
            "savepoint_catalog": store.catalog_uri, "savepoint_state": store.state_uri(newest.savepoint_id)}


def _read_and_append_by_delta_spark(spark, tables: dict[str, tuple[str, str]]) -> dict[str, dict]:
    """Delta Spark in the job's own session (its SQL extension and catalog: pipelines.job.runtime.delta_sql_conf):
    each table's rows, rows at version 0 and columns; one of its rows appended to the copy, and the copy's rows."""
    # Tables of a few hundred rows: 2 partitions for Delta's log replay, not 50 tasks per stage.
    spark.conf.set("spark.databricks.delta.snapshotPartitions", "2")
    try:
        answers = {}
        for name, (uri, copy) in tables.items():
            frame = spark.read.format("delta").load(uri)
            answers[name] = {"rows": frame.count(), "columns": sorted(frame.columns),
                             "rows_v0": spark.read.format("delta").option("versionAsOf", 0).load(uri).count()}
            frame.limit(1).write.format("delta").mode("append").save(copy)
            answers[name]["copy_rows_after_append"] = spark.read.format("delta").load(copy).count()
        return answers
    finally:
        spark.conf.unset("spark.databricks.delta.snapshotPartitions")


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
    compact(config)  # delta-rs's OPTIMIZE and VACUUM rewrote them too

    # raw_events whose files Spark tasks wrote (a large landed file: pipelines.job.ingest_tasks), committed by delta-rs.
    by_tasks = make_config(tmp_path / "tasks", "rocksdb")
    for k, b in enumerate(batches):
        land(by_tasks.landing, f"part-{k}.jsonl", [line(e) for e in b] + ["not json"])
    assert ingest(by_tasks, large=SparkIngestTasks(spark, min_bytes=1, range_bytes=4096)).by_tasks == len(batches)
    tables = {**_tables(config), "raw_events_by_tasks": by_tasks.raw_events_table}
    copies = {name: str(tmp_path / "copies" / name) for name in tables}
    for name, uri in tables.items():
        shutil.copytree(uri, copies[name])
    by_spark = _read_and_append_by_delta_spark(spark, {name: (uri, copies[name]) for name, uri in tables.items()})
    for name, uri in tables.items():
        by_rs = DeltaTable(uri).to_pyarrow_table()
        assert by_rs.num_rows > 0, name
        assert by_spark[name]["rows"] == by_rs.num_rows, name
        assert by_spark[name]["columns"] == sorted(by_rs.column_names), name
        # Time travel through the scrubbed log: version 0 loads in both engines with the same row count (its data
        # files may be vacuumed by the erasure: the count is the log's).
        first = pa.table(DeltaTable(uri, version=0).get_add_actions(flatten=True))
        assert by_spark[name]["rows_v0"] == int(pc.sum(first["num_records"]).as_py() or 0), name
        # Delta Spark appended to the copy; delta-rs reads it, appends, and the count adds up.
        assert by_spark[name]["copy_rows_after_append"] == by_rs.num_rows + 1, name
        assert DeltaTable(copies[name]).to_pyarrow_table().num_rows == by_rs.num_rows + 1, name
        write_deltalake(copies[name], by_rs.slice(0, 1), mode="append")
        assert DeltaTable(copies[name]).to_pyarrow_table().num_rows == by_rs.num_rows + 2, name
