"""Native savepoints (state_store.savepoint.native): the checkpoint's own files of a savepoint's batch, kept beside its
canonical rows and put back by a restore to the same provider, partitions and operator -- checked against the
oracle (state, sessions table, the replay after it: exactly once), against a copy that was tampered with (the
canonical rows instead, said in the answer), and through compaction and erasure (no native copy survives a forget)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipelines.errors import SavepointFailed
from pipelines.job.checkpoint import inspect_checkpoint, read_job_metadata
from pipelines.job.stream import catch_up
from pipelines.locations import checkpoint_path
from state_store.erasure import forget
from state_store.lifecycle import restore, take_savepoint
from state_store.maintenance import compact
from state_store.savepoint.catalog import SavepointStore
from state_store.savepoint.native import MANIFEST, native_uri
from state_store.verification import verify
from tests.kit.homes import make_config
from tests.kit.savepoint_expectations import oracle_of
from tests.kit.tables import read_open_sessions, read_sessions
from tests.test_lifecycle import GAP_MIN, LATENESS_MIN, _chunks, _config, _expected, _land_and_ingest

pytestmark = pytest.mark.tier("spark")


@pytest.mark.tier("pure")
def test_the_files_copied_are_the_chain_that_loads_the_batch(tmp_path):
    """Per partition: the newest snapshot at or below version N+1 and every delta after it (RocksDB: and the SST files
    its zip names); the logs up to N; the metadata -- and nothing the batch does not need."""
    import zipfile

    from state_store.savepoint.native import NativeUnavailable, _checkpoint_files

    root = tmp_path / "checkpoint"
    names = ["metadata", "_job.json", "sources/0/0", "state/0/_metadata/metadata", "state/0/0/_metadata/schema",
             *(f"offsets/{b}" for b in range(8)), *(f"commits/{b}" for b in range(7)), "offsets/.6.crc",
             *(f"state/0/0/{v}.changelog" for v in range(1, 9)), "state/0/0/SSTs/a-1.sst", "state/0/0/SSTs/b-2.sst",
             "state/0/0/SSTs/c-3.sst", *(f"state/0/1/{v}.changelog" for v in range(1, 9)),
             "state/0/2/7.changelog"]  # a partition beyond the count (a repartition's leftover)
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    for version, ssts in ((3, ["a-1.sst"]), (6, ["a-1.sst", "b-2.sst"])):
        with zipfile.ZipFile(root / f"state/0/0/{version}.zip", "w") as archive:
            archive.writestr("metadata", "v1\n" + json.dumps({"sstFiles": [{"dfsSstFileName": s} for s in ssts]}))
    chosen = _checkpoint_files(root, 6, partitions=2, provider="rocksdb")  # batch 6: state version 7
    assert all(size == len(name) for name, size in chosen.items() if not name.endswith(".zip"))  # holds its name
    assert list(chosen) == sorted(["metadata", "_job.json", "sources/0/0", "state/0/_metadata/metadata",
                             "state/0/0/_metadata/schema", *(f"offsets/{b}" for b in range(7)),
                             *(f"commits/{b}" for b in range(7)), "state/0/0/6.zip", "state/0/0/7.changelog",
                             "state/0/0/SSTs/a-1.sst", "state/0/0/SSTs/b-2.sst",
                             *(f"state/0/1/{v}.changelog" for v in range(1, 8))])
    (root / "state/0/1/4.changelog").unlink()
    with pytest.raises(NativeUnavailable, match="4.changelog"):
        _checkpoint_files(root, 6, partitions=2, provider="rocksdb")
    with pytest.raises(NativeUnavailable, match="no commit"):
        _checkpoint_files(root, 7, partitions=2, provider="rocksdb")

GAP_MS, LATENESS_MS = GAP_MIN * 60_000, LATENESS_MIN * 60_000


def _native_dir(config, savepoint_id: str) -> Path:
    return Path(native_uri(config.savepoint_uri, savepoint_id))


@pytest.mark.parametrize("provider,store", [("rocksdb", "local"), ("hdfs", "s3")])
def test_a_native_restore_resumes_from_the_checkpoint_files_exactly_once(tmp_path, spark, s3_endpoint, provider,
                                                                          store):
    config = _config(tmp_path, provider, f"s3://savepoints/{tmp_path.name}" if store == "s3" else None)
    chunks = _chunks(seed=21)
    _land_and_ingest(config, chunks[:3], 0)
    catch_up(config, spark)
    before = read_job_metadata(config.checkpoint)
    saved = take_savepoint(config, spark=spark, native_copy=True)
    assert saved.native_files and saved.native_bytes and saved.native_checksum, saved
    listed = SavepointStore.of(config).get(saved.savepoint_id)
    assert (listed.native_files, listed.native_checksum) == (saved.native_files, saved.native_checksum)
    manifest = json.loads((checkpoint_path(native_uri(config.savepoint_uri, saved.savepoint_id)) / MANIFEST).read_text())
    paths = {entry["path"] for entry in manifest["files"]}
    assert f"commits/{saved.batch_id}" in paths and f"commits/{saved.batch_id + 1}" not in paths
    version = saved.batch_id + 1  # the state version batch N commits, in every partition
    ends = {"rocksdb": (f"/{version}.changelog", f"/{version}.zip"), "hdfs": (f"/{version}.delta", f"/{version}.snapshot")}
    for partition in range(int(saved.partitions or 0)):
        assert any(p.startswith(f"state/0/{partition}/") and p.endswith(ends[provider]) for p in paths), sorted(paths)

    _land_and_ingest(config, chunks[3:5], 3)
    catch_up(config, spark)  # sessions these batches close must be rolled back, then written once by the replay
    restored = restore(config, "latest", spark=spark)
    assert restored.method == "native" and restored.verified and "bootstrap_batch" not in restored.phases, restored
    at_savepoint = oracle_of(chunks[:3], GAP_MS, LATENESS_MS)
    assert read_open_sessions(spark, config) == sorted(at_savepoint.open_sessions)
    assert read_sessions(config) == sorted(at_savepoint.closed)
    assert restored.rolled_back["sessions"] == \
        len(oracle_of(chunks[:5], GAP_MS, LATENESS_MS).closed) - len(at_savepoint.closed) > 0
    after = read_job_metadata(config.checkpoint)
    assert after is not None and before is not None
    assert after.created_from == saved.savepoint_id and after.incarnation != before.incarnation

    _land_and_ingest(config, chunks[5:], 5)
    catch_up(config, spark)  # the replay of every event after the savepoint, and the rest
    got = read_sessions(config)
    assert len({row[0] for row in got}) == len(got), "a session was written twice"
    assert got == _expected(chunks)


def test_a_native_copy_not_fit_for_the_restore_falls_back_to_the_canonical_rows(tmp_path, spark):
    config = _config(tmp_path, "hdfs")
    chunks = _chunks(seed=23, parts=4)
    _land_and_ingest(config, chunks[:2], 0)
    catch_up(config, spark)
    saved = take_savepoint(config, spark=spark, native_copy=True)
    at_savepoint = oracle_of(chunks[:2], GAP_MS, LATENESS_MS)

    other = restore(config, saved.savepoint_id, partitions=3, spark=spark)  # another partition count
    assert other.method == "canonical" and "--partitions 3" in str(other.note), other
    assert read_open_sessions(spark, config) == sorted(at_savepoint.open_sessions)

    # One byte of one state file changed in the native copy: found while copying back, the checkpoint left as it
    # was, the canonical rows restored instead, and the answer says why.
    manifest = json.loads((_native_dir(config, saved.savepoint_id) / MANIFEST).read_text())
    state_file = next(e["path"] for e in manifest["files"] if e["path"].endswith((".delta", ".snapshot")))
    damaged = _native_dir(config, saved.savepoint_id) / state_file
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF
    damaged.write_bytes(bytes(data))
    fallback = restore(config, saved.savepoint_id, spark=spark)
    assert fallback.method == "canonical" and "damaged" in str(fallback.note), fallback
    assert read_open_sessions(spark, config) == sorted(at_savepoint.open_sessions)
    assert read_sessions(config) == sorted(at_savepoint.closed)
    assert restore(config, saved.savepoint_id, spark=spark, canonical=True).note is None  # asked: nothing to say

    # The copy itself fails (here: where the copy goes cannot be written): the savepoint is complete, canonical,
    # and says why; nothing is left under native/ for it.
    blocked = _native_dir(config, "x").parent
    shutil.move(blocked, tmp_path / "native-aside")
    blocked.write_text("not a folder")
    unwritable = take_savepoint(config, spark=spark, native_copy=True)
    assert unwritable.native_checksum is None and "no native copy: the copy failed" in str(unwritable.note), unwritable
    assert SavepointStore.of(config).get(unwritable.savepoint_id).status == "complete"
    blocked.unlink()
    shutil.move(tmp_path / "native-aside", blocked)

    _land_and_ingest(config, chunks[2:], 2)
    catch_up(config, spark)
    assert read_sessions(config) == _expected(chunks)


def test_compaction_and_erasure_remove_native_copies(tmp_path, spark):
    # Every savepoint keeps a native copy by the setting (the erasure's own savepoint does not: forget drops them all).
    config = _config(tmp_path, "rocksdb", SESSIONS_KEEP_SAVEPOINTS="1", SESSIONS_KEEP_DAILY_DAYS="0",
                     SESSIONS_SAVEPOINT_NATIVE="true")
    chunks = _chunks(seed=25, parts=3)
    _land_and_ingest(config, chunks[:1], 0)
    catch_up(config, spark)
    first = take_savepoint(config, spark=spark, full=True)
    _land_and_ingest(config, chunks[1:2], 1)
    catch_up(config, spark)
    second = take_savepoint(config, spark=spark, full=True)
    assert first.native_checksum and second.native_checksum
    orphan = _native_dir(config, "sp-killed-after-its-copy")
    orphan.mkdir(parents=True)
    (orphan / MANIFEST).write_text("{}")

    report = compact(config)
    assert first.savepoint_id in report.savepoints_deleted and report.orphan_native_removed == [orphan.name]
    assert not _native_dir(config, first.savepoint_id).exists() and not orphan.exists()
    assert _native_dir(config, second.savepoint_id).exists()

    user = chunks[0][0]["user_id"]
    found = verify(config, user, spark=spark).files  # the native copy's state files, decoded, name the user
    assert any(f.startswith(f"savepoints:native/{second.savepoint_id}/state/") for f in found), found
    forgotten = forget(config, user, spark=spark)
    assert forgotten.removed["native_copies"] == 1
    assert not _native_dir(config, second.savepoint_id).exists()
    assert SavepointStore.of(config).get(second.savepoint_id).native_checksum is None
    assert verify(config, user, spark=spark).clean
    restored = restore(config, second.savepoint_id, spark=spark)  # still restorable: from its erased rows
    assert restored.method == "canonical" and restored.note is None


@pytest.mark.tier("subprocess")
def test_kills_inside_a_native_savepoint_and_a_native_restore_lose_nothing(tmp_path, spark):
    """SIGKILL right after a savepoint's native copy (no catalog row yet: an orphan compaction removes), and right
    after a restore put the native files back (no job metadata, outputs not rolled back): `catch-up` refuses, the same
    restore run again finishes it, and the sessions are the oracle's, each once."""
    import subprocess

    from pipelines.errors import RestoreIncomplete
    from pipelines.job.runtime import stop_state_stores
    from tests.kit.homes import config_env, tool

    config = _config(tmp_path, "rocksdb")
    chunks = _chunks(seed=27, parts=4)
    _land_and_ingest(config, chunks[:2], 0)
    catch_up(config, spark)
    stop_state_stores(spark)  # the subprocesses below work on this checkpoint; nothing of this JVM's may write to it
    killed = subprocess.run([tool("sessionctl"), "savepoint", "--native"], capture_output=True, text=True,
                            env={**config_env(config), "SESSIONS_KILL_AT": "savepoint:native-copied"}, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    store = SavepointStore.of(config)
    orphans = [p.name for p in Path(native_uri(config.savepoint_uri, "x")).parent.iterdir()]
    assert len(orphans) == 1 and store.find(orphans[0]) is None
    assert compact(config).orphan_native_removed == orphans

    saved = take_savepoint(config, spark=spark, native_copy=True)
    _land_and_ingest(config, chunks[2:3], 2)
    catch_up(config, spark)
    stop_state_stores(spark)
    restore_args = [tool("sessionctl"), "restore", "--savepoint", saved.savepoint_id]
    killed = subprocess.run(restore_args, capture_output=True, text=True, timeout=300,
                            env={**config_env(config), "SESSIONS_KILL_AT": "restore:native-copied"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    with pytest.raises(RestoreIncomplete, match=f"sessionctl restore --savepoint {saved.savepoint_id}"):
        catch_up(config, spark)
    again = subprocess.run(restore_args, capture_output=True, text=True, timeout=300, env=config_env(config))
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["method"] == "native"
    assert read_sessions(config) == sorted(oracle_of(chunks[:2], GAP_MS, LATENESS_MS).closed)

    _land_and_ingest(config, chunks[3:], 3)
    catch_up(config, spark)
    assert read_sessions(config) == _expected(chunks)


@pytest.mark.tier("pure")
@pytest.mark.parametrize("checkpoint_uri", ["{home}/checkpoints", "hdfs://127.0.0.1:9000/sessions-home/checkpoints",
                                            "s3a://bucket/sessions-home/checkpoints"])
def test_a_prepared_rescale_builds_its_side_checkpoint_beside_the_checkpoint(tmp_path, checkpoint_uri):
    """The side checkpoint of a running stream's rescale (state_store.rescale) sits beside the checkpoint on
    the same file system, named `<checkpoint>.rescale-side-<time>` (one a killed preparation leaves is listed with the
    checkpoints restores set aside), in a folder of its own that is deleted whole."""
    from state_store.kernel import replaced_checkpoints
    from state_store.rescale import side_config

    config = make_config(tmp_path, "rocksdb", SESSIONS_CHECKPOINT_URI=checkpoint_uri.format(home=tmp_path / "home"),
                         SESSIONS_LEASE_URI=str(tmp_path / "leases"))
    side = side_config(config, "20261129T000000")
    assert str(side.checkpoint.parent.parent) == str(config.checkpoint.parent)
    assert side.checkpoint.parent.name == "sessions.rescale-side-20261129T000000"
    assert side.checkpoint.name == config.checkpoint.name
    assert (side.sessions_table, side.savepoint_uri, side.lease_uri) == \
        (config.sessions_table, config.savepoint_uri, config.lease_uri)
    if checkpoint_uri.startswith("{home}"):  # left behind by a killed preparation: listed with the failed restores
        (side.checkpoint / "offsets").mkdir(parents=True)
        assert [p.name for p in replaced_checkpoints(config)] == [side.checkpoint.parent.name]


def test_a_savepoint_beside_a_stream_reads_its_pinned_batch_whatever_retention_removes(tmp_path, spark, monkeypatch):
    """Beside a running stream (its job lease held, as `sessionctl run` holds it) a savepoint first pins its batch
    (state_store.savepoint.pin) and reads that copy: Spark's retention removing the batch's files from the live
    checkpoint in the middle of the savepoint -- here the whole state folder, between the pin and the read -- changes
    nothing, for a full, an incremental and a native savepoint. The pinned copy is gone afterwards, also after a
    failure; one a killed savepoint left is removed by the next; a file gone during the copy itself moves the
    savepoint to the newest batch. Each savepoint against the state read at its batch before and, restored, the
    oracle."""
    from pipelines.coordination.job_leases import job_lock
    from state_store.savepoint import native as native_module
    from state_store.savepoint import take
    from state_store.savepoint.checksum import state_checksum
    from state_store.savepoint.pin import pinned_dir
    from testkit.lifecycle_expectations import live_state

    config = _config(tmp_path, "rocksdb")
    chunks = _chunks(seed=29, parts=5)
    _land_and_ingest(config, chunks[:2], 0)
    catch_up(config, spark)
    first = take_savepoint(config, spark=spark)  # no stream: read in place
    assert first.kind == "full" and first.note is None, first
    live = config.checkpoint / "state"
    gone = config.checkpoint / "state-removed-by-retention"
    write = take.write_state_files
    reads: list[str] = []

    def retention_strikes(spark_, frame, uri, **kwargs):  # Spark's retention, between the pin and the read
        reads.append(uri)
        if live.exists():
            live.rename(gone)
        return write(spark_, frame, uri, **kwargs)

    def pinned_copies() -> list[str]:
        return [p.name for p in config.checkpoint.parent.iterdir() if "pinned" in p.name]

    monkeypatch.setattr(take, "write_state_files", retention_strikes)
    taken = []
    for k, native_copy in ((2, False), (3, True)):
        _land_and_ingest(config, chunks[k:k + 1], k)
        catch_up(config, spark)
        batch = inspect_checkpoint(config.checkpoint).last_committed_batch
        expected = state_checksum(live_state(spark, config.checkpoint, batch_id=batch))
        leftover = pinned_dir(config, f"killed-{k}")  # a killed savepoint's pinned copy
        leftover.mkdir()
        legacy = config.checkpoint.with_name(f"{config.checkpoint.name}.failed-restore-pinned-killed-{k}")
        legacy.mkdir()  # one an earlier release named so
        with job_lock(config, "run"):  # the stream runs
            saved = take_savepoint(config, spark=spark, native_copy=native_copy)
        gone.rename(live)
        assert reads and saved.batch_id == batch and saved.checksum == expected, saved
        assert not pinned_copies() and not legacy.exists(), "the pinned copy and the leftovers are gone"
        taken.append(saved)
    incremental, with_native = taken
    assert incremental.kind == "incremental", incremental  # its change feed read from the pinned copy
    assert with_native.native_checksum and with_native.note is None, with_native  # the pinned copy is the native one
    manifest = json.loads((_native_dir(config, with_native.savepoint_id) / MANIFEST).read_text())
    kept = {str(p.relative_to(_native_dir(config, with_native.savepoint_id)))
            for p in _native_dir(config, with_native.savepoint_id).rglob("*") if p.is_file()}
    assert kept == {e["path"] for e in manifest["files"]} | {MANIFEST}, "the change feed's files are not kept"

    # A file of the batch removed during the copy itself: the newest batch is pinned instead (here the same one),
    # and no failed attempt is listed. A failure after the pin leaves no copy behind either.
    copy_all, lost = native_module._copy_all, []

    def one_file_gone(copy, files):
        copied = copy_all(copy, files)
        if not lost:
            lost.append(next(iter(files)))
            copied[0] = (-1, "")
        return copied

    monkeypatch.setattr(native_module, "_copy_all", one_file_gone)
    def disk_full(*args, **kwargs):
        raise OSError("disk full")

    with job_lock(config, "run"):
        again = take_savepoint(config, spark=spark, full=True)
        gone.rename(live)
        monkeypatch.setattr(take, "write_state_files", disk_full)
        with pytest.raises(SavepointFailed, match="disk full"):
            take_savepoint(config, spark=spark, full=True)
    assert lost and again.status == "complete" and again.batch_id == with_native.batch_id and not pinned_copies()
    assert [s.status for s in SavepointStore.of(config).list()] == ["failed", "complete", "complete", "complete",
                                                                   "complete"]

    for saved, k in ((with_native, 3), (incremental, 2)):  # (the newer first: restoring it abandons no timeline)
        restored = restore(config, saved.savepoint_id, spark=spark)
        assert restored.method == ("native" if saved.native_checksum else "canonical"), restored
        at_savepoint = oracle_of(chunks[:k + 1], GAP_MS, LATENESS_MS)
        assert read_open_sessions(spark, config) == sorted(at_savepoint.open_sessions)
        assert read_sessions(config) == sorted(at_savepoint.closed)
