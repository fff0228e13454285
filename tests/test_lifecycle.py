"""State lifecycle against real Spark, real Delta tables, and a real S3 HTTP endpoint (moto server on
loopback): exactly-once across savepoint -> restore -> rescale, restore from the savepoint alone,
injected savepoint failure, refusal of incompatible savepoints, retention, and the CLI's one-line errors."""
from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from pipelines.config import SessionsConfig
from pipelines.coordination.job_leases import job_lock
from pipelines.core.sample_data import land
from pipelines.errors import (
    CheckpointMissing,
    RestoreIncomplete,
    SavepointDamaged,
    SavepointFailed,
    SavepointIncompatible,
    SavepointNotFound,
)
from pipelines.ingest import ingest
from pipelines.job.checkpoint import inspect_checkpoint
from pipelines.job.stream import catch_up
from pipelines.storage import open_table
from state_store.lifecycle import restore, take_savepoint, validate_savepoint
from state_store.maintenance import compact
from state_store.rescale import rescale
from state_store.results import RescaleResult, SavepointInfo
from state_store.savepoint import catalog as sp
from state_store.savepoint.checksum import state_checksum
from testkit.lifecycle_expectations import expected_closed_sessions
from tests.kit.datagen import in_order_chunks
from tests.kit.homes import tool
from tests.kit.savepoint_expectations import after_migration, oracle_of, state_event_keys, state_sessions
from tests.kit.tables import read_open_sessions, read_sessions

pytestmark = pytest.mark.tier("spark")

REPO = Path(__file__).resolve().parent.parent
GAP_MIN, LATENESS_MIN = 30, 10


# S3 calls that give up in seconds: the failure test
# below stops the endpoint mid-savepoint, and the product's 3 retries of 30 s would only make it wait.
SUITE_ENV = {"SESSIONS_S3_TIMEOUT": "5s",
             "SESSIONS_S3_RETRY_TIMEOUT": "5s", "SESSIONS_S3_MAX_RETRIES": "1"}


def _config(tmp_path: Path, provider: str, savepoint_uri: str | None = None, **extra) -> SessionsConfig:
    env = {"SESSIONS_HOME": str(tmp_path / "home"), "SESSIONS_STATE_STORE": provider,
           "SESSIONS_GAP_MINUTES": str(GAP_MIN), "SESSIONS_LATENESS_MINUTES": str(LATENESS_MIN),
           "SESSIONS_MAX_VERSIONS_PER_BATCH": "1", **SUITE_ENV, **extra}
    if savepoint_uri:
        env["SESSIONS_SAVEPOINT_URI"] = savepoint_uri
    return SessionsConfig.from_env(env)


def _chunks(users=60, sessions=3, seed=11, parts=6) -> list[list[dict]]:
    # Disorder (120 s) well inside the lateness (10 min): no event is late, whatever the split.
    return in_order_chunks(users, seed, parts, sessions)


def _land_and_ingest(config: SessionsConfig, chunks: list[list[dict]], start: int) -> None:
    for offset, chunk in enumerate(chunks):
        land(config.landing, f"part-{start + offset:04d}.jsonl", [json.dumps(e) for e in chunk])
        ingest(config, files_per_commit=1)  # one file = one ingest seq = one micro-batch


def _expected(chunks: list[list[dict]]) -> list[tuple]:
    return sorted(expected_closed_sessions(chunks, GAP_MIN * 60_000, LATENESS_MIN * 60_000))


