"""Locks that hold across hosts: the job/lifecycle leases live beside the checkpoint (one shared filesystem), not
in each host's SESSIONS_HOME; a dead holder's lease is broken at once on its own host, after its expiry elsewhere."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipelines.coordination.job_leases import job_lock
from pipelines.coordination.lease_stores import store_for
from pipelines.coordination.leases import LeaseHeld, LeaseInfo, acquire, holding, lease, live_holder, waiting_lease
from pipelines.coordination.liveness import identity
from pipelines.errors import ConfigError, JobRunning, LeaseLost, LeaseWaitTimedOut
from tests.kit.homes import config_env, make_config, tool
from tests.kit.waits import wait_until

pytestmark = pytest.mark.tier("pure")
# Parametrized tests whose cases differ in tier (tests/conftest.py reads this)
TIER_OF_CASE = {
    "test_processes_racing_for_an_expired_lease_exactly_one_wins[local]": "subprocess",
    "test_a_holder_paused_past_the_ttl_is_fenced_and_never_touches_the_newer_holder[local]": "subprocess",
    "test_processes_racing_for_an_expired_lease_exactly_one_wins[s3]": "e2e",
    "test_a_holder_paused_past_the_ttl_is_fenced_and_never_touches_the_newer_holder[s3]": "e2e",
    "test_renewals_lapsed_past_the_ttl_fence_the_holder_even_when_nobody_took_over[s3]": "e2e",
    "test_an_empty_lease_record_is_recovered_after_the_ttl[s3]": "e2e",
    "test_waiting_for_a_lease_has_a_deadline_that_names_the_holder[s3]": "e2e",
    "test_a_pid_is_judged_only_in_its_own_host_boot_and_pid_namespace[s3]": "e2e",
    "test_old_epoch_records_are_collected_and_a_hand_emptied_store_starts_a_new_series[s3]": "e2e",
    "test_job_lock_and_stop_requests_live_at_the_lease_uri[s3]": "e2e",
    # On the suite's HDFS (a session fixture started on first use): every case of the lease store's contract.
    **{f"{test}[hdfs]": "e2e" for test in (
        "test_processes_racing_for_an_expired_lease_exactly_one_wins",
        "test_a_holder_paused_past_the_ttl_is_fenced_and_never_touches_the_newer_holder",
        "test_renewals_lapsed_past_the_ttl_fence_the_holder_even_when_nobody_took_over",
        "test_a_swap_replaces_only_the_version_it_read", "test_a_renewal_never_overwrites_a_write_made_after_its_read",
        "test_an_empty_lease_record_is_recovered_after_the_ttl",
        "test_waiting_for_a_lease_has_a_deadline_that_names_the_holder",
        "test_a_pid_is_judged_only_in_its_own_host_boot_and_pid_namespace",
        "test_old_epoch_records_are_collected_and_a_hand_emptied_store_starts_a_new_series",
        "test_job_lock_and_stop_requests_live_at_the_lease_uri")},
}


@pytest.mark.tier("subprocess")
def test_two_hosts_with_separate_homes_share_the_lease(tmp_path):
    """Two processes, each its own SESSIONS_HOME, one shared checkpoint filesystem."""
    shared = tmp_path / "shared-checkpoints"
    host_a = make_config(tmp_path / "a", SESSIONS_CHECKPOINT_URI=shared)
    host_b = make_config(tmp_path / "b", SESSIONS_CHECKPOINT_URI=shared)
    assert host_a.lease_dir == host_b.lease_dir
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys; from pipelines.coordination.job_leases import job_lock; from tests.kit.homes import make_config; "
        f"config = make_config({str(tmp_path / 'a')!r}, SESSIONS_CHECKPOINT_URI={str(shared)!r}); "
        "lock = job_lock(config, 'run'); lock.__enter__(); print('held', flush=True); sys.stdin.read()")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=os.getcwd())  # holds until killed
    try:
        assert holder.stdout.readline().strip() == "held"
        refused = subprocess.run([tool("sessionctl"), "catch-up"], env=config_env(host_b),
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        line = refused.stderr.strip()
        assert "\n" not in line and line.startswith(f"sessionctl catch-up: the job is running: run (pid {holder.pid} on ")
        assert str(host_b.lease_dir / "job.lease") in line
    finally:
        holder.kill()
        holder.wait()
    with job_lock(host_b, "savepoint"):  # the holder was killed on this host: its lease is broken at once
        pass


def _plant(directory, name: str, **fields) -> None:
    """A lease in the single-file format before epochs (`<name>.lease`), as a process of an older version holds it."""
    directory.mkdir(parents=True, exist_ok=True)
    info = {"what": "catch-up", "host": "other-host", "pid": 4242, "token": "t0", "expires_at": time.time() + 60}
    (directory / f"{name}.lease").write_text(json.dumps({**info, **fields}))


def test_a_live_lease_of_another_host_refuses_and_an_expired_one_is_broken(tmp_path):
    config = make_config(tmp_path)
    _plant(config.lease_dir, "job")
    with pytest.raises(JobRunning, match=r"the job is running: catch-up \(pid 4242 on other-host\)"), \
            job_lock(config, "savepoint"):
        pass
    _plant(config.lease_dir, "job", expires_at=time.time() - 1)
    with job_lock(config, "savepoint") as held:
        current = live_holder(config.lease_dir, "job")
        assert current is not None and current.what == "savepoint" and current.pid == os.getpid()
        assert current.token == held.token and current.epoch == held.epoch == 1
    assert not (config.lease_dir / "job.lease").exists()  # the old format's lease was removed once expired
    assert live_holder(config.lease_dir, "job") is None   # released


def test_the_holder_renews_its_lease(tmp_path):
    with lease(tmp_path, "job", "run", ttl_s=1.5) as held:
        first = held.info.expires_at
        # The renewal thread (every TTL/3) moves the record's expiry on, before the first one is reached.
        current = wait_until(lambda: (info := live_holder(tmp_path, "job")) and info.expires_at > first and info,
                             timeout_s=30, what="the holder's renewal of its lease record")
        assert current.token == held.token
        with pytest.raises(LeaseHeld), lease(tmp_path, "job", "savepoint", ttl_s=1.5):
            pass
        held.check()


def test_stop_request_is_answered_and_a_joined_stop_without_savepoint_says_so(tmp_path, monkeypatch):
    """The stop protocol without Spark: a holder of the job lease (as `run`) answers the request it finds; a
    `stop --savepoint` that joins an earlier request made without a savepoint is not reported as having one."""
    import threading

    from pipelines.coordination import requests
    from pipelines.coordination.requests import StopAnswer, answer_request, pending_request, request_stop
    from pipelines.errors import NotRunning, StopIncomplete
    from state_store import stream_control
    from state_store.stream_control import stop_stream

    joined_requests: list = []  # the requests stop_stream made or joined, as it returns them

    def recording_request_stop(*args, **kwargs):
        made = requests.request_stop(*args, **kwargs)
        joined_requests.append(made)
        return made

    monkeypatch.setattr(stream_control, "request_stop", recording_request_stop)

    config = make_config(tmp_path)
    with pytest.raises(NotRunning, match="no stream is running"):
        stop_stream(config)
    with job_lock(config, "run") as held:
        first = request_stop(config, stream=held, savepoint=False)  # someone asked for a plain stop

        def stream_answers() -> None:
            request = wait_until(lambda: pending_request(config, held), timeout_s=30, what="the stop request")
            assert request.token == first.token
            # Answer only once the second stopper joined that request (else it would make its own, with a savepoint).
            wait_until(lambda: joined_requests, timeout_s=30, what="stop_stream joining the request")
            answer_request(config, request, StopAnswer(last_committed_batch=7))

        stream = threading.Thread(target=stream_answers)
        stream.start()
        with pytest.raises(StopIncomplete, match="without a savepoint") as joined:
            stop_stream(config, savepoint=True, timeout_s=30)
        stream.join()
    assert [r.token for r in joined_requests] == [first.token]  # joined, not a request of its own
    assert joined.value.next_step == "sessionctl savepoint"
    assert pending_request(config, held) is None  # answered: the request is gone



def test_erasure_requests_pending_together_are_one_erasure_and_each_requester_gets_its_answer(tmp_path):
    """Two `forget`s beside a running stream do not replace each other: the stream takes every erasure request
    pending between two batches as one (their users, each once), answers each requester and removes them; one made
    after it read them waits for the next boundary."""
    from pipelines.coordination.requests import (
        ErasureAnswer,
        answer_request,
        pending_request,
        request_erasure,
        take_answer,
    )

    config = make_config(tmp_path)
    with job_lock(config, "run") as held:
        first = request_erasure(config, stream=held, user_ids=["u1", "u2"])
        second = request_erasure(config, stream=held, user_ids=["u2", "u3"])
        assert first.token != second.token
        found = pending_request(config, held)
        assert found is not None and found.user_ids == ["u1", "u2", "u3"]
        assert {found.token, *found.joined} == {first.token, second.token}
        late = request_erasure(config, stream=held, user_ids=["u4"])  # after the stream read the others
        answer = ErasureAnswer(erased={"erasure_id": "er-1"})
        answer_request(config, found, answer)
        assert take_answer(config, first) == answer and take_answer(config, second) == answer
        after = pending_request(config, held)
        assert after is not None and after.token == late.token and after.user_ids == ["u4"] and after.joined == ()
        answer_request(config, after, answer)
        assert take_answer(config, late) == answer and pending_request(config, held) is None
        assert [name for name in store_for(config.lease_uri).names("erase.")] == []  # no request or answer is left


def test_a_rescale_beside_a_running_stream_is_asked_of_it_and_says_its_answer(tmp_path):
    """The rescale protocol without Spark: with a `run` holding the job lease (in this process, so the rescale is
    not prepared here: the stream does it between two batches), `rescale` makes a request and returns the stream's
    answer (its result and downtime); a failed one is one line with the next step, and so is a stream that goes away
    without answering."""
    from pipelines.coordination.requests import RescaleRequest, ResumedAnswer, answer_request, pending_request
    from pipelines.errors import StopIncomplete
    from state_store.rescale import rescale

    config = make_config(tmp_path)
    done = {"partitions_before": 2, "partitions_after": 3, "method": "repartition", "savepoint_id": "sp-1",
            "rows": 12, "seconds": 4.5}

    def answer_with(answer: ResumedAnswer, held) -> threading.Thread:
        def stream() -> None:
            request = wait_until(lambda: pending_request(config, held), timeout_s=30, what="the rescale request")
            assert isinstance(request, RescaleRequest) and request.partitions == 3
            answer_request(config, request, answer)
        thread = threading.Thread(target=stream)
        thread.start()
        return thread

    with job_lock(config, "run") as held:
        thread = answer_with(ResumedAnswer(result=done, downtime_s=2.25, resumed_s=1.5), held)
        result = rescale(config, 3, timeout_s=30)
        thread.join()
        said = result.to_dict()
        assert said.pop("stream").startswith("run"), result  # the stream that did it: its lease holder
        assert said == {**done, "phases": {}, "downtime_seconds": 2.25, "resumed_seconds": 1.5}
        thread = answer_with(ResumedAnswer(error="the lifecycle lease is held by compact"), held)
        with pytest.raises(StopIncomplete, match="could not rescale .the lifecycle lease is held by compact.") as failed:
            rescale(config, 3, timeout_s=30)
        thread.join()
        assert failed.value.next_step == "sessionctl rescale --partitions 3"
        assert pending_request(config, held) is None  # answered: the request is gone
    with job_lock(config, "run") as other:  # a stream that never answers, then goes away
        def go_away() -> None:
            wait_until(lambda: pending_request(config, other), timeout_s=30, what="the rescale request")
            other.release()
        thread = threading.Thread(target=go_away)
        thread.start()
        with pytest.raises(StopIncomplete, match="went away before it answered the rescale"):
            rescale(config, 3, timeout_s=30)
        thread.join()


def test_an_online_restore_is_asked_of_the_running_stream_after_its_preflight(tmp_path):
    """`restore --online` without Spark: with a `run` holding the job lease, the requester resolves `latest` to an
    id and runs the pre-flight itself -- a savepoint the settings cannot restore is refused in one line and the
    stream is never asked -- then asks the stream and returns its answer (the restore's result and downtime).
    Without --online, a running stream is a refusal, as before."""
    from pipelines.coordination.requests import RestoreRequest, ResumedAnswer, answer_request, pending_request
    from pipelines.errors import SavepointIncompatible
    from state_store.lifecycle import restore
    from tests.test_one_line_errors import a_savepoint

    config = make_config(tmp_path, SESSIONS_GAP_MINUTES=30, SESSIONS_LATENESS_MINUTES=10,
                         SESSIONS_STATE_BUCKETS=1024)
    savepoint_id = a_savepoint(config.home)
    done = {"savepoint_id": savepoint_id, "batch_id": 0, "rows": 0, "checksum": "c", "verified": True,
            "source_seq": 0, "watermark_ms": 0, "provider": "rocksdb", "partitions": 2, "rolled_back": {},
            "previous_checkpoint": None, "seconds": 3.5, "phases": {"bootstrap": 1.0}, "method": "native"}
    asked: list[RestoreRequest] = []

    with job_lock(config, "run") as held:
        def stream() -> None:
            request = wait_until(lambda: pending_request(config, held), timeout_s=30, what="the restore request")
            assert isinstance(request, RestoreRequest)
            asked.append(request)
            answer_request(config, request, ResumedAnswer(result=done, downtime_s=4.0, resumed_s=3.0))
        thread = threading.Thread(target=stream)
        thread.start()
        result = restore(config, "latest", online=True, timeout_s=30)
        thread.join()
        assert (asked[0].savepoint, asked[0].partitions, asked[0].migrate, asked[0].canonical) == \
            (savepoint_id, None, False, False)
        said = result.to_dict()
        assert said.pop("stream").startswith("run"), said
        assert said == {**done, "downtime_seconds": 4.0, "resumed_seconds": 3.0}

        other_gap = config.with_(gap_minutes=5)
        with pytest.raises(SavepointIncompatible, match="gap"):
            restore(other_gap, savepoint_id, online=True, timeout_s=30)
        assert pending_request(config, held) is None  # refused before the stream was asked
        with pytest.raises(JobRunning):
            restore(config, savepoint_id, timeout_s=30)


# ---- leases with epochs, on every store (a shared directory, S3 with conditional writes, HDFS by WebHDFS) --------

@pytest.fixture(params=["local", "s3", "hdfs"])
def lease_location(request, tmp_path, monkeypatch):
    """Where the leases live: a directory, a prefix on the test S3 server (moto, real HTTP on loopback), or a directory
    on the suite's HDFS (a NameNode and a DataNode on loopback)."""
    if request.param == "local":
        return tmp_path / "leases"
    if request.param == "s3":
        request.getfixturevalue("s3_endpoint")
        return f"s3://warehouse/leases-{uuid.uuid4().hex[:8]}"
    hdfs = request.getfixturevalue("hdfs")
    # Its HTTP port is not WebHDFS's default: for this process and the racing ones it starts.
    monkeypatch.setenv("SESSIONS_WEBHDFS_ADDRESS", hdfs.webhdfs.removeprefix("http://"))
    return f"{hdfs.uri}/leases-{uuid.uuid4().hex[:8]}"


def _record(location, name: str, epoch: int, **fields) -> None:
    """Plant epoch `epoch` of lease `name` (a LeaseInfo with `fields`), or raw bytes with data=b"..."."""
    data = fields.pop("data", None)
    if data is None:
        info = {"what": "run", "host": "other-host", "pid": 4242, "token": uuid.uuid4().hex,
                "expires_at": time.time() + 60, "epoch": epoch, "series": "s1", **fields}
        data = json.dumps(info).encode()
    store_for(location).replace(f"{name}.lease.epoch-{epoch:012d}", data)


RACER = """
import sys
from pipelines.coordination.lease_stores import store_for
from pipelines.coordination.leases import LeaseHeld, acquire
location = sys.argv[1]
store_for(location)  # connected (S3: boto3 imported, a client made) before the start, so they race for real
print("ready", flush=True)
sys.stdin.readline()  # the start: the test sends it once every racer is ready
try:
    held = acquire(location, "job", "racer", 30.0)
    print(f"won {held.epoch}", flush=True)
except LeaseHeld as busy:
    print(f"held: {busy}", flush=True)
"""


def test_processes_racing_for_an_expired_lease_exactly_one_wins(lease_location):
    _record(lease_location, "job", 1, expires_at=time.time() - 1)  # the last holder's, expired
    for round_ in range(3):  # then each round's winner exits (dead here: broken at once) and they race again
        racers = [subprocess.Popen([sys.executable, "-c", RACER, str(lease_location)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=os.getcwd())
                  for _ in range(4)]
        ready = [racer.stdout.readline().strip() for racer in racers]  # blocks until each one is imported, connected
        assert ready == ["ready"] * 4, ([racer.poll() for racer in racers], ready)
        for racer in racers:  # the start, to all of them at once
            racer.stdin.write("go\n")
            racer.stdin.flush()
        outputs = [racer.communicate(timeout=60) for racer in racers]
        lines = [out.strip() for out, _ in outputs]
        assert all(racer.returncode == 0 for racer in racers), [err for _, err in outputs]
        assert lines.count(f"won {round_ + 2}") == 1, lines
        assert all(line.startswith("held: racer (pid ") for line in lines if not line.startswith("won")), lines
        record = store_for(lease_location).read(f"job.lease.epoch-{round_ + 2:012d}")
        winner = LeaseInfo.parse(record.data) if record else None
        assert winner is not None and winner.what == "racer" and f"won {winner.epoch}" in lines
        assert not store_for(lease_location).names(f"job.lease.epoch-{round_ + 3:012d}")


PAUSED = """
import sys, time
from pipelines.errors import LeaseLost
from pipelines.coordination.leases import lease
try:
    with lease(sys.argv[1], "job", "run", 2.0) as held:
        print(f"held {held.epoch}", flush=True)
        while True:
            held.check()
            time.sleep(0.1)  # the holder's work between checks (not a wait for anything)
except LeaseLost as lost:
    print(f"lost: {lost}", flush=True)
    sys.exit(3)
"""


def test_a_holder_paused_past_the_ttl_is_fenced_and_never_touches_the_newer_holder(lease_location):
    """SIGSTOP a holder past its TTL; another process takes the lease; SIGCONT: the old holder's next check() fails
    with LeaseLost naming the newer holder, and it neither renews nor releases anything of the newer one."""
    holder = subprocess.Popen([sys.executable, "-c", PAUSED, str(lease_location)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        assert holder.stdout.readline().strip() == "held 1"
        with pytest.raises(LeaseHeld, match=r"run \(pid \d+ on .*, epoch 1\)"):
            acquire(lease_location, "job", "restore", 2.0)
        os.kill(holder.pid, signal.SIGSTOP)
        # Stopped past its TTL: the point of the test. Wait for its record to expire (the process is alive, only
        # stopped, so nothing renews it) rather than for a guessed time.
        wait_until(lambda: _expired(lease_location, "job", 1), timeout_s=30, what="the stopped holder's record to expire")
        with lease(lease_location, "job", "restore", 30.0) as newer:
            assert newer.epoch == 2
            before = store_for(lease_location).read("job.lease.epoch-000000000002")
            os.kill(holder.pid, signal.SIGCONT)
            out, err = holder.communicate(timeout=30)
            assert holder.returncode == 3, err[-2000:]
            assert out.startswith("lost: the job lease ") and out.count("\n") == 1, out
            assert "epoch 1" in out and ("epoch 2, restore (pid" in out or "not renewed for" in out), out
            after = store_for(lease_location).read("job.lease.epoch-000000000002")
            assert before is not None and after is not None and after.data == before.data
            newer.check()  # still the holder
            current = live_holder(lease_location, "job")
            assert current is not None and current.token == newer.token
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGCONT)
            holder.kill()
            holder.wait()


def _expired(location, name: str, epoch: int) -> bool:
    """Epoch `epoch` of lease `name` is a readable record whose expiry is in the past."""
    record = store_for(location).read(f"{name}.lease.epoch-{epoch:012d}")
    info = LeaseInfo.parse(record.data) if record else None
    return info is not None and info.expires_at < time.time()


def _acquired(location, name: str, what: str, ttl_s: float):
    """acquire(), or None while the lease is held."""
    try:
        return acquire(location, name, what, ttl_s)
    except LeaseHeld:
        return None


def test_renewals_lapsed_past_the_ttl_fence_the_holder_even_when_nobody_took_over(lease_location):
    with pytest.raises(LeaseLost, match="not renewed for"), lease(lease_location, "job", "run", 30.0) as held:
        held.check()
        held._renewed_at -= 31  # as if the process had been stopped for 31 s (its monotonic clock moved on)
        with pytest.raises(LeaseLost, match=r"the job lease .* was lost by run \(pid \d+ on .*, epoch 1\): not renewed"):
            held.check()
        with pytest.raises(LeaseLost):
            held.renew()  # the renewal thread does not bring it back either
        raise held.lost  # type: ignore[misc]
    current = store_for(lease_location).read("job.lease.epoch-000000000001")
    assert current is not None and b'"released": false' in current.data  # a lost lease is never released


def test_a_swap_replaces_only_the_version_it_read(lease_location):
    """The compare-and-swap renewals rest on: a version read earlier no longer swaps once anyone rewrote the object,
    nor brings it back once it was removed; of writers racing from one version, exactly one wins."""
    store, name = store_for(lease_location), "job.lease.epoch-000000000001"
    assert store.create(name, b"one")
    first = store.read(name)
    assert first is not None and first.version
    assert store.swap(name, b"two", first.version)
    assert not store.swap(name, b"three", first.version)  # rewritten since `first` was read
    second = store.read(name)
    assert second is not None and second.data == b"two" and second.version != first.version
    barrier = threading.Barrier(6)

    def racer(k: int) -> bool:
        barrier.wait()
        return store.swap(name, f"racer {k}".encode(), second.version)

    with ThreadPoolExecutor(6) as pool:
        won = [k for k, ok in enumerate(pool.map(racer, range(6))) if ok]
    current = store.read(name)
    assert len(won) == 1 and current is not None and current.data == f"racer {won[0]}".encode(), won
    store.delete(name)
    assert not store.swap(name, b"four", current.version) and store.read(name) is None  # removed: not brought back


class _WriteBeforeSwap:
    """A lease store as its holder sees it while another process writes `other` into the record right before each
    of the holder's swaps (after the holder read it)."""

    def __init__(self, store, other: bytes) -> None:
        self.store, self.other = store, other

    def __getattr__(self, attr):
        return getattr(self.store, attr)

    def swap(self, name: str, data: bytes, version: str) -> bool:
        self.store.replace(name, self.other)
        return self.store.swap(name, data, version)


def test_a_renewal_never_overwrites_a_write_made_after_its_read(lease_location):
    """The renewal reads its record, checks its token, then writes: another write in between fences the holder and
    stays as written (a read-check-replace renewal would have overwritten it)."""
    with pytest.raises(LeaseLost), lease(lease_location, "job", "run", 30.0) as held:
        store, name = held.store, f"job.lease.epoch-{held.epoch:012d}"
        record = store.read(name)
        assert record is not None
        other = json.dumps({**json.loads(record.data), "what": "another writer"}).encode()
        held.store = _WriteBeforeSwap(store, other)
        with pytest.raises(LeaseLost, match=r"epoch 1\): its record .* was rewritten or removed by another process "
                                            "while it renewed"):
            held.renew()
        held.store = store
        after = store.read(name)
        assert after is not None and after.data == other
        with pytest.raises(LeaseLost):
            held.check()


def test_an_empty_lease_record_is_recovered_after_the_ttl(lease_location):
    """A kill between create and write, or a full disk, leaves an empty record: held until a TTL after it was
    written, then taken over -- never a LeaseHeld(None) forever."""
    _record(lease_location, "job", 1, data=b"")
    empty = store_for(lease_location).read("job.lease.epoch-000000000001")
    assert empty is not None and empty.data == b""
    with pytest.raises(LeaseHeld, match="an unreadable lease record .*job.lease.epoch-000000000001"):
        acquire(lease_location, "job", "run", 4.0)
    with pytest.raises(LeaseWaitTimedOut, match="unreadable lease record"), \
            waiting_lease(lease_location, "job", "run", 4.0, timeout_s=0.5):
        pass
    # The record's age is the store's own (S3: its Last-Modified), which a test cannot backdate: try until taken,
    # then check it was taken only once a TTL had passed since that write.
    taken = wait_until(lambda: _acquired(lease_location, "job", "run", 4.0), timeout_s=60, interval_s=0.2,
                       what="the empty lease record to expire")
    assert time.time() >= empty.mtime + 4.0
    with holding(taken) as held:
        assert held.epoch == 2 and held.info.series  # a new series (the unreadable record named none)


def test_an_empty_lease_file_of_the_old_format_is_recovered_after_the_ttl(tmp_path):
    tmp_path.joinpath("job.lease").write_bytes(b"")  # the operator's wedge: every command failed forever
    with pytest.raises(LeaseHeld, match="unreadable"):
        acquire(tmp_path, "job", "run", 2.0)
    past = time.time() - 2.5  # written more than a TTL ago
    os.utime(tmp_path / "job.lease", (past, past))
    with lease(tmp_path, "job", "run", 2.0) as held:
        assert held.epoch == 1 and not tmp_path.joinpath("job.lease").exists()


class _CountingListings:
    """A lease store that counts the listings of epoch records (the first of each acquire attempt, and two more in one that wins)."""

    def __init__(self, store) -> None:
        self.store, self.listings = store, 0

    def __getattr__(self, attr):
        return getattr(self.store, attr)

    def names(self, prefix: str) -> list[str]:
        if ".lease.epoch-" in prefix:
            self.listings += 1
        return self.store.names(prefix)


def test_waiting_for_a_lease_has_a_deadline_that_names_the_holder(lease_location):
    with lease(lease_location, "ingest", "catch-up", 30.0) as held:
        started = time.monotonic()
        with pytest.raises(LeaseWaitTimedOut, match=r"ingest waited 1 s for the ingest lease .*ingest.lease, and "
                                                    r"catch-up \(pid \d+ on .*, epoch 1\) still holds it") as late, \
                waiting_lease(lease_location, "ingest", "ingest", 30.0, timeout_s=1.0):
            pass
        assert 1.0 <= time.monotonic() - started < 10 and late.value.holder == held.describe()
        assert "\n" not in str(late.value)
    with lease(lease_location, "ingest", "catch-up", 30.0) as held:
        waiter = _CountingListings(store_for(lease_location))

        def release_once_refused() -> None:
            # Its second attempt has begun: the first one, made while the lease was held, was refused.
            wait_until(lambda: waiter.listings >= 2, timeout_s=30, what="the waiter's second attempt")
            held.release()

        releaser = threading.Thread(target=release_once_refused)
        releaser.start()
        with waiting_lease(waiter, "ingest", "ingest", 30.0, timeout_s=20.0) as mine:
            assert mine.epoch == held.epoch + 1  # taken once released, well within the deadline
        releaser.join()
        assert waiter.listings >= 4  # refused at least once (one listing), then taken (three)


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_pid_is_judged_only_in_its_own_host_boot_and_pid_namespace(lease_location):
    """Containers sharing a host name (host networking) have their own PID namespaces: a live holder there whose pid
    happens to be unused here is not broken; on this very host, boot and namespace a dead pid is broken at once."""
    me = identity()
    same = {"host": me.host, "boot_id": me.boot_id, "pid": _dead_pid()}
    _record(lease_location, "job", 1, **same, pid_ns="pid:[4026599999]")  # another container's namespace
    with pytest.raises(LeaseHeld, match=r"run \(pid \d+ on"):
        acquire(lease_location, "job", "restore", 30.0)
    _record(lease_location, "job", 1, **{**same, "boot_id": "another-boot"}, pid_ns=me.pid_ns)  # before a reboot
    with pytest.raises(LeaseHeld):
        acquire(lease_location, "job", "restore", 30.0)
    _record(lease_location, "job", 1, **same, pid_ns=me.pid_ns)  # here, and the process is gone
    with lease(lease_location, "job", "restore", 30.0) as held:
        assert held.epoch == 2
    _record(lease_location, "job", 3, **{**same, "pid": os.getpid()}, pid_ns=me.pid_ns, started="1")  # pid reused
    with lease(lease_location, "job", "restore", 30.0) as held:
        assert held.epoch == 4


def test_old_epoch_records_are_collected_and_a_hand_emptied_store_starts_a_new_series(lease_location):
    series = set()
    for _ in range(8):
        with lease(lease_location, "job", "run", 30.0) as held:
            series.add(held.info.series)
    names = store_for(lease_location).names("job.lease.")
    assert len(series) == 1 and sorted(names) == [f"job.lease.epoch-{e:012d}" for e in range(5, 9)], names
    for name in names:
        store_for(lease_location).delete(name)
    with lease(lease_location, "job", "run", 30.0) as held:
        assert held.epoch == 1 and held.info.series not in series


def test_a_huge_ttl_is_refused_in_one_line_and_a_long_one_renews_without_overflow(tmp_path):
    with pytest.raises(ConfigError, match=r"^SESSIONS_LEASE_TTL_S=1e\+11 is too long: at most 86400"):
        make_config(tmp_path, SESSIONS_LEASE_TTL_S="1e11")
    assert make_config(tmp_path, SESSIONS_LEASE_TTL_S="86400").lease_ttl_s == 86400
    with lease(tmp_path, "job", "run", 86400.0) as held:  # the renewal thread waits 8 h at a time: no OverflowError
        assert held.info.expires_at > time.time() + 86000


def test_job_lock_and_stop_requests_live_at_the_lease_uri(lease_location, tmp_path):
    """SESSIONS_LEASE_URI: a path, or S3 or HDFS alone (no shared filesystem): the job lease and the stop protocol
    there."""
    from pipelines.coordination.job_leases import running_stream
    from pipelines.coordination.requests import StopAnswer, answer_request, pending_request, request_stop, take_answer

    config = make_config(tmp_path, SESSIONS_LEASE_URI=lease_location)
    assert config.lease_uri == str(lease_location).rstrip("/")
    with job_lock(config, "run") as held:
        stream = running_stream(config)
        assert stream is not None and stream.token == held.token and stream.epoch == held.epoch
        with pytest.raises(JobRunning, match=r"the job is running: run \(pid \d+ on .*, epoch 1\) holds .*job.lease"), \
                job_lock(config, "restore"):
            pass
        request = request_stop(config, stream=stream, savepoint=False)
        found = pending_request(config, held)
        assert found is not None and found.token == request.token
        answer_request(config, found, StopAnswer(last_committed_batch=3))
        assert pending_request(config, held) is None
        assert take_answer(config, request) == StopAnswer(last_committed_batch=3)
        assert take_answer(config, request) is None
    assert running_stream(config) is None


@pytest.mark.tier("subprocess")
def test_work_beside_a_stream_on_this_host_gives_way_and_its_children_inherit_it(tmp_path):
    """With a `run` holding the job lease here, a process about to start its JVM for a savepoint lowers its CPU
    priority to SESSIONS_BESIDE_STREAM_NICE, and the processes it starts (the JVM, its Python workers) run at it;
    with no stream, or a stream on another host, or 0, nothing changes."""
    config = make_config(tmp_path)
    probe = ("import os, subprocess, sys\n"
             "from pipelines.config import SessionsConfig\n"
             "from state_store.kernel import give_way_to_stream\n"
             "gave = give_way_to_stream(SessionsConfig.from_env())\n"
             "child = subprocess.run([sys.executable, '-c', 'import os; print(os.getpriority(os.PRIO_PROCESS, 0))'],"
             " capture_output=True, text=True, check=True).stdout.strip()\n"
             "print(gave, child)\n")

    def beside(**env: str) -> str:
        done = subprocess.run([sys.executable, "-c", probe], env={**os.environ, **config_env(config), **env},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    base = os.getpriority(os.PRIO_PROCESS, 0)
    if base >= 7:
        pytest.skip(f"the suite runs at nice {base}: there is nothing to lower to 7 or 10")
    assert beside() == f"False {base}"  # no stream
    with job_lock(config, "run"):
        assert beside() == "True 10"  # the default
        assert beside(SESSIONS_BESIDE_STREAM_NICE="7") == "True 7"
        assert beside(SESSIONS_BESIDE_STREAM_NICE="0") == f"False {base}"
    with job_lock(config, "savepoint"):  # not a stream: nothing to give way to
        assert beside() == f"False {base}"
    _plant(config.lease_dir, "job", what="run")  # a stream on another host: its cores are not ours to free
    assert beside() == f"False {base}"


@pytest.mark.tier("subprocess")
def test_a_commands_jvm_launched_ahead_is_its_sessions_and_beside_a_stream_it_waits_to_give_way(tmp_path):
    """sessionctl launches a command's JVM as the command starts, beside its imports: the session it asks for later
    runs in that JVM, and a command that ends before asking leaves none behind. Beside a stream on this host it
    launches none ahead: the session's JVM starts after the process gave way, at the lowered priority."""
    config = make_config(tmp_path)
    probe = ("import os\n"
             "from pipelines.config import SessionsConfig\n"
             "from pipelines.job import runtime\n"
             "from sessionctl.cli import _spark_ahead, build_parser\n"
             "from state_store.kernel import session\n"
             "config = SessionsConfig.from_env()\n"
             "_spark_ahead(config, build_parser().parse_args(['savepoint']))\n"
             "ahead = runtime._AHEAD.launched().proc if runtime._AHEAD else None\n"
             "spark = session(config, None)\n"
             "jvm = spark.sparkContext._gateway.proc\n"
             "print(ahead is not None, ahead is None or ahead.pid == jvm.pid, os.getpriority(os.PRIO_PROCESS, jvm.pid))\n"
             "runtime.stop_spark(spark)\n")
    ends_early = ("from pipelines.config import SessionsConfig\n"
                  "from pipelines.job import runtime\n"
                  "from sessionctl.cli import _spark_ahead, build_parser\n"
                  "_spark_ahead(SessionsConfig.from_env(), build_parser().parse_args(['state', '--user', 'u1']))\n"
                  "jvm = runtime._AHEAD.launched().proc\n"
                  "runtime.stop_spark()\n"
                  "print(jvm.poll() is not None)\n")

    def run(script: str) -> str:
        done = subprocess.run([sys.executable, "-c", script], env={**os.environ, **config_env(config)},
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert run(probe) == f"True True {base}"
    assert run(ends_early) == "True"
    if base >= 10:
        return  # nothing to lower to: the rest is about the priority
    with job_lock(config, "run"):
        assert run(probe) == "False True 10"
