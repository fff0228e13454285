"""The product's tables rewritten by Delta Spark while the stream is stopped -- OPTIMIZE, ZORDER BY, UPDATE, DELETE with
deletion vectors on, VACUUM -- and then every command that reads them: catch-up with more data, savepoint, restore
(canonical and native) of a savepoint taken before the rewrite, status, `state --user`, forget. Each result is the
oracle's on the stream as the rewrite left it: the deleted user never was, everyone else exactly once.

The rewrite runs in the job's own session (Delta's SQL extension is part of it: pipelines.job.runtime.delta_sql_conf).
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pipelines.data_files import data_files
from pipelines.job.stream import catch_up
from pipelines.storage import open_table, read_rows
from state_store.erasure import forget
from state_store.lifecycle import restore, take_savepoint
from state_store.state import lookup_user
from state_store.status import status
from testkit.oracle import run_oracle
from tests.kit.datagen import land_batches, land_files, line, make_event, stream_scenario
from tests.kit.homes import make_config
from tests.kit.storages import s3a_session
from tests.kit.tables import assert_late_keys, read_open_sessions, read_sessions

pytestmark = pytest.mark.tier("spark")  # in the long depth (tests/conftest.py LONG)

GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000
SEED = 7
DELETED = "x-deleted"   # a user an operator deletes with Delta Spark (rows of every table, deletion vectors)
FORGOTTEN = "u4"        # a user `forget` erases afterwards


def _scenario() -> list[list[dict]]:
    """stream_scenario's batches, with DELETED's session in batch 2: on time, and closed (logout) by batch 2's own
    watermark, so that once its rows are deleted from every table no state or output holds it."""
    batches = stream_scenario(SEED, 6, True, GAP_MS, LATENESS_MS)
    before = max(e["event_time_ms"] for b in batches[:2] for e in b)
    through = max(e["event_time_ms"] for b in batches[:3] for e in b)
    logout = through - LATENESS_MS - 60_000
    assert logout - 60_000 > before, "batch 2 must move the watermark past DELETED's session"
    batches[2] = [*batches[2], make_event(DELETED, "del-1", logout - 60_000, "page_view"),
                  make_event(DELETED, "del-2", logout, "logout")]
    return batches


def _without(batches: list[list[dict]], *users: str) -> list[list[dict]]:
    return [[e for e in batch if e["user_id"] not in users] for batch in batches]


def _assert_oracle(spark, config, batches: list[list[dict]]) -> None:
    expected = run_oracle(batches, GAP_MS, LATENESS_MS)
    assert read_sessions(config) == sorted(expected.closed)
    assert read_open_sessions(spark, config) == sorted(expected.open_sessions)
    assert_late_keys(config, expected)


def _rewrite_with_delta_spark(spark, config) -> None:
    """What a user runs on the tables with Delta Spark: compaction, Z-order, an UPDATE that rewrites rows (to the
    same values), DELETE of a user and of the rejected lines with deletion vectors on, VACUUM of every old file."""
    with _small_tables(spark):
        _delta_commands(spark, config)


@contextmanager
def _small_tables(spark) -> Iterator[None]:
    """Delta's defaults are sized for large tables (50 partitions to rebuild a snapshot; VACUUM lists files with the
    partition discovery's 10,000 tasks), which made these commands cost minutes here."""
    tuned = {"spark.databricks.delta.retentionDurationCheck.enabled": "false",
             "spark.databricks.delta.snapshotPartitions": "2",
             "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2"}
    for key, value in tuned.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key in tuned:
            spark.conf.unset(key)


def _delta_commands(spark, config) -> None:
    for uri in (config.raw_events_table, config.sessions_table, config.quarantine_table):
        table = f"delta.`{uri}`"
        spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
        spark.sql(f"OPTIMIZE {table}")
        spark.sql(f"OPTIMIZE {table} ZORDER BY (user_id)")
        spark.sql(f"UPDATE {table} SET user_id = user_id WHERE user_id = 'u1'")
        spark.sql(f"DELETE FROM {table} WHERE user_id = '{DELETED}'")
        spark.sql(f"VACUUM {table} RETAIN 0 HOURS")
    # The junk lines too: gone from raw_events and from the quarantine (a replay must not bring them back).
    spark.sql(f"DELETE FROM delta.`{config.raw_events_table}` WHERE reject_reason IS NOT NULL")
    spark.sql(f"DELETE FROM delta.`{config.quarantine_table}` WHERE reason <> 'late'")


def _deletion_vectors(config, uri: str) -> bool:
    table = open_table(config, uri)
    return "deletionVectors" in (table.protocol().reader_features or []) and \
        read_rows(table, columns=["user_id"]).num_rows < sum(f.rows or 0 for f in data_files(table))


