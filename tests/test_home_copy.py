"""A home that only touches itself: a copy of SESSIONS_HOME (`cp -a H1 H3`) works on its own savepoints, never the
original's.

The savepoint catalog once recorded each state table's absolute path, and every consumer used it: compaction in the
copy deleted the original's savepoint table, after which the original's `restore --dry-run` failed. The catalog now
records `state/<id>` relative to the savepoint store, and SavepointStore.list resolves every row -- a legacy row
holding an absolute path too -- under the current store's root.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from deltalake import DeltaTable

from pipelines.core.sample_data import land_sample
from pipelines.job.stream import catch_up
from state_store.lifecycle import take_savepoint
from state_store.savepoint.catalog import SavepointStore
from tests.kit.homes import config_env, make_config, tool

pytestmark = pytest.mark.tier("subprocess")


def _files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root: relative path -> (size, mtime_ns)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def _sessionctl(config, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([tool("sessionctl"), *args], env=config_env(config), capture_output=True, text=True,
                          timeout=600, cwd=config.home)


def test_compacting_a_copied_home_leaves_the_original_alone(tmp_path, spark):
    original = make_config(tmp_path, home=tmp_path / "h1")
    land_sample(original.landing, users=12, sessions_per_user=2, files=1)
    catch_up(original, spark)
    older = take_savepoint(original, spark=spark, full=True)
    land_sample(original.landing, users=12, sessions_per_user=2, files=1, seed=8)
    catch_up(original, spark)
    newer = take_savepoint(original, spark=spark, full=True)

    store = SavepointStore.of(original)
    catalog = DeltaTable(store.catalog_uri).to_pyarrow_table(columns=["savepoint_id", "state_uri"])
    recorded = {row["savepoint_id"]: row["state_uri"] for row in catalog.to_pylist()}
    assert recorded == {s: f"state/{s}" for s in (older.savepoint_id, newer.savepoint_id)}  # relative, not absolute
    assert older.state_uri == store.state_uri(older.savepoint_id)  # what a caller gets: the table's location
    # The older row as builds before this recorded it: H1's absolute path (a legacy catalog).
    DeltaTable(store.catalog_uri).update(updates={"state_uri": f"'{store.state_uri(older.savepoint_id)}'"},
                                         predicate=f"savepoint_id = '{older.savepoint_id}'")
    before = _files(Path(original.savepoint_uri))

    copy_home = tmp_path / "h3"
    shutil.copytree(original.home, copy_home, symlinks=True)
    copy = make_config(tmp_path, home=copy_home)
    copied = SavepointStore.of(copy)
    assert [s.state_uri for s in copied.list()] == [copied.state_uri(newer.savepoint_id),
                                                    copied.state_uri(older.savepoint_id)]  # the legacy row too

    compacted = _sessionctl(copy, "compact", "--keep-last", "1", "--keep-daily-days", "0")
    assert compacted.returncode == 0, compacted.stderr[-3000:]
    assert json.loads(compacted.stdout)["savepoints_deleted"] == [older.savepoint_id]
    assert not (copy_home / "savepoints" / "state" / older.savepoint_id).exists()  # the copy's own table went
    assert [s.savepoint_id for s in copied.list()] == [newer.savepoint_id]
    in_copy = _sessionctl(copy, "restore", "--savepoint", "latest", "--dry-run", "--json")
    assert in_copy.returncode == 0 and json.loads(in_copy.stdout)["restorable"] is True, in_copy.stderr[-3000:]

    # The original: every savepoint file as it was, both rows listed, and the savepoint the copy dropped restorable.
    assert _files(Path(original.savepoint_uri)) == before
    assert [s.savepoint_id for s in store.list()] == [newer.savepoint_id, older.savepoint_id]
    for saved in (older, newer):
        dry = _sessionctl(original, "restore", "--savepoint", saved.savepoint_id, "--dry-run", "--json")
        assert dry.returncode == 0, dry.stderr[-3000:]
        assert "Traceback" not in dry.stderr and json.loads(dry.stdout)["restorable"] is True


def test_nothing_else_in_a_home_records_its_absolute_path(tmp_path, spark):
    """Beside the catalog: checkpoint files, restore markers, leases, ingest positions and logs of the job name no
    absolute path of the home (Delta's own commitInfo records where a table was created: informational only, never
    read back), so a copy reads and writes nothing of the original through them."""
    config = make_config(tmp_path, home=tmp_path / "h1")
    land_sample(config.landing, users=8, sessions_per_user=2, files=1)
    catch_up(config, spark)
    take_savepoint(config, spark=spark, full=True)
    home = str(config.home)
    named = []
    for path in config.home.rglob("*"):
        if not path.is_file() or "logs" in path.relative_to(config.home).parts or "_delta_log" in path.parts:
            continue
        if path.suffix in (".parquet", ".zip", ".sst", ".changelog", ".crc"):
            continue
        if home.encode() in path.read_bytes():
            named.append(str(path.relative_to(config.home)))
    assert named == []
    raw = DeltaTable(config.raw_events_table).to_pyarrow_table(columns=["source_file"])
    assert {name for name in raw["source_file"].to_pylist() if name} == {"clicks-0000.jsonl"}  # as landed: a name
    for log in config.home.rglob("_delta_log/*.json"):
        for line in log.read_text().splitlines():
            action = json.loads(line)
            assert home not in json.dumps(action.get("add", {})) and home not in json.dumps(action.get("remove", {}))
