"""Lifecycle without downtime: savepoints of a running `sessionctl run` (files landing all the while), stop with
savepoint, kill -9 of a savepoint or of the stream during one, and Ctrl-C at any moment. Every check ends at the
oracle: restored to a savepoint, the sessions table and the state together hold exactly the oracle's sessions of the
events up to the savepoint's source position; caught up, exactly the oracle's sessions of everything."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from deltalake import DeltaTable

from pipelines.coordination.leases import live_holder
from pipelines.core.sample_data import land
from pipelines.errors import SavepointFailed, SavepointIncompatible, StopIncomplete
from pipelines.job.checkpoint import inspect_checkpoint
from pipelines.job.stream import catch_up
from state_store.lifecycle import restore, take_savepoint, validate_savepoint
from state_store.rescale import rescale
from state_store.savepoint.catalog import SavepointStore
from state_store.savepoint.native import MANIFEST, native_uri
from testkit.lifecycle_expectations import expected_closed_sessions
from testkit.oracle import run_oracle
from tests.kit.datagen import in_order_chunks
from tests.kit.homes import config_env, make_config, tool
from tests.kit.tables import iso_ms, read_open_sessions, read_sessions
from tests.kit.waits import still_running, stream_caught_up, wait_until

pytestmark = pytest.mark.tier("subprocess")

GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000
RETAIN = "3"  # SESSIONS_MIN_BATCHES_TO_RETAIN of the tests whose savepoints read beside a stream committing fast


class Feeder(threading.Thread):
    """Lands one file every `every` seconds, as producers do (written elsewhere, renamed in); once `hurry` is set
    (what the pace was for has happened), the chunks left in one file."""

    def __init__(self, landing: Path, chunks: list[list[dict]], every: float, prefix: str = "live") -> None:
        super().__init__(daemon=True)
        self.landing, self.chunks, self.every, self.prefix = landing, chunks, every, prefix
        self.hurry = threading.Event()

    def run(self) -> None:
        for i, chunk in enumerate(self.chunks):
            rest = self.chunks[i:] if self.hurry.is_set() else [chunk]
            land(self.landing, f"{self.prefix}-{i:04d}.jsonl", [json.dumps(e) for part in rest for e in part])
            if len(rest) > 1:
                return
            self.hurry.wait(self.every)  # the producers' pace


def _committed(config) -> int:
    last = inspect_checkpoint(config.checkpoint).last_committed_batch
    return -1 if last is None else last


def _pinned_copies(config) -> list[str]:
    """Private copies of a batch that savepoints beside the stream pinned (state_store.savepoint.pin), left over."""
    return [p.name for p in config.checkpoint.parent.iterdir() if "pinned" in p.name]


def _start_run(config) -> subprocess.Popen:
    return subprocess.Popen([tool("sessionctl"), "run", "--poll-seconds", "1"], env=config_env(config),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=config.home.parent)


def _events_up_to(config, source_seq: int) -> list[dict]:
    """The accepted events the stream had consumed at `source_seq` (raw_events, read independently of the job)."""
    rows = DeltaTable(config.raw_events_table).to_pyarrow_table(
        columns=["ingest_seq", "reject_reason", "event_id", "user_id", "event_time", "event_type"]).to_pylist()
    return [{"event_id": r["event_id"], "user_id": r["user_id"], "event_type": r["event_type"],
             "event_time_ms": int(r["event_time"].timestamp() * 1000)}
            for r in rows if r["ingest_seq"] <= source_seq and r["reject_reason"] is None]


def _assert_restored_exactly(config, spark, source_seq: int) -> None:
    """After a restore: written sessions + open state = the oracle's sessions of the events up to source_seq,
    each once, on one side only (whatever the watermark has closed so far)."""
    oracle = run_oracle([_events_up_to(config, source_seq)], GAP_MS, LATENESS_MS)
    written, open_now = read_sessions(config), read_open_sessions(spark, config)
    assert not set(written) & set(open_now), "a session both written and open"
    assert len(set(written)) == len(written), "a session written twice"
    assert sorted(written + open_now) == sorted(set(oracle.closed) | set(oracle.open_sessions))


def _assert_clean_exit(run: subprocess.Popen, out: str, err: str) -> None:
    """No traceback, no JVM fatal-error banner, no hs_err file: a summary (exit 0) or one line (exit 130)."""
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    banner = [line for line in (out + err).splitlines() if line.startswith("#")]
    assert not banner, "JVM fatal-error banner:\n" + "\n".join(banner[:20])
    if run.returncode == 0:
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["stopped_by"] in ("caller", "stop request")
    else:
        assert run.returncode == 130, err[-3000:]
        lines = [line for line in err.strip().splitlines() if not line.startswith("WARNING: Using incubator")]
        assert lines[-1] == "sessionctl run: interrupted", err[-3000:]


@pytest.mark.parametrize("provider,store", [("rocksdb", "s3"), ("hdfs", "local")])
def test_savepoints_of_a_running_stream_and_stop_with_savepoint_restore_exactly_once(tmp_path, spark, provider, store,
                                                                                      request):
    savepoints = str(tmp_path / "savepoints")
    if store == "s3":  # savepoints on a real S3 HTTP endpoint (moto server on loopback)
        request.getfixturevalue("s3_endpoint")
        savepoints = f"s3://savepoints/{tmp_path.name}"
    # Spark keeps 3 versions only: the stream's retention removes the online savepoint's batch while it is read
    # (a batch a second), which a savepoint that did not pin its batch first fails on.
    config = make_config(tmp_path, provider, SESSIONS_SAVEPOINT_URI=savepoints, SESSIONS_MIN_BATCHES_TO_RETAIN=RETAIN)
    chunks = in_order_chunks(users=60, seed=31, parts=10)
    run = _start_run(config)
    early = Feeder(config.landing, chunks[:5], every=1.5, prefix="early")
    early.start()
    try:
        wait_until(lambda: still_running(run) and _committed(config) >= 1, timeout_s=180, interval_s=0.5,
                   what="the stream's first batches")
        # the early files all landed first: a later file ingested before an earlier one would make the
        # earlier one's events late (in order only as a whole)
        early.join()
        feeder = Feeder(config.landing, chunks[5:], every=1.5)
        feeder.start()  # files keep landing while the savepoint reads
        online = take_savepoint(config, spark=spark)  # beside the running stream
        assert online.status == "complete" and run.poll() is None, "the stream must keep running"
        assert not _pinned_copies(config), "the savepoint's pinned copy of its batch is gone"
        wait_until(lambda: still_running(run) and _committed(config) > online.batch_id, timeout_s=120, interval_s=0.5,
                   what="a batch committed after the savepoint")
        feeder.join()
        stopped = subprocess.run([tool("sessionctl"), "stop", "--savepoint", "--json"], env=config_env(config),
                                 capture_output=True, text=True, timeout=600)
        assert stopped.returncode == 0, stopped.stderr
        answer = json.loads(stopped.stdout)
        out, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, err[-3000:]
    _assert_clean_exit(run, out, err)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["stopped_by"] == "stop request" and summary["savepoint"]["savepoint_id"] == answer["savepoint_id"]
    # The stop's savepoint is of the stream's very last committed batch, and the catalog lists it.
    assert answer["stopped"] and answer["trigger"] == "stop"
    assert answer["batch_id"] == answer["last_committed_batch"] == _committed(config)
    complete = [r.savepoint_id for r in SavepointStore.of(config).list() if r.status == "complete"]
    assert complete == [answer["savepoint_id"], online.savepoint_id]
    assert online.uri.startswith(savepoints) and answer["uri"].startswith(savepoints)

    expected_all = expected_closed_sessions(chunks, GAP_MS, LATENESS_MS)
    for savepoint_id, source_seq in ((answer["savepoint_id"], answer["source_seq"]),
                                     (online.savepoint_id, online.source_seq)):
        restore(config, savepoint_id, spark=spark)
        _assert_restored_exactly(config, spark, source_seq)
        catch_up(config, spark)
        assert read_sessions(config) == sorted(expected_all), f"after restoring {savepoint_id} and catching up"
    # Back on the online savepoint's timeline, the stop savepoint (taken after it) lost its sessions to that
    # restore's roll-back: restoring it now is refused in one line, not a silent loss.
    with pytest.raises(SavepointIncompatible, match="timeline that a later restore abandoned"):
        restore(config, answer["savepoint_id"], spark=spark)


def test_kill_9_of_a_savepoint_or_of_the_stream_during_one(tmp_path, spark):
    config = make_config(tmp_path, "rocksdb")
    chunks = in_order_chunks(users=60, seed=37, parts=8)
    run = _start_run(config)
    Feeder(config.landing, chunks[:4], every=1.0).start()
    try:
        wait_until(lambda: still_running(run) and _committed(config) >= 1, timeout_s=180, interval_s=0.5,
                   what="the stream's first batches")
        # Killed between its lease and its catalog row (JVM start-up to state read): no complete savepoint appears.
        # A savepoint that finished before the kill (a faster JVM start: CI once saw it done in 4.2 s) did not test
        # that, so the next attempt kills it earlier.
        def complete() -> set[str]:
            return {r.savepoint_id for r in SavepointStore.of(config).list() if r.status == "complete"}

        for delay in (random.Random(5).uniform(1.0, 2.5), 0.7, 0.3, 0.1):
            before = complete()
            victim = subprocess.Popen([tool("sessionctl"), "savepoint", "--json"], env=config_env(config),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            wait_until(lambda v=victim: v.poll() is not None or live_holder(config.lease_dir, "lifecycle") is not None,
                       timeout_s=120, what="the savepoint's lease")  # (one that already ended is judged below)
            # A moment into the savepoint is the point (no state marks "JVM starting" or "reading state"); what the
            # kill hit is checked below, and an attempt that finished first is repeated with a shorter delay.
            time.sleep(delay)
            victim.send_signal(signal.SIGKILL)
            victim.communicate()
            assert run.poll() is None, "a killed savepoint must not touch the stream"
            appeared = complete() - before
            for savepoint_id in appeared:  # finished before the kill, or killed after its catalog row: whole
                validate_savepoint(config, savepoint_id)  # re-reads its state: rows and checksum as catalogued
            if victim.returncode == -signal.SIGKILL and not appeared:
                break  # killed mid-way, and it left no complete savepoint
            wait_until(lambda: live_holder(config.lease_dir, "lifecycle") is None, timeout_s=120, interval_s=0.5,
                       what="the lease after it")
        else:
            pytest.fail("every savepoint attempt completed before its kill: none was killed mid-way")
        after_kill = take_savepoint(config, spark=spark)  # the dead holder's lease is broken at once (same host)
        assert after_kill.status == "complete"

        # Now the stream dies (kill -9) while a savepoint reads beside it: the savepoint finishes or fails in one line.
        outcome: dict = {}

        def savepoint_beside() -> None:
            try:
                outcome["info"] = take_savepoint(config, spark=spark)
            except SavepointFailed as error:
                outcome["error"] = str(error)

        beside = threading.Thread(target=savepoint_beside)
        beside.start()
        # Killed once the savepoint is under way (it holds the lifecycle lease), not after a guessed second.
        wait_until(lambda: live_holder(config.lease_dir, "lifecycle") is not None or not beside.is_alive(),
                   timeout_s=120, interval_s=0.02, what="the savepoint beside the stream to take its lease")
        during = beside.is_alive()
        run.send_signal(signal.SIGKILL)
        run.communicate()
        beside.join(timeout=300)
        assert during, f"the savepoint ended before the stream was killed: {outcome}"
        assert "info" in outcome or "\n" not in outcome["error"]
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    # Restarted: the rest lands, the job catches up exactly once.
    for i, chunk in enumerate(chunks[4:]):
        land(config.landing, f"late-{i:04d}.jsonl", [json.dumps(e) for e in chunk])
    catch_up(config, spark)
    got = read_sessions(config)
    assert len({row[0] for row in got}) == len(got), "a session was written twice"
    assert got == sorted(expected_closed_sessions(chunks, GAP_MS, LATENESS_MS))


@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_ctrl_c_at_random_moments_is_one_line_or_the_summary(tmp_path, spark, provider):
    """A short campaign: Ctrl-C from JVM start-up to the middle of batches. Never a traceback, a JVM banner or an
    hs_err file; afterwards the job catches up exactly once."""
    config = make_config(tmp_path, provider)
    chunks = in_order_chunks(users=40, seed=41, parts=6)
    rng = random.Random(43 if provider == "rocksdb" else 47)
    for i, chunk in enumerate(chunks[:3]):
        land(config.landing, f"first-{i:04d}.jsonl", [json.dumps(e) for e in chunk])
    # Three windows: the JVM's start-up (0.5-4 s), the query's start and state load (6-12 s), batches (14-22 s). The
    # start-up is the same for both providers (RocksDB takes it), the query's start goes to HDFS, both get batches.
    windows = [(0.5, 4), (14, 22)] if provider == "rocksdb" else [(6, 12), (14, 22)]
    for attempt, delay in enumerate([rng.uniform(*window) for window in windows]):
        land(config.landing, f"more-{attempt:04d}.jsonl", [json.dumps(e) for e in chunks[3 + attempt]])
        run = _start_run(config)
        time.sleep(delay)  # a random moment of the window is the point; the run must still be there to interrupt
        assert run.poll() is None, f"the run ended by itself before the Ctrl-C at {delay:.1f} s: {run.communicate()}"
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=300)
        _assert_clean_exit(run, out, err)
        assert not list(config.home.parent.glob("hs_err_pid*.log")), f"JVM crash file after Ctrl-C at {delay:.1f} s"
    for i, chunk in enumerate(chunks[3 + len(windows):]):
        land(config.landing, f"last-{i:04d}.jsonl", [json.dumps(e) for e in chunk])
    catch_up(config, spark)
    got = read_sessions(config)
    assert len({row[0] for row in got}) == len(got), "a session was written twice"
    assert got == sorted(expected_closed_sessions(chunks, GAP_MS, LATENESS_MS))


@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_rescale_of_a_running_stream_between_two_batches(tmp_path, spark, provider):
    """`sessionctl rescale` beside a running `sessionctl run` (files landing all the while): prepared beside the
    stream (the pre-rescale savepoint, restored at the new count into a side checkpoint kept as its native copy), then
    swapped in by the stream between two batches, which goes on without a restart (where no native copy can be kept,
    the stream does the whole rescale between two batches: test_a_running_stream_killed_inside_its_rescale_...). The
    answer gives the downtime, measured from Spark's progress (the end of the last batch before to the end of the
    first after). Then every session exactly once against the oracle, the open ones in the rescaled state."""
    # Spark keeps 3 versions only: the pre-rescale savepoint's batch is removed from the live checkpoint while the
    # savepoint reads it (it reads its pinned copy).
    config = make_config(tmp_path, provider, SESSIONS_STATE_PARTITIONS=2, SESSIONS_MIN_BATCHES_TO_RETAIN=RETAIN)
    # Files land a second apart for longer than the rescale takes beside the stream: one is waiting after it.
    chunks = in_order_chunks(users=60, seed=41, parts=60)
    run = _start_run(config)
    early = Feeder(config.landing, chunks[:4], every=1.0, prefix="early")
    early.start()
    try:
        wait_until(lambda: still_running(run) and _committed(config) >= 1, timeout_s=180, interval_s=0.5,
                   what="the stream's first batches")
        # the early files all landed first: a later file ingested before an earlier one would make the
        # earlier one's events late (in order only as a whole)
        early.join()
        feeder = Feeder(config.landing, chunks[4:], every=1.0)
        feeder.start()  # files keep landing through the rescale: a batch is waiting when the stream resumes
        # The rescale the operator asks for, from this process: the library call `sessionctl rescale` makes, its
        # preparation (the pre-rescale savepoint, the side checkpoint) in the tests' warm session instead of a JVM
        # started for it; its answer is the command's JSON (`.to_dict()`, what cmd_rescale prints).
        answer = json.loads(json.dumps(rescale(config, 3, spark=spark).to_dict()))
        assert run.poll() is None, "the stream must keep running"
        feeder.hurry.set()  # the rescale is answered: the first batch after it ran (its downtime is measured)
        feeder.join()
        out, err = _caught_up_then_stopped(config, run, after="rescale")
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    _assert_clean_exit(run, out, err)
    assert (answer["partitions_before"], answer["partitions_after"], answer["method"]) == (2, 3, "prepared"), answer
    assert inspect_checkpoint(config.checkpoint).partitions == 3
    assert answer["stream"].startswith("run"), answer
    assert "pre_rescale_savepoint" in answer["phases"] and sum(answer["phases"].values()) <= answer["seconds"] + 0.01
    # The stream's part: the native files copied in and its outputs rolled back.
    assert list(answer["phases"]) == ["pre_rescale_savepoint", "side_checkpoint_built", "native_copied",
                                      "swap_preflight", "swap_native_copied", "swap_outputs_rolled_back"], \
        answer["phases"]
    assert not [p for p in config.checkpoint.parent.iterdir() if "prepared" in p.name], "the side checkpoint is gone"
    assert not _pinned_copies(config), "the pre-rescale savepoint's pinned copy of its batch is gone"
    # The side checkpoint stopped after its bootstrap (marker) batch and wrote no output: the sessions its savepoint
    # held as due are closed by the stream's first batch after the swap, after its rollback (else they are lost).
    copy = Path(native_uri(config.savepoint_uri, answer["savepoint_id"]))
    side = json.loads((copy / "_job.json").read_text())["incarnation"]
    assert json.loads((copy / MANIFEST).read_text())["batch_id"] == 0
    assert side not in set(DeltaTable(config.sessions_table).to_pyarrow_table(columns=["incarnation"])
                           ["incarnation"].to_pylist())
    # A batch was waiting (the feeder lands a file a second): the first one after the rescale ran within the wait.
    assert answer.get("downtime_seconds") is not None and 0 < answer["resumed_seconds"] <= answer["downtime_seconds"], json.dumps(answer)
    print("rescale of a running stream:", answer)  # (shown with -rP: the downtime on this machine)
    _assert_every_session_once(config, spark, chunks)


def test_restore_of_a_running_stream_between_two_batches(tmp_path, spark):
    """`sessionctl restore --online` beside a running `sessionctl run` (files landing all the while): the stream
    restores an older savepoint between two batches -- the sessions it wrote since rolled back, the events since
    replayed -- and goes on without a restart; the answer gives its downtime. Then every session exactly once
    against the oracle of every event, the open ones in the restored stream's state."""
    config = make_config(tmp_path, "rocksdb", SESSIONS_STATE_PARTITIONS=2)
    chunks = in_order_chunks(users=60, seed=47, parts=10)
    run = _start_run(config)
    early = Feeder(config.landing, chunks[:4], every=0.5, prefix="early")
    early.start()
    try:
        wait_until(lambda: still_running(run) and _committed(config) >= 1 and _all_processed(config), timeout_s=180,
                   interval_s=0.5, what="the early files processed")
        saved = take_savepoint(config, spark=spark).to_dict()  # beside the running stream, from this process
        # the early files all landed first: a later file ingested before an earlier one would make the
        # earlier one's events late (in order only as a whole)
        early.join()
        feeder = Feeder(config.landing, chunks[4:], every=1.0)
        feeder.start()  # files keep landing through the restore
        wait_until(lambda: still_running(run) and _committed(config) >= saved["batch_id"] + 3, timeout_s=180,
                   interval_s=0.5, what="batches after the savepoint")
        restored = subprocess.run([tool("sessionctl"), "restore", "--online", "--savepoint", saved["savepoint_id"]],
                                  env=config_env(config), capture_output=True, text=True, timeout=600)
        assert restored.returncode == 0, restored.stderr[-3000:]
        answer = json.loads(restored.stdout.strip().splitlines()[-1])
        assert run.poll() is None, "the stream must keep running"
        feeder.join()
        out, err = _caught_up_then_stopped(config, run, after="restore")
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    _assert_clean_exit(run, out, err)
    assert (answer["savepoint_id"], answer["source_seq"], answer["verified"]) == \
        (saved["savepoint_id"], saved["source_seq"], True), answer
    assert answer["stream"].startswith("run"), answer
    # Three batches ran after the savepoint (this seed closes sessions in them): the restore rolled them back.
    assert answer["rolled_back"]["sessions"] > 0, answer
    assert answer.get("downtime_seconds") is not None and 0 < answer["resumed_seconds"] <= answer["downtime_seconds"], json.dumps(answer)
    print("restore of a running stream:", answer)  # (shown with -rP: the downtime on this machine)
    _assert_every_session_once(config, spark, chunks)