@pytest.mark.tier("e2e")
@pytest.mark.parametrize("provider,store", [("rocksdb", "s3"), ("hdfs", "local")])
def test_savepoint_restore_rescale_is_exactly_once(tmp_path, spark, s3_endpoint, provider, store):
    uri = "s3://savepoints/" + tmp_path.name if store == "s3" else str(tmp_path / "savepoints")
    config = _config(tmp_path, provider, uri)
    chunks = _chunks()
    _land_and_ingest(config, chunks[:2], 0)
    catch_up(config, spark)
    saved = take_savepoint(config, spark=spark)
    assert saved.status == "complete" and saved.rows > 0 and saved.uri.startswith(uri)
    assert sp.SavepointStore.of(config).list()[0].savepoint_id == saved.savepoint_id

    _land_and_ingest(config, chunks[2:4], 2)
    catch_up(config, spark)  # these sessions must not survive the restore twice
    restored = restore(config, "latest", spark=spark)
    # The savepoint's rows as stored, the state restored from them and the sessions table rolled back to them: each
    # the oracle's at the savepoint's batch; what was rolled back, the sessions the two batches after it closed.
    at_savepoint = oracle_of(chunks[:2], GAP_MIN * 60_000, LATENESS_MIN * 60_000)
    saved_rows = open_table(config, saved.uri).to_pyarrow_table()
    assert state_sessions(saved_rows) == sorted(at_savepoint.open_sessions)
    assert state_event_keys(saved_rows) <= at_savepoint.open_events
    assert restored.savepoint_id == saved.savepoint_id
    assert read_open_sessions(spark, config) == sorted(at_savepoint.open_sessions)
    assert read_sessions(config) == sorted(at_savepoint.closed)
    assert restored.rolled_back["sessions"] == \
        len(oracle_of(chunks[:4], GAP_MIN * 60_000, LATENESS_MIN * 60_000).closed) - len(at_savepoint.closed) > 0

    scaled = rescale(config, 3, spark=spark)
    assert scaled.partitions_after == 3
    assert scaled.method == ("repartition" if provider == "rocksdb" else "savepoint-restore")
    assert sp.SavepointStore.of(config).list()[0].trigger == "pre-rescale"
    # Where its time went, each step once, together no more than the whole rescale.
    assert list(scaled.phases)[:1] == ["pre_rescale_savepoint"], scaled.phases
    assert (["repartition", "state_checked"] if provider == "rocksdb" else
            ["restore_state_written", "restore_state_checked"]) == [
        name for name in scaled.phases if name in ("repartition", "state_checked", "restore_state_written",
                                                   "restore_state_checked")], scaled.phases
    assert 0 < sum(scaled.phases.values()) <= scaled.seconds + 0.01, (scaled.phases, scaled.seconds)

    _land_and_ingest(config, chunks[4:], 4)
    catch_up(config, spark)
    got = read_sessions(config)
    assert len({row[0] for row in got}) == len(got), "a session was written twice"
    assert got == _expected(chunks)


@pytest.mark.tier("e2e")
def test_restore_rebuilds_a_lost_checkpoint_from_s3_alone(tmp_path, spark, s3_endpoint):
    config = _config(tmp_path, "rocksdb", f"s3://savepoints/{tmp_path.name}")
    chunks = _chunks(seed=5, parts=4)
    _land_and_ingest(config, chunks[:2], 0)
    catch_up(config, spark)
    take_savepoint(config, spark=spark)
    shutil.rmtree(config.checkpoint)  # the checkpoint is gone entirely
    with pytest.raises(CheckpointMissing, match="no checkpoint"):
        catch_up(config, spark)  # refuses to start over and write sessions twice
    restore(config, "latest", partitions=2, spark=spark)
    _land_and_ingest(config, chunks[2:], 2)
    catch_up(config, spark)
    assert read_sessions(config) == _expected(chunks)


@pytest.mark.tier("e2e")
def test_savepoint_failure_mid_write_is_never_listed(tmp_path, spark, s3_endpoint, monkeypatch):
    uri = f"s3://savepoints/{tmp_path.name}"
    config = _config(tmp_path, "rocksdb", uri)
    chunks = _chunks(seed=3, parts=3)
    _land_and_ingest(config, chunks[:2], 0)
    catch_up(config, spark)
    first = take_savepoint(config, spark=spark)

    # The state's files are written and committed; the re-read lists them from the Delta log (state_store.
    # state_store.savepoint.files.verify_state_files) when S3 stops answering.
    real_list = sp.SavepointStore.data_files

    def endpoint_dies_after_the_state_write(*args, **kwargs):
        os.kill(s3_endpoint["process"].pid, signal.SIGSTOP)  # S3 stops answering mid-savepoint
        return real_list(*args, **kwargs)

    monkeypatch.setattr(sp.SavepointStore, "data_files", endpoint_dies_after_the_state_write)
    with pytest.raises(SavepointFailed, match="not listed as complete"):
        take_savepoint(config, spark=spark)
    monkeypatch.setattr(sp.SavepointStore, "data_files", real_list)
    os.kill(s3_endpoint["process"].pid, signal.SIGCONT)  # the endpoint is back, with its data

    # The operator's next commands are new processes (this one's S3 connections died with the server).
    env = {"SESSIONS_SAVEPOINT_URI": uri, "SESSIONS_MAX_VERSIONS_PER_BATCH": "1", **s3_endpoint["env"], **SUITE_ENV}
    listed = json.loads(_sessionctl(config.home, "savepoints", "--json", env=env).stdout)
    assert [r["savepoint_id"] for r in listed if r["status"] == "complete"] == [first.savepoint_id]
    # The endpoint was down when the attempt failed: its row waited locally and is in the catalog now.
    assert [r["status"] for r in listed] == ["failed", "complete"]
    assert "S3 at " in listed[0]["error"] and s3_endpoint["env"]["AWS_ENDPOINT_URL"] in listed[0]["error"]
    retried = _sessionctl(config.home, "savepoint", "--json", env=env)
    assert retried.returncode == 0, retried.stderr
    retried_id = json.loads(retried.stdout)["savepoint_id"]
    listed = json.loads(_sessionctl(config.home, "savepoints", "--json", env=env).stdout)
    assert [r["savepoint_id"] for r in listed if r["status"] == "complete"] == [retried_id, first.savepoint_id]


