"""Soak: `sessionctl run` for a long time with files landing at a steady rate and an online savepoint on schedule;
does the run stay as lean and as fast at the end as it was at the start?

What runs: `sessionctl run` (its own process tree: the CLI's Python, the Spark JVM, the Python workers) on a fresh
SESSIONS_HOME; a producer thread here lands a file every 60/--files-per-minute seconds (written elsewhere, renamed
in), each --events-per-file events of a pool of --users users whose event time runs --event-speedup times faster than
the wall clock (so sessions close and the open state reaches a steady size within minutes: 40 event minutes of gap and
lateness pass in 40/speedup wall minutes); `sessionctl savepoint --json` every --savepoint-every-minutes.
What is measured, every --sample-seconds: the resident memory (VmRSS from /proc) of the run's whole process tree and
of each kind of process in it, the load average, the landing backlog; every batch's duration (its offset-log file's
time to its commit file's time: Spark deletes old ones, so they are read as they come); the savepoints' durations.
Reported: the first --window-minutes vs the last (default 10, or a quarter of the run when shorter): medians of RSS
and batch duration and their ratios (goal <= 1.1x), batches during a savepoint apart too, and the machine's load.
Results: benchmarks/results/soak.json and soak.md (--results-dir). Usage:
  .venv/bin/python benchmarks/soak.py [--minutes 60] [--savepoint-every-minutes 5] [--files-per-minute 6]
                                      [--events-per-file 2000] [--users 20000] [--poll-seconds 5]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipelines.config import SessionsConfig  # noqa: E402
from pipelines.core.sample_data import PAGES, TYPES, land  # noqa: E402

SESSIONCTL = str(Path(sys.executable).parent / "sessionctl")
EVENT_START = dt.datetime(2026, 11, 1, 8, tzinfo=dt.timezone.utc)


# ---- the process tree's memory -------------------------------------------------------------------------------

def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, kind): jvm, python_workers (any Python: the root is told apart by tree_rss) or other."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        exe = os.path.basename(cmdline[0].decode(errors="replace")) if cmdline and cmdline[0] else "?"
        if exe.startswith("java"):
            kind = "jvm"
        elif "python" in exe:
            kind = "python_workers"  # the run's own Python is its root (python_driver); every other one Spark's
        else:
            kind = "other"
        table[int(entry.name)] = (ppid, kind)
    return table


def _kib(path: str, field: str) -> int:
    with suppress(OSError):
        for line in Path(path).read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def tree_rss(root: int) -> dict[str, int]:
    """KiB resident per kind of process in `root`'s tree (root included), and `total`, `processes`; `pss_total`:
    the proportional set size, where a page shared by N processes (Spark's forked Python workers) counts 1/N each."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            found.append(pid)
            todo.extend(children.get(pid, []))
    by_kind: dict[str, int] = {"total": 0, "pss_total": 0, "processes": len(found)}
    for pid in found:
        kib = _kib(f"/proc/{pid}/status", "VmRSS:")
        kind = "python_driver" if pid == root else table[pid][1]
        by_kind[kind] = by_kind.get(kind, 0) + kib
        by_kind["total"] += kib
        by_kind["pss_total"] += _kib(f"/proc/{pid}/smaps_rollup", "Pss:")
    return by_kind


# ---- the producer ----------------------------------------------------------------------------------------------

class Producer(threading.Thread):
    """Lands a file every `period_s` seconds; event time = EVENT_START + speedup x wall time since the start (each
    event up to a minute of event time earlier: disorder well within the lateness)."""

    def __init__(self, landing: Path, period_s: float, events_per_file: int, users: int, speedup: float,
                 stop: threading.Event) -> None:
        super().__init__(daemon=True, name="producer")
        self.landing, self.period_s, self.events_per_file = landing, period_s, events_per_file
        self.users, self.speedup, self.stop = users, speedup, stop
        self.files, self.events, self.started = 0, 0, time.monotonic()
        self.rng = random.Random(7)

    def run(self) -> None:
        due = time.monotonic()
        while not self.stop.is_set():
            now = dt.timedelta(seconds=(time.monotonic() - self.started) * self.speedup)
            lines = []
            for _ in range(self.events_per_file):
                self.events += 1
                at = EVENT_START + now - dt.timedelta(seconds=self.rng.uniform(0, 60))
                kind = "logout" if self.rng.random() < 0.03 else self.rng.choice(TYPES)
                lines.append(json.dumps({"event_id": f"e-{self.events:010d}",
                                         "user_id": f"user-{self.rng.randrange(self.users):07d}",
                                         "event_time": at.isoformat().replace("+00:00", "Z"), "event_type": kind,
                                         "page": None if kind == "logout" else self.rng.choice(PAGES)}))
            land(self.landing, f"soak-{self.files:06d}.jsonl", lines)
            self.files += 1
            due += self.period_s
            self.stop.wait(max(0.0, due - time.monotonic()))


# ---- sampling --------------------------------------------------------------------------------------------------

class Sampler(threading.Thread):
    """Every `every_s`: the run's tree RSS, the load, the landing backlog, and the batches committed since."""

    def __init__(self, run_pid: int, home: Path, checkpoint: Path, every_s: float, stop: threading.Event,
                 started: float) -> None:
        super().__init__(daemon=True, name="sampler")
        self.run_pid, self.home, self.every_s, self.stop, self.started = run_pid, home, every_s, stop, started
        self.checkpoint = checkpoint
        self.samples: list[dict[str, Any]] = []
        self.batches: dict[int, tuple[float, float]] = {}  # batch id -> (start, end) wall time
        self.sizes: list[dict[str, Any]] = []

    def _read_batches(self) -> None:
        checkpoint = self.checkpoint
        with_commit = checkpoint / "commits"
        if not with_commit.exists():
            return
        for commit in list(with_commit.iterdir()):
            if not commit.name.isdigit() or int(commit.name) in self.batches:
                continue
            try:
                self.batches[int(commit.name)] = ((checkpoint / "offsets" / commit.name).stat().st_mtime,
                                                  commit.stat().st_mtime)
            except OSError:
                continue  # deleted by Spark's retention meanwhile

    def run(self) -> None:
        last_size = 0.0
        while not self.stop.is_set():
            now = time.time()
            self._read_batches()
            backlog = len(list((self.home / "landing").glob("*.jsonl")))
            self.samples.append({"t": round(now - self.started, 1), "rss_kib": tree_rss(self.run_pid),
                                 "load": [round(x, 2) for x in os.getloadavg()], "landing_backlog": backlog})
            if now - last_size >= 60:
                last_size = now
                self.sizes.append({"t": round(now - self.started, 1), **{
                    name: _du(self.home / name) for name in ("checkpoints", "warehouse", "logs")}})
            self.stop.wait(self.every_s)
        self._read_batches()


def _du(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with suppress(OSError):  # deleted meanwhile (Spark's retention, a compaction)
                total += os.stat(os.path.join(root, name)).st_size
    return total


# ---- the run ---------------------------------------------------------------------------------------------------

def savepoint(env: dict[str, str], started: float) -> dict[str, Any]:
    begun = time.time()
    done = subprocess.run([SESSIONCTL, "savepoint", "--json"], env=env, capture_output=True, text=True, timeout=900)
    out: dict[str, Any] = {"t": round(begun - started, 1), "seconds": round(time.time() - begun, 2),
                           "exit": done.returncode}
    if done.returncode == 0:
        fields = json.loads(done.stdout.strip().splitlines()[-1])
        out.update({k: fields.get(k) for k in ("savepoint_id", "batch_id", "rows")})
    else:
        out["error"] = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    return out


def soak(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    home = work / "home"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SESSIONS_")},
           "SESSIONS_HOME": str(home), "SESSIONS_STATE_STORE": args.provider, "PYSPARK_PYTHON": sys.executable,
           "PYTHONPATH": str(REPO)}
    (home / "landing").mkdir(parents=True)
    stop = threading.Event()
    out_path, err_path = work / "run.out", work / "run.err"
    with out_path.open("w") as out, err_path.open("w") as err:
        run = subprocess.Popen([SESSIONCTL, "run", "--poll-seconds", str(args.poll_seconds)], env=env, stdout=out,
                               stderr=err)
    started = time.time()
    producer = Producer(home / "landing", 60.0 / args.files_per_minute, args.events_per_file, args.users,
                        args.event_speedup, stop)
    sampler = Sampler(run.pid, home, SessionsConfig.from_env(env).checkpoint, args.sample_seconds, stop, started)
    savepoints: list[dict[str, Any]] = []
    load_before = [round(x, 2) for x in os.getloadavg()]
    producer.start()
    sampler.start()
    try:
        end = started + args.minutes * 60
        next_savepoint = started + args.savepoint_every_minutes * 60
        while time.time() < end:
            if run.poll() is not None:  # a result too: reported with its exit code and stderr
                print(f"sessionctl run ended early ({run.returncode}): {err_path.read_text()[-2000:]}", flush=True)
                break
            if args.savepoint_every_minutes > 0 and time.time() >= next_savepoint:
                savepoints.append(savepoint(env, started))
                print(f"  savepoint at {savepoints[-1]['t']:.0f} s: {savepoints[-1]}", flush=True)
                next_savepoint += args.savepoint_every_minutes * 60
            time.sleep(1)
    finally:
        stop.set()
        producer.join(timeout=60)
        sampler.join(timeout=120)
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
        run.wait(timeout=600)
    stdout = out_path.read_text().strip().splitlines()
    summary = json.loads(stdout[-1]) if stdout and stdout[-1].startswith("{") else None
    return {"exit": run.returncode, "ran_s": round(time.time() - started, 1), "summary": summary,
            "files_landed": producer.files, "events_landed": producer.events, "load_before": load_before,
            "load_after": [round(x, 2) for x in os.getloadavg()], "samples": sampler.samples,
            "batches": [{"batch": b, "start": round(s - started, 2), "seconds": round(e - s, 3)}
                        for b, (s, e) in sorted(sampler.batches.items())],
            "savepoints": savepoints, "sizes": sampler.sizes,
            "stderr_tail": err_path.read_text().splitlines()[-20:]}


def _median(values: list[float], digits: int = 3) -> float | None:
    return round(statistics.median(values), digits) if values else None


def _ratio(last: float | None, first: float | None) -> float | None:
    return round(last / first, 3) if last is not None and first else None


def windows(result: dict[str, Any], minutes: float, window_minutes: float) -> dict[str, Any]:
    """First vs last window: medians of RSS (total and per kind), batch seconds (all; outside savepoints), load."""
    w = window_minutes * 60
    # From the first committed batch (before it: the JVM's start and the first batch's warm-up, not the steady run)
    # to the run's end.
    begin = min((b["start"] + b["seconds"] for b in result["batches"]), default=0.0)
    end = min(result["ran_s"], minutes * 60)
    busy = [(p["t"], p["t"] + p["seconds"]) for p in result["savepoints"]]

    def during_savepoint(batch: dict[str, Any]) -> bool:
        return any(batch["start"] < end and batch["start"] + batch["seconds"] > begin for begin, end in busy)

    def window(low: float, high: float) -> dict[str, Any]:
        samples = [s for s in result["samples"] if low <= s["t"] < high]
        batches = [b for b in result["batches"] if low <= b["start"] < high]
        kinds = sorted({k for s in samples for k in s["rss_kib"] if k not in ("total", "pss_total", "processes")})
        return {
            "from_s": low, "to_s": high, "samples": len(samples), "batches": len(batches),
            "rss_mib_median": _median([s["rss_kib"]["total"] / 1024 for s in samples], 1),
            "rss_mib_max": round(max(s["rss_kib"]["total"] for s in samples) / 1024, 1) if samples else None,
            "pss_mib_median": _median([s["rss_kib"]["pss_total"] / 1024 for s in samples], 1),
            "rss_mib_median_by_kind": {k: _median([s["rss_kib"].get(k, 0) / 1024 for s in samples], 1)
                                       for k in kinds},
            "batch_s_median": _median([b["seconds"] for b in batches]),
            "batch_s_p90": round(sorted(b["seconds"] for b in batches)[int(0.9 * (len(batches) - 1))], 3)
            if batches else None,
            "batch_s_median_outside_savepoints": _median([b["seconds"] for b in batches if not during_savepoint(b)]),
            "batches_during_savepoints": sum(1 for b in batches if during_savepoint(b)),
            "load1_median": _median([s["load"][0] for s in samples]),
            "landing_backlog_max": max((s["landing_backlog"] for s in samples), default=None),
        }

    first, last = window(begin, begin + w), window(end - w, end + 60)
    return {"window_minutes": window_minutes, "first": first, "last": last, "ratios": {
        "rss": _ratio(last["rss_mib_median"], first["rss_mib_median"]),
        "pss": _ratio(last["pss_mib_median"], first["pss_mib_median"]),
        "batch_s": _ratio(last["batch_s_median"], first["batch_s_median"]),
        "batch_s_outside_savepoints": _ratio(last["batch_s_median_outside_savepoints"],
                                             first["batch_s_median_outside_savepoints"]),
        **{f"rss_{k}": _ratio(last["rss_mib_median_by_kind"].get(k), first["rss_mib_median_by_kind"].get(k))
           for k in first["rss_mib_median_by_kind"]}}}


def per_minute(points: list[tuple[float, float]], digits: int) -> str:
    """Median of the values of each minute of the run: "minute: median, ..."."""
    minutes: dict[int, list[float]] = {}
    for at, value in points:
        minutes.setdefault(int(at // 60), []).append(value)
    return ", ".join(f"{m}: {_median(v, digits)}" for m, v in sorted(minutes.items()))


SUMMARY_KEYS = ("ingested_files", "batches", "input_rows", "sessions_written", "source_errors", "storage_errors")


def markdown(report: dict[str, Any]) -> str:
    s, cmp, r = report["settings"], report["comparison"], report["run"]
    first, last, ratios = cmp["first"], cmp["last"], cmp["ratios"]
    w = cmp["window_minutes"]
    goal = "goal <= 1.1x"
    lines = [f"# Soak: `sessionctl run` for {s['minutes']} minutes", "",
             f"{report['when']}, {report['machine']}; provider {s['provider']}, poll {s['poll_seconds']} s; "
             f"{s['files_per_minute']} files/min x {s['events_per_file']} events ({s['users']} users, event time x"
             f"{s['event_speedup']}); online savepoint every {s['savepoint_every_minutes']} min. "
             f"First {w:g} minutes (from the first committed batch: the JVM start and the first batch before it are "
             f"not the steady run) vs last {w:g} minutes"
             + (" (a short run: not the 10-minute windows of the full soak)." if w != 10 else "."), "",
             f"run exit {r['exit']}; {r['files_landed']} files / {r['events_landed']} events landed; "
             f"summary: {json.dumps({k: (r['summary'] or {}).get(k) for k in SUMMARY_KEYS})}; "
             f"load (1/5/15 min) before {r['load_before']}, after {r['load_after']}", "",
             "| measure | first window | last window | last / first |", "|---|---:|---:|---:|",
             f"| process tree RSS, median MiB | {first['rss_mib_median']} | {last['rss_mib_median']} | "
             f"**{ratios['rss']}x** ({goal}) |"]
    lines.append(f"| process tree PSS (shared pages split), median MiB | {first['pss_mib_median']} | "
                 f"{last['pss_mib_median']} | {ratios['pss']}x |")
    for kind, value in first["rss_mib_median_by_kind"].items():
        lines.append(f"| - {kind} RSS, median MiB | {value} | {last['rss_mib_median_by_kind'].get(kind)} | "
                     f"{ratios.get('rss_' + kind)}x |")
    lines += [f"| process tree RSS, max MiB | {first['rss_mib_max']} | {last['rss_mib_max']} | |",
              f"| batch seconds, median (all batches) | {first['batch_s_median']} ({first['batches']} batches) | "
              f"{last['batch_s_median']} ({last['batches']}) | **{ratios['batch_s']}x** ({goal}) |",
              f"| batch seconds, median outside savepoints | {first['batch_s_median_outside_savepoints']} | "
              f"{last['batch_s_median_outside_savepoints']} | {ratios['batch_s_outside_savepoints']}x |",
              f"| batch seconds, p90 | {first['batch_s_p90']} | {last['batch_s_p90']} | |",
              f"| batches during a savepoint | {first['batches_during_savepoints']} | "
              f"{last['batches_during_savepoints']} | |",
              f"| load average (1 min), median | {first['load1_median']} | {last['load1_median']} | |",
              f"| landing backlog, max files | {first['landing_backlog_max']} | {last['landing_backlog_max']} | |",
              "", "Savepoints (time into the run: seconds taken): " + ("; ".join(
                  f"{p['t']:.0f} s: {p['seconds']} s" + (f" (batch {p.get('batch_id')}, {p.get('rows')} rows)"
                                                          if p["exit"] == 0 else f" FAILED {p.get('error')}")
                  for p in r["savepoints"]) or "none"), "",
              "Process tree RSS (MiB, median of each minute's samples): "
              + per_minute([(x["t"], x["rss_kib"]["total"] / 1024) for x in r["samples"]], 0), "",
              "Batch seconds (median of each minute's batches): "
              + per_minute([(b["start"], b["seconds"]) for b in r["batches"]], 2), "",
              "Sizes on disk (bytes) each minute, first and last: "
              + (f"{r['sizes'][0]} ... {r['sizes'][-1]}" if r["sizes"] else "none"), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--savepoint-every-minutes", type=float, default=5)
    parser.add_argument("--files-per-minute", type=float, default=6)
    parser.add_argument("--events-per-file", type=int, default=2000)
    parser.add_argument("--users", type=int, default=20000)
    parser.add_argument("--event-speedup", type=float, default=20.0,
                        help="event minutes per wall minute (sessions close after 40 event minutes)")
    parser.add_argument("--poll-seconds", type=float, default=5.0, help="sessionctl run's (its default: 5)")
    parser.add_argument("--sample-seconds", type=float, default=5.0)
    parser.add_argument("--window-minutes", type=float, default=None,
                        help="the first and last windows compared (default: 10, or a quarter of a shorter run)")
    parser.add_argument("--provider", choices=("rocksdb", "hdfs"), default="rocksdb")
    parser.add_argument("--results-dir", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    window = args.window_minutes or min(10.0, args.minutes / 4)
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    print(f"soak: {args.minutes} min in {work} (first/last {window:g} min compared)", flush=True)
    try:
        run = soak(args, work)
    finally:
        keep = os.environ.get("SOAK_KEEP")
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    report = {"when": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": f"{os.cpu_count()} cores, {os.uname().machine}", "note": args.note,
              "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "comparison": windows(run, args.minutes, window), "run": run}
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / "soak.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report) + (f"\nNote: {args.note}\n" if args.note else "")
    (args.results_dir / "soak.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
