"""The benchmark scripts still run against the product (its source, operator and sink), in their quick form: a
change to the source's columns once broke the throughput anchor and only the next benchmark run said so. Each
script runs as the user runs it (its own process and JVM); the checks are the scripts' own cross-checks between the
job and native Spark, not timings.

Each runs at the smallest size that still takes every path of the script -- data generated and ingested one commit
per batch, the priming pass (throughput: capped by the source's targetSeq), warm-up and measured batches, the job
and native queries in both orders, the state read at the end -- a few thousand events, where the quick form's tens
of thousands only made each micro-batch longer. The figures themselves come from the scripts' own runs
(benchmarks/README.md), never from these tests."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.tier("subprocess")

REPO = Path(__file__).resolve().parent.parent


def _run(script: str, results: Path, *args: str) -> None:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--quick", "--provider", "rocksdb",
                           "--results-dir", str(results), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


def test_throughput_benchmark_measures_both_queries_on_the_same_batches(tmp_path):
    # a warm-up batch and two measured ones (sessions close in them: the data spans hours of event time whatever its
    # size), after a priming pass of one batch per query
    _run("throughput.py", tmp_path, "--events-per-batch", "2000", "--users", "500", "--warmup", "1", "--batches", "2",
         "--prime-batches", "1")
    (run,) = json.loads((tmp_path / "throughput.json").read_text())["runs"]
    job, native = run["job"], run["native"]
    assert job["measured_events"] == native["measured_events"] > 0
    assert job["events_per_s"] > 0 and native["events_per_s"] > 0
    assert job["sessions_written"] > 0 and native["sessions_written"] > 0


def test_state_scaling_benchmark_holds_every_open_user_in_both_operators(tmp_path):
    # one N with two pairs, the second in the other order, one measured batch each after the preload and clock
    # batches; no priming pass (the same queries as the pairs', discarded). 1,000 events over 100 active users: each
    # of them has events (the open-user count below needs every one)
    _run("state_scaling.py", tmp_path, "--repeats", "2", "--users", "300", "--active", "100",
         "--events-per-batch", "1000", "--warmup", "0", "--batches", "1", "--no-prime")
    results = json.loads((tmp_path / "state_scaling_quick.json").read_text())
    active = results["settings"]["active"]
    assert [run["sleepers"] for run in results["runs"]] == results["settings"]["users"]
    for run in results["runs"]:
        # two job/native pairs, the second in the other order; the tables' figures are one of the measured repeats
        assert [pair["order"] for pair in run["repeats"]] == [["job", "native"], ["native", "job"]]
        for which in ("job", "native"):
            assert run[which] in [pair[which] for pair in run["repeats"]]
        # in every pair, every sleeper and every active user has one open session at the end (+1: the benchmark's
        # clock user), and native's session windows count the same sessions
        open_users = run["sleepers"] + active + 1
        for pair in run["repeats"]:
            assert pair["job"]["state"]["open_users"] == pair["job"]["state"]["open_sessions"] == open_users
            assert pair["native"]["state_rows_total_at_end"] == open_users


@pytest.mark.parametrize("script", sorted(path.name for path in (REPO / "benchmarks").glob("*.py")))
def test_every_benchmark_script_starts(script):
    """Each script's imports still name the product's modules (a module split once left one importing a name that
    had gone): `--help` imports the script and everything it imports, and starts no JVM."""
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "usage" in done.stdout, done.stderr[-3000:]
