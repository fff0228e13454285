"""A seeded crash campaign: `sessionctl` commands (catch-up, savepoint, restore, rescale, compact) SIGKILLed at random
moments, each followed by what an operator would do (finish a restore whose marker is there), then a final catch-up;
the sessions are compared with the oracle: how many lost, how many written twice (both must be 0).

    .venv/bin/python benchmarks/crash_campaign.py --kill-points 100 --seed 7     # both providers, ~35 min
    .venv/bin/python benchmarks/crash_campaign.py --kill-points 10               # a short one

Writes benchmarks/results/crash_campaign.{json,md}: kill points by phase (killed while running / finished before the
kill), lost and duplicated sessions per provider. `tests/test_crash_campaign.py` runs a short seeded one in make test.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pipelines.config import SessionsConfig  # noqa: E402
from pipelines.sample_data import arrival_order, generate_events, land  # noqa: E402
from pipelines.storage import open_table, table_exists  # noqa: E402
from tests.lifecycle_expectations import expected_closed_sessions  # noqa: E402

PHASES = ("catch-up", "savepoint", "restore", "rescale", "compact")
GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000
SESSIONCTL = str(Path(sys.executable).parent / "sessionctl")


def _env(home: Path, provider: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("SESSIONS_")}, "SESSIONS_HOME": str(home),
            "SESSIONS_STATE_STORE": provider, "SESSIONS_STATE_PARTITIONS": "2", "SESSIONS_MAX_VERSIONS_PER_BATCH": "1",
            "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO)}


def _sessionctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SESSIONCTL, *args], env=env, capture_output=True, text=True, timeout=900)


def _kill_during(env: dict[str, str], args: list[str], delay_s: float) -> bool:
    """Run `sessionctl args` and SIGKILL its process group after delay_s; True if it was still running."""
    proc = subprocess.Popen([SESSIONCTL, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + delay_s
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    killed = proc.poll() is None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    return killed


def _recover(env: dict[str, str]) -> list[str]:
    """What the one-line errors tell an operator to do: finish a restore, redo a half repartition."""
    done = []
    status = _sessionctl(env, "status", "--json", "--no-state")
    report = json.loads(status.stdout) if status.returncode == 0 else {}
    for what in ("restore", "rescale"):
        command = report.get(f"{what}_in_progress")
        if command:
            _sessionctl(env, *command.split()[1:])
            done.append(f"finished {what}")
    return done


def _final_catch_up(env: dict[str, str]) -> list[str]:
    steps = []
    for _ in range(3):
        steps += _recover(env)
        done = _sessionctl(env, "catch-up")
        if done.returncode == 0:
            return steps
        line = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        steps.append(f"catch-up refused: {line[:160]}")
        if "restore --savepoint latest" in line or "rescale" in line:
            _sessionctl(env, "restore", "--savepoint", "latest")
            steps.append("restore latest")
    raise RuntimeError(f"the job did not recover: {steps}")


def run_campaign(work: Path, provider: str, seed: int, kill_points: int) -> dict:
    rng = random.Random(seed)
    started = time.monotonic()
    home = work / f"{provider}-{seed}"
    env = _env(home, provider)
    config = SessionsConfig.from_env(env)
    events = arrival_order(generate_events(40, 3, seed=seed), seed=seed, jitter_seconds=120)  # no late event
    parts = max(2, kill_points // 2 + 1)
    size = -(-len(events) // parts)
    chunks = [events[i * size:(i + 1) * size] for i in range(parts)]
    by_phase, recoveries = Counter(), []
    # A job with a committed batch and a savepoint first, so every phase can be hit from the first kill on.
    land(config.landing, "part-0000.jsonl", [json.dumps(e) for e in chunks[0]])
    for setup in (["catch-up"], ["savepoint", "--json"]):
        done = _sessionctl(env, *setup)
        if done.returncode != 0:
            raise RuntimeError(f"campaign setup failed: {done.stderr[-500:]}")
    landed = 1
    for k in range(kill_points):
        if landed < len(chunks) and k % 2 == 0:
            land(config.landing, f"part-{landed:04d}.jsonl", [json.dumps(e) for e in chunks[landed]])
            landed += 1
        phase = rng.choice(PHASES)
        args = {"catch-up": ["catch-up"], "savepoint": ["savepoint", "--json"],
                "restore": ["restore", "--savepoint", "latest"], "rescale": ["rescale", "--partitions", str(rng.choice((2, 3)))],
                "compact": ["compact"]}[phase]
        killed = _kill_during(env, args, rng.uniform(2.0, 30.0))  # JVM start-up to deep in the operation
        by_phase[f"{phase}:{'killed' if killed else 'finished first'}"] += 1
        recoveries += _recover(env)
    for i in range(landed, len(chunks)):
        land(config.landing, f"part-{i:04d}.jsonl", [json.dumps(e) for e in chunks[i]])
    recoveries += _final_catch_up(env)
    expected = expected_closed_sessions(chunks, GAP_MS, LATENESS_MS)
    got = []
    if table_exists(config, config.sessions_table):
        table = open_table(config, config.sessions_table).to_pyarrow_table(columns=["session_id"])
        got = table["session_id"].to_pylist()
    expected_ids = {row[0] for row in expected}
    return {"provider": provider, "seed": seed, "kill_points": kill_points, "by_phase": dict(sorted(by_phase.items())),
            "expected_sessions": len(expected_ids), "written": len(got),
            "lost": len(expected_ids - set(got)), "duplicated": len(got) - len(set(got)),
            "unexpected": len(set(got) - expected_ids), "recoveries": Counter(r.split(":")[0] for r in recoveries),
            "minutes": round((time.monotonic() - started) / 60, 1), "load_avg_1m_end": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kill-points", type=int, default=100, help="per provider")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--providers", default="rocksdb,hdfs")
    parser.add_argument("--work-dir", default="/tmp/crash-campaign")
    parser.add_argument("--results-dir", default=str(HERE / "results"))
    args = parser.parse_args()
    reports = [run_campaign(Path(args.work_dir), provider, args.seed, args.kill_points)
               for provider in args.providers.split(",")]
    write_results(reports, Path(args.results_dir))
    print(json.dumps(reports, default=dict))


def write_results(reports: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "crash_campaign.json").write_text(json.dumps(reports, indent=2, default=dict))
    lines = ["# Crash campaign", "", "| provider | seed | kill points | by phase | operator's recoveries | lost | "
             "duplicated | unexpected | minutes |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['provider']} | {r['seed']} | {r['kill_points']} | {r['by_phase']} | {dict(r['recoveries'])} | "
              f"{r['lost']} | {r['duplicated']} | {r['unexpected']} | {r['minutes']} |" for r in reports]
    (out / "crash_campaign.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
