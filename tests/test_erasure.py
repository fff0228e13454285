"""`sessionctl forget --user U` against independent expectations: the oracle run on the stream without U equals what
the job holds after the erasure (sessions, open sessions, late events), after more data, and after a restore of a
savepoint taken before the erasure; `forget --verify` scans every file and finds U nowhere -- older Delta versions
included -- where it found U before."""
from __future__ import annotations

import json
import subprocess

import pytest

from pipelines.ingest.erased import LOG_TABLE, user_hash
from pipelines.job.stream import catch_up
from state_store.erasure import forget
from state_store.lifecycle import restore, take_savepoint
from state_store.savepoint.catalog import SavepointStore
from state_store.verification import verify_forgotten, verify_forgotten_many
from testkit.oracle import run_oracle
from tests.kit.datagen import land_batches, stream_scenario, with_users
from tests.kit.homes import config_env, make_config, tool
from tests.kit.storages import checkpoint_env
from tests.kit.tables import assert_late_keys, read_open_sessions, read_sessions
from tests.kit.waits import still_running, stream_caught_up, wait_until

pytestmark = pytest.mark.tier("spark")

GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000
# Seed 7's u4: closed sessions, late events and an open session at CUT, and never the newest event of a batch, so
# that the stream without u4 has the same watermarks (the oracle without it is the expectation for everyone else).
SEED, USER, CUT = 7, "u4", 3


# A bulk erasure's other users (tests.kit.datagen.with_users: two events each, nobody else's sessions changed): closed
# sessions only, open sessions only at CUT, a non-ASCII id among them.
CLOSED, OPENED = ["gone-c1", "gone-c2", "gone-ü3"], ["gone-o1", "gone-o2", "gone-ö3"]
USERS = [USER, *CLOSED, *OPENED]


def _scenario_with_users() -> list[list[dict]]:
    return with_users(stream_scenario(SEED, 6, False, GAP_MS, LATENESS_MS), CLOSED, OPENED, GAP_MS, LATENESS_MS)


def _without(batches: list[list[dict]], *users: str) -> list[list[dict]]:
    gone = set(users)
    return [[e for e in batch if e["user_id"] not in gone] for batch in batches]


def _assert_is_the_oracle_without_the_user(spark, config, batches, users: tuple[str, ...] = (USER,)) -> None:
    expected = run_oracle(_without(batches, *users), GAP_MS, LATENESS_MS)
    assert read_sessions(config) == sorted(expected.closed)
    assert read_open_sessions(spark, config) == sorted(expected.open_sessions)
    assert_late_keys(config, expected)


TIER_OF_CASE = {"test_forget_a_user_of_a_stopped_job[hdfs]": "e2e"}  # the HDFS-backed provider in the long depth


@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_forget_a_user_of_a_stopped_job(spark, tmp_path, provider):
    """Erased after batch ERASED, when U has closed sessions and late events (sessions and quarantine rewritten); a
    savepoint taken after batch SAVED, while U had an open session, is restored after the erasure: its replay reads
    the raw_events files the erasure rewrote (delta-rs writes their strings as views), then more data lands."""
    saved, erased = 4, 6
    config = make_config(tmp_path, provider)
    batches = stream_scenario(SEED, 6, False, GAP_MS, LATENESS_MS)
    at_erasure = run_oracle(batches[:erased], GAP_MS, LATENESS_MS)
    assert any(s[1] == USER for s in at_erasure.closed) and any(k[0] == USER for k in at_erasure.late_keys)
    assert any(s[1] == USER for s in run_oracle(batches[:saved], GAP_MS, LATENESS_MS).open_sessions)
    assert all(any(e["user_id"] == USER for e in batch) for batch in batches[saved:erased])
    land_batches(config, batches[:saved])
    catch_up(config, spark)
    before_erasure = take_savepoint(config, spark=spark, full=True)
    land_batches(config, batches[saved:erased], start=saved)
    catch_up(config, spark)

    found = verify_forgotten(config, spark, USER)
    assert not found.clean
    assert all(found.found[place] > 0 for place in ("raw_events", "sessions", "savepoints", "landed_lines")), found.found

    result = forget(config, USER, spark=spark)
    assert all(result.removed[place] > 0 for place in ("raw_events", "sessions", "quarantine", "savepoint_rows")), \
        result.removed
    assert USER not in json.dumps(result.to_dict())
    # In place: only the state partition U is placed in was rewritten (no erasure savepoint, no restore).
    assert result.removed["state_partitions_rewritten"] == 1, result.removed
    assert not [s for s in SavepointStore.of(config).list() if s.trigger == "erasure"]
    after = verify_forgotten(config, spark, USER)
    assert after.clean and set(after.found.values()) == {0}, after.found
    assert USER not in _log_text(config) and result.user_hash in _log_text(config)

    # Everyone else's stream goes on exactly once; U's later events never came (the data without U lands).
    rest = _without(batches, USER)
    land_batches(config, rest[erased:-1], start=erased)
    catch_up(config, spark)
    _assert_is_the_oracle_without_the_user(spark, config, batches[:-1])

    # A savepoint taken before the erasure does not bring U back: its replay reads the rewritten raw_events files,
    # the restore rewinds the rewritten sessions and quarantine; then more data lands.
    restore(config, before_erasure.savepoint_id, spark=spark)
    catch_up(config, spark)
    _assert_is_the_oracle_without_the_user(spark, config, batches[:-1])
    land_batches(config, rest[-1:], start=len(batches) - 1)
    catch_up(config, spark)
    _assert_is_the_oracle_without_the_user(spark, config, batches)
    assert verify_forgotten(config, spark, USER).clean


