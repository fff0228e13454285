"""A restore killed with SIGKILL leaves a marker: status shows the command that finishes it, catch-up refuses in one
line naming it, the Dagster check fails with it; running it finishes the restore and the job goes on exactly once."""
from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from pipelines.core.sample_data import land
from pipelines.errors import RestoreIncomplete
from pipelines.ingest import ingest
from pipelines.job.checkpoint import BOOTSTRAP_FILE, read_restore_marker, restore_marker
from pipelines.job.stream import catch_up
from state_store.kernel import replaced_checkpoints
from state_store.lifecycle import restore, take_savepoint
from testkit.lifecycle_expectations import expected_closed_sessions
from tests.kit.datagen import in_order_chunks
from tests.kit.homes import assert_half_done_is_reported, config_env, make_config, tool
from tests.kit.tables import read_sessions
from tests.kit.waits import still_running, wait_until

pytestmark = pytest.mark.tier("subprocess")


def test_a_killed_restore_is_reported_and_finished_by_its_command(tmp_path, spark):
    config = make_config(tmp_path, "hdfs")
    chunks = in_order_chunks(50, seed=31, parts=4)
    for i in range(3):
        land(config.landing, f"part-{i}.jsonl", [json.dumps(e) for e in chunks[i]])
        ingest(config, files_per_commit=1)
        if i == 1:
            catch_up(config, spark)
            saved = take_savepoint(config, spark=spark)
    catch_up(config, spark)

    env = config_env(config)
    err = tmp_path / "restore.err"
    with err.open("w") as sink:
        restoring = subprocess.Popen([tool("sessionctl"), "restore", "--savepoint", saved.savepoint_id], env=env,
                                     stdout=subprocess.DEVNULL, stderr=sink)
    # Killed well into the restore: the old checkpoint set aside and the new one's bootstrap written (next: the
    # tables rolled back, then the bootstrap query).
    wait_until(lambda: still_running(restoring, err) and (config.checkpoint / BOOTSTRAP_FILE).exists(), timeout_s=120,
               interval_s=0.02, what="the restore to write the new checkpoint's bootstrap")
    os.kill(restoring.pid, signal.SIGKILL)
    restoring.wait()
    assert restore_marker(config.checkpoint).exists() and replaced_checkpoints(config)

    command = f"sessionctl restore --savepoint {saved.savepoint_id}"
    assert read_restore_marker(config.checkpoint)["command"] == command
    assert_half_done_is_reported(config, "restore_in_progress", command)
    with pytest.raises(RestoreIncomplete):
        catch_up(config, spark)

    restore(config, saved.savepoint_id, spark=spark)  # the command, in-process
    assert read_restore_marker(config.checkpoint) is None
    land(config.landing, "part-3.jsonl", [json.dumps(e) for e in chunks[3]])
    catch_up(config, spark)
    got = read_sessions(config)
    assert len({row[0] for row in got}) == len(got), "a session was written twice"
    assert got == sorted(expected_closed_sessions([chunks[0], chunks[1], chunks[2] + chunks[3]],
                                                  30 * 60_000, 10 * 60_000))

