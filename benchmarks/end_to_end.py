"""End to end: one JSONL clickstream through `sessionctl catch-up`, native Spark and Flink SQL, side by side.

One run generates ONE gap-only clickstream file (pipelines.core.sample_data: no logouts -- they become clicks --, no
duplicate event_ids, disorder of at most 2 minutes against a lateness of 10, so that no event is late anywhere)
plus one sentinel event, and then runs each engine in a fresh directory, one at a time, over the same file:

  sessionctl-jvm-rocksdb / -hdfs  the product: `.venv/bin/sessionctl catch-up` (ingest into raw_events, then the
                               availableNow stream, the JVM operator) with SESSIONS_HOME a fresh directory and the
                               file copied into its landing/ beforehand; SESSIONS_STATE_STORE = rocksdb / hdfs.
                               Sessions = rows of the `sessions` Delta table (read with deltalake). The ratios are
                               to sessionctl-jvm-rocksdb when it ran. (The names keep "jvm" so that results files of
                               the retired Python operator's `sessionctl-rocksdb` runs stay apart.)
  spark-rocksdb / -hdfs        native Spark (benchmarks/peers/spark_sessions.py, its own JVM): Spark's JSON file
                               source, withWatermark + groupBy(session_window, user_id), append, parquet sink,
                               availableNow, local[2], shuffle partitions 4, same provider.
  flink-rocksdb / -hashmap     Flink SQL 2.3.0 (benchmarks/peers/flink_sessions.py, run by the Flink venv of
                               `make peers`): filesystem JSON source, SESSION window TVF, csv sink, checkpoints
                               every 10 s, parallelism 2. Skipped with a note when the venv is missing.

The sentinel is one event of a user of its own at max(event_time) + gap + lateness + 1 minute, the last line of the
file: its watermark (max + gap + 1 min) closes every real session in every engine. Its own session stays open in the
Spark engines; Flink's bounded source ends with a MAX watermark that closes it too. It is never counted.

Repetitions alternate the order (A B C ... then ... C B A, then A B C again); the median over repetitions is reported.
Measured per run: wall seconds of the engine's process (from start to exit, JVM start included), events/s = lines in
the file / wall s, sessions produced (and their events and page views, checked against an exact gap-only
sessionization of the generated file: a mismatch is printed loudly and recorded), 1-minute load average before and
after, the CPU seconds of the engine's process tree (sampled from /proc every 0.5 s) and of the whole machine (so the
CPU taken by other people's jobs during the run shows), plus each engine's own inside view: catch-up's JSON summary
and its checkpoint's batch times, Spark's per-batch durationMs, Flink's net job runtime and checkpoints. Ingest alone
(`pipelines.ingest.ingest` into a fresh home, no Spark) is timed once per repetition to split sessionctl's time.

    .venv/bin/python benchmarks/end_to_end.py --quick        # 1/10 size, one repetition: a smoke run
    .venv/bin/python benchmarks/end_to_end.py                # 2M events over 50k users, 3 repetitions
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pipelines.core.sample_data import arrival_order, generate_events  # noqa: E402

PEERS = HERE / "peers"
FLINK_PYTHON = PEERS / ".venv-flink" / "bin" / "python"
SESSIONCTL = REPO / ".venv" / "bin" / "sessionctl"
SENTINEL_USER = "zz-end-sentinel"
EVENTS_PER_SESSION = 6.5 + 0.3  # generate_events: 1..12 events per session, +1 logout 30% of the time
ENGINES = ("sessionctl-jvm-rocksdb", "sessionctl-jvm-hdfs",
           "spark-rocksdb", "spark-hdfs", "flink-rocksdb", "flink-hashmap")
FULL = {"events": 2_000_000, "users": 50_000, "repetitions": 3}
QUICK = {"events": 200_000, "users": 5_000, "repetitions": 1}


def log(message: str) -> None:
    print(f"[{dt.datetime.now().strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------
# Data: one gap-only JSONL file and what every engine must produce from it.

def iso(t: dt.datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def parse_time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def generate(path: Path, events: int, users: int, seed: int, gap_min: int, lateness_min: int) -> dict[str, Any]:
    started = time.monotonic()
    sessions_per_user = max(1, math.ceil(events / (users * EVENTS_PER_SESSION) * 1.05))
    rows = arrival_order(generate_events(users, sessions_per_user, seed=seed, gap_minutes=gap_min), seed=seed,
                         duplicate_rate=0.0)
    while len(rows) < events:
        sessions_per_user += 1
        rows = arrival_order(generate_events(users, sessions_per_user, seed=seed, gap_minutes=gap_min), seed=seed,
                             duplicate_rate=0.0)
    rows = rows[:events]  # arrival order: the cut keeps a prefix of the stream; nothing left can become late
    logouts = 0
    for e in rows:
        if e["event_type"] == "logout":  # gap-only data: a logout would split sessions in the product only
            e["event_type"], e["page"] = "click", "/"
            logouts += 1
    ids = {e["event_id"] for e in rows}
    if len(ids) != len(rows):
        raise RuntimeError(f"duplicate event_ids in the generated data: {len(rows) - len(ids)}")

    # No event may be late: every event must be above (max event_time seen before it - lateness), the product's
    # rule (late = at or below the watermark), the strictest of the three engines'.
    lateness = dt.timedelta(minutes=lateness_min)
    max_seen: dt.datetime | None = None
    min_margin: float | None = None
    times = [parse_time(e["event_time"]) for e in rows]
    for t in times:
        if max_seen is not None:
            margin = (t - (max_seen - lateness)).total_seconds()
            min_margin = margin if min_margin is None else min(min_margin, margin)
            if margin <= 0:
                raise RuntimeError(f"event at {t} would be late (watermark {max_seen - lateness})")
        max_seen = t if max_seen is None or t > max_seen else max_seen
    assert max_seen is not None
    sentinel_time = max_seen + dt.timedelta(minutes=gap_min + lateness_min + 1)
    sentinel = {"event_id": "sentinel-end-0", "user_id": SENTINEL_USER, "event_time": iso(sentinel_time),
                "event_type": "click", "page": "/"}

    expected = expected_sessions(rows, times, gap_min)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for e in rows:
            fh.write(json.dumps(e))
            fh.write("\n")
        fh.write(json.dumps(sentinel) + "\n")
    return {
        "file": str(path),
        "bytes": path.stat().st_size,
        "lines": len(rows) + 1,
        "events": len(rows),
        "users": len({e["user_id"] for e in rows}),
        "sessions_per_user_generated": sessions_per_user,
        "logouts_turned_into_clicks": logouts,
        "duplicate_event_ids": 0,
        "min_time": iso(min(times)),
        "max_time": iso(max_seen),
        "sentinel": sentinel,
        "min_margin_above_watermark_s": min_margin,
        "expected": expected,
        "generate_seconds": round(time.monotonic() - started, 1),
    }


def expected_sessions(rows: list[dict[str, Any]], times: list[dt.datetime], gap_min: int) -> dict[str, int]:
    """Exact gap-only sessions of the file (the oracle's rules without logouts and duplicates): per user, in event
    time order, a new session when event_time - previous >= gap."""
    gap = dt.timedelta(minutes=gap_min)
    per_user: dict[str, list[tuple[dt.datetime, bool]]] = {}
    for e, t in zip(rows, times):
        per_user.setdefault(e["user_id"], []).append((t, e["event_type"] == "page_view"))
    sessions = page_views = 0
    for evs in per_user.values():
        evs.sort()
        previous = None
        for t, pv in evs:
            if previous is None or t - previous >= gap:
                sessions += 1
            previous = t
            page_views += pv
    return {"sessions": sessions, "events_in_sessions": len(rows), "page_views": page_views}


# ---------------------------------------------------------------------------------------------------
# Measuring one process: wall time, load, CPU of its process tree and of the machine.

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _proc_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, starttime, utime+stime ticks) of every process."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2:].split()
        # fields[0] = state (field 3); ppid is field 4, utime 14, stime 15, starttime 22
        table[int(name)] = (int(fields[1]), int(fields[19]), int(fields[11]) + int(fields[12]))
    return table


def _machine_busy_ticks() -> int:
    parts = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    values = [int(x) for x in parts]
    user, nice, system, _idle, _iowait, irq, softirq, steal = values[:8]
    return user + nice + system + irq + softirq + steal


class TreeCpu:
    """CPU seconds of a process and all its descendants, sampled every `interval` s (a process's last < interval s
    before it exits is missed; the long-lived JVMs and Python workers are not)."""

    def __init__(self, root: int, interval: float = 0.5):
        self.root, self.interval = root, interval
        self.seen: dict[tuple[int, int], int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        table = _proc_table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _s, _c) in table.items():
            children.setdefault(ppid, []).append(pid)
        stack = [self.root]
        while stack:
            pid = stack.pop()
            if pid in table:
                _ppid, start, ticks = table[pid]
                self.seen[(pid, start)] = max(ticks, self.seen.get((pid, start), 0))
            stack.extend(children.get(pid, []))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return round(sum(self.seen.values()) / CLK_TCK, 1)


def wait_for_calm(threshold: float | None, max_wait: float) -> float:
    """Wait (up to max_wait s) until the 1-minute load average is at most `threshold`: the machine is shared, and a
    run started into someone else's burst measures the burst. Returns the seconds waited (recorded)."""
    if threshold is None:
        return 0.0
    started = time.monotonic()
    while os.getloadavg()[0] > threshold and time.monotonic() - started < max_wait:
        time.sleep(5)
    return round(time.monotonic() - started, 1)


def run_process(argv: list[str], env: dict[str, str], run_dir: Path, timeout: float) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    stdout_path, stderr_path = run_dir / "stdout.txt", run_dir / "stderr.txt"
    load_before = os.getloadavg()
    busy_before = _machine_busy_ticks()
    started_wall = time.time()
    started = time.monotonic()
    with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, cwd=str(REPO), start_new_session=True)
        cpu = TreeCpu(proc.pid)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            rc = proc.wait()
            rc = rc if rc else -9
        wall = time.monotonic() - started
        tree_cpu_s = cpu.stop()
    busy_s = (_machine_busy_ticks() - busy_before) / CLK_TCK
    load_after = os.getloadavg()
    stdout = stdout_path.read_text(errors="replace")
    last_json = None
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                last_json = json.loads(line)
                break
            except ValueError:
                continue
    return {
        "rc": rc,
        "started_at": started_wall,
        "ended_at": started_wall + wall,
        "wall_s": round(wall, 3),
        "load1_before": round(load_before[0], 2),
        "load1_after": round(load_after[0], 2),
        "load5_before": round(load_before[1], 2),
        "load5_after": round(load_after[1], 2),
        "engine_cpu_s": tree_cpu_s,
        "machine_cpu_s": round(busy_s, 1),
        "others_cpu_s": round(max(0.0, busy_s - tree_cpu_s), 1),
        "output": last_json,
        "stderr_tail": None if rc == 0 else stderr_path.read_text(errors="replace")[-3000:],
    }


