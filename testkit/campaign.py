"""The seeded crash campaign (run by benchmarks/crash_campaign.py and, short, by tests/test_crash_campaign.py):
`sessionctl` commands SIGKILLed at random moments, each followed by what an operator would do (finish a restore whose
marker is there), then a final catch-up; the sessions are compared with the oracle: how many lost, how many written
twice (both must be 0). Phases: catch-up, savepoint, restore, rescale, compact on the stopped job; and beside a
running `sessionctl run`: an online savepoint killed (or the stream killed under it), and `stop --savepoint` with the
stopper or the stream killed at a random moment of the stop."""
from __future__ import annotations

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
from typing import TYPE_CHECKING, Any

from pipelines.config import SessionsConfig
from pipelines.coordination.job_leases import JOB, LIFECYCLE, running_stream
from pipelines.coordination.leases import live_holder
from pipelines.core.sample_data import arrival_order, generate_events, land
from pipelines.errors import SessionsError
from pipelines.job.checkpoint import inspect_checkpoint
from pipelines.storage import open_table, read_rows, table_exists
from testkit.lifecycle_expectations import expected_closed_sessions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPO = Path(__file__).resolve().parent.parent
PHASES = ("catch-up", "savepoint", "restore", "rescale", "compact", "online-savepoint", "stop-savepoint")
GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000
# How long after taking its lease each command on the stopped job may be killed: below its shortest run after the
# lease on a quiet machine (its JVM start-up and its work; CI's timelines: a savepoint ~8-14 s, a restore ~20-40 s, a
# catch-up ~15-40 s, a rescale ~15 s and more, a compaction with nothing to fold well under a second), so the kill
# lands inside the command, anywhere from its JVM start to deep in the operation.
KILL_WITHIN_S = {"catch-up": 8.0, "savepoint": 6.0, "restore": 10.0, "rescale": 8.0, "compact": 0.3}
SESSIONCTL = str(Path(sys.executable).parent / "sessionctl")


def _env(home: Path, provider: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("SESSIONS_")}, "SESSIONS_HOME": str(home),
            "SESSIONS_STATE_STORE": provider, "SESSIONS_STATE_PARTITIONS": "2", "SESSIONS_MAX_VERSIONS_PER_BATCH": "1",
            "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO)}


def _timed(env: dict[str, str], args: list[str] | tuple[str, ...], started: float, outcome: object) -> None:
    """One line per sessionctl command beside the campaign's home (<home>.timeline.jsonl): where the time goes."""
    home = Path(env["SESSIONS_HOME"])
    with open(home.with_name(home.name + ".timeline.jsonl"), "a") as out:
        out.write(json.dumps({"args": " ".join(args), "seconds": round(time.monotonic() - started, 2),
                              "outcome": outcome, "kill_at": env.get("SESSIONS_KILL_AT")}) + "\n")


def _sessionctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    done = subprocess.run([SESSIONCTL, *args], env=env, capture_output=True, text=True, timeout=900)
    phases = None
    with contextlib.suppress(ValueError, IndexError, AttributeError):
        phases = json.loads(done.stdout.strip().splitlines()[-1]).get("phase_seconds")
    _timed(env, args, started, [done.returncode, phases] if phases else done.returncode)
    return done


