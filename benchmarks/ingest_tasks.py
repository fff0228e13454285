"""Ingest of one large landed file: read and parsed by the ingesting process, or by Spark tasks where the file is
(pipelines.job.ingest_tasks), side by side in one run.

One gap-only clickstream file (benchmarks/end_to_end.py's generator) is ingested into a fresh home, in alternating
order (A B A B ...):
- `here`: `pipelines.ingest.ingest(config)` -- this process reads, parses and commits;
- `tasks`: `ingest(config, large=SparkIngestTasks(...))` on a warm SparkSession (`--master`, local[2] by default; a
  standalone cluster's URL for its executors) -- the tasks read, parse and write, this process commits.
Reported per variant: median wall seconds, events/s, and events per CPU-second (the CPU of this process and every
process it started: the JVM, Python workers; on a cluster, the executors' CPU is not on this host's process tree and
is added from the cluster's /proc when `--cluster-pids` names the worker JVMs' parents), with the 1-minute load.

    .venv/bin/python benchmarks/ingest_tasks.py --events 2000000 --rounds 3
    .venv/bin/python benchmarks/ingest_tasks.py --events 2000000 --master spark://127.0.0.1:7077
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.end_to_end import _proc_table, generate, machine_info  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def _tree_ticks(root: int, table: dict[int, tuple[int, int, int]]) -> int:
    """CPU ticks of `root` and its descendants (living ones: the JVM and its Python workers outlive each ingest)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += table.get(pid, (0, 0, 0))[2]
        todo += children.get(pid, [])
    return total


def _cpu_s(roots: list[int]) -> float:
    table = _proc_table()
    return sum(_tree_ticks(root, table) for root in roots) / TICK


def _one(variant: str, landed: Path, work: Path, spark: Any, roots: list[int]) -> dict[str, Any]:
    from pipelines.config import SessionsConfig
    from pipelines.ingest import ingest
    from pipelines.job.ingest_tasks import SparkIngestTasks

    home = work / f"home-{variant}"
    shutil.rmtree(home, ignore_errors=True)
    config = SessionsConfig.from_env({"SESSIONS_HOME": str(home), "SESSIONS_IDLE_CLOSE_MINUTES": "0"})
    config.landing.mkdir(parents=True)
    os.link(landed, config.landing / "events.jsonl")  # the same bytes, no copy (ingest moves the link)
    large: Any = "read" if variant == "here" else SparkIngestTasks(spark, min_bytes=1)
    cpu_before, load = _cpu_s(roots), os.getloadavg()[0]
    started = time.monotonic()
    result = ingest(config, large=large)
    seconds = time.monotonic() - started
    cpu = _cpu_s(roots) - cpu_before
    return {"variant": variant, "seconds": round(seconds, 3), "cpu_s": round(cpu, 3), "rows": result.rows,
            "by_tasks": result.by_tasks, "load_1m": round(load, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--cluster-pids", default="", help="comma-separated pids whose process trees are the "
                        "cluster's executors (their CPU is added to the tasks variant's)")
    parser.add_argument("--out", default=None, help="default: results/ingest_tasks-local.json or -cluster.json")
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    work = Path(tempfile.mkdtemp(prefix="ingest-tasks-"))
    landed = work / "events.jsonl"
    generate(landed, args.events, max(1, args.events // 40), 7, 30, 10)
    size = landed.stat().st_size
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(args.master).appName("ingest-tasks-bench")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.range(0, 4, 1, 2).collect()  # the JVM and Python workers up before the first timed round
    roots = [os.getpid()] + [int(p) for p in args.cluster_pids.split(",") if p]
    runs = []
    try:
        for round_ in range(args.rounds):
            order = ("here", "tasks") if round_ % 2 == 0 else ("tasks", "here")
            for variant in order:
                runs.append({"round": round_, **_one(variant, landed, work, spark, roots)})
                print(json.dumps(runs[-1]), flush=True)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    summary = {}
    for variant in ("here", "tasks"):
        mine = [r for r in runs if r["variant"] == variant]
        seconds, cpu = statistics.median(r["seconds"] for r in mine), statistics.median(r["cpu_s"] for r in mine)
        summary[variant] = {"median_seconds": seconds, "median_cpu_s": cpu,
                            "events_per_s": round(args.events / seconds), "events_per_cpu_s": round(args.events / cpu)}
    summary["tasks_over_here_wall"] = round(summary["here"]["median_seconds"] / summary["tasks"]["median_seconds"], 2)
    out = {"events": args.events, "bytes": size,
           "master": args.master, "runs": runs, "summary": summary, "machine": machine_info(),
           "load_after": os.getloadavg()}
    target = Path(args.out or HERE / "results" / (
        "ingest_tasks-local.json" if args.master.startswith("local") else "ingest_tasks-cluster.json"))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(out, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
