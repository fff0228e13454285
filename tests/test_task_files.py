"""The sink's two-phase append (pipelines/job/task_files.py): files written where the tasks run, one fenced, idempotent
delta-rs commit. The tasks' function is run here directly on Arrow batches (what mapInArrow hands it); the stream's
own use of it is covered by the stream tests against the oracle."""
from __future__ import annotations

import datetime as dt
import json
from functools import partial
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from pipelines.coordination.fencing import EPOCH_KEY
from pipelines.coordination.leases import acquire
from pipelines.errors import LeaseLost
from pipelines.job.sink import SESSIONS_SCHEMA, ensure_table, session_rows
from pipelines.job.task_files import TaskFile, _partition_writer, commit_task_files, file_stats
from tests.test_fencing import _expire

pytestmark = pytest.mark.tier("pure")

UTC = dt.timezone.utc


def _operator_rows(users: list[str], start_ms: int = 1_700_000_000_000) -> pa.Table:
    n = len(users)
    return pa.table({"session_id": [f"{u}-s" for u in users], "user_id": users,
                     "session_start_ms": [start_ms + i for i in range(n)],
                     "session_end_ms": [start_ms + 60_000 + i for i in range(n)],
                     "event_count": [3] * n, "page_views": [1] * n, "end_reason": ["inactivity"] * n})


def _task_files(uri: str, partitions: list[list[str]], batch_id: int = 1, version: int = 1) -> list[TaskFile]:
    """What the tasks of a batch return: one file per non-empty partition."""
    write = _partition_writer(uri, SESSIONS_SCHEMA, partial(session_rows, batch_id=batch_id, incarnation="inc",
                                                            written_version=version), f"part-b{batch_id}")
    files = []
    for users in partitions:
        for row in write(iter(_operator_rows(users).to_batches())):
            files.extend(TaskFile(r["path"], r["size"], r["rows"], r["stats"]) for r in row.to_pylist())
    return files


def test_file_statistics_are_the_ones_delta_rs_writes_for_the_same_rows(tmp_path):
    """Independent expectation: delta-rs's own statistics of the same table (ms-precision timestamps, integers, short
    strings, a null)."""
    rows = session_rows(_operator_rows(["ann", "bob", "cy"]), batch_id=4, incarnation="inc", written_version=7)
    rows = rows.set_column(rows.schema.get_field_index("end_reason"), "end_reason",
                           pa.array(["logout", None, "inactivity"], pa.string()))
    write_deltalake(str(tmp_path / "t"), rows)
    (log,) = (tmp_path / "t" / "_delta_log").glob("*.json")
    theirs = next(json.loads(json.loads(line)["add"]["stats"]) for line in log.read_text().splitlines()
                  if line.startswith('{"add"'))
    assert _moments(json.loads(file_stats(rows))) == _moments(theirs)


def _moments(stats: dict) -> dict:
    """ISO timestamps as instants (one writer prints 20Z, the other 20.000Z for the same moment)."""
    def value(v: object) -> object:
        return dt.datetime.fromisoformat(v) if isinstance(v, str) and v.endswith("Z") and v[:4].isdigit() else v
    return {k: {c: value(v) for c, v in part.items()} if isinstance(part, dict) else part for k, part in stats.items()}


def test_statistics_never_narrower_than_the_data():
    """A sub-millisecond maximum is rounded up (a reader skipping files by it must not skip this one); a string longer
    than Delta's prefix gets no min/max at all."""
    moment = dt.datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)
    stats = json.loads(file_stats(pa.table({"at": pa.array([moment], pa.timestamp("us", tz="UTC")),
                                             "text": ["x" * 40]})))
    assert stats["minValues"] == {"at": "2026-01-01T00:00:00.123Z"}
    assert stats["maxValues"] == {"at": "2026-01-01T00:00:00.124Z"}
    assert stats["nullCount"] == {"at": 0, "text": 0} and stats["numRecords"] == 1


def test_one_commit_adds_every_task_file_once_per_batch(tmp_path):
    uri = str(tmp_path / "sessions")
    ensure_table(uri, SESSIONS_SCHEMA)
    files = _task_files(uri, [["ann", "bob"], [], ["cy"]])
    assert len(files) == 2  # the empty partition wrote nothing
    assert commit_task_files(uri, files, schema=SESSIONS_SCHEMA, app_id="sessions-inc", version=1)
    table = DeltaTable(uri)
    assert table.version() == 1 and table.transaction_version("sessions-inc") == 1
    assert sorted(table.to_pyarrow_table()["user_id"].to_pylist()) == ["ann", "bob", "cy"]
    assert sorted(Path(u).name for u in table.file_uris()) == sorted(f.path for f in files)
    # The batch again (a retry after a crash before the checkpoint noted it): nothing committed, its files removed.
    again = _task_files(uri, [["ann", "bob"], ["cy"]])
    assert not commit_task_files(uri, again, schema=SESSIONS_SCHEMA, app_id="sessions-inc", version=1)
    assert DeltaTable(uri).version() == 1
    assert not any((tmp_path / "sessions" / f.path).exists() for f in again)
    # Data skipping by the statistics finds the rows (a wrong min/max would hide them).
    assert DeltaTable(uri).to_pyarrow_table(filters=[("user_id", "=", "cy")]).num_rows == 1


def test_a_fenced_holders_task_files_are_refused_and_removed(tmp_path):
    """The holder of epoch 1 lost its lease to epoch 2, which committed: its commit is refused (LeaseLost) and its
    files, in no version, are removed."""
    uri, leases = str(tmp_path / "sessions"), tmp_path / "leases"
    ensure_table(uri, SESSIONS_SCHEMA)
    old = acquire(leases, "job", "run", 30.0)
    stale = _task_files(uri, [["ann"]], batch_id=2)
    _expire(leases, "job", old.epoch)  # its record looks expired to others (its host's clock far behind)
    newer = acquire(leases, "job", "restore", 30.0)
    assert newer.epoch == 2
    assert commit_task_files(uri, _task_files(uri, [["bob"]], batch_id=1), schema=SESSIONS_SCHEMA,
                             app_id="sessions-new", version=1, leases=(newer,))
    old.check = lambda: None  # its own view of the lease store stale: only the table can tell
    with pytest.raises(LeaseLost, match="epoch 2 of it already committed"):
        commit_task_files(uri, stale, schema=SESSIONS_SCHEMA, app_id="sessions-old", version=2, leases=(old,))
    assert DeltaTable(uri).to_pyarrow_table()["user_id"].to_pylist() == ["bob"]
    assert DeltaTable(uri).history(limit=1)[0][EPOCH_KEY] == "2"
    assert not (tmp_path / "sessions" / stale[0].path).exists()