def test_failed_restore_leaves_a_known_next_step(tmp_path, spark, monkeypatch):
    """A restore that breaks before touching the tables puts the old checkpoint back (the old job goes on);
    one that breaks after the roll-back says to run it again, and the rerun ends exactly-once."""
    import state_store.restore as restoring
    from state_store.kernel import replaced_checkpoints

    config = _config(tmp_path, "hdfs", str(tmp_path / "savepoints"))
    chunks = _chunks(seed=13, parts=4)
    _land_and_ingest(config, chunks[:2], 0)
    catch_up(config, spark)
    take_savepoint(config, spark=spark)
    _land_and_ingest(config, chunks[2:3], 2)
    catch_up(config, spark)
    batch_before, sessions_before = inspect_checkpoint(config.checkpoint).last_committed_batch, read_sessions(config)

    def broken(*args, **kwargs):
        raise OSError("injected: disk full")

    with monkeypatch.context() as patch:
        patch.setattr(restoring, "write_job_metadata", broken)
        with pytest.raises(RestoreIncomplete, match="previous checkpoint is back in place"):
            restore(config, "latest", spark=spark)
    assert inspect_checkpoint(config.checkpoint).last_committed_batch == batch_before
    assert read_sessions(config) == sessions_before

    rolls_back = restoring.roll_back

    def broken_after_roll_back(*args, **kwargs):  # the tables changed (the state is written and checked before it)
        rolls_back(*args, **kwargs)
        broken()

    with monkeypatch.context() as patch:
        patch.setattr(restoring, "roll_back", broken_after_roll_back)
        with pytest.raises(RestoreIncomplete, match="run the same restore again") as incomplete:
            restore(config, "latest", spark=spark)
    assert incomplete.value.next_step == "run the same restore again"
    restore(config, "latest", spark=spark)  # the rerun: state and sessions table as the oracle has them at the savepoint
    at_savepoint = oracle_of(chunks[:2], GAP_MIN * 60_000, LATENESS_MIN * 60_000)
    assert read_open_sessions(spark, config) == sorted(at_savepoint.open_sessions)
    assert read_sessions(config) == sorted(at_savepoint.closed)
    _land_and_ingest(config, chunks[3:], 3)
    catch_up(config, spark)
    assert read_sessions(config) == _expected(chunks)
    # the original (set aside by the second attempt) and the half-built checkpoint it left, for compaction
    assert len(replaced_checkpoints(config)) == 2


