"""Fencing: a process that lost its lease (paused past the TTL while another process took it over) writes nothing
more -- its Delta commits are refused by its lease (a newer epoch exists, its renewals lapsed) and by the table
(a newer epoch committed there), and a commit that lost the race for its version is never rebased onto the winner."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

from pipelines.coordination.fencing import EPOCH_KEY, committing, fence
from pipelines.coordination.leases import acquire, lease, live_holder
from pipelines.core.sample_data import arrival_order, generate_events, land
from pipelines.errors import LeaseLost
from pipelines.ingest import ingest
from pipelines.job.checkpoint import restore_marker
from pipelines.job.sink import SESSIONS_SCHEMA, ensure_table, idempotent_append
from pipelines.job.stream import catch_up
from state_store.lifecycle import restore, take_savepoint
from testkit.lifecycle_expectations import expected_closed_sessions
from tests.kit.homes import config_env, make_config, tool
from tests.kit.tables import read_sessions
from tests.kit.waits import still_running, wait_until

pytestmark = pytest.mark.tier("subprocess")

REPO = Path(__file__).resolve().parent.parent


def _rows(tag: str, n: int = 2) -> pa.Table:
    return pa.table({"session_id": [f"{tag}-{i}" for i in range(n)], "user_id": [tag] * n,
                     "session_start": [0] * n, "session_end": [0] * n, "event_count": [1] * n, "page_views": [0] * n,
                     "end_reason": ["inactivity"] * n, "batch_id": [1] * n, "incarnation": [tag] * n,
                     "written_version": [None] * n},
                    schema=SESSIONS_SCHEMA)


def _spawn(script: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)


def _resume(process: subprocess.Popen) -> tuple[str, str]:
    os.kill(process.pid, signal.SIGCONT)
    return process.communicate("go\n", timeout=60)


STALE_WRITER = """
import sys
from pipelines.errors import LeaseLost
from pipelines.coordination.leases import lease
from pipelines.job.sink import idempotent_append
from tests.test_fencing import _rows
leases, table, skewed = sys.argv[1], sys.argv[2], sys.argv[3] == "skewed"
try:
    with lease(leases, "job", "run", 3600.0 if skewed else 2.0) as held:
        print(f"held {held.epoch}", flush=True)
        sys.stdin.readline()  # (stopped here past the TTL); another process takes over and commits
        if skewed:  # and its listing of the lease store is stale: only the table can tell
            held.check = lambda: None
        idempotent_append(table, _rows("old"), "sessions-old-incarnation", 1, leases=(held,))
        print("committed", flush=True)
except LeaseLost as lost:
    print(f"refused: {lost}", flush=True)
    sys.exit(3)
