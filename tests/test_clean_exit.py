"""sessionctl's light commands end the way they worked: exit 0 every time, their JSON whole on stdout.

`savepoints --json` used to print its listing and then die at interpreter exit with `terminate called without an
active exception` (exit 134) in 17 of 260 runs: Arrow's scan of the catalog (deltalake's pyarrow dataset over a Python
filesystem) still held that filesystem on one of its threads when the interpreter began finalizing, and that thread's
late GIL request ended it inside a destructor. sessionctl.await_arrow_readers lets those threads finish before the
teardown; with it alone the abort still came in 17 of 600 runs (2.8%; one in 200 in a CI run). Delta
tables are now read by delta-rs' own engine (pipelines.storage.read_rows), in Rust, without a Python filesystem: 0 of
600. At 2.8%, the 70 clean `savepoints` runs below would pass by chance in about one test run in seven. The
light commands start no JVM and `--help` and `savepoints` import no pyspark (checked below): the 110 runs take about
half a minute, two at a time."""
from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from itertools import zip_longest

import pytest

from pipelines.core.sample_data import land
from tests.kit.datagen import in_order_chunks
from tests.kit.homes import config_env, make_config, tool

pytestmark = pytest.mark.tier("subprocess")

# Runs of each light command, 110 in all: `savepoints --json` is the one that aborted (about half a CPU-second a run,
# most of it imports; it was a second while it imported pandas too); `status --no-state` (no Arrow scan, never seen to
# abort; 1.5 s: it imports pyspark) and `--help` (nothing read, 0.15 s) are the controls.
SAVEPOINTS, STATUS, HELP = ("savepoints", "--json"), ("status", "--json", "--no-state"), ("--help",)
RUNS = {SAVEPOINTS: 70, HELP: 30, STATUS: 10}  # --help: a control, which never aborted


@pytest.fixture(scope="module")
def home(tmp_path_factory, spark) -> tuple[dict, dict]:
    """A real home with one savepoint: a landed file processed by a catch-up, then a savepoint -- what `sessionctl
    catch-up` and `sessionctl savepoint` call, in the tests' Spark session (no JVM of their own to start; the light
    commands below only read what they left). Returns the environment of a sessionctl process on it and the savepoint
    as `savepoint --json` prints it."""
    from pipelines.job.runtime import stop_state_stores
    from pipelines.job.stream import catch_up
    from state_store.lifecycle import take_savepoint

    config = make_config(tmp_path_factory.mktemp("clean-exit"))
    for index, chunk in enumerate(in_order_chunks(10, seed=3, parts=1)):
        land(config.landing, f"part-{index:04d}.jsonl", [json.dumps(event) for event in chunk])
    try:
        catch_up(config, spark)
        saved = take_savepoint(config, trigger="manual", spark=spark)
    finally:
        stop_state_stores(spark)  # nothing of this JVM writes to the home while the commands read it
    return config_env(config), json.loads(json.dumps(saved.to_dict(), default=str))


def _sessionctl(env: dict, args: tuple[str, ...]) -> tuple[tuple[str, ...], subprocess.CompletedProcess]:
    return args, subprocess.run([tool("sessionctl"), *args], env=env, capture_output=True, text=True, timeout=120)


def test_light_commands_exit_0_every_time_with_whole_json(home):
    env, savepoint = home
    # Interleaved (savepoints, --help, status, savepoints, ...), two processes at a time.
    queues = [[args] * count for args, count in RUNS.items()]
    jobs = [args for batch in zip_longest(*queues) for args in batch if args is not None]
    assert len(jobs) == sum(RUNS.values())
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda args: _sessionctl(env, args), jobs))

    failed = [(" ".join(args), done.returncode, done.stderr.strip()[-300:]) for args, done in results
              if done.returncode != 0]
    assert not failed, f"{len(failed)} of {len(results)} runs failed, the first ones: {failed[:3]}"
    for args, done in results:
        assert "terminate called" not in done.stderr, done.stderr
        if args == SAVEPOINTS:
            [saved] = json.loads(done.stdout)
            assert saved["savepoint_id"] == savepoint["savepoint_id"] and saved["status"] == "complete", saved
        elif args == STATUS:
            assert json.loads(done.stdout)["last_committed_batch"] == savepoint["batch_id"]
        else:
            assert done.stdout.startswith("usage: sessionctl"), done.stdout[:200]


# The console script's own path (sessionctl.main) in a process that reports, as it exits, which heavy packages
# the command imported.
_IMPORTS = """
import json, sys
from sessionctl import main
sys.argv = ["sessionctl", *sys.argv[1:]]
try:
    code = main()
except SystemExit as exit:  # --help: argparse exits after printing
    code = exit.code
heavy = sorted(name for name in ("pyspark", "py4j", "pandas", "pyarrow", "deltalake") if name in sys.modules)
print(json.dumps({"code": code, "heavy": heavy}), file=sys.stderr)
"""


@pytest.mark.parametrize("args, allowed", [
    (HELP, set()),
    # (pandas: state_store.savepoint.catalog imports it only to checksum rows, which the listing does not do)
    (SAVEPOINTS, {"pyarrow", "deltalake"}),
], ids=["help", "savepoints"])
def test_light_commands_import_no_spark(home, args, allowed):
    done = subprocess.run([sys.executable, "-c", _IMPORTS, *args], env=home[0], capture_output=True, text=True,
                          timeout=120)
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["code"] == 0
    assert set(report["heavy"]) <= allowed, report["heavy"]