def _caught_up_then_stopped(config, run: subprocess.Popen, *, after: str) -> tuple[str, str]:
    """Once every landed file is ingested and processed by the running stream, `sessionctl stop`; its output."""
    wait_until(lambda: still_running(run) and _all_processed(config), timeout_s=180, interval_s=0.5,
               what=f"every file ingested and processed after the {after}")
    stopped = subprocess.run([tool("sessionctl"), "stop"], env=config_env(config), capture_output=True, text=True,
                             timeout=600)
    assert stopped.returncode == 0, stopped.stderr
    return run.communicate(timeout=300)


def _assert_every_session_once(config, spark, chunks) -> None:
    """Written sessions + open state = the oracle's sessions of every event, each once, on one side only."""
    oracle = _oracle_all(chunks)
    written, open_now = read_sessions(config), read_open_sessions(spark, config)
    assert len(set(written)) == len(written), "a session written twice"
    assert not set(written) & set(open_now), "a session both written and open"
    assert sorted(written + open_now) == sorted(set(oracle.closed) | set(oracle.open_sessions))


def _oracle_all(chunks):
    return run_oracle([[{"event_id": e["event_id"], "user_id": e["user_id"], "event_type": e["event_type"],
                         "event_time_ms": iso_ms(e["event_time"])} for chunk in chunks for e in chunk]],
                      GAP_MS, LATENESS_MS)