def test_incompatible_savepoint_is_refused_unless_migrating(tmp_path, spark):
    config = _config(tmp_path, "hdfs")
    chunks = _chunks(seed=9, parts=2)
    _land_and_ingest(config, chunks[:1], 0)
    catch_up(config, spark)
    saved = take_savepoint(config, spark=spark)
    other = config.with_(gap_minutes=3)  # under the steps inside a session (5 s to 5 min): sessions and frozen prefixes split
    with pytest.raises(SavepointIncompatible, match="--migrate"):
        restore(other, saved.savepoint_id, spark=spark)
    with pytest.raises(SavepointNotFound, match="no such savepoint"):
        restore(config, "sp-does-not-exist", spark=spark)
    at_savepoint = read_sessions(config)
    migrated = restore(other, saved.savepoint_id, migrate=True, spark=spark)
    assert migrated.savepoint_id == saved.savepoint_id
    # The new gap makes sessions of the savepoint due at its watermark: the restore's own batch after batch 0
    # closes them, into the rolled-back table (a savepoint with none due leaves that batch to the stream).
    after_restore = read_sessions(other)
    assert "settle_batch" in migrated.phases and len(after_restore) > len(at_savepoint), migrated.phases
    # The rest of the data under the new gap ends as docs/operations.md ("Savepoints") promises for --migrate: the sessions closed before the
    # savepoint as written, then the savepoint's rows (checked against the oracle) and the later events walked with the
    # new gap, each frozen prefix one piece (the new gap would split some of them).
    saved_rows = open_table(config, saved.uri).to_pyarrow_table()
    assert state_sessions(saved_rows) == sorted(oracle_of(chunks[:1], GAP_MIN * 60_000, LATENESS_MIN * 60_000).open_sessions)
    _land_and_ingest(other, chunks[1:], 1)
    catch_up(other, spark)
    closed, still_open = after_migration(saved_rows, chunks, 1, GAP_MIN * 60_000, LATENESS_MIN * 60_000, 3 * 60_000)
    assert read_sessions(other) == closed and closed != _expected(chunks)  # the new gap changed sessions
    assert set(after_restore) <= set(closed)
    assert read_open_sessions(spark, other) == still_open


def test_damaged_savepoint_is_refused_and_the_job_is_left_alone(tmp_path, spark):
    """One event's type flipped inside the savepoint's Delta table (count unchanged): validate and restore
    refuse it with the catalog's and the re-read's figures, and the checkpoint is not touched."""
    config = _config(tmp_path, "rocksdb")
    _land_and_ingest(config, _chunks(seed=5, parts=2)[:1], 0)
    catch_up(config, spark)
    saved = take_savepoint(config, spark=spark)
    rows = DeltaTable(saved.uri).to_pyarrow_table()
    flipped = pa.array(["logout"] + rows["event_type"].to_pylist()[1:], pa.string())
    write_deltalake(saved.uri, rows.set_column(rows.schema.get_field_index("event_type"), "event_type", flipped),
                    mode="overwrite")
    commits_before = sorted(p.name for p in (config.checkpoint / "commits").iterdir())
    with pytest.raises(SavepointDamaged, match="damaged"):
        validate_savepoint(config, saved.savepoint_id)
    with pytest.raises(SavepointDamaged, match="damaged"):
        restore(config, "latest", spark=spark)
    assert sorted(p.name for p in (config.checkpoint / "commits").iterdir()) == commits_before


@pytest.mark.tier("pure")
def test_state_checksum_ignores_order_and_sees_every_field():
    rows = pa.table({"user_id": ["u1", "u1", "u2"], "event_id": ["a", "b", "c"],
                     "event_time": pa.array([1_000_000, 2_000_000, 3_000_000], pa.timestamp("us", tz="UTC")),
                     "event_type": ["page_view", None, "logout"]})
    base = state_checksum(rows)
    assert state_checksum(rows.take([2, 0, 1])) == base
    assert base.startswith("siphash64:3:")
    for name, changed in [("user_id", ["u1", "u1", "u3"]), ("event_id", ["a", "b", "d"]),
                          ("event_type", ["page_view", "click", "logout"]),
                          ("event_time", pa.array([1_000_000, 2_000_000, 3_001_000], pa.timestamp("us", tz="UTC")))]:
        other = rows.set_column(rows.schema.get_field_index(name), name, pa.array(changed, rows[name].type))
        assert state_checksum(other) != base, name
    assert state_checksum(rows.slice(0, 2)) != base