# ---------------------------------------------------------------------------------------------------
# The engines.

def clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment without SESSIONS_* (each engine gets only what is set here)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONS_")}
    env.update(extra)
    return env


def _mtimes(directory: Path) -> dict[int, float]:
    out = {}
    if directory.is_dir():
        for p in directory.iterdir():
            if p.name.isdigit():
                out[int(p.name)] = p.stat().st_mtime
    return out


def run_sessionctl(variant: str, data: Path, run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """variant: jvm-<provider>."""
    _, _, provider = variant.rpartition("-")
    home = run_dir / "home"
    (home / "landing").mkdir(parents=True)
    shutil.copy(data, home / "landing" / data.name)  # before the clock starts: the others read it in place
    env = clean_env(SESSIONS_HOME=str(home), SESSIONS_STATE_STORE=provider,
                    SESSIONS_GAP_MINUTES=str(args.gap_minutes), SESSIONS_LATENESS_MINUTES=str(args.lateness_minutes))
    result = run_process([str(SESSIONCTL), "catch-up"], env, run_dir, args.timeout)
    result["summary"] = result.pop("output")
    if result["rc"] != 0:
        return result
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    table = DeltaTable(str(home / "warehouse" / "sessions")).to_pyarrow_table(
        columns=["user_id", "event_count", "page_views"])
    mask = pc.equal(table["user_id"], SENTINEL_USER)
    result["excluded_sessions"] = int(pc.sum(mask.cast("int64")).as_py() or 0)
    table = table.filter(pc.invert(mask))
    result["sessions"] = table.num_rows
    result["events_in_sessions"] = int(pc.sum(table["event_count"]).as_py() or 0)
    result["page_views"] = int(pc.sum(table["page_views"]).as_py() or 0)

    # The split, from file times: ingest ends with raw_events' last Delta commit before the stream's first offset
    # file; the stream runs until its last commit file; per batch offsets/N -> commits/N.
    ckpt = home / "checkpoints" / "sessions"
    offsets, commits = _mtimes(ckpt / "offsets"), _mtimes(ckpt / "commits")
    first_offset = min(offsets.values()) if offsets else None
    raw_log = home / "warehouse" / "raw_events" / "_delta_log"
    raw_commits = sorted(p.stat().st_mtime for p in raw_log.glob("*.json"))
    ingest_done = max((t for t in raw_commits if first_offset is None or t <= first_offset), default=None)
    last_commit = max(commits.values()) if commits else None
    start, end = result["started_at"], result["ended_at"]
    split: dict[str, Any] = {}
    if ingest_done and last_commit:
        split = {
            "start_to_ingest_committed_s": round(ingest_done - start, 2),   # Python + JVM start + ingest
            "ingest_committed_to_first_batch_planned_s": round((first_offset or ingest_done) - ingest_done, 2),
            "stream_s": round(last_commit - ingest_done, 2),                # query start + every batch
            "after_last_batch_s": round(end - last_commit, 2),              # stop, JVM shutdown, exit
        }
    split["batches"] = [{"batch": b, "offset_to_commit_s": round(commits[b] - offsets[b], 2)}
                        for b in sorted(commits) if b in offsets]
    result["split"] = split
    return result


def run_peer(argv: list[str], run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """A peer engine's process; its JSON line's counts lifted into the result."""
    result = run_process(argv, clean_env(), run_dir, args.timeout)
    out = result.pop("output") or {}
    result["inside"] = out
    for key in ("sessions", "events_in_sessions", "page_views", "excluded_sessions"):
        if key in out:
            result[key] = out[key]
    return result


def run_spark(provider: str, data_dir: Path, run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    argv = [sys.executable, str(PEERS / "spark_sessions.py"), "--input", str(data_dir),
            "--output", str(run_dir / "out"), "--checkpoint", str(run_dir / "checkpoint"), "--provider", provider,
            "--gap-minutes", str(args.gap_minutes), "--lateness-minutes", str(args.lateness_minutes),
            "--partitions", str(args.partitions), "--exclude-user", SENTINEL_USER]
    return run_peer(argv, run_dir, args)


def run_flink(backend: str, data_dir: Path, run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    argv = [str(FLINK_PYTHON), str(PEERS / "flink_sessions.py"), "--input", str(data_dir),
            "--output", str(run_dir / "out"), "--checkpoints", str(run_dir / "checkpoints"), "--backend", backend,
            "--gap-minutes", str(args.gap_minutes), "--lateness-minutes", str(args.lateness_minutes),
            "--parallelism", "2", "--exclude-user", SENTINEL_USER, "--log-dir", str(run_dir / "flink-log")]
    return run_peer(argv, run_dir, args)


def run_engine(engine: str, data: Path, run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    kind, variant = engine.split("-", 1)
    if kind == "sessionctl":
        return run_sessionctl(variant, data, run_dir, args)
    if kind == "spark":
        return run_spark(variant, data.parent, run_dir, args)
    return run_flink(variant, data.parent, run_dir, args)


def time_ingest_alone(data: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """pipelines.ingest.ingest into a fresh home, in this process, no Spark: what sessionctl's ingest step costs."""
    from pipelines.config import SessionsConfig
    from pipelines.ingest import ingest

    home = work / "ingest-alone"
    shutil.rmtree(home, ignore_errors=True)
    (home / "landing").mkdir(parents=True)
    shutil.copy(data, home / "landing" / data.name)
    config = SessionsConfig.from_env(clean_env(SESSIONS_HOME=str(home)))
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    result = ingest(config)
    seconds = time.monotonic() - started
    shutil.rmtree(home, ignore_errors=True)
    return {"seconds": round(seconds, 2), "rows": result.rows, "load1_before": round(load_before, 2),
            "load1_after": round(os.getloadavg()[0], 2)}


# ---------------------------------------------------------------------------------------------------
# Reporting.

def machine_info() -> dict[str, Any]:
    def cmd(*argv: str) -> str:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=str(REPO))
            return (out.stdout + out.stderr).strip()
        except Exception as exc:  # noqa: BLE001 - informational only
            return f"unavailable: {exc}"

    cpu_model = None
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu_model = line.split(":", 1)[1].strip()
            break
    kb = int(next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal")).split()[1])
    import pyspark

    flink = None
    if FLINK_PYTHON.exists():
        flink = cmd(str(FLINK_PYTHON), "-c", "from importlib.metadata import version; print(version('apache-flink'))")
    java = cmd("java", "-version")
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model,
        "mem_total_gb": round(kb / 1024 / 1024, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "apache_flink": flink,
        "java": java.splitlines()[0] if java else None,
        "git_commit": cmd("git", "rev-parse", "--short", "HEAD"),
        "git_uncommitted_in_product": [ln[3:] for ln in cmd("git", "status", "--porcelain").splitlines()
                                       if ln[3:].startswith(("pipelines/", "sessionctl/", "state_store/"))],
    }


def product_tree() -> dict[str, Any]:
    """The product code a repetition ran: HEAD and a fingerprint of uncommitted changes under the product's packages
    (other people edit them while this runs; a changed fingerprint between repetitions says the code changed)."""
    import hashlib

    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], capture_output=True, text=True, cwd=str(REPO)).stdout

    paths = ["pipelines", "sessionctl", "state_store"]
    diff = git("diff", "HEAD", "--", *paths)
    untracked = git("ls-files", "--others", "--exclude-standard", "--", *paths).split()
    digest = hashlib.sha1(diff.encode())
    for name in sorted(untracked):
        with suppress(OSError):
            digest.update(name.encode() + (REPO / name).read_bytes())
    changed = [ln[3:] for ln in git("status", "--porcelain", "--", *paths).splitlines()]
    return {"head": git("rev-parse", "--short", "HEAD").strip(), "uncommitted": changed,
            "fingerprint": digest.hexdigest()[:12] if changed else None}


def summarize(engine: str, runs: list[dict[str, Any]], lines: int) -> dict[str, Any]:
    ok = [r for r in runs if r.get("rc") == 0]
    walls = [r["wall_s"] for r in ok]
    median = statistics.median(walls) if walls else None
    sessions = sorted({r.get("sessions") for r in ok})
    return {
        "engine": engine,
        "runs_ok": len(ok),
        "runs_failed": len(runs) - len(ok),
        "wall_s_median": median,
        "wall_s_all": [r["wall_s"] for r in runs],
        "wall_s_min": min(walls) if walls else None,
        "events_per_s": round(lines / median) if median else None,
        "sessions": sessions[0] if len(sessions) == 1 else sessions,
        "engine_cpu_s_median": statistics.median([r["engine_cpu_s"] for r in ok]) if ok else None,
        "events_per_engine_cpu_s": (round(lines / statistics.median([r["engine_cpu_s"] for r in ok]))
                                    if ok and statistics.median([r["engine_cpu_s"] for r in ok]) else None),
        "others_cpu_s_all": [r["others_cpu_s"] for r in runs],
        "load1": [(r["load1_before"], r["load1_after"]) for r in runs],
    }


def check(engine: str, rep: int, result: dict[str, Any], expected: dict[str, int]) -> list[str]:
    if result.get("rc") != 0:
        return [f"{engine} repetition {rep}: FAILED (exit {result.get('rc')}), no sessions to compare"]
    problems = []
    for key in ("sessions", "events_in_sessions", "page_views"):
        if result.get(key) != expected[key]:
            problems.append(f"{engine} repetition {rep}: {key} {result.get(key)} != expected {expected[key]}")
    return problems


LABELS = {
    "sessionctl-jvm-rocksdb": ("sessionctl catch-up, JVM operator (the default)", "rocksdb"),
    "sessionctl-jvm-hdfs": ("sessionctl catch-up, JVM operator (the default)", "hdfs"),
    "spark-rocksdb": ("native Spark session_window", "rocksdb"),
    "spark-hdfs": ("native Spark session_window", "hdfs"),
    "flink-rocksdb": ("Flink SQL SESSION TVF", "rocksdb"),
    "flink-hashmap": ("Flink SQL SESSION TVF", "hashmap"),
}


def render_md(results: dict[str, Any]) -> str:
    d, s, m = results["data"], results["settings"], results["machine"]
    # Ratios to this job as a user runs it: the default (JVM) operator on RocksDB, else the Python operator's run.
    base_engine = next((e for e in ("sessionctl-jvm-rocksdb", "sessionctl-rocksdb") if e in results["summary"]),
                       "sessionctl-jvm-rocksdb")
    base = results["summary"].get(base_engine, {}).get("events_per_s")
    base_cpu = results["summary"].get(base_engine, {}).get("events_per_engine_cpu_s")
    title = "End to end: sessionctl catch-up vs native Spark vs Flink SQL" + (" -- QUICK run" if s["quick"] else "")
    out = [
        f"# {title}",
        "",
        f"Measured {results['date']} on {m['cpu_count']} cores ({m['cpu_model']}, {m['mem_total_gb']} GB), "
        f"{m['java']}, PySpark {m['pyspark']}, apache-flink {m['apache_flink']}, commit {m['git_commit']}"
        + (f" (uncommitted product changes of others in the tree: {', '.join(m['git_uncommitted_in_product'])})"
           if m["git_uncommitted_in_product"] else "") + ".",
        *([f"Note: {s['note']}"] if s["note"] else []),
        f"Data: one JSONL file, {d['lines']:,} lines ({d['events']:,} events over {d['users']:,} users + 1 sentinel), "
        f"{d['bytes'] / 1e6:.0f} MB; gap {s['gap_minutes']} min, lateness {s['lateness_minutes']} min; "
        f"expected {d['expected']['sessions']:,} sessions. {s['repetitions']} repetition(s), order alternating "
        f"({' / '.join(' '.join(o) for o in results['orders'][:2])}); median reported.",
        "",
        "events/s = lines in the file / wall s of the engine's process (start to exit: JVM start, ingest and the "
        f"stream included). ratio = events/s / this job's events/s ({LABELS[base_engine][0]}, rocksdb; > 1: faster "
        "than this job). Engine CPU s = "
        "CPU time of the engine's process tree (JVM, Python workers); others' CPU s = the rest of the machine's busy "
        "CPU during the run (other people's jobs: 2 cores give at most 2 x wall s in all). Before each run the "
        f"script waited for load <= {s.get('calm_load')} (at most {s.get('calm_wait_s', 0):.0f} s; waits per run in "
        "the JSON).",
        "",
        "| engine | provider/backend | wall s median | wall s all runs | events/s | sessions | ratio to this job's rocksdb | engine CPU s (median) | events per engine CPU s | CPU ratio to this job's rocksdb | load 1m before->after, per run | others' CPU s per run |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for engine, row in results["summary"].items():
        name, provider = LABELS[engine]
        if row.get("skipped"):
            out.append(f"| {name} | {provider} | skipped | {row['skipped']} | | | | | | | | |")
            continue
        eps = row["events_per_s"]
        ratio = f"{eps / base:.2f}x" if eps and base else "-"
        loads = ", ".join(f"{a:.1f}->{b:.1f}" for a, b in row["load1"])
        walls = ", ".join(f"{w:.1f}" for w in row["wall_s_all"])
        med = f"{row['wall_s_median']:.1f}" if row["wall_s_median"] else "-"
        epc = row.get("events_per_engine_cpu_s")
        per_cpu = f"{epc:,}" if epc else "-"
        cpu_ratio = f"{epc / base_cpu:.2f}x" if epc and base_cpu else "-"
        out.append(f"| {name} | {provider} | {med} | {walls} | {eps:,} | {row['sessions']} | {ratio} | "
                   f"{row['engine_cpu_s_median']} | {per_cpu} | {cpu_ratio} | {loads} | "
                   f"{', '.join(str(x) for x in row['others_cpu_s_all'])} |"
                   if eps else f"| {name} | {provider} | {med} | {walls} | - | {row['sessions']} | - | - | - | - | {loads} | |")
    out += ["", "**Agreement:** " + ("all engines produced the expected sessions, events and page views in every run."
                                     if not results["mismatches"] else "MISMATCHES -- " + "; ".join(results["mismatches"]))]

    # sessionctl's split and the engines' inside views (median run of each).
    out += ["", "## Inside the runs (the median run of each engine)", "",
            "| engine | provider | inside view |", "|---|---|---|"]
    ingest_alone_text = ", ".join(str(x["seconds"]) for x in results["ingest_alone"])
    for engine in results["summary"]:
        runs = [r for r in results["runs"] if r["engine"] == engine and r.get("rc") == 0]
        if not runs:
            continue
        r = sorted(runs, key=lambda x: x["wall_s"])[len(runs) // 2]
        name, provider = LABELS[engine]
        if engine.startswith("sessionctl"):
            sp, sm = r.get("split", {}), r.get("summary") or {}
            batches = ", ".join(f"{b['batch']}: {b['offset_to_commit_s']} s" for b in sp.get("batches", []))
            view = (f"catch-up summary seconds {sm.get('seconds')} (lease to end: JVM start + ingest + stream), "
                    f"batches {sm.get('batches')}; start -> ingest committed {sp.get('start_to_ingest_committed_s')} s "
                    f"(Python + JVM start + ingest; ingest alone without Spark, per repetition: {ingest_alone_text} s); stream (query start "
                    f"+ batches) {sp.get('stream_s')} s; batch offset->commit: {batches}; after the last batch "
                    f"{sp.get('after_last_batch_s')} s")
            if sm.get("phase_seconds"):  # catch-up's own clock (summaries from before it had none)
                view += "; catch-up's phases: " + ", ".join(f"{k} {v} s" for k, v in sm["phase_seconds"].items())
        elif engine.startswith("spark"):
            inside = r.get("inside", {})
            phases = "; ".join(f"batch {b['batchId']} ({b['numInputRows']:,} rows): " + ", ".join(
                f"{k} {v / 1000:.1f}" for k, v in sorted((b["durationMs"] or {}).items(), key=lambda kv: -kv[1])
                if v >= 100) for b in inside.get("batches", []))
            view = (f"JVM start {inside.get('jvm_start_s')} s, query {inside.get('query_s')} s; durationMs phases "
                    f"(s, >= 0.1): {phases}")
        else:
            inside = r.get("inside", {})
            view = (f"gateway JVM + planning {inside.get('startup_s')} s, submit to end "
                    f"{inside.get('submit_to_end_s')} s, Flink net job runtime {inside.get('job_net_runtime_s')} s; "
                    f"source splits {inside.get('source_splits')}; {inside.get('completed_checkpoints')} checkpoints "
                    f"({', '.join(str(x) for x in inside.get('checkpoint_duration_ms', []))} ms); operators "
                    f"{', '.join(inside.get('plan_operators', []))}")
        out.append(f"| {name} | {provider} | {view} |")
    out += ["", f"Full figures, every run, the settings of each engine: `{results['json_name']}`.", ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="1/10 of the default size, one repetition: a smoke run")
    p.add_argument("--events", type=int, default=None, help=f"events in the file (default {FULL['events']:,})")
    p.add_argument("--users", type=int, default=None, help=f"distinct users (default {FULL['users']:,})")
    p.add_argument("--repetitions", type=int, default=None, help="rounds over all engines (default 3; quick 1)")
    p.add_argument("--engines", default=",".join(ENGINES), help="comma list, in the order of the first round")
    p.add_argument("--partitions", type=int, default=4, help="native Spark shuffle partitions (job default: 4)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--timeout", type=float, default=3600, help="per engine run, seconds")
    p.add_argument("--work-dir", default=None, help="default: a temp dir, removed afterwards")
    p.add_argument("--keep", action="store_true", help="keep the work dir (data and every run's directory)")
    p.add_argument("--results-dir", default=str(HERE / "results"))
    p.add_argument("--calm-load", type=float, default=2.0,
                   help="before each run wait until the 1-minute load average is at most this (default 2.0 = the "
                        "2 cores; negative: never wait)")
    p.add_argument("--calm-wait", type=float, default=180, help="... but at most this many seconds (default 180)")
    p.add_argument("--note", default="")
    p.add_argument("--render", default=None, metavar="JSON",
                   help="only re-render the summary and the .md from a results JSON of an earlier run")
    args = p.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for key in ("events", "users", "repetitions"):
        if getattr(args, key) is None:
            setattr(args, key, defaults[key])
    env = os.environ
    args.gap_minutes = int(env.get("SESSIONS_GAP_MINUTES") or 30)
    args.lateness_minutes = int(env.get("SESSIONS_LATENESS_MINUTES") or 10)
    if args.calm_load is not None and args.calm_load < 0:
        args.calm_load = None
    args.engine_list = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in args.engine_list if e not in ENGINES]
    if unknown:
        p.error(f"unknown engines {unknown}; choose from {', '.join(ENGINES)}")
    return args


def rerender(path: Path) -> int:
    results = json.loads(path.read_text())
    lines = results["data"]["lines"]
    for engine, row in list(results["summary"].items()):
        if not row.get("skipped"):
            results["summary"][engine] = summarize(engine, [r for r in results["runs"] if r["engine"] == engine],
                                                   lines)
    path.write_text(json.dumps(results, indent=1, default=str) + "\n")
    path.with_suffix(".md").write_text(render_md(results))
    print(render_md(results))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        return rerender(Path(args.render))
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="end_to_end_"))
    work.mkdir(parents=True, exist_ok=True)
    results_dir = Path(args.results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    data = work / "data" / "clicks.jsonl"
    log(f"work dir {work}; generating {args.events:,} events over {args.users:,} users")
    info = generate(data, args.events, args.users, args.seed, args.gap_minutes, args.lateness_minutes)
    log(f"data: {info['lines']:,} lines, {info['bytes'] / 1e6:.0f} MB, expected {info['expected']['sessions']:,} "
        f"sessions (min margin above the watermark {info['min_margin_above_watermark_s']:.0f} s), "
        f"{info['generate_seconds']} s")

    engines = list(args.engine_list)
    skipped: dict[str, str] = {}
    if any(e.startswith("flink") for e in engines) and not FLINK_PYTHON.exists():
        note = f"{FLINK_PYTHON.relative_to(REPO)} is missing: run `make peers` (skipped, the run goes on)"
        for e in engines:
            if e.startswith("flink"):
                skipped[e] = note
        log(f"NOTE: Flink skipped: {note}")
    active = [e for e in engines if e not in skipped]

    runs: list[dict[str, Any]] = []
    mismatches: list[str] = []
    ingest_alone: list[dict[str, Any]] = []
    orders: list[list[str]] = []
    trees: list[dict[str, Any]] = []
    for rep in range(args.repetitions):
        order = active if rep % 2 == 0 else list(reversed(active))
        orders.append(order)
        log(f"repetition {rep + 1}/{args.repetitions}: ingest alone, then {' '.join(order)}")
        trees.append(product_tree())
        log(f"  product code: {trees[-1]}")
        ingest_alone.append(time_ingest_alone(data, work, args))
        log(f"  ingest alone (pipelines.ingest.ingest, no Spark): {ingest_alone[-1]['seconds']} s")
        for engine in order:
            run_dir = work / "runs" / f"r{rep + 1}-{engine}"
            waited = wait_for_calm(args.calm_load, args.calm_wait)
            log(f"  {engine}: running (load 1m {os.getloadavg()[0]:.2f}, waited {waited} s for load <= "
                f"{args.calm_load})")
            result = run_engine(engine, data, run_dir, args)
            result.update({"engine": engine, "repetition": rep + 1, "calm_wait_s": waited})
            runs.append(result)
            problems = check(engine, rep + 1, result, info["expected"])
            for problem in problems:
                print(f"!!!!!!!! MISMATCH: {problem} !!!!!!!!", file=sys.stderr, flush=True)
            mismatches += problems
            eps = info["lines"] / result["wall_s"] if result["rc"] == 0 else 0
            log(f"  {engine}: rc {result['rc']}, wall {result['wall_s']:.1f} s, {eps:,.0f} events/s, sessions "
                f"{result.get('sessions')}, load {result['load1_before']}->{result['load1_after']}, engine CPU "
                f"{result['engine_cpu_s']} s, others' CPU {result['others_cpu_s']} s")
            if not args.keep:
                shutil.rmtree(run_dir, ignore_errors=True)

    summary: dict[str, Any] = {}
    for engine in engines:
        if engine in skipped:
            summary[engine] = {"engine": engine, "skipped": skipped[engine]}
        else:
            summary[engine] = summarize(engine, [r for r in runs if r["engine"] == engine], info["lines"])
    name = "end_to_end"  # a quick run says so in its title and settings.quick
    results = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "json_name": f"{name}.json",
        "settings": {"quick": args.quick, "events": args.events, "users": args.users,
                     "repetitions": args.repetitions, "engines": engines, "partitions": args.partitions,
                     "gap_minutes": args.gap_minutes, "lateness_minutes": args.lateness_minutes, "seed": args.seed,
                     "calm_load": args.calm_load, "calm_wait_s": args.calm_wait, "note": args.note,
                     "how_measured": {
                         "wall_s": "time.monotonic around the engine's process, Popen to exit",
                         "events_per_s": "lines in the file (events + sentinel) / wall_s",
                         "engine_cpu_s": "utime+stime of the process tree, sampled from /proc every 0.5 s",
                         "others_cpu_s": "machine busy CPU (/proc/stat) during the run minus engine_cpu_s",
                         "sessionctl split": "file times: raw_events' last Delta commit before offsets/0, "
                                             "offsets/N and commits/N of the checkpoint, process start and exit",
                     }},
        "machine": machine_info(),
        "data": info,
        "orders": orders,
        "ingest_alone": ingest_alone,
        "product_tree_per_repetition": trees,
        "summary": summary,
        "mismatches": mismatches,
        "runs": runs,
    }
    (results_dir / f"{name}.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    (results_dir / f"{name}.md").write_text(render_md(results))
    print(render_md(results))
    if mismatches:
        print("!!!!!!!! SESSION MISMATCHES: " + "; ".join(mismatches), file=sys.stderr, flush=True)
    if not args.keep and not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
