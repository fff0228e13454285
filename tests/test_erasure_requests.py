"""Erasure requests as files (state_store.erasure_requests) and the Dagster sensor that batches them
(assets.erasure_runs.erasure_requests), without Spark: which files count, their users, what is refused and left, what
is deleted, and when the sensor asks for a run. The erasure itself, from such files through the sensor's run, is
tests/test_dagster_erasure.py's."""
from __future__ import annotations

import json
import subprocess

import pytest
from dagster import DagsterRun, DagsterRunStatus, RunRequest, SkipReason, build_sensor_context, instance_for_test

from assets.erasure_runs import FORGET_JOB, erasure_requests
from assets.resources import SessionsResource
from state_store.erasure_requests import close_requests, pending_files, read_requests
from tests.kit.homes import config_env, make_config, tool

pytestmark = pytest.mark.tier("pure")


def _inbox(config):
    inbox = config.home / "erasure_requests"
    assert str(inbox) == config.erasure_requests_uri  # the default location
    inbox.mkdir(parents=True)
    return inbox


def test_request_files_name_users_once_in_file_order_and_a_bad_file_is_left_with_why(tmp_path):
    config = make_config(tmp_path)
    assert pending_files(config) == [] and read_requests(config).files == []  # no inbox yet: nothing pending
    inbox = _inbox(config)
    (inbox / "b-ticket.users").write_text("u3\n\n  u1  \n")
    (inbox / "a-ticket.users").write_text("u1\nü-2\n")
    (inbox / "c-ticket.users.tmp").write_text("u9\n")  # being written: not a request until renamed
    (inbox / "latin1.users").write_bytes("caf\xe9\n".encode("latin-1"))
    (inbox / "sub.users").mkdir()  # a directory is not a request
    assert pending_files(config) == ["a-ticket.users", "b-ticket.users", "latin1.users"]
    requests = read_requests(config)
    assert requests.files == ["a-ticket.users", "b-ticket.users"]
    assert requests.user_ids == ["u1", "ü-2", "u3"]
    assert list(requests.refused) == ["latin1.users"] and "not UTF-8" in requests.refused["latin1.users"]
    assert "u1" not in repr(requests)  # the ids stay out of logs and results
    close_requests(config, requests)
    assert sorted(p.name for p in inbox.iterdir()) == ["c-ticket.users.tmp", "latin1.users", "sub.users"]
    close_requests(config, requests)  # a rerun after a kill: already gone, nothing to do


def test_named_request_files_only_those_and_names_that_are_not_requests_refused(tmp_path):
    config = make_config(tmp_path)
    inbox = _inbox(config)
    (inbox / "one.users").write_text("u1\n")
    (inbox / "two.users").write_text("u2\n")
    requests = read_requests(config, ["two.users", "gone.users", "../escape.users", "notes.txt"])
    assert requests.files == ["two.users"] and requests.user_ids == ["u2"]  # gone.users: erased by an earlier run
    assert sorted(requests.refused) == ["../escape.users", "notes.txt"]


def test_the_sensor_asks_one_run_for_every_pending_file_and_retries_a_set_it_did_not_erase_after_an_hour(tmp_path):
    config = make_config(tmp_path)
    sessions = SessionsResource(home=str(config.home))
    (tmp_path / "dagster").mkdir()
    with instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        def evaluate(cursor: str | None = None):
            with build_sensor_context(instance=instance, resources={"sessions": sessions}, cursor=cursor) as context:
                return erasure_requests(context), context.cursor

        answer, _ = evaluate()
        assert isinstance(answer, SkipReason) and "no erasure request" in str(answer.skip_message)
        inbox = _inbox(config)
        (inbox / "t2.users").write_text("u2\n")
        (inbox / "t1.users").write_text("u1\n")
        answer, cursor = evaluate()
        assert isinstance(answer, RunRequest)
        assert answer.run_config == {"ops": {"forget_user_op": {"config": {"request_files": ["t1.users", "t2.users"]}}}}
        assert cursor and "t1" not in cursor  # a digest: the cursor keeps no file name
        again, _ = evaluate(cursor)  # the same files still pending a minute later: the run did not erase them
        assert isinstance(again, SkipReason) and "asked again after 60 minutes" in str(again.skip_message)
        (inbox / "t3.users").write_text("u3\n")  # a new request: a new set, asked for at once
        assert isinstance(evaluate(cursor)[0], RunRequest)
        (inbox / "t3.users").unlink()
        stale = cursor.rpartition("@")[0] + "@0"  # the same set as asked for an hour and more ago
        assert isinstance(evaluate(stale)[0], RunRequest)
        # While a forget_user run is in progress, requests wait for the next one (they are batched).
        instance.run_storage.add_run(DagsterRun(job_name=FORGET_JOB, run_id="f" * 32, status=DagsterRunStatus.STARTED))
        waiting, _ = evaluate()
        assert isinstance(waiting, SkipReason) and f"forget_user run {'f' * 32}" in str(waiting.skip_message)


@pytest.mark.tier("subprocess")
def test_forget_requests_with_none_pending_did_its_work(tmp_path):
    """`sessionctl forget --requests` with no request file: nothing to erase, no Spark started, exit 0 and an answer
    saying so."""
    config = make_config(tmp_path)
    done = subprocess.run([tool("sessionctl"), "forget", "--requests", "--json"], env=config_env(config),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"files": [], "users": 0, "erasure": None, "refused": {}}
    assert not (config.home / "logs" / "spark.log").exists()  # no JVM