def test_every_command_after_delta_spark_rewrote_the_tables(spark, tmp_path):
    """On RocksDB only: what a rewrite changes is the tables, which both providers' jobs read and write alike; the
    HDFS-backed provider's native restore is test_native_savepoints' (hdfs-s3), its canonical one test_lifecycle's."""
    config = make_config(tmp_path, "rocksdb")
    batches = _scenario()
    land_files(config, [[line(e) for e in batches[0]] + ["not json"], *[[line(e) for e in b] for b in batches[1:2]]])
    catch_up(config, spark)
    before = take_savepoint(config, spark=spark, full=True, native_copy=True)  # before the rewrite and batch 2
    land_batches(config, batches[2:3], start=2)
    catch_up(config, spark)
    assert any(s[1] == DELETED for s in read_sessions(config))

    _rewrite_with_delta_spark(spark, config)
    assert _deletion_vectors(config, config.raw_events_table), "the DELETE left deletion vectors in raw_events"
    expected = _without(batches, DELETED)

    # status and state --user read the rewritten tables and the state.
    report = status(config, spark=spark)
    assert report.sessions_rows == len(read_sessions(config))
    _assert_oracle(spark, config, expected[:3])
    open_user = run_oracle(expected[:3], GAP_MS, LATENESS_MS).open_sessions[0]
    looked_up = lookup_user(spark, config, open_user[1])
    assert len(looked_up["open_sessions"]) == sum(1 for s in run_oracle(expected[:3], GAP_MS, LATENESS_MS)
                                                  .open_sessions if s[1] == open_user[1])

    # More data, exactly once, then a savepoint of the rewritten job.
    land_batches(config, expected[3:4], start=3)
    catch_up(config, spark)
    _assert_oracle(spark, config, expected[:4])
    after = take_savepoint(config, spark=spark, full=True)
    assert after.rows > 0

    # A savepoint taken before the rewrite: its replay reads the files Delta Spark rewrote (deleted rows included in
    # them, cut by deletion vectors). Canonical, then native; more data after each.
    assert restore(config, before.savepoint_id, spark=spark, canonical=True).method == "canonical"
    catch_up(config, spark)
    _assert_oracle(spark, config, expected[:4])
    assert restore(config, before.savepoint_id, spark=spark).method == "native"
    land_batches(config, expected[4:5], start=4)
    catch_up(config, spark)
    _assert_oracle(spark, config, expected[:5])

    # forget on tables with deletion vectors.
    assert forget(config, FORGOTTEN, spark=spark).removed["raw_events"] > 0  # its verification: test_erasure's
    land_batches(config, _without(expected[5:], FORGOTTEN), start=5)
    catch_up(config, spark)
    _assert_oracle(spark, config, _without(expected, FORGOTTEN))
    # Delta Spark still reads what the product and delta-rs wrote over its rewrite, row for row.
    for uri in (config.raw_events_table, config.sessions_table, config.quarantine_table):
        by_rs = read_rows(open_table(config, uri))
        by_spark = spark.read.format("delta").load(uri)
        assert by_spark.count() == by_rs.num_rows and sorted(by_spark.columns) == sorted(by_rs.column_names), uri


@pytest.mark.tier("e2e")
def test_optimize_and_delete_by_delta_spark_on_s3(spark, s3_endpoint, tmp_path):
    """The warehouse on S3 (the suite's moto endpoint; Delta Spark through Hadoop's S3A, the product through
    delta-rs): OPTIMIZE and a DELETE with deletion vectors on raw_events and sessions, then a restore of a savepoint
    taken before them -- whose replay reads the files they rewrote -- and a catch-up with more data."""
    config = make_config(tmp_path, "rocksdb", SESSIONS_WAREHOUSE_URI=f"s3://warehouse/{tmp_path.name}/tables",
                         SESSIONS_SAVEPOINT_URI=f"s3://savepoints/{tmp_path.name}")
    s3a_session(spark, s3_endpoint)
    batches = _scenario()
    land_files(config, [[line(e) for e in b] for b in batches[:2]])
    catch_up(config, spark)
    before = take_savepoint(config, spark=spark)
    land_files(config, [[line(e) for e in b] for b in batches[2:3]], start=2)
    catch_up(config, spark)
    with _small_tables(spark):
        for uri in (config.raw_events_table, config.sessions_table):
            table = f"delta.`{uri.replace('s3://', 's3a://', 1)}`"
            spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
            spark.sql(f"OPTIMIZE {table}")
            spark.sql(f"DELETE FROM {table} WHERE user_id = '{DELETED}'")
    assert _deletion_vectors(config, config.raw_events_table)
    expected = _without(batches, DELETED)
    assert restore(config, before.savepoint_id, spark=spark).savepoint_id == before.savepoint_id
    land_files(config, [[line(e) for e in b] for b in expected[3:]], start=3)
    catch_up(config, spark)
    _assert_oracle(spark, config, expected)