def _step(env: dict[str, str], config: SessionsConfig, spark: SparkSession | None, *args: str) -> dict[str, Any]:
    """A step the campaign prepares with, never one it kills or an operator's recovery: `sessionctl args` -- or, given
    `spark` (the tests' session), the library call that command makes, in this process: no JVM and no Python to start,
    most of such a short command's time. Its state stores are closed after it (StateStore.stop, as a restore does), so
    nothing of this JVM touches the checkpoint while the next `sessionctl` works on it. Returns the command's JSON."""
    if spark is None:
        done = _sessionctl(env, *args)
        if done.returncode != 0:
            raise RuntimeError(f"sessionctl {' '.join(args)} failed: {done.stderr[-500:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result
    from pipelines.job.runtime import stop_state_stores
    from pipelines.job.stream import catch_up
    from state_store.lifecycle import restore, take_savepoint
    from state_store.maintenance import compact

    started = time.monotonic()
    try:
        if args[0] == "catch-up":
            result = catch_up(config, spark).to_dict()
        elif args[0] == "savepoint":
            result = take_savepoint(config, trigger="manual", spark=spark).to_dict()
        elif args[:2] == ("restore", "--savepoint"):
            result = restore(config, args[2], spark=spark).to_dict()
        elif args == ("compact", "--keep-last", "1", "--keep-daily-days", "0"):
            result = compact(config.with_(keep_savepoints=1, keep_daily_days=0)).to_dict()
        else:
            raise ValueError(f"no library step for sessionctl {' '.join(args)}")
    finally:
        stop_state_stores(spark)
    _timed(env, ["(in process)", *args], started, 0)
    return result


def _holds_a_lease(config: SessionsConfig, pid: int) -> bool:
    """`pid` holds the job or the lifecycle lease (every command the campaign kills on the stopped job takes one)."""
    holders = (live_holder(config.lease_uri, name, config.lease_ttl_s) for name in (JOB, LIFECYCLE))
    return any(holder is not None and holder.pid == pid for holder in holders)


def _kill_during(env: dict[str, str], config: SessionsConfig, args: list[str], delay_s: float) -> bool:
    """Run `sessionctl args` and SIGKILL its process group delay_s after it took its lease (its Python start-up and
    the lease itself are proved by the named `lease:taken` kills; a kill drawn past its end proves nothing and costs
    the whole command); True if it was still running."""
    started = time.monotonic()
    proc = subprocess.Popen([SESSIONCTL, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = started + 120
    while proc.poll() is None and not _holds_a_lease(config, proc.pid) and time.monotonic() < deadline:
        _wait(proc, 0.05)
    leased = time.monotonic() - started
    _wait(proc, delay_s)
    killed = proc.poll() is None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    _timed(env, args, started, f"killed {delay_s:.1f} s after its lease ({leased:.1f} s)" if killed
           else f"finished first (lease at {leased:.1f} s, kill drawn {delay_s:.1f} s after it)")
    return killed


def _start(env: dict[str, str], args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([SESSIONCTL, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _kill(proc: subprocess.Popen[bytes]) -> bool:
    """SIGKILL the process group; True if it was still running."""
    killed = proc.poll() is None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    return killed


def _wait(proc: subprocess.Popen[bytes], seconds: float) -> None:
    """Until `proc` exits or `seconds` passed, whichever comes first."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=seconds)


def _online(env: dict[str, str], config: SessionsConfig, phase: str, startup_s: float, kill_after_s: float,
            victim: str) -> str:
    """A kill beside a running stream: a savepoint (or the stream under it), or a stop-with-savepoint (the stopper or
    the stream). The stream is then stopped (or left dead) and the next phase starts from whatever it left."""
    started = time.monotonic()
    stream = _start(env, ["run", "--poll-seconds", "1"])
    deadline = time.monotonic() + 120
    while running_stream(config) is None and stream.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    _timed(env, ["run (until it holds the lease)"], started, stream.poll())
    time.sleep(startup_s)  # the stream's start-up to its batches
    other = _start(env, ["savepoint", "--json"] if phase == "online-savepoint" else ["stop", "--savepoint"])
    _wait(other, kill_after_s)
    killed = _kill(stream if victim == "stream" else other)
    _wait(other, 300)  # a stopper whose stream is gone answers by itself
    _kill(other)
    if stream.poll() is None:  # stop what is left in order
        _sessionctl(env, "stop")
        _wait(stream, 300)
    _kill(stream)
    _timed(env, [phase, "(stream and other, whole)"], started, f"{victim} {'killed' if killed else 'finished first'}")
    return f"{victim} {'killed' if killed else 'finished first'}"


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


def plan(seed: int, kill_points: int) -> list[tuple[str, tuple[Any, ...]]]:
    """The seed's kills, drawn before any runs: each phase and its moments -- on the stopped job, the delay after
    the command took its lease (within KILL_WITHIN_S); beside the stream, the stream's start-up before the other
    command starts, the delay to the kill and the victim (_online). The tests pick their seeds from it."""
    rng = random.Random(seed)
    drawn: list[tuple[str, tuple[Any, ...]]] = []
    for _ in range(kill_points):
        phase = rng.choice(PHASES)
        if phase.startswith(("online", "stop")):
            drawn.append((phase, (rng.uniform(0.0, 8.0), rng.uniform(1.0, 25.0), rng.choice(("stream", "other")))))
        else:
            drawn.append((phase, (rng.uniform(0.0, KILL_WITHIN_S[phase]),)))
    return drawn


def _other_count(config: SessionsConfig) -> str:
    """The partition count the job does not have (2 <-> 3): a rescale to the count it has is a no-op without a JVM."""
    try:
        partitions = inspect_checkpoint(config.checkpoint).partitions
    except SessionsError:  # unreadable: the rescale's own one-line answer and the recovery after it say why
        partitions = 2
    return "3" if partitions == 2 else "2"


def run_campaign(work: Path, provider: str, seed: int, kill_points: int,
                 spark: SparkSession | None = None, *, settings: dict[str, str] | None = None) -> dict[str, Any]:
    """`kill_points` kills at random phases and moments (the seed decides), the operator's recoveries, a final catch-up;
    the sessions against the oracle. With `spark`, the setup (a catch-up and a savepoint) runs in it (_step).
    `settings`: more SESSIONS_* variables (e.g. a checkpoint on HDFS)."""
    started = time.monotonic()
    home = work / f"{provider}-{seed}"
    env = {**_env(home, provider), **(settings or {})}
    config = SessionsConfig.from_env(env)
    events = arrival_order(generate_events(40, 3, seed=seed), seed=seed, jitter_seconds=120)  # no late event
    parts = max(2, kill_points // 2 + 1)
    size = -(-len(events) // parts)
    chunks = [events[i * size:(i + 1) * size] for i in range(parts)]
    by_phase: Counter[str] = Counter()
    recoveries: list[str] = []
    reruns = 0
    # A job with a committed batch and a savepoint first, so every phase can be hit from the first kill on.
    land(config.landing, "part-0000.jsonl", [json.dumps(e) for e in chunks[0]])
    for setup in (("catch-up",), ("savepoint", "--json")):
        _step(env, config, spark, *setup)
    landed = 1
    for k, (phase, draws) in enumerate(plan(seed, kill_points)):
        if landed < len(chunks) and k % 2 == 0:
            land(config.landing, f"part-{landed:04d}.jsonl", [json.dumps(e) for e in chunks[landed]])
            landed += 1
        if phase.startswith(("online", "stop")):
            by_phase[f"{phase}:{_online(env, config, phase, *draws)}"] += 1
            recoveries += _recover(env)
            continue
        # A command that finished before its kill (a faster machine than the draw assumed) is run again with the
        # kill drawn sooner -- a quarter of the delay, then right at its lease -- so the kill lands inside it.
        for delay_s in (draws[0], draws[0] / 4, 0.0):
            args = {"catch-up": ["catch-up"], "savepoint": ["savepoint", "--json"],
                    "restore": ["restore", "--savepoint", "latest"],
                    "rescale": ["rescale", "--partitions", _other_count(config)], "compact": ["compact"]}[phase]
            killed = _kill_during(env, config, args, delay_s)
            recoveries += _recover(env)
            if killed:
                break
            reruns += 1
        by_phase[f"{phase}:{'killed' if killed else 'finished first'}"] += 1
    for i in range(landed, len(chunks)):
        land(config.landing, f"part-{i:04d}.jsonl", [json.dumps(e) for e in chunks[i]])
    recoveries += _final_catch_up(env)
    complete_savepoints = json.loads(_sessionctl(env, "savepoints", "--json").stdout or "[]")
    expected = expected_closed_sessions(chunks, GAP_MS, LATENESS_MS)
    got = []
    if table_exists(config, config.sessions_table):
        table = read_rows(open_table(config, config.sessions_table), columns=["session_id"])
        got = table["session_id"].to_pylist()
    expected_ids = {row[0] for row in expected}
    return {"provider": provider, "seed": seed, "kill_points": kill_points, "by_phase": dict(sorted(by_phase.items())),
            "reruns_after_finished_first": reruns,
            "expected_sessions": len(expected_ids), "written": len(got),
            "lost": len(expected_ids - set(got)), "duplicated": len(got) - len(set(got)),
            "unexpected": len(set(got) - expected_ids),
            "savepoints_complete": sum(1 for r in complete_savepoints if r["status"] == "complete"), "recoveries": Counter(r.split(":")[0] for r in recoveries),
            "minutes": round((time.monotonic() - started) / 60, 1), "load_avg_1m_end": round(os.getloadavg()[0], 2)}


# ---- named kill points (pipelines/coordination/__init__.py): crashes at exact moments of savepoints and folds -------------

# (command, point): each killed in turn on one chain -- a full savepoint and an incremental one, then changes not yet
# in a savepoint. The second kill of a kind reuses the chain and the changes its first one left (that one committed
# nothing); the folds fold that same chain (compaction keeping only its newest savepoint: the full one expires).
NAMED_KILLS = (("savepoint", "savepoint:files-written"), ("savepoint", "savepoint:committed"),
               ("compact", "fold:written"), ("compact", "fold:committed"))
# Killed right after taking a lease (its new epoch written, nothing done under it, no JVM started yet): a catch-up
# and a restore, each followed by a catch-up that must take the lease over (run_kill_points).


def _next_catch_up(env: dict[str, str], config: SessionsConfig, spark: SparkSession | None) -> tuple[int, str]:
    """The catch-up after a kill (_step: in `spark` when given): its exit code and error line (the CLI's: 1 and the
    one line for an expected operator error)."""
    if spark is None:
        done = _sessionctl(env, "catch-up")
        return done.returncode, done.stderr.strip()[-300:]
    try:
        _step(env, config, spark, "catch-up")
    except SessionsError as error:
        return 1, str(error)[-300:]
    return 0, ""


def _killed_at(env: dict[str, str], point: str, args: list[str]) -> int:
    """`sessionctl args` with SESSIONS_KILL_AT=point, in its own process group (the JVM dies with it): its exit code
    (-9 when it reached the point)."""
    proc = subprocess.Popen([SESSIONCTL, *args], env={**env, "SESSIONS_KILL_AT": point}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    started = time.monotonic()
    code = proc.wait(timeout=900)
    _timed({**env, "SESSIONS_KILL_AT": point}, args, started, code)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group
    return code


def _catalog(config: SessionsConfig) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    uri = f"{config.savepoint_uri}/catalog"
    return DeltaTable(uri).to_pyarrow_table().to_pylist() if DeltaTable.is_deltatable(uri) else []


def _chains_whole(config: SessionsConfig, catalog: list[dict[str, Any]]) -> bool:
    """Every complete savepoint's chain: members complete in the catalog, each a committed Delta table."""
    from deltalake import DeltaTable

    complete = {row["savepoint_id"] for row in catalog if row["status"] == "complete"}
    for row in catalog:
        if row["status"] != "complete":
            continue
        members = (row.get("chain") or row["savepoint_id"]).split(",")
        if not set(members) <= complete or not all(
                DeltaTable.is_deltatable(f"{config.savepoint_uri}/state/{member}") for member in members):
            return False
    return True


def run_kill_points(work: Path, provider: str, seed: int, spark: SparkSession | None = None, *,
                    settings: dict[str, str] | None = None, ingest_kill: bool = True) -> dict[str, Any]:
    """A chain of incremental savepoints, killed at each named point in turn -- between a savepoint's task files and
    its Delta commit, between that commit and its catalog row, inside a chain fold before and after the folded
    table's commit -- each followed by checks that nothing is half-listed as complete (the complete savepoints are
    the same, every chain whole, the newest restorable by the pre-flight); then the compaction that folds the chain,
    a catch-up killed right after taking its lease and the catch-up that must take it over, a savepoint on the folded
    chain, a restore of the newest, a restore killed right after taking its lease, and the final catch-up that must
    take it over, compared with the oracle.

    Its cost is its `sessionctl` processes (a JVM start for most): the chain is as short as the kills need (a full
    savepoint, one increment, changes), the kills share it, the lease kills sit where a catch-up is due anyway (that
    catch-up is the command that must take the lease over), and with `spark` the steps that are not killed (the
    chain, the compaction, the catch-ups that take a dead holder's lease over, the savepoint and restore after it)
    run in that session (_step): the takeover is the library's lease acquisition, the same in any process. `settings`: more SESSIONS_* variables (e.g. a checkpoint on HDFS); `ingest_kill` False: no ingest kill (see below)."""
    started = time.monotonic()
    home = work / f"{provider}-kill-points-{seed}"
    env = {**_env(home, provider), "SESSIONS_SAVEPOINT_FULL_EVERY": "10", "SESSIONS_SAVEPOINT_CHAIN_SHARE": "100",
           **(settings or {})}
    config = SessionsConfig.from_env(env)
    events = arrival_order(generate_events(40, 3, seed=seed), seed=seed, jitter_seconds=120)
    parts = 7  # one by one: the chain's two savepoints, the changes, the sink kill, the catch-up after a lease kill; two at the end
    size = -(-len(events) // parts)
    chunks = [events[i * size:(i + 1) * size] for i in range(parts)]
    landed = 0

    def land_next(pad: int = 0) -> None:
        nonlocal landed
        land(config.landing, f"part-{landed:04d}.jsonl",
             [json.dumps({**e, "props": "x" * pad} if pad else e) for e in chunks[landed]])
        landed += 1

    def lease_kill(args: list[str], then_land: int) -> dict[str, Any]:
        """`sessionctl args` killed right after taking its lease; `then_land` parts land; the catch-up after it must
        take the dead holder's lease over at once (same host, pid dead)."""
        code = _killed_at(env, "lease:taken", args)
        for _ in range(then_land):
            land_next()
        exit_code, error = _next_catch_up(env, config, spark)
        return {"point": "lease:taken", "command": " ".join(args), "killed": code == -signal.SIGKILL,
                "next_command_exit": exit_code, "next_command_error": error}

    for savepoint in (True, True, False):  # the chain's full savepoint, an increment, then changes for the kills
        land_next()
        _step(env, config, spark, "catch-up")
        if savepoint:
            _step(env, config, spark, "savepoint", "--json")
    outcomes = []
    for command, point in NAMED_KILLS:
        before = _catalog(config)
        args = ["savepoint", "--json"] if command == "savepoint" else ["compact", "--keep-last", "1",
                                                                         "--keep-daily-days", "0"]
        code = _killed_at(env, point, args)
        after = _catalog(config)
        dry = _sessionctl(env, "restore", "--savepoint", "latest", "--dry-run", "--json")
        complete_before = {r["savepoint_id"] for r in before if r["status"] == "complete"}
        outcomes.append({
            "point": point, "killed": code == -signal.SIGKILL,
            "complete_unchanged": {r["savepoint_id"] for r in after if r["status"] == "complete"} == complete_before,
            "chains_whole": _chains_whole(config, after),
            "incremental_before": sum(1 for r in before if r.get("kind") == "incremental"),
            "restorable": dry.returncode == 0 and bool(json.loads(dry.stdout or "{}").get("restorable"))})
    folded = _step(env, config, spark, "compact", "--keep-last", "1", "--keep-daily-days", "0")["savepoints_folded"]
    # A part past SESSIONS_INGEST_TASK_MIB (an extra field, ignored by the line rules) and a catch-up whose Spark tasks
    # read it, killed between their raw_events files and the ingest commit: files in no version, the part unmoved.
    # (raw_events and landing are local paths with any checkpoint, which the ingest does not touch: `ingest_kill`
    # False leaves it to the local run; the dead holder of a remote job lease is the lease kills' below.)
    land_next(pad=-(-(1 << 20) // len(chunks[landed])) + 100 if ingest_kill else 0)
    ingest: dict[str, Any] | None = None
    if ingest_kill:
        tasks_env = {**env, "SESSIONS_INGEST_BY_TASKS": "always", "SESSIONS_INGEST_TASK_MIB": "1"}
        killed = _killed_at(tasks_env, "ingest:files-written", ["catch-up"]) == -signal.SIGKILL
        raw_in_version = {Path(uri).name for uri in open_table(config, config.raw_events_table).file_uris()}
        ingest = {"point": "ingest:files-written", "killed": killed,
                  "files_in_no_version": len({p.name for p in Path(config.raw_events_table).glob("*.parquet")}
                                             - raw_in_version),
                  "part_still_landed": (config.landing / f"part-{landed - 1:04d}.jsonl").exists()}
    # The same part, read here this time (or first): a catch-up killed between its tasks' session files and the sink's commit;
    # the next one redoes it.
    killed = _killed_at(env, "sink:files-written", ["catch-up"]) == -signal.SIGKILL
    in_version = {Path(uri).name for uri in open_table(config, config.sessions_table).file_uris()}
    sink_kill = {"point": "sink:files-written", "killed": killed,
                 "files_in_no_version": len({p.name for p in Path(config.sessions_table).glob("*.parquet")} - in_version)}
    taken = [lease_kill(["catch-up"], then_land=1)]
    _step(env, config, spark, "savepoint", "--json")  # an increment on the folded chain
    _step(env, config, spark, "restore", "--savepoint", "latest")
    taken.append(lease_kill(["restore", "--savepoint", "latest"], then_land=len(chunks) - landed))  # the final catch-up
    recoveries = [] if taken[-1]["next_command_exit"] == 0 else _final_catch_up(env)
    expected = {row[0] for row in expected_closed_sessions(chunks, GAP_MS, LATENESS_MS)}
    got = read_rows(open_table(config, config.sessions_table), columns=["session_id"])["session_id"].to_pylist()
    catalog = _catalog(config)
    return {"provider": provider, "seed": seed, "kill_points": outcomes, "ingest_kill": ingest,
            "sink_kill": sink_kill, "lease_kills": taken,
            "compact_after_kills_folded": folded,
            "chains_whole_at_end": _chains_whole(config, catalog),
            "kinds_at_end": dict(Counter(str(r.get("kind")) for r in catalog if r["status"] == "complete")),
            "expected_sessions": len(expected), "written": len(got), "lost": len(expected - set(got)),
            "duplicated": len(got) - len(set(got)), "unexpected": len(set(got) - expected), "recoveries": recoveries,
            "minutes": round((time.monotonic() - started) / 60, 1), "load_avg_1m_end": round(os.getloadavg()[0], 2)}