def _log_text(config) -> str:
    from deltalake import DeltaTable

    return json.dumps(DeltaTable(config.table_uri(LOG_TABLE)).to_pyarrow_table().to_pylist(), default=str)


@pytest.mark.tier("subprocess")
def test_the_cli_forgets_and_verifies_in_json(spark, tmp_path):
    """`--user` repeated and `--users-file` (blank lines ignored) in one forget; `--verify` of several users answers
    per user, in the order given."""
    config = make_config(tmp_path, "hdfs")
    batches = _scenario_with_users()
    land_batches(config, batches[:CUT])
    catch_up(config, spark)
    env = config_env(config)
    listed = tmp_path / "users.txt"
    listed.write_text("\n".join(["", *CLOSED, "  ", *OPENED, USER, ""]) + "\n")
    done = subprocess.run([tool("sessionctl"), "forget", "--user", USER, "--user", OPENED[0], "--users-file",
                           str(listed), "--json"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["removed"]["raw_events"] > 0 and not any(user in done.stdout for user in USERS)
    assert len(result["users"]) == len(USERS) and result["users"][0]["removed"]["live_state_events"] > 0
    assert result["removed"]["raw_events"] == sum(u["removed"]["raw_events"] for u in result["users"])
    given = [USER, OPENED[0], *CLOSED, *OPENED[1:]]  # each once, in the order given (--user first, then the file)
    assert [u["user_hash"] for u in result["users"]] == [user_hash(config, user) for user in given]
    checked = subprocess.run([tool("sessionctl"), "forget", "--verify", "--full",
                              *(a for u in USERS for a in ("--user", u)), "--json"],
                             env=env, capture_output=True, text=True, timeout=600)
    assert checked.returncode == 0, checked.stderr[-2000:]
    answer = json.loads(checked.stdout)
    assert answer["clean"] is True and set(answer["found"].values()) == {0}
    assert [u["user_hash"] for u in answer["users"]] == [user_hash(config, user) for user in USERS]
    assert answer["users"][0]["files_skipped"] == 0 and answer["users"][0]["files_read"] > 10  # --full: every file


def test_forget_twice_is_a_no_op_the_second_time(spark, tmp_path):
    """Idempotent: what a forget killed half-way leaves, the same command finishes; run twice, the second finds
    nothing to remove."""
    config = make_config(tmp_path, "hdfs")
    batches = _scenario_with_users()
    land_batches(config, batches[:CUT])
    catch_up(config, spark)
    forget(config, USERS, spark=spark)
    again = forget(config, USERS, spark=spark)
    assert set(again.removed.values()) == {0}, again.removed
    assert all(set(user.removed.values()) == {0} for user in again.users)
    assert all(check.clean for check in verify_forgotten_many(config, spark, USERS))


@pytest.mark.tier("subprocess")
def test_forget_beside_a_running_stream(spark, tmp_path):
    """`sessionctl forget` while `sessionctl run` works: the stream erases U between two batches and goes on; the rest
    of the data (without U) lands and is processed by the same stream; stopped, the job holds exactly the oracle's
    sessions of the stream without U, and U is nowhere."""
    config = make_config(tmp_path, "rocksdb")
    batches = _scenario_with_users()
    land_batches(config, batches[:CUT])
    env = config_env(config)
    run = subprocess.Popen([tool("sessionctl"), "run", "--poll-seconds", "1"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: still_running(run) and stream_caught_up(config), timeout_s=300, interval_s=0.5,
                   what="the stream to process the first batches")
        # Two forgets at once, as two compliance requests may come: neither replaces the other's request; the stream
        # erases what is pending between two batches as one erasure (or the later one at the next boundary).
        halves = [[USER, *CLOSED], OPENED]
        forgets = [subprocess.Popen([tool("sessionctl"), "forget", *(a for u in half for a in ("--user", u)), "--json"],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for half in halves]
        answers = []
        for done in forgets:
            out, err = done.communicate(timeout=600)
            assert done.returncode == 0, err[-2000:]
            answers.append(json.loads(out))
        erased = {u["user_hash"]: u["removed"]["live_state_events"] for answer in answers for u in answer["users"]}
        live = [erased[user_hash(config, user)] for user in USERS]  # every user erased, with their open events
        assert live[0] > 0 and live[1:] == [0] * len(CLOSED) + [2] * len(OPENED), live
        assert run.poll() is None, "the stream goes on after the erasure"
        # One file at a time, each ingested before the next lands: the stream's own ingest (16 files a commit) may
        # take a file first, and two files in one commit would be one micro-batch, not the oracle's two.
        for i, batch in enumerate(_without(batches[CUT:], *USERS)):
            land_batches(config, [batch], start=CUT + i)
        wait_until(lambda: still_running(run) and stream_caught_up(config), timeout_s=300, interval_s=0.5,
                   what="the stream to process the rest of the data")
        stop = subprocess.run([tool("sessionctl"), "stop", "--json"], env=env, capture_output=True, text=True,
                              timeout=600)
        assert stop.returncode == 0, stop.stderr[-2000:]
        assert run.wait(timeout=300) == 0, run.stderr.read()[-2000:]
    finally:
        if run.poll() is None:
            run.kill()
    _assert_is_the_oracle_without_the_user(spark, config, batches, tuple(USERS))
    assert all(check.clean for check in verify_forgotten_many(config, spark, USERS))


@pytest.mark.tier("subprocess")
@pytest.mark.parametrize("kill_at", ["forget:state-installed", "forget:rows-erased"])
def test_a_bulk_forget_killed_midway_is_finished_by_running_it_again(spark, tmp_path, kill_at):
    """`sessionctl forget` of several users killed (its named kill points: SESSIONS_KILL_AT) with the rewritten state
    installed and the older state files not removed yet, or with raw_events erased and the other tables, landed files
    and logs not yet; then the same erasure again: none of the users is anywhere, and the job is the oracle's without them -- never a half-applied erasure left looking done.
    The second one is the library call `sessionctl forget` makes, in the tests' session: what finishes the erasure is
    what the killed one left on disk, and a second process would add only a JVM start (the CLI's own exit and JSON:
    test_the_cli_forgets_and_verifies_in_json)."""
    import signal

    from deltalake import DeltaTable

    config = make_config(tmp_path, "hdfs")
    batches = _scenario_with_users()
    land_batches(config, batches[:CUT])
    catch_up(config, spark)
    env = config_env(config, SESSIONS_KILL_AT=kill_at)
    victim = subprocess.run([tool("sessionctl"), "forget", *(a for u in USERS for a in ("--user", u)), "--json"],
                            env=env, capture_output=True, text=True, timeout=600, start_new_session=True)
    assert victim.returncode == -signal.SIGKILL, victim.stderr[-2000:]  # killed part-way, not finished first
    log = DeltaTable(config.table_uri(LOG_TABLE)).to_pyarrow_table().to_pylist()
    assert sorted(r["status"] for r in log) == ["started"] * len(USERS)  # one row per user, none complete
    result = forget(config, USERS, spark=spark)
    assert all(check.clean for check in verify_forgotten_many(config, spark, USERS))
    complete = [r for r in DeltaTable(config.table_uri(LOG_TABLE)).to_pyarrow_table().to_pylist()
                if r["status"] == "complete"]
    assert sorted(r["user_hash"] for r in complete) == sorted(u.user_hash for u in result.users)
    land_batches(config, _without(batches[CUT:], *USERS), start=CUT)
    catch_up(config, spark)
    _assert_is_the_oracle_without_the_user(spark, config, batches, tuple(USERS))


def test_a_file_landed_while_the_erasure_rewrites_the_state_is_processed_once(spark, tmp_path, monkeypatch):
    """The stream erasing between two batches, with the worst moment for new data forced by a hook (no sleeps): a
    file lands after the erasure rewrote the state partitions at the stream's last committed batch, before their older
    files are removed. The stream resumes at its own source position and watermark, so that file is processed once,
    after the erasure, as its own micro-batch (neither skipped nor judged against another watermark); the rest follows
    one file at a time. The job is the oracle's without U, and U is nowhere."""
    import threading

    import state_store.erasure as erasure
    from state_store.stream_control import run_stream

    config = make_config(tmp_path, "rocksdb")
    batches = stream_scenario(SEED, 6, False, GAP_MS, LATENESS_MS)
    rest = _without(batches[CUT:], USER)
    land_batches(config, batches[:CUT])
    rewrite = erasure.erase_state
    landed = threading.Event()

    def rewrite_then_land(*args, **kwargs):
        rewritten = rewrite(*args, **kwargs)
        land_batches(config, rest[:1], start=CUT)  # after the state's rewrite, before its older files go
        landed.set()
        return rewritten

    monkeypatch.setattr(erasure, "erase_state", rewrite_then_land)
    stop, failures = threading.Event(), []

    def run() -> None:
        try:
            run_stream(config, spark=spark, stop=stop, poll_seconds=1)
        except BaseException as error:  # noqa: BLE001 -- reported by the test's thread
            failures.append(error)

    def wait_for(predicate, what: str) -> None:
        def stream_alive() -> bool:
            assert not failures and stream.is_alive(), f"the stream ended while waiting for {what}: {failures}"
            return True

        wait_until(lambda: stream_alive() and predicate(), timeout_s=300, interval_s=0.5, what=what)

    stream = threading.Thread(target=run, name="erasure-stream", daemon=True)
    stream.start()
    try:
        wait_for(lambda: stream_caught_up(config), "the first batches")
        assert forget(config, USER, spark=spark).removed["live_state_events"] > 0
        assert landed.is_set(), "the erasure did not rewrite the state in place"
        for i, batch in enumerate(rest[1:], start=1):
            land_batches(config, [batch], start=CUT + i)
        wait_for(lambda: stream_caught_up(config), "the rest of the data")
    finally:
        stop.set()
        stream.join(timeout=300)
    assert not failures and not stream.is_alive(), failures
    _assert_is_the_oracle_without_the_user(spark, config, batches)
    assert verify_forgotten(config, spark, USER).clean


@pytest.mark.tier("e2e")  # the HDFS cluster or the S3 endpoint, taken through checkpoint_env: the long depth
@pytest.mark.parametrize("storage,provider", [("hdfs", "rocksdb"), ("hdfs", "hdfs"), ("s3", "rocksdb")])
def test_forget_with_the_checkpoint_on_hdfs_or_s3(spark, request, tmp_path, storage, provider):
    """The same erasure with the Spark checkpoint on the real HDFS or on S3: the state partition rewritten and
    purged there, the auditor's scan reads the checkpoint's files there (HDFS through WebHDFS) as it reads a local one,
    a restore's set-aside checkpoint there is removed, and the stream goes on exactly once without U."""
    config = make_config(tmp_path, provider, **checkpoint_env(request, spark, storage, tmp_path),
                         SESSIONS_LEASE_URI=str(tmp_path / "leases"))
    batches = stream_scenario(SEED, 6, False, GAP_MS, LATENESS_MS)
    land_batches(config, batches[:CUT])
    catch_up(config, spark)
    saved = take_savepoint(config, spark=spark)
    restore(config, saved.savepoint_id, spark=spark)  # sets the old checkpoint aside, on HDFS: U's state is in it

    found = verify_forgotten(config, spark, USER)
    assert not found.clean and found.found["live_state_events"] > 0, found.found
    assert found.found.get("set_aside_checkpoints", 0) + found.found.get("checkpoint", 0) > 0, found.found
    assert forget(config, USER, spark=spark).removed["state_partitions_rewritten"] == 1
    after = verify_forgotten(config, spark, USER)
    assert after.clean and set(after.found.values()) == {0}, after.found

    land_batches(config, _without(batches[CUT:], USER), start=CUT)
    catch_up(config, spark)
    _assert_is_the_oracle_without_the_user(spark, config, batches)