@contextmanager
def _run_killed_at(config, point: str) -> Iterator[subprocess.Popen]:
    """`sessionctl run` that SIGKILLs itself (and its JVM: its own process group) at the named kill point; the block
    asks it for what reaches the point, then the run is waited for (killed here if it is still running)."""
    run = subprocess.Popen([tool("sessionctl"), "run", "--poll-seconds", "1"],
                           env={**config_env(config), "SESSIONS_KILL_AT": point}, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, cwd=config.home.parent, start_new_session=True)
    try:
        yield run
        run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.communicate()
    assert run.returncode == -signal.SIGKILL, "the stream reached the kill point"


def _assert_went_away(asked: subprocess.CompletedProcess | StopIncomplete, what: str) -> None:
    """The requester of a stream killed inside the change: exit 1, one line, run the same change again (a
    `sessionctl` process's exit code and stderr, or the StopIncomplete an in-process call raised: the line the CLI
    prints after `sessionctl <command>: `)."""
    if isinstance(asked, StopIncomplete):
        said = str(asked).strip()
        assert "\n" not in said and "Traceback" not in said, said
    else:
        said = asked.stderr.strip()
        assert asked.returncode == 1 and "\n" not in said and "Traceback" not in said, said
    assert f"went away before it answered the {what}" in said and f"run the same {what} again" in said, said


