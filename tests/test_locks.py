"""Locks that hold across hosts: the job/lifecycle leases live beside the checkpoint (one shared filesystem), not
in each host's SESSIONS_HOME; a dead holder's lease is broken at once on its own host, after its expiry elsewhere."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from pipelines.errors import JobRunning
from pipelines.guards import job_lock
from pipelines.locks import LeaseHeld, lease
from tests.conftest import config_env, make_config, tool


def test_two_hosts_with_separate_homes_share_the_lease(tmp_path):
    """Two processes, each its own SESSIONS_HOME, one shared checkpoint filesystem."""
    shared = tmp_path / "shared-checkpoints"
    host_a = make_config(tmp_path / "a", SESSIONS_CHECKPOINT_URI=shared)
    host_b = make_config(tmp_path / "b", SESSIONS_CHECKPOINT_URI=shared)
    assert host_a.lease_dir == host_b.lease_dir
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pipelines.guards import job_lock; from tests.conftest import make_config; "
        f"config = make_config({str(tmp_path / 'a')!r}, SESSIONS_CHECKPOINT_URI={str(shared)!r}); "
        "lock = job_lock(config, 'run'); lock.__enter__(); print('held', flush=True); time.sleep(120)")],
        stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        assert holder.stdout.readline().strip() == "held"
        refused = subprocess.run([tool("sessionctl"), "rescale", "--partitions", "3"], env=config_env(host_b),
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        line = refused.stderr.strip()
        assert "\n" not in line and line.startswith(f"sessionctl rescale: the job is running: run (pid {holder.pid} on ")
        assert str(host_b.lease_dir / "job.lease") in line
    finally:
        holder.kill()
        holder.wait()
    with job_lock(host_b, "savepoint"):  # the holder was killed on this host: its lease is broken at once
        pass


def _plant(directory, name: str, **fields) -> None:
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
    with job_lock(config, "savepoint"):
        current = json.loads((config.lease_dir / "job.lease").read_text())
        assert current["what"] == "savepoint" and current["pid"] == os.getpid()
    assert not (config.lease_dir / "job.lease").exists()


def test_the_holder_renews_its_lease(tmp_path):
    with lease(tmp_path, "job", "run", ttl_s=0.6) as info:
        time.sleep(1.0)  # past the first expiry: the renewal thread moved it on
        current = json.loads((tmp_path / "job.lease").read_text())
        assert current["token"] == info.token and current["expires_at"] > info.expires_at
        with pytest.raises(LeaseHeld), lease(tmp_path, "job", "savepoint", ttl_s=0.6):
            pass


def test_stop_request_is_answered_and_a_joined_stop_without_savepoint_says_so(tmp_path):
    """The stop protocol without Spark: a holder of the job lease (as `run`) answers the request it finds; a
    `stop --savepoint` that joins an earlier request made without a savepoint is not reported as having one."""
    import threading

    from pipelines.errors import NotRunning, StopIncomplete
    from pipelines.guards import answer_stop, pending_stop, request_stop
    from state_store.lifecycle import stop_stream

    config = make_config(tmp_path)
    with pytest.raises(NotRunning, match="no stream is running"):
        stop_stream(config)
    with job_lock(config, "run") as held:
        first = request_stop(config, held, savepoint=False)  # someone asked for a plain stop

        def stream_answers() -> None:
            deadline = time.monotonic() + 30
            while (request := pending_stop(config, held)) is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert request is not None and request.token == first.token
            time.sleep(0.5)  # the second stopper is waiting on the same request by now
            answer_stop(config, request, {"stopped": True, "last_committed_batch": 7, "savepoint": None, "error": None})

        stream = threading.Thread(target=stream_answers)
        stream.start()
        with pytest.raises(StopIncomplete, match="without a savepoint") as joined:
            stop_stream(config, savepoint=True, timeout_s=30)
        stream.join()
    assert joined.value.next_step == "sessionctl savepoint"
    assert pending_stop(config, held) is None  # answered: the request is gone
