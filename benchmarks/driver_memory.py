"""Driver memory: how much the Python process of `sessionctl catch-up` (the Spark driver's Python side) grows with the
events it catches up, side by side with a baseline commit.

One run generates one gap-only clickstream file per size (benchmarks/end_to_end.py's generator), then for each size
and state store provider runs `sessionctl catch-up` in a fresh SESSIONS_HOME with the file in its landing/, once with
this checkout and once with `--baseline` (a git worktree of that commit, sharing this checkout's build/: the JVM
operator and the jars), in alternating order. Every 0.2 s it samples the resident set of the sessionctl process and
the sum over its descendants (the driver JVM, Python workers); the peaks are reported with the catch-up's own phase
times and the 1-minute load before and after.

    .venv/bin/python benchmarks/driver_memory.py --baseline a811214                 # 200k and 2M events
    .venv/bin/python benchmarks/driver_memory.py --baseline a811214 --quick         # 20k and 200k, rocksdb only
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.end_to_end import _proc_table, generate, machine_info  # noqa: E402

RUN = "import sys; from sessionctl.cli import main; sys.exit(main(sys.argv[1:]))"


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class PeakRss:
    """Peak resident set of a process and, apart, of the sum over its descendants, sampled every `interval` s."""

    def __init__(self, pid: int, interval: float = 0.2):
        self.pid, self.interval = pid, interval
        self.own_kib = self.children_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            table = _proc_table()
            children: dict[int, list[int]] = {}
            for pid, (ppid, _, _) in table.items():
                children.setdefault(ppid, []).append(pid)
            todo, descendants = list(children.get(self.pid, [])), []
            while todo:
                pid = todo.pop()
                descendants.append(pid)
                todo += children.get(pid, [])
            self.own_kib = max(self.own_kib, _rss_kib(self.pid))
            self.children_kib = max(self.children_kib, sum(_rss_kib(pid) for pid in descendants))
            self._stop.wait(self.interval)

    def stop(self) -> tuple[float, float]:
        self._stop.set()
        self._thread.join()
        return round(self.own_kib / 1024, 1), round(self.children_kib / 1024, 1)


def catch_up(checkout: Path, data: Path, work: Path, provider: str, timeout: float,
             extra: dict[str, str] | None = None) -> dict[str, Any]:
    home = work / "home"
    (home / "landing").mkdir(parents=True)
    shutil.copy(data, home / "landing" / data.name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONS_")}
    env.update(SESSIONS_HOME=str(home), SESSIONS_STATE_STORE=provider, PYTHONPATH=str(checkout), **(extra or {}))
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    with (work / "stdout.txt").open("wb") as out, (work / "stderr.txt").open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-c", RUN, "catch-up"], env=env, cwd=checkout, stdout=out,
                                stderr=err, start_new_session=True)
        peak = PeakRss(proc.pid)
        rc = proc.wait(timeout=timeout)
        own, children = peak.stop()
    summary = next((json.loads(line) for line in reversed((work / "stdout.txt").read_text().splitlines())
                    if line.startswith("{")), {})
    return {"rc": rc, "wall_s": round(time.monotonic() - started, 1), "driver_python_peak_mib": own,
            "children_peak_mib": children, "phase_seconds": summary.get("phase_seconds"),
            "sessions_written": summary.get("sessions_written"), "load1_before": round(load_before, 2),
            "load1_after": round(os.getloadavg()[0], 2),
            "stderr_tail": None if rc == 0 else (work / "stderr.txt").read_text(errors="replace")[-2000:]}


def render(results: dict[str, Any]) -> str:
    lines = ["# Driver memory: sessionctl catch-up, this checkout and a baseline", "",
             f"Measured {results['measured_at']} on {results['machine'].get('cpu_count')} cores; this checkout "
             f"{results['head']} (settings {results.get('settings', {}).get('this')}), baseline {results['baseline']}. "
             "Peak resident set of the sessionctl Python process "
             "(the driver's Python side) and of the sum of its descendants (driver JVM, Python workers), sampled "
             "every 0.2 s. growth = peak at the largest size / peak at the smallest.", "",
             "| provider | code | events | wall s | driver Python peak MiB | children peak MiB | phase seconds | "
             "load 1m before->after |", "|---|---|---:|---:|---:|---:|---|---|"]
    for run in results["runs"]:
        lines.append(f"| {run['provider']} | {run['code']} | {run['events']:,} | {run['wall_s']} | "
                     f"{run['driver_python_peak_mib']} | {run['children_peak_mib']} | {run['phase_seconds']} | "
                     f"{run['load1_before']}->{run['load1_after']} |")
    lines += ["", "| provider | code | driver Python growth | children growth |", "|---|---|---:|---:|"]
    for (provider, code), growth in results["growth"].items():
        lines.append(f"| {provider} | {code} | {growth['driver']}x | {growth['children']}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="a git commit to compare with")
    parser.add_argument("--sizes", default="200000,2000000")
    parser.add_argument("--providers", default="rocksdb,hdfs")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", default=str(HERE / "results" / "driver_memory" / "latest"))
    parser.add_argument("--master", default=None, help="SESSIONS_SPARK_MASTER for both (default: the product's)")
    parser.add_argument("--this-env", action="append", default=[], metavar="K=V",
                        help="a setting for this checkout's runs only (e.g. SESSIONS_INGEST_BY_TASKS=always)")
    args = parser.parse_args(argv)
    sizes = [20_000, 200_000] if args.quick else [int(s) for s in args.sizes.split(",")]
    providers = ["rocksdb"] if args.quick else args.providers.split(",")
    both = {"SESSIONS_SPARK_MASTER": args.master} if args.master else {}
    extra = {"this": {**both, **dict(item.split("=", 1) for item in args.this_env)}, "baseline": both}
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="driver-memory-") as tmp:
        work = Path(tmp)
        base = work / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.baseline], cwd=REPO, check=True,
                       capture_output=True)
        try:
            (base / "build").symlink_to(REPO / "build")
            runs = []
            for size in sizes:
                data = work / f"events-{size}.jsonl"
                generate(data, size, max(1, size // 40), 7, 30, 10)
                for index, provider in enumerate(providers):
                    order = [("this", REPO), ("baseline", base)]
                    for code, checkout in order if index % 2 == 0 else order[::-1]:
                        run_dir = work / f"{code}-{provider}-{size}"
                        run = catch_up(checkout, data, run_dir, provider, args.timeout, extra[code])
                        runs.append({"provider": provider, "code": code, "events": size, **run})
                        print(json.dumps(runs[-1]), flush=True)
                        shutil.rmtree(run_dir, ignore_errors=True)
                data.unlink()
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO, capture_output=True)
    growth = {}
    for provider in providers:
        for code in ("this", "baseline"):
            mine = [r for r in runs if r["provider"] == provider and r["code"] == code and r["rc"] == 0]
            if len(mine) >= 2:
                small, large = min(mine, key=lambda r: r["events"]), max(mine, key=lambda r: r["events"])
                growth[f"{provider}|{code}"] = {
                    "driver": round(large["driver_python_peak_mib"] / small["driver_python_peak_mib"], 2),
                    "children": round(large["children_peak_mib"] / small["children_peak_mib"], 2)}
    results = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine_info(),
               "head": head, "baseline": args.baseline, "settings": extra, "runs": runs, "growth": growth}
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2))
    results["growth"] = {tuple(k.split("|")): v for k, v in growth.items()}
    out.with_suffix(".md").write_text(render(results))
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