def _all_processed(config) -> bool:
    """Every landed file ingested and processed by the stream."""
    return not list(config.landing.glob("*.jsonl")) and stream_caught_up(config)


@pytest.mark.parametrize("point,partitions_after_kill,method_after", [
    ("restore:aside", None, "prepared"), ("restore:rolled-back", None, "prepared"),
    ("rescale:saved", 2, "repartition"), ("rescale:moved", 3, "none")])
def test_a_running_stream_killed_inside_its_rescale_loses_nothing(tmp_path, spark, point, partitions_after_kill,
                                                                  method_after):
    """`sessionctl run` SIGKILLed inside the rescale it was asked for. Prepared beside it, the stream's part is a
    restore of the pre-rescale savepoint from its native copy: killed with the old checkpoint set aside, or with its
    outputs rolled back (the restore half done). Done by the stream between two batches (no native copy can be kept:
    the savepoints' native/ folder is a file): after its pre-rescale savepoint (the state not moved yet), or after
    Spark's repartition (before it runs again). The requester says in one line that the stream went away and to run
    the same rescale again; that rescale (the stream stopped, so here) finishes the job, and the catch-up after it
    writes every session exactly once against the oracle."""
    from pipelines.job.checkpoint import read_restore_marker

    config = make_config(tmp_path, "rocksdb", SESSIONS_STATE_PARTITIONS=2)
    chunks = in_order_chunks(users=60, seed=43, parts=6)
    if point.startswith("rescale:"):
        blocked = Path(config.savepoint_uri) / "native"
        blocked.parent.mkdir(parents=True, exist_ok=True)
        blocked.write_text("not a folder")
    feeder = Feeder(config.landing, chunks[:3], every=1.0, prefix="early")
    with _run_killed_at(config, point) as run:
        feeder.start()
        wait_until(lambda: still_running(run) and _committed(config) >= 1, timeout_s=180, interval_s=0.5,
                   what="the stream's first batches")
        # The requester, from this process (the library call of `sessionctl rescale`, whose preparation needs a
        # Spark session: the tests' warm one instead of a JVM started for it); the CLI turns its error into its one
        # line and exit 1 (sessionctl.cli.main, test_one_line_errors).
        with pytest.raises(StopIncomplete) as asked:
            rescale(config, 3, spark=spark)
    _assert_went_away(asked.value, "rescale")
    if partitions_after_kill is None:  # the restore is half done: the marker names it
        assert read_restore_marker(config.checkpoint)["command"].endswith("--partitions 3")
    else:
        assert inspect_checkpoint(config.checkpoint).partitions == partitions_after_kill
    # The same rescale, the stream gone: done here, by the library call `sessionctl rescale` makes in its process
    # (the command's exit code and JSON: test_lifecycle's and the campaign's `sessionctl rescale` processes).
    assert rescale(config, 3, spark=spark).method == method_after
    feeder.join()
    for i, chunk in enumerate(chunks[3:], start=3):
        land(config.landing, f"late-{i:04d}.jsonl", [json.dumps(e) for e in chunk])
    catch_up(config, spark)
    assert inspect_checkpoint(config.checkpoint).partitions == 3
    _assert_every_session_once(config, spark, chunks)


