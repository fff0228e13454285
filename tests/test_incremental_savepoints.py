"""Incremental savepoints (state_store.savepoint.catalog, "Incremental savepoints"), against expectations the product does not
compute: the state read through Spark's state data source at the savepoint's batch, the oracle (testkit/oracle.py) at
that batch, and the sessions table after a restore and a catch-up. Users join, change, sleep, log out and close
between the savepoints, so increments hold new users, changed users, tombstones, and leave users out."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import state_store.savepoint.fold as savepoint_fold
from pipelines.core.sample_data import land
from pipelines.ingest import ingest
from pipelines.ingest.erased import UserSpelling
from pipelines.job.stream import catch_up
from state_store.erasure import _erase_savepoints
from state_store.lifecycle import restore, take_savepoint, validate_savepoint
from state_store.maintenance import compact
from state_store.savepoint.catalog import DELETED, SavepointStore
from state_store.savepoint.chain import savepoint_checksum, savepoint_rows
from state_store.savepoint.checksum import state_checksum
from testkit.lifecycle_expectations import live_state
from tests.kit.datagen import BASE_MS, iso
from tests.kit.homes import make_config
from tests.kit.savepoint_expectations import oracle_of
from tests.kit.tables import open_sessions_of, read_open_sessions, read_sessions

pytestmark = pytest.mark.tier("spark")  # (the S3 case: e2e, by its s3_endpoint fixture)



GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000
MINUTE = 60_000


def _scenario(parts: int) -> list[list[dict]]:
    """One micro-batch per 15 minutes. Steady users act in every batch; leaving ones in the first two only (they close
    later: tombstones); loggers-out log out in the second; joiners start in the fourth; returning ones act in the
    first and the fifth (closed in between, a new session then); sleepers act once in the first third of a batch
    and are then left alone while open (absent from increments)."""
    groups = {"steady": (8, range(parts)), "leaving": (6, (0, 1)), "logout": (4, (0, 1)), "joining": (6, range(3, parts)),
              "returning": (4, (0, 4)), "sleeping": (4, (2,))}
    chunks: list[list[dict]] = [[] for _ in range(parts)]
    for group, (users, batches) in groups.items():
        for u in range(users):
            user = f"{group}-{u}"
            for k in batches:
                if k >= parts:
                    continue
                for step, offset in enumerate((1 + u % 3, 5 + u % 4)):
                    kind = "logout" if group == "logout" and k == 1 and step == 1 else "page_view" if step else "click"
                    at = BASE_MS + k * 15 * MINUTE + offset * MINUTE
                    chunks[k].append({"event_id": f"{user}-{k}-{step}", "user_id": user, "event_time": iso(at),
                                      "event_type": kind, "page": "/"})
    return chunks


def _land(config, chunks: list[list[dict]], start: int) -> None:
    for k, chunk in enumerate(chunks, start):
        land(config.landing, f"part-{k:04d}.jsonl", [json.dumps(e) for e in chunk])
        ingest(config, files_per_commit=1)


def _oracle_open(chunks: list[list[dict]]) -> list[tuple]:
    return sorted(oracle_of(chunks, GAP_MS, LATENESS_MS).open_sessions)


def _chain(config, spark, chunks: list[list[dict]], start: int = 0) -> list:
    """A savepoint after each chunk from `start` on; each checked against the live state at its batch and the oracle
    of every chunk up to it."""
    taken = []
    for k, chunk in enumerate(chunks[start:], start):
        _land(config, [chunk], k)
        catch_up(config, spark)
        saved = take_savepoint(config, spark=spark)
        live = live_state(spark, config.checkpoint, batch_id=saved.batch_id)
        resolved = savepoint_rows(spark, SavepointStore.of(config), saved.savepoint_id).toArrow()
        assert (saved.rows, saved.checksum) == (live.num_rows, state_checksum(live)) == \
            (resolved.num_rows, state_checksum(resolved)), (k, saved.kind)
        assert open_sessions_of(resolved.to_pylist()) == _oracle_open(chunks[:k + 1]), k
        taken.append(saved)
    return taken


@pytest.mark.parametrize("provider,store", [("rocksdb", "s3"), ("hdfs", "local")])
def test_a_chain_resolves_to_the_live_state_and_restores_exactly_once(tmp_path, spark, s3_endpoint, provider, store):
    uri = f"s3://savepoints/{tmp_path.name}" if store == "s3" else str(tmp_path / "savepoints")
    # The share rule is tested below: here one chain, whatever it holds.
    config = make_config(tmp_path, provider, SESSIONS_SAVEPOINT_URI=uri, SESSIONS_S3_TIMEOUT="10s",
                         SESSIONS_SAVEPOINT_CHAIN_SHARE=100)
    chunks = _scenario(6)
    taken = _chain(config, spark, chunks)
    assert [s.kind for s in taken] == ["full"] + ["incremental"] * 5
    assert all(s.base_id == taken[0].savepoint_id and s.chain_ids == [t.savepoint_id for t in taken[:i + 1]]
               for i, s in enumerate(taken[1:], 1))

    # What the increments hold, from their tables: new users, changed users, tombstones -- and not the users left
    # alone since the previous savepoint.
    sp = SavepointStore.of(config)
    seen = {"added": 0, "changed": 0, "tombstones": 0, "left_out": 0}
    for before, after in zip(taken, taken[1:]):
        table = sp.read_table(after.uri)
        assert table.num_rows == after.table_rows and DELETED in table.column_names
        users = set(table["user_id"].to_pylist())
        previous = set(sp.read_state(before.savepoint_id)["user_id"].to_pylist())
        now = set(sp.read_state(after.savepoint_id)["user_id"].to_pylist())  # == the live state's (_chain)
        tombstones = set(table.filter(pc.equal(table[DELETED], True))["user_id"].to_pylist())
        assert tombstones == previous - now  # exactly the users whose state went
        seen["tombstones"] += len(tombstones)
        seen["added"] += len(now - previous)
        seen["changed"] += len((users - tombstones) & previous)
        seen["left_out"] += len((previous & now) - users)
        assert now - previous <= users  # every new user is in the increment
    assert all(seen.values()), seen

    # A savepoint from the middle of the chain restores to the oracle at its batch, then catches up exactly once.
    middle = taken[3]
    validate_savepoint(config, middle.savepoint_id)
    restore(config, middle.savepoint_id, spark=spark)
    at_savepoint = oracle_of(chunks[:4], GAP_MS, LATENESS_MS)
    assert read_open_sessions(spark, config) == sorted(at_savepoint.open_sessions)
    assert read_sessions(config) == sorted(at_savepoint.closed)
    catch_up(config, spark)
    got = read_sessions(config)
    assert len({row[0] for row in got}) == len(got) and got == sorted(oracle_of(chunks, GAP_MS, LATENESS_MS).closed)


def test_policy_full_every_k_forced_full_new_lineage_and_chain_share(tmp_path, spark):
    config = make_config(tmp_path, "rocksdb", SESSIONS_SAVEPOINT_FULL_EVERY=3, SESSIONS_SAVEPOINT_CHAIN_SHARE=100)
    chunks = _scenario(8)
    taken = _chain(config, spark, chunks[:5])
    assert [s.kind for s in taken] == ["full", "incremental", "incremental", "full", "incremental"]
    forced = take_savepoint(config, spark=spark, full=True)
    assert forced.kind == "full" and (forced.rows, forced.checksum) == (taken[-1].rows, taken[-1].checksum)
    same = take_savepoint(config, spark=spark)  # no batch since: an empty increment on the forced full one
    assert (same.kind, same.table_rows, same.base_id) == ("incremental", 0, forced.savepoint_id)
    assert (same.rows, same.checksum) == (forced.rows, forced.checksum)

    restore(config, "latest", spark=spark)  # a new lineage: its first savepoint is full
    _land(config, [chunks[5]], 5)
    catch_up(config, spark)
    assert take_savepoint(config, spark=spark).kind == "full"
    config = config.with_(savepoint_chain_share=0.05)
    kinds = []
    for k in (6, 7):  # the first increment passes (nothing before it); it holds more than 5% of the base's rows
        _land(config, [chunks[k]], k)
        catch_up(config, spark)
        kinds.append(take_savepoint(config, spark=spark).kind)
    assert kinds == ["incremental", "full"]


def test_a_change_feed_out_of_reach_or_unreadable_gives_a_full_savepoint(tmp_path, spark):
    chunks = _scenario(6)
    config = make_config(tmp_path, "rocksdb", SESSIONS_MIN_BATCHES_TO_RETAIN=4)
    _land(config, chunks[:1], 0)
    catch_up(config, spark)
    assert take_savepoint(config, spark=spark).kind == "full"
    for k in (1, 2, 3):  # more batches than the change feed keeps
        _land(config, [chunks[k]], k)
        catch_up(config, spark)
    far = take_savepoint(config, spark=spark)
    assert far.kind == "full"
    assert far.checksum == state_checksum(live_state(spark, config.checkpoint, batch_id=far.batch_id))

    # A checkpoint written without RocksDB's changelog has no change feed: the read fails, the savepoint is full,
    # in the same run, and the folder holds the full table's files only.
    other = make_config(tmp_path / "other", "rocksdb", SESSIONS_ROCKSDB_CHANGELOG="false")
    _land(other, chunks[:2], 0)
    catch_up(other, spark)
    first = take_savepoint(other, spark=spark)
    _land(other, [chunks[2]], 2)
    catch_up(other, spark)
    fallback = take_savepoint(other.with_(rocksdb_changelog=True), spark=spark)  # as if the setting had changed
    assert (first.kind, fallback.kind) == ("full", "full")
    assert fallback.checksum == state_checksum(live_state(spark, other.checkpoint, batch_id=fallback.batch_id))
    files = {p.name for p in Path(fallback.uri).glob("*.parquet")}
    assert files == {Path(f).name for f in SavepointStore.of(other).data_files(fallback.savepoint_id).files}


def test_compact_folds_a_chain_and_keeps_what_kept_savepoints_need(tmp_path, spark, monkeypatch):
    """Retention keeps the newest two of a chain of five: the older of the two is folded into a full savepoint (in
    place), the three before go. A fold killed before its commit, or after it and before the catalog's update, leaves
    every savepoint restorable; the next compaction finishes it."""
    config = make_config(tmp_path, "rocksdb", SESSIONS_SAVEPOINT_CHAIN_SHARE=100)
    chunks = _scenario(6)
    taken = _chain(config, spark, chunks[:5])
    ids = [s.savepoint_id for s in taken]
    store = SavepointStore.of(config)
    before = {s.savepoint_id: (s.rows, s.checksum) for s in taken}
    retention = config.with_(keep_savepoints=2, keep_daily_days=0, vacuum_retention_hours=0)

    def killed_at(point: str):
        def kill(name: str) -> None:
            if name == point:
                raise KeyboardInterrupt(f"killed at {name}")
        return kill

    monkeypatch.setattr(savepoint_fold, "kill_point", killed_at("fold:written"))
    with pytest.raises(KeyboardInterrupt):
        compact(retention)
    assert store.is_increment(store.state_uri(ids[3])) and len(store.list()) == 5
    leftovers = len(list(Path(taken[3].uri).glob("*.parquet"))) - len(store.data_files(ids[3]).files)
    assert leftovers > 0  # the fold's files, never committed
    monkeypatch.setattr(savepoint_fold, "kill_point", killed_at("fold:committed"))
    with pytest.raises(KeyboardInterrupt):
        compact(retention)
    assert not store.is_increment(store.state_uri(ids[3]))  # full before the catalog says so
    assert store.get(ids[3]).kind == "incremental" and len(store.list()) == 5
    for saved in taken:  # every reader starts resolution at the full table: nothing changed for them
        assert savepoint_checksum(spark, store, saved.savepoint_id) == before[saved.savepoint_id]
    monkeypatch.undo()

    report = compact(retention)
    assert report.savepoints_folded == [ids[3]] and sorted(report.savepoints_deleted) == sorted(ids[:3])
    kept = store.list()
    assert [(s.savepoint_id, s.kind, s.chain) for s in kept] == [
        (ids[4], "incremental", (ids[3], ids[4])), (ids[3], "full", (ids[3],))]
    assert kept[0].base_id == ids[3] and kept[1].base_id is None and kept[1].table_rows == kept[1].rows
    assert sorted(p.name for p in (Path(config.savepoint_uri) / "state").iterdir()) == sorted(ids[3:])
    for saved in kept:
        assert savepoint_checksum(spark, store, saved.savepoint_id) == before[saved.savepoint_id]
        assert len(list(Path(saved.uri).glob("*.parquet"))) == len(store.data_files(saved.savepoint_id).files)
        validate_savepoint(config, saved.savepoint_id)
    restore(config, ids[4], spark=spark)
    assert read_open_sessions(spark, config) == _oracle_open(chunks[:5])
    _land(config, [chunks[5]], 5)
    catch_up(config, spark)
    got = read_sessions(config)
    assert len({row[0] for row in got}) == len(got) and got == sorted(oracle_of(chunks, GAP_MS, LATENESS_MS).closed)


def test_erasure_rewrites_every_table_of_a_chain(tmp_path, spark):
    """A user erased from every savepoint table (state_store.erasure, oldest first): each savepoint's resolved state
    is what it was without the user, and its catalog count and checksum say so."""
    config = make_config(tmp_path, "hdfs", SESSIONS_SAVEPOINT_CHAIN_SHARE=100)
    chunks = _scenario(6)
    taken = _chain(config, spark, chunks[:5])
    store = SavepointStore.of(config)
    expected = {}
    for saved in taken:
        rows = store.read_state(saved.savepoint_id)
        expected[saved.savepoint_id] = rows.filter(pc.invert(pc.is_in(rows["user_id"], pa.array(["steady-1",
                                                                                                 "leaving-2"]))))
    # Both at once (one DELETE per table): changed in every increment; in the base, then a tombstone.
    _erase_savepoints(config, spark, [UserSpelling("steady-1"), UserSpelling("leaving-2")])
    for saved in store.list():
        want = expected[saved.savepoint_id]
        assert (saved.rows, saved.checksum) == (want.num_rows, state_checksum(want))
        assert savepoint_checksum(spark, store, saved.savepoint_id) == (saved.rows, saved.checksum)
        for member in saved.chain_ids:
            users = store.read_table(store.state_uri(member))["user_id"].to_pylist()
            assert "steady-1" not in users and "leaving-2" not in users


@pytest.mark.parametrize("canonical", [True, False], ids=["canonical", "native"])
def test_a_chain_that_starts_at_a_restored_rocksdb_checkpoint(tmp_path, spark, canonical):
    """A full savepoint taken right after a restore, before the stream ran a batch of its own: the restored
    checkpoint's versions are snapshots (a canonical restore's bootstrap) or a copy (a native one), without the
    changelogs a change feed reads. The increments after it read only the stream's own batches, and each savepoint
    holds the live state at its batch and the oracle's."""
    config = make_config(tmp_path, "rocksdb", SESSIONS_SAVEPOINT_CHAIN_SHARE=100)
    chunks = _scenario(5)
    taken = _chain(config, spark, chunks[:2])
    restore(config, taken[-1].savepoint_id, spark=spark, canonical=canonical)
    at_restore = take_savepoint(config, spark=spark)  # a new lineage, at the restore's own batch
    assert at_restore.kind == "full" and at_restore.rows == taken[-1].rows
    after = _chain(config, spark, chunks, start=2)
    # The change feed starts after the restore's versions: changelogs only.
    assert [s.kind for s in after] == ["incremental"] * 3
    restore(config, "latest", spark=spark)
    assert read_open_sessions(spark, config) == _oracle_open(chunks)
    assert read_sessions(config) == sorted(oracle_of(chunks, GAP_MS, LATENESS_MS).closed)
