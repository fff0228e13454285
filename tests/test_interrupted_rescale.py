"""A rescale killed with SIGKILL inside Spark's offline repartition (its repartition batch written, not committed):
status names the command that finishes it, catch-up refuses in one line naming it, the Dagster check fails with
it, and the next rescale -- to any count -- finishes it first; the job then goes on exactly once (oracle)."""
from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from pipelines.core.sample_data import land
from pipelines.errors import RescaleIncomplete
from pipelines.ingest import ingest
from pipelines.job.checkpoint import inspect_checkpoint
from pipelines.job.stream import catch_up
from state_store.rescale import rescale
from testkit.lifecycle_expectations import expected_closed_sessions
from tests.kit.datagen import in_order_chunks
from tests.kit.homes import assert_half_done_is_reported, config_env, make_config, tool
from tests.kit.tables import read_sessions
from tests.kit.waits import still_running, wait_until

pytestmark = pytest.mark.tier("subprocess")


def _kill_inside_repartition(config, env: dict, partitions: int) -> bool:
    """Start `sessionctl rescale`, SIGKILL it once Spark has written the repartition batch's offset and before
    its commit. False when the repartition was too quick to catch (committed first)."""
    batch = inspect_checkpoint(config.checkpoint).last_committed_batch + 1
    offset, commit = config.checkpoint / "offsets" / str(batch), config.checkpoint / "commits" / str(batch)
    proc = subprocess.Popen([tool("sessionctl"), "rescale", "--partitions", str(partitions)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    wait_until(lambda: still_running(proc) and offset.exists(), timeout_s=180, interval_s=0.002,
               what="the rescale to reach the repartition (its batch's offset file)")
    os.killpg(proc.pid, signal.SIGKILL)  # the JVM too: it is what writes the state
    proc.wait()
    return not commit.exists()


def test_a_rescale_killed_inside_the_repartition_is_finished_by_the_next_rescale(tmp_path, spark):
    config = make_config(tmp_path, "rocksdb")  # the offline repartition is RocksDB's; HDFS rescales by restore
    chunks = in_order_chunks(50, seed=41, parts=3)
    for i in range(2):
        land(config.landing, f"part-{i}.jsonl", [json.dumps(e) for e in chunks[i]])
        ingest(config, files_per_commit=1)
    catch_up(config, spark)
    env = config_env(config)

    caught = False
    for _ in range(3):  # a kill that lands after the commit is a finished rescale: try again from there
        caught = _kill_inside_repartition(config, env, 3 if inspect_checkpoint(config.checkpoint).partitions != 3 else 2)
        if caught:
            break
    assert caught, "the repartition committed before the kill three times"
    interrupted = inspect_checkpoint(config.checkpoint).unfinished_rescale
    command = f"sessionctl rescale --partitions {interrupted}"

    assert_half_done_is_reported(config, "rescale_in_progress", command)
    with pytest.raises(RescaleIncomplete):
        catch_up(config, spark)

    # Spark itself refuses any other count until the interrupted one is finished; ours finishes it first.
    other = 4 if interrupted != 4 else 5
    # The library under `sessionctl rescale`, in the shared session: the process boundary was the kill's, above.
    assert rescale(config, other, spark=spark).partitions_after == other
    assert inspect_checkpoint(config.checkpoint).unfinished_rescale is None

    land(config.landing, "part-2.jsonl", [json.dumps(e) for e in chunks[2]])
    catch_up(config, spark)
    got = read_sessions(config)
    assert len({row[0] for row in got}) == len(got), "a session was written twice"
    assert got == sorted(expected_closed_sessions([chunks[0], chunks[1], chunks[2]], 30 * 60_000, 10 * 60_000))