@pytest.mark.parametrize("point", ["restore:aside", "restore:rolled-back"])
def test_a_running_stream_killed_inside_its_restore_loses_nothing(tmp_path, spark, point):
    """`sessionctl run` SIGKILLed inside the restore it was asked for (`restore --online`): with the old checkpoint
    set aside and nothing else changed, or with the outputs rolled back to the savepoint and the new state not built.
    The requester says in one line that the stream went away and to run the same restore again; the restore is
    half done (the marker names the command, a catch-up refuses); the same command, the stream gone, finishes it
    here, and the catch-up after it writes every session exactly once against the oracle of every event."""
    from pipelines.errors import RestoreIncomplete
    from pipelines.job.checkpoint import read_restore_marker

    config = make_config(tmp_path, "rocksdb", SESSIONS_STATE_PARTITIONS=2)
    chunks = in_order_chunks(users=60, seed=53, parts=8)
    env = config_env(config)
    with _run_killed_at(config, point) as run:
        early = Feeder(config.landing, chunks[:3], every=0.5, prefix="early")
        early.start()
        early.join()  # all landed before they are awaited: the files after the savepoint must come after them
        wait_until(lambda: still_running(run) and _all_processed(config), timeout_s=180, interval_s=0.5,
                   what="the early files processed")
        saved = take_savepoint(config, spark=spark)  # beside the running stream, from this process
        for i, chunk in enumerate(chunks[3:6], start=3):
            land(config.landing, f"after-{i:04d}.jsonl", [json.dumps(e) for e in chunk])
        wait_until(lambda: still_running(run) and _all_processed(config), timeout_s=180, interval_s=0.5,
                   what="the files after the savepoint processed")
        assert _committed(config) > saved.batch_id
        asked = subprocess.run([tool("sessionctl"), "restore", "--online", "--savepoint", saved.savepoint_id],
                               env=env, capture_output=True, text=True, timeout=600)
    _assert_went_away(asked, "restore")
    command = f"sessionctl restore --savepoint {saved.savepoint_id}"
    assert read_restore_marker(config.checkpoint)["command"] == command
    with pytest.raises(RestoreIncomplete, match="sessionctl restore --savepoint"):
        catch_up(config, spark)
    # As the line said: the same restore, the stream gone, done here (the library call of `sessionctl restore`; the
    # command's exit code and JSON after a kill: test_restore_marker's).
    finished = restore(config, saved.savepoint_id, online=True, spark=spark)
    assert finished.savepoint_id == saved.savepoint_id, finished
    assert read_restore_marker(config.checkpoint) is None
    for i, chunk in enumerate(chunks[6:], start=6):
        land(config.landing, f"late-{i:04d}.jsonl", [json.dumps(e) for e in chunk])
    catch_up(config, spark)
    _assert_every_session_once(config, spark, chunks)