@pytest.mark.tier("pure")
def test_result_json_keeps_the_contract_keys():
    """The CLI prints to_dict(): a savepoint has at least savepoint_id, batch_id, rows, uri (uri right after
    seconds, as always); keys that were only present when set stay out while None."""
    row = {name: None for name in sp.CATALOG_SCHEMA.names}
    row.update(savepoint_id="sp-1", batch_id=3, rows=5, state_uri="/sp/state/sp-1", status="complete",
               created_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
    saved = SavepointInfo.from_row(row).to_dict()
    assert {"savepoint_id", "batch_id", "rows", "uri"} <= saved.keys() and "error" not in saved
    assert list(saved)[-2:] == ["seconds", "uri"] and saved["uri"] == "/sp/state/sp-1"
    assert saved["created_at"] == "2026-01-01T00:00:00+00:00"
    # validate's JSON: `verified` last, after uri
    assert list(SavepointInfo.from_row(row, verified=True).to_dict()) == [
        "savepoint_id", "trigger", "created_at", "batch_id", "source_seq", "watermark_ms", "gap_ms", "lateness_ms",
        "buckets", "provider", "partitions", "state_schema", "rows", "checksum", "sessions_version",
        "quarantine_version", "incarnation", "state_uri", "status", "bytes", "seconds", "uri", "verified"]
    # `savepoints --json`: each entry is the catalog row (every column, `error` null when none) and its uri
    assert list(SavepointInfo.from_row(row).to_dict(catalog=True)) == [
        "savepoint_id", "status", "trigger", "created_at", "batch_id", "source_seq", "watermark_ms", "gap_ms",
        "lateness_ms", "buckets", "provider", "partitions", "state_schema", "rows", "checksum", "sessions_version",
        "quarantine_version", "incarnation", "state_uri", "bytes", "seconds", "error", "uri"]
    assert "rows" not in RescaleResult(4, 4, "none", None, None, 0.0).to_dict()


def test_compaction_and_retention(tmp_path, spark):
    config = _config(tmp_path, "rocksdb")
    chunks = _chunks(seed=4, parts=4)
    ids = []
    for i, chunk in enumerate(chunks):
        _land_and_ingest(config, [chunk], i)
        catch_up(config, spark)
        ids.append(take_savepoint(config, spark=spark).savepoint_id)
    restore(config, ids[-1], spark=spark)  # leaves a replaced checkpoint behind
    files_before = len(DeltaTable(config.sessions_table).file_uris())
    orphan = Path(config.savepoint_uri) / "state" / "sp-killed-before-its-catalog-row"
    orphan.mkdir()
    (orphan / "part-00000.parquet").write_bytes(b"half a savepoint")
    report = compact(config.with_(keep_savepoints=2, keep_daily_days=0, vacuum_retention_hours=0))
    assert sorted(report.savepoints_deleted) == sorted(ids[:2])
    assert [s.savepoint_id for s in sp.SavepointStore.of(config).list()] == ids[:1:-1]
    assert report.replaced_checkpoints_removed and report.bytes_reclaimed > 0
    assert report.tables["sessions"]["files_before"] == files_before > report.tables["sessions"]["files_after"] == 1
    assert sum(1 for _ in (Path(config.savepoint_uri) / "state").iterdir()) == 2
    assert report.orphan_state_removed == [orphan.name] and not orphan.exists()
    assert read_sessions(config) == _expected(chunks)  # still readable and whole after OPTIMIZE + VACUUM


def _sessionctl(home: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "SESSIONS_HOME": str(home), "PYSPARK_PYTHON": sys.executable, **(env or {})}
    return subprocess.run([tool("sessionctl"), *args], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.tier("subprocess")
def test_cli_expected_errors_are_one_line(tmp_path):
    home = tmp_path / "home"
    missing = _sessionctl(home, "restore", "--savepoint", "nope")
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().count("\n") == 0
    assert missing.stderr.startswith("sessionctl restore: no such savepoint: nope in ")
    config = SessionsConfig.from_env({"SESSIONS_HOME": str(home)})
    with job_lock(config, "run"):  # as if `sessionctl run` were going: a restore needs it stopped
        busy = _sessionctl(home, "restore", "--savepoint", "latest")
    assert busy.returncode != 0 and "Traceback" not in busy.stderr
    assert busy.stderr.strip().count("\n") == 0 and "the job is running" in busy.stderr
    assert "restore needs it stopped: stop it with `sessionctl stop`" in busy.stderr
    not_running = _sessionctl(home, "stop", "--savepoint")
    assert not_running.returncode == 1 and not_running.stderr.strip().startswith("sessionctl stop: no stream is running")
    nothing = _sessionctl(home, "savepoint", "--json")
    assert nothing.returncode != 0 and "nothing to savepoint" in nothing.stderr
    zero = _sessionctl(home, "rescale", "--partitions", "0")
    assert zero.returncode == 2 and zero.stderr.strip() == ("sessionctl rescale: argument --partitions: 0 must be between "
                                                            "1 and 10000 (see `sessionctl rescale --help`)")
    listing = _sessionctl(home, "savepoints", "--json")
    assert listing.returncode == 0 and json.loads(listing.stdout) == []
