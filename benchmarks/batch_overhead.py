"""The fixed cost of a micro-batch: small batches (a few hundred events), so what is measured is what every batch
pays whatever its size -- planning, the offset and commit logs, the Python runners, the state store commit.

Variants, run side by side in one SparkSession in alternating order (A B C A B C ...), each in a fresh home:
  rocksdb            the job on RocksDB with changelog checkpointing (SESSIONS_ROCKSDB_CHANGELOG, the default)
  rocksdb-snapshot   the job on RocksDB uploading a snapshot every commit (Spark's own default)
  hdfs               the job on the HDFS-backed provider
With `--buckets 64,8` each variant runs once per bucket count (SESSIONS_STATE_BUCKETS), named `<variant>/<buckets>`:
the Python operator pays a fixed cost per bucket it calls, and a small batch touches most buckets. With
`--delta-snapshot-partitions 50,2` each runs once per count of partitions Delta replays a table's log in
(`spark.databricks.delta.snapshotPartitions`; the job sets a local master's threads), named `.../dsp<N>`.
Per variant: median trigger ms of the data batches after the first (the first pays the query's start), and the
medians of Spark's durationMs phases and of the state operator's updates / removals (timeouts) / commit ms.

    .venv/bin/python benchmarks/batch_overhead.py [--batches 10] [--events 200] [--repeats 3] [--buckets 64]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.throughput import OPERATOR_TIMES, PHASES, batch_record, log, machine_info, phase_medians  # noqa: E402
from pipelines.config import SessionsConfig  # noqa: E402
from pipelines.core.sample_data import land  # noqa: E402
from pipelines.ingest import ingest  # noqa: E402
from pipelines.job.runtime import DELTA_SNAPSHOT_PARTITIONS, get_spark  # noqa: E402
from pipelines.job.startup import checkpoint_metadata, ensure_tables  # noqa: E402
from pipelines.job.stream import start_query  # noqa: E402

VARIANTS = {"rocksdb": ("rocksdb", "true"), "rocksdb-snapshot": ("rocksdb", "false"), "hdfs": ("hdfs", "true")}
T0 = dt.datetime(2026, 11, 1, 8, tzinfo=dt.timezone.utc)


def _config(home: Path, variant: str) -> SessionsConfig:
    name, _, buckets = variant.split("/dsp")[0].partition("/")
    provider, changelog = VARIANTS[name]
    return SessionsConfig.from_env({"SESSIONS_HOME": str(home), "SESSIONS_STATE_STORE": provider,
                                    "SESSIONS_ROCKSDB_CHANGELOG": changelog, "SESSIONS_STATE_PARTITIONS": "2",
                                    "SESSIONS_STATE_BUCKETS": buckets or "64",
                                    "SESSIONS_MAX_VERSIONS_PER_BATCH": "1", "SESSIONS_IDLE_CLOSE_MINUTES": "0"})


def _land(config: SessionsConfig, batches: int, events: int) -> None:
    for b in range(batches):
        lines = []
        for i in range(events):
            at = T0 + dt.timedelta(minutes=b, milliseconds=i)
            lines.append(json.dumps({"event_id": f"e{b}-{i}", "user_id": f"u{i % 100}", "event_type": "page_view",
                                     "event_time": at.isoformat().replace("+00:00", "Z"), "page": "/"}))
        land(config.landing, f"part-{b:04d}.jsonl", lines)
        ingest(config)  # one ingest commit = one micro-batch


def run_variant(spark, variant: str, work: Path, args: argparse.Namespace) -> dict:
    config = _config(Path(tempfile.mkdtemp(dir=work)), variant)
    if "/dsp" in variant:
        spark.conf.set(DELTA_SNAPSHOT_PARTITIONS, variant.split("/dsp")[1])
    _land(config, args.batches, args.events)
    ensure_tables(config)
    meta, operator = checkpoint_metadata(config)
    query, _ = start_query(spark, config, meta, operator, trigger={"availableNow": True})
    query.awaitTermination()
    if query.exception():
        raise RuntimeError(f"{variant}: {query.exception()}")
    batches = [batch_record(json.loads(p.json)) for p in query.recentProgress]
    measured = [b for b in batches if b["input_rows"] > 0][1:]
    return {"trigger_ms": [b["trigger_ms"] for b in measured], "phases": phase_medians(measured)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--buckets", default="64", help="SESSIONS_STATE_BUCKETS, a comma list to compare (default 64)")
    parser.add_argument("--delta-snapshot-partitions", default="",
                        help="a comma list of Delta's log replay partitions to compare (default: the job's setting)")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="batch-overhead-"))
    spark = get_spark(_config(work / "session", "rocksdb"))
    load = [os.getloadavg()[0]]
    counts = args.buckets.split(",")
    names = [f"{v}/{b}" for b in counts for v in VARIANTS]
    if args.delta_snapshot_partitions:
        names = [f"{n}/dsp{d}" for d in args.delta_snapshot_partitions.split(",") for n in names]
    runs: dict[str, list[dict]] = {v: [] for v in names}
    run_variant(spark, names[-1], work, args)  # priming: JIT and Python workers warm before anything counts
    for repeat in range(args.repeats):
        for variant in names:
            runs[variant].append(run_variant(spark, variant, work, args))
            load.append(os.getloadavg()[0])
            log(f"repeat {repeat}: {variant} median {statistics.median(runs[variant][-1]['trigger_ms'])} ms/batch")
    columns = [*PHASES, *OPERATOR_TIMES, "python_fn_s"]
    summary = {}
    for variant, results in runs.items():
        every = [ms for r in results for ms in r["trigger_ms"]]
        summary[variant] = {"median_trigger_ms": statistics.median(every),
                            "per_repeat_median_ms": [statistics.median(r["trigger_ms"]) for r in results],
                            "phases_last_repeat": dict(zip(columns, results[-1]["phases"]))}
    out = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine_info(),
           "settings": vars(args) | {"results_dir": str(args.results_dir)}, "loadavg_1m": load, "variants": summary}
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / "batch_overhead.json").write_text(json.dumps(out, indent=2) + "\n")
    base_name = next(n for n in names if n.startswith("rocksdb-snapshot/"))
    base = summary[base_name]["median_trigger_ms"]
    lines = ["# Fixed cost of a micro-batch (`benchmarks/batch_overhead.py`)", "",
             f"{out['date']}, {args.batches} batches of {args.events} events per run (the first batch of each run "
             f"not counted), {args.repeats} repeats in alternating order, one SparkSession (`local[2]`, 2 state "
             f"partitions); load 1m {min(load):.1f}-{max(load):.1f}.", "",
             f"| variant/buckets | median ms/batch | per repeat | vs {base_name} |", "|---|---:|---|---:|"]
    for variant, s in summary.items():
        lines.append(f"| {variant} | {s['median_trigger_ms']:.0f} | {', '.join(f'{m:.0f}' for m in s['per_repeat_median_ms'])} "
                     f"| {s['median_trigger_ms'] / base:.2f}x |")
    lines += ["", "Phases of the last repeat (medians, ms): " + ", ".join(columns[:-1]), ""]
    lines += [f"- {variant}: " + ", ".join(f"{k} {v}" for k, v in s["phases_last_repeat"].items() if v)
              for variant, s in summary.items()]
    (args.results_dir / "batch_overhead.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