"""


def _expire(location: Path, name: str, epoch: int) -> None:
    """Make epoch `epoch` of lease `name` look expired to others (the clock of its holder's host far behind)."""
    record = location / f"{name}.lease.epoch-{epoch:012d}"
    record.write_text(json.dumps({**json.loads(record.read_text()), "expires_at": time.time() - 1}))


def _expired(location: Path, name: str, epoch: int) -> bool:
    """Epoch `epoch` of lease `name` is a record whose expiry is in the past."""
    record = location / f"{name}.lease.epoch-{epoch:012d}"
    return json.loads(record.read_text())["expires_at"] < time.time()


def _take_over(process: subprocess.Popen, location: Path, name: str, epoch: int, skewed: bool) -> None:
    """The holder `process` of epoch `epoch` loses it: stopped past its TTL, or (skewed) its record looks expired
    to others while it still counts itself within its TTL."""
    if skewed:
        _expire(location, name, epoch)
    else:
        os.kill(process.pid, signal.SIGSTOP)
        # Stopped past its TTL is the point: wait for its record to expire (nothing renews it while stopped).
        wait_until(lambda: _expired(location, name, epoch), timeout_s=30, what=f"{name} epoch {epoch} to expire")


@pytest.mark.parametrize("skewed", [False, True], ids=["paused", "skewed-clock-stale-listing"])
def test_a_fenced_holder_cannot_append_after_a_newer_epoch_committed(tmp_path, skewed):
    """Two processes: the old holder loses the lease (stopped past its TTL), the new one takes it and appends; the
    old one, resumed, is refused by its lease -- or, when it cannot know (its clock behind, its listing stale), by
    the epoch the table recorded."""
    leases, table = tmp_path / "leases", str(tmp_path / "sessions")
    ensure_table(table, SESSIONS_SCHEMA)
    old = _spawn(STALE_WRITER, str(leases), table, "skewed" if skewed else "paused")
    try:
        assert old.stdout.readline().strip() == "held 1"
        _take_over(old, leases, "job", 1, skewed)
        with lease(leases, "job", "restore", 30.0) as newer:
            assert newer.epoch == 2
            assert idempotent_append(table, _rows("new"), "sessions-new-incarnation", 1, leases=(newer,))
            out, err = _resume(old)
    finally:
        if old.poll() is None:
            old.kill()
            old.wait()
    assert old.returncode == 3, (out, err[-2000:])
    assert out.startswith("refused: the job lease ") and out.count("\n") == 1, out
    if skewed:
        assert "epoch 2 of it already committed to" in out, out
    else:
        assert "a newer holder took it: epoch 2" in out or "not renewed for" in out, out
    delta = DeltaTable(table)
    assert sorted(delta.to_pyarrow_table()["session_id"].to_pylist()) == ["new-0", "new-1"]
    assert delta.history(limit=1)[0][EPOCH_KEY] == "2"


@pytest.mark.tier("pure")
def test_a_commit_that_loses_the_race_for_its_version_is_tried_again_not_rebased(tmp_path):
    """max_commit_retries=0 (deltalake 1.6.6): a write on a table loaded before another commit fails instead of
    being rebased; committing() tries again from a fresh load, whose fence sees a newer epoch that committed."""
    uri = str(tmp_path / "sessions")
    ensure_table(uri, SESSIONS_SCHEMA)
    stale = DeltaTable(uri)
    write_deltalake(uri, _rows("compaction"), mode="append")  # someone else's commit (no lease: a compaction)
    with pytest.raises(CommitFailedError):
        write_deltalake(stale, _rows("late"), mode="append", commit_properties=CommitProperties(max_commit_retries=0))
    held = acquire(tmp_path / "leases", "job", "run", 30.0)
    loads = [DeltaTable(uri, version=0)]  # the first attempt works on the version before the compaction
    assert idempotent_append(uri, _rows("a"), "app", 1, leases=(held,))  # plain: loads the newest itself

    def attempt(tag: str) -> None:
        table = loads.pop() if loads else DeltaTable(uri)
        transactions, metadata = fence(table, [held], uri)
        write_deltalake(table, _rows(tag), mode="append", commit_properties=CommitProperties(
            app_transactions=transactions, custom_metadata=metadata, max_commit_retries=0))

    committing(lambda: attempt("retried"), uri)  # lost the race once, then committed on the newest version
    assert DeltaTable(uri).version() == 3 and DeltaTable(uri).transaction_version(held.app_id) == 1
    # A newer epoch commits in between: the retry's fence refuses (the lease store blind, as above).
    newer_epoch = held.epoch + 1
    write_deltalake(uri, _rows("newer"), mode="append", commit_properties=CommitProperties(
        app_transactions=[Transaction(held.app_id, newer_epoch)]))
    loads.append(DeltaTable(uri, version=3))
    held.check = lambda: None  # type: ignore[method-assign]
    with pytest.raises(LeaseLost, match=f"epoch {newer_epoch} of it already committed"):
        committing(lambda: attempt("fenced"), uri)
    assert "fenced-0" not in DeltaTable(uri).to_pyarrow_table()["session_id"].to_pylist()


STALE_INGESTER = """
import sys
from pipelines.errors import LeaseLost
from pipelines.ingest.appender import Appender
from pipelines.ingest.lines import split_lines
from pipelines.ingest.table import RowSource, latest_clock, latest_seq, open_raw_table
from pipelines.coordination.leases import waiting_lease
from tests.kit.homes import make_config
skewed = sys.argv[2] == "skewed"
config = make_config(sys.argv[1], SESSIONS_LEASE_TTL_S="3600" if skewed else "2")
try:
    with waiting_lease(config.lease_uri, "ingest", "ingest", config.lease_ttl_s, timeout_s=30) as held:
        table = open_raw_table(config)
        appender = Appender(config, latest_seq(table), latest_clock(table), leases=(held,), version=table.version())
        print(f"ready {held.epoch} {appender.seq}", flush=True)
        sys.stdin.readline()  # (stopped here past the TTL) while another ingester takes over and commits
        if skewed:
            held.check = lambda: None
        line = b'{"event_id": "a-1", "user_id": "u", "event_time": "2026-11-01T08:00:00Z", "event_type": "x"}\\n'
        appender.append([RowSource("stale.jsonl", split_lines(line, 0, False)[0])], {"test": "stale"})
        print("committed", flush=True)
except LeaseLost as lost:
    print(f"refused: {lost}", flush=True)
    sys.exit(3)
"""


@pytest.mark.parametrize("skewed", [False, True], ids=["paused", "skewed-clock-stale-listing"])
def test_two_ingesters_racing_after_an_expired_lease_never_commit_an_ingest_seq_twice(tmp_path, skewed):
    config = make_config(tmp_path, SESSIONS_LEASE_TTL_S="2")
    events = [json.dumps(e) for e in generate_events(5, 2, seed=3)]
    assert len(events) > 6
    land(config.landing, "first.jsonl", events[:5])
    assert ingest(config).last_seq == 1
    stale = _spawn(STALE_INGESTER, str(tmp_path), "skewed" if skewed else "paused")
    try:
        assert stale.stdout.readline().strip() == "ready 2 1"
        _take_over(stale, config.lease_dir, "ingest", 2, skewed)
        land(config.landing, "second.jsonl", events[5:])
        took = ingest(config)  # (waits out the stopped ingester's TTL, then) takes the ingest lease: epoch 3
        assert (took.first_seq, took.last_seq) == (2, 2)
        out, err = _resume(stale)
    finally:
        if stale.poll() is None:
            stale.kill()
            stale.wait()
    assert stale.returncode == 3, (out, err[-2000:])
    assert out.startswith("refused: the ingest lease ") and "epoch 2" in out, out
    if skewed:
        assert "epoch 3 of it already committed to" in out, out
    raw = DeltaTable(config.raw_events_table)
    seqs = [int(c["ingest_seq"]) for c in raw.history() if "ingest_seq" in c]
    assert sorted(seqs) == [1, 2]
    rows = raw.to_pyarrow_table(columns=["ingest_seq", "source_file"]).to_pylist()
    assert {(r["ingest_seq"], r["source_file"]) for r in rows} == {(1, "first.jsonl"), (2, "second.jsonl")}


def _any_session(config) -> bool:
    return len(read_sessions(config, missing_ok=True)) > 0


def _frozen_past_the_ttl(config) -> None:
    """Wait until the frozen run's job lease expired (the point of the test: nothing renews it while stopped)."""
    wait_until(lambda: live_holder(config.lease_uri, "job") is None, timeout_s=60, interval_s=0.2,
               what="the frozen run's job lease to expire")


def _found_itself_fenced(run: subprocess.Popen, err: Path) -> None:
    """Wait until the resumed run said it lost its lease (or ended): the operator's Ctrl-C comes after that."""
    wait_until(lambda: "was lost by run" in err.read_text() or run.poll() is not None, timeout_s=120,
               what="the resumed run to report its lost lease")


def _run(env: dict, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """`sessionctl run` in its own process group; its stderr goes to a file (read while it runs)."""
    err = tmp_path / "run.err"
    with err.open("w") as sink:
        run = subprocess.Popen([tool("sessionctl"), "run", "--poll-seconds", "1"], env=env, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=sink, text=True, cwd=tmp_path)
    return run, err


@pytest.mark.parametrize("checkpoint", ["local", pytest.param("hdfs", marks=pytest.mark.tier("e2e"))])
def test_a_frozen_run_is_fenced_after_another_process_caught_up(tmp_path, request, spark, checkpoint):
    """The operator's scenario, catch-up variant: `sessionctl run` frozen (SIGSTOP of its process group) past a short
    TTL, another process takes the job lease and runs a catch-up, then the run resumes (SIGCONT) and is stopped with
    Ctrl-C: it commits nothing more and exits non-zero with one line naming the lost lease; the sessions table holds
    every expected session exactly once. With the checkpoint on the real HDFS too, and the leases with it (no
    SESSIONS_LEASE_URI: `_leases` beside the checkpoint, on HDFS). The other process is this one (the library call of
    `sessionctl catch-up`, in the tests' session): a lease is held by a process, whichever command runs in it."""
    ttl = "6"
    remote: dict[str, str] = {}
    if checkpoint == "hdfs":
        hdfs = request.getfixturevalue("hdfs")
        remote = {"SESSIONS_CHECKPOINT_URI": f"{hdfs.uri}/fencing/{tmp_path.name}",
                  "SESSIONS_WEBHDFS_ADDRESS": hdfs.webhdfs.removeprefix("http://")}
    config = make_config(tmp_path, SESSIONS_LEASE_TTL_S=ttl, **remote)
    if checkpoint == "hdfs":
        assert config.lease_uri == f"{remote['SESSIONS_CHECKPOINT_URI']}/_leases"
    env = config_env(config, SESSIONS_LEASE_TTL_S=ttl, **remote)
    events = arrival_order(generate_events(40, 3, seed=21), seed=21, jitter_seconds=120)
    first, second = events[: len(events) // 2], events[len(events) // 2:]
    land(config.landing, "first.jsonl", [json.dumps(e) for e in first])
    run, run_err = _run(env, tmp_path)
    try:
        wait_until(lambda: still_running(run, run_err) and _any_session(config), timeout_s=180, interval_s=1,
                   what="a session written while running")
        os.killpg(run.pid, signal.SIGSTOP)
        land(config.landing, "second.jsonl", [json.dumps(e) for e in second])
        _frozen_past_the_ttl(config)
        catch_up(config, spark)  # takes the expired job lease over
        expected = expected_closed_sessions([first, second], 30 * 60_000, 10 * 60_000)
        assert read_sessions(config) == sorted(expected)
        versions = (DeltaTable(config.sessions_table).version(), DeltaTable(config.raw_events_table).version(),
                    _batch_files(config))
        os.killpg(run.pid, signal.SIGCONT)
        _found_itself_fenced(run, run_err)
        run.send_signal(signal.SIGINT)  # the operator's Ctrl-C
        out, _ = run.communicate(timeout=180)
        err = run_err.read_text()
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGCONT)
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert run.returncode == 1, (out[-2000:], err[-3000:])
    assert "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("sessionctl run: the job lease ") and " was lost by run (pid " in last, err[-3000:]
    assert "catch-up (pid" in last or "not renewed for" in last, last
    # nothing more in the tables, nor in the checkpoint's logs (Spark's own writes are fenced in its JVM)
    assert (DeltaTable(config.sessions_table).version(), DeltaTable(config.raw_events_table).version(),
            _batch_files(config)) == versions
    assert read_sessions(config) == sorted(expected)  # every session exactly once


def _batch_files(config) -> tuple[list[str], list[str]]:
    listing = [sorted(p.name for p in (config.checkpoint / d).iterdir() if p.name.isdigit())
               for d in ("offsets", "commits")]
    return listing[0], listing[1]


@pytest.mark.tier("e2e")
def test_a_frozen_run_is_fenced_after_a_restore_from_another_process(tmp_path, spark):
    """The operator's scenario as measured: `sessionctl run` frozen past the TTL after a savepoint, a restore of that
    earlier savepoint from another process (it takes the expired lease), the rest caught up by the new holder, then
    the frozen run resumed and stopped with Ctrl-C: it exits non-zero with one line naming the lost lease, commits
    nothing more, and the sessions table holds every expected session exactly once (it held ~1,500 extra ones before
    fencing). The other process is this one: the savepoint beside the running stream, the restore and the catch-up
    are the library calls of `sessionctl savepoint`, `restore` and `catch-up`, in the tests' session (a lease is
    held by a process, whichever command runs in it; the commands' own processes: test_online_lifecycle's and the
    crash campaign's)."""
    ttl = "6"
    config = make_config(tmp_path, SESSIONS_LEASE_TTL_S=ttl)
    env = config_env(config, SESSIONS_LEASE_TTL_S=ttl)
    events = arrival_order(generate_events(60, 3, seed=5), seed=5, jitter_seconds=120)
    thirds = [events[i * len(events) // 3:(i + 1) * len(events) // 3] for i in range(3)]
    land(config.landing, "first.jsonl", [json.dumps(e) for e in thirds[0]])
    run, run_err = _run(env, tmp_path)
    try:
        wait_until(lambda: still_running(run, run_err) and _any_session(config), timeout_s=300, interval_s=1,
                   what="a session written while running")
        savepoint_id = take_savepoint(config, spark=spark).savepoint_id  # beside the running stream
        land(config.landing, "second.jsonl", [json.dumps(e) for e in thirds[1]])
        two = sorted(expected_closed_sessions(thirds[:2], 30 * 60_000, 10 * 60_000))
        wait_until(lambda: still_running(run, run_err) and read_sessions(config) == two, timeout_s=300, interval_s=1,
                   what="the second file's sessions written")
        os.killpg(run.pid, signal.SIGSTOP)
        land(config.landing, "third.jsonl", [json.dumps(e) for e in thirds[2]])
        _frozen_past_the_ttl(config)
        restore(config, savepoint_id, spark=spark)  # takes the expired lease over
        catch_up(config, spark)
        expected = sorted(expected_closed_sessions(thirds, 30 * 60_000, 10 * 60_000))
        assert read_sessions(config) == expected
        before = (DeltaTable(config.sessions_table).version(), DeltaTable(config.raw_events_table).version(),
                  _batch_files(config))
        os.killpg(run.pid, signal.SIGCONT)
        _found_itself_fenced(run, run_err)  # it resumes, and finds itself fenced
        run.send_signal(signal.SIGINT)
        out, _ = run.communicate(timeout=180)
        err = run_err.read_text()
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGCONT)
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert run.returncode == 1 and "Traceback" not in err, (out[-2000:], err[-3000:])
    last = err.strip().splitlines()[-1]
    assert last.startswith("sessionctl run: the job lease ") and " was lost by run (pid " in last, err[-3000:]
    after = (DeltaTable(config.sessions_table).version(), DeltaTable(config.raw_events_table).version(),
             _batch_files(config))
    assert after == before, (before, after)
    assert read_sessions(config) == expected  # every session exactly once


def _paused(pid: int) -> bool:
    """The process is stopped (SIGSTOP): its state in /proc is T."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


def _tree(root: Path) -> dict[str, tuple[int, int, bytes | None]]:
    """Every file under `root`: (size, modification time, the bytes of the small ones)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns,
                                       p.read_bytes() if p.stat().st_size < 4096 else None)
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.tier("e2e")
@pytest.mark.parametrize("point", ["restore:checked", "restore:aside"])
def test_a_restore_paused_midway_writes_nothing_after_another_restore(tmp_path, spark, point):
    """`sessionctl restore --canonical` frozen (its process group SIGSTOPped at a kill point: `restore:checked`, its
    checks done and nothing written; `restore:aside`, the old checkpoint set aside) past the job lease's TTL;
    meanwhile another process restores a later savepoint and catches up. Resumed, the frozen restore writes nothing --
    not its marker, not a set-aside of the new holder's checkpoint, not its job metadata into it, not its way back of
    a failed restore (which moves checkpoints) -- and exits 1 with one line naming the lost lease; the checkpoint's
    files, the tables and the sessions (the oracle's) are as the new holder left them."""
    ttl = "6"
    config = make_config(tmp_path, SESSIONS_LEASE_TTL_S=ttl)
    events = arrival_order(generate_events(60, 3, seed=9), seed=9, jitter_seconds=120)
    thirds = [events[i * len(events) // 3:(i + 1) * len(events) // 3] for i in range(3)]
    savepoints = []
    for i in range(2):
        land(config.landing, f"{i}.jsonl", [json.dumps(e) for e in thirds[i]])
        catch_up(config, spark)
        savepoints.append(take_savepoint(config, spark=spark).savepoint_id)
    err = tmp_path / "restore.err"
    with err.open("w") as sink:
        frozen = subprocess.Popen([tool("sessionctl"), "restore", "--savepoint", savepoints[0], "--canonical"],
                                  env=config_env(config, SESSIONS_LEASE_TTL_S=ttl, SESSIONS_PAUSE_AT=point),
                                  start_new_session=True, stdout=subprocess.PIPE, stderr=sink, text=True, cwd=tmp_path)
    try:
        wait_until(lambda: frozen.poll() is not None or _paused(frozen.pid), timeout_s=300, interval_s=0.2,
                   what=f"the restore to pause at {point}")
        assert frozen.poll() is None, err.read_text()[-3000:]
        _frozen_past_the_ttl(config)
        restore(config, savepoints[1], spark=spark)  # takes the expired lease over
        land(config.landing, "2.jsonl", [json.dumps(e) for e in thirds[2]])
        catch_up(config, spark)
        expected = sorted(expected_closed_sessions(thirds, 30 * 60_000, 10 * 60_000))
        assert read_sessions(config) == expected
        before = (_tree(config.checkpoint), DeltaTable(config.sessions_table).version())
        assert not restore_marker(config.checkpoint).exists()
        os.killpg(frozen.pid, signal.SIGCONT)
        out, _ = frozen.communicate(timeout=180)
    finally:
        if frozen.poll() is None:
            os.killpg(frozen.pid, signal.SIGCONT)
            os.killpg(frozen.pid, signal.SIGKILL)
            frozen.wait()
    text = err.read_text()
    assert frozen.returncode == 1 and "Traceback" not in text, (out[-2000:], text[-3000:])
    last = text.strip().splitlines()[-1]
    assert last.startswith("sessionctl restore: the job lease ") and " was lost by restore (pid " in last, text[-3000:]
    assert (_tree(config.checkpoint), DeltaTable(config.sessions_table).version()) == before
    assert not restore_marker(config.checkpoint).exists()  # `status` shows no restore in progress
    assert read_sessions(config) == expected
