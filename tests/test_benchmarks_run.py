"""The benchmark scripts still run against the product (its source, operator and sink), in their quick form: a
change to the source's columns once broke the throughput anchor and only the next benchmark run said so. Each
script runs as the user runs it (its own process and JVM); the checks are the scripts' own cross-checks between the
job and native Spark, not timings."""
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
    _run("throughput.py", tmp_path)
    (run,) = json.loads((tmp_path / "throughput.json").read_text())["runs"]
    job, native = run["job"], run["native"]
    assert job["measured_events"] == native["measured_events"] > 0
    assert job["events_per_s"] > 0 and native["events_per_s"] > 0
    assert job["sessions_written"] > 0 and native["sessions_written"] > 0


def test_state_scaling_benchmark_holds_every_open_user_in_both_operators(tmp_path):
    # one N with two pairs (the quick form's two Ns with one pair each cost the same)
    _run("state_scaling.py", tmp_path, "--repeats", "2", "--users", "2000")
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
