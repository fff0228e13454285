"""State scaling: does a micro-batch cost what the batch costs, or what the state costs?

For each open-user count N (default 10k, 100k, 1M) one dataset is landed and ingested (one ingest commit per
micro-batch), then the job and Spark's native `session_window` run over it one after the other, per provider:

  batch 0        N sleeping users, 2 events each (an open session of theirs), never touched again
  batch 1        a clock event: the watermark passes the sleepers' events (the job freezes them) but stays
                 below their sessions' close, so every sleeper stays open for the whole run. With
                 `--sleepers live` their events are 2 min below the clock instead: above the watermark for the
                 whole run (kept one by one for de-duplication, never frozen; needs `--batch-minutes 1`)
  batches 2..    `--events-per-batch` events over `--active` active users (distinct from the sleepers),
                 `--batch-minutes` of event time each; the first `--warmup` are discarded, the next
                 `--batches` are measured

User ids: `--ids prefixed` (the default, the figures so far) names them `active-N` and `sleeper-N`, so in key order
the batch's users sit together; `--ids interleaved` names every user `user-<8 hex digits>` from one shuffled
numbering, so active and sleeping users interleave as real ids do (native's RocksDB keys are user_id-ordered,
the job's hash-prefixed).

Per query: median trigger time of the measured batches (durationMs.triggerExecution), bytes the checkpoint's
state directory gained per measured batch (files attributed to a batch by mtime), state directory size at
the end; for the job also what its state holds (open users/sessions, rows, value bytes). Growth = median
s/batch at the largest N over the smallest; job/native = native s/batch over job s/batch (throughput ratio).

    .venv/bin/python benchmarks/state_scaling.py                       # full: ~25 min on 2 cores
    .venv/bin/python benchmarks/state_scaling.py --quick               # ~3 min smoke run
    .venv/bin/python benchmarks/state_scaling.py --users 10000,1000000 --repeats 3   # medians of 3 pairs each
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import benchmarks.throughput as throughput  # noqa: E402
from benchmarks.throughput import (  # noqa: E402
    OPERATOR_TIMES_NOTE,
    batch_record,
    log,
    machine_info,
    phase_medians,
    start_job,
    start_native,
)
from pipelines.config import SessionsConfig  # noqa: E402
from pipelines.core.sample_data import land  # noqa: E402
from pipelines.ingest import ingest  # noqa: E402
from pipelines.job.runtime import get_spark  # noqa: E402

T0_MS = 1_793_520_000_000  # 2026-11-01T08:00:00Z
MIN = 60_000
FULL = {"users": [10_000, 100_000, 1_000_000], "active": 10_000, "events_per_batch": 50_000, "warmup": 2,
        "batches": 5}
QUICK = {"users": [2_000, 20_000], "active": 2_000, "events_per_batch": 10_000, "warmup": 1, "batches": 3}


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def _line(event_id: str, user: str, ms: int, kind: str) -> str:
    return json.dumps({"event_id": event_id, "user_id": user, "event_time": _iso(ms), "event_type": kind})


def prepare_data(home: Path, sleepers: int, args) -> dict:
    """Land and ingest the batches described in the module docstring into home/warehouse/raw_events."""
    config = SessionsConfig.from_env({"SESSIONS_HOME": str(home)})
    rng = random.Random(args.seed)
    started = time.monotonic()
    # Sleepers: two events 1 min apart, between T0-14 and T0-12 min: frozen once the clock batch puts the
    # watermark at T0-10 min, still open at the end (their close is >= T0+16 min; the run ends below it).
    # Live: between T0-2 and T0 min, above the watermark until the newest event passes T0+8 min.
    first = T0_MS - (2 if args.sleepers == "live" else 14) * MIN
    if args.ids == "interleaved":
        numbers = random.Random(args.seed + 1).sample(range(16 ** 8), sleepers + args.active)
        sleeper_id = [f"user-{n:08x}" for n in numbers[:sleepers]]
        active_id = [f"user-{n:08x}" for n in numbers[sleepers:]]
    else:
        sleeper_id = [f"sleeper-{u}" for u in range(sleepers)]
        active_id = [f"active-{a}" for a in range(args.active)]
    lines = []
    for u in range(sleepers):
        t = first + rng.randrange(MIN)
        lines += [_line(f"s{u}-1", sleeper_id[u], t, "page_view"), _line(f"s{u}-2", sleeper_id[u], t + MIN, "click")]
    batches = [lines, [_line("clock-0", "clock", T0_MS, "page_view")]]
    kinds = ["page_view"] * 6 + ["click"] * 3 + ["search"]
    for b in range(args.warmup + args.batches):
        low = T0_MS + b * args.batch_minutes * MIN
        span = args.batch_minutes * MIN
        batches.append([_line(f"a{b}-{i}", active_id[rng.randrange(args.active)], low + rng.randrange(span),
                              rng.choice(kinds)) for i in range(args.events_per_batch)])
    last_ms = T0_MS + (args.warmup + args.batches) * args.batch_minutes * MIN
    if last_ms - config.rules.lateness_ms >= T0_MS - 13 * MIN + config.rules.gap_ms:
        raise SystemExit("--batch-minutes too large: sleepers would close during the run")
    if args.sleepers == "live" and last_ms - config.rules.lateness_ms >= first:
        raise SystemExit("--batch-minutes too large for --sleepers live: the watermark would pass the sleepers' "
                         "events during the run (use --batch-minutes 1)")
    for i, batch in enumerate(batches):
        land(config.landing, f"scale-{i:05d}.jsonl", batch)
        result = ingest(config, files_per_commit=1)
        if result.rows != len(batch):
            raise RuntimeError(f"batch {i}: ingested {result.rows} of {len(batch)} lines")
    return {"sleepers": sleepers, "sleeper_events": 2 * sleepers, "data_batches": len(batches),
            "prepare_seconds": round(time.monotonic() - started, 1)}


def _state_files(directory: Path) -> list[tuple[float, int]]:
    out = []
    for path in directory.rglob("*"):
        if path.is_file():
            stat = path.stat()
            out.append((stat.st_mtime, stat.st_size))
    return out


def bytes_per_batch(state_dir: Path, batches: list[dict]) -> list[int]:
    """Bytes of state files whose mtime falls in [start of batch k, start of batch k+1) per measured batch."""
    files = _state_files(state_dir)
    starts = [b["start_s"] for b in batches] + [float("inf")]
    return [sum(size for mtime, size in files if starts[k] <= mtime < starts[k + 1]) for k in range(len(batches))]


def run_one(which: str, spark, config: SessionsConfig, args) -> dict:
    load_before = os.getloadavg()[0]
    query, _ = (start_job if which == "job" else start_native)(spark, config)
    query.awaitTermination()
    if query.exception():
        raise RuntimeError(f"{which} failed: {query.exception()}")
    progresses = sorted((json.loads(p.json) for p in query.recentProgress), key=lambda p: p["batchId"])
    records = []
    for p in progresses:
        record = batch_record(p)
        record["start_s"] = dt.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
        records.append(record)
    data = [r for r in records if r["input_rows"] > 0]
    # Counted from the end: the sleepers' preload may reach the stream in several batches (a large ingest commits
    # in pieces, a source caps its rows per batch); the clock, warm-up and measured batches are one commit each.
    tail = 1 + args.warmup + args.batches
    preload, clock, measured = data[:-tail], data[-tail], data[-args.batches:]
    if not preload or clock["input_rows"] != 1 or any(r["input_rows"] != args.events_per_batch for r in measured):
        raise RuntimeError(f"{which}: expected the preload, a clock batch of 1 row and {args.batches} measured "
                           f"batches of {args.events_per_batch} rows, got rows per batch "
                           f"{[r['input_rows'] for r in data]}")
    state_dir = (config.checkpoint if which == "job" else config.home / "checkpoints" / "native") / "state"
    # The window of the last measured batch ends at the next batch's start (the settling empty batch).
    following = [r for r in records if r["batch_id"] > measured[-1]["batch_id"]]
    written = bytes_per_batch(state_dir, measured + following[:1])[:len(measured)]
    seconds = [r["trigger_ms"] / 1000 for r in measured]
    result = {
        "median_batch_s": round(statistics.median(seconds), 3), "batch_s": seconds,
        "preload_batch_s": sum(r["trigger_ms"] for r in preload) / 1000, "preload_batches": len(preload),
        "clock_batch_s": clock["trigger_ms"] / 1000,
        "state_bytes_written_per_batch": written,
        "median_state_bytes_written": int(statistics.median(written)),
        "state_dir_bytes_at_end": sum(size for _, size in _state_files(state_dir)),
        # where a batch's time goes (Spark's progress breakdown: addBatch = operator + sink, ...)
        "duration_ms_median": {k: statistics.median(r["duration_ms"].get(k, 0) for r in measured)
                               for k in measured[0]["duration_ms"]},
        # the same as cells: durationMs phases, the state operator's updates/removals/commit ms, python_fn_s
        "phase_medians": dict(zip([*throughput.PHASES, *throughput.OPERATOR_TIMES, "python_fn_s"],
                                  phase_medians(measured))),
        "rocksdb_custom_metrics_median": {k: statistics.median(r["state"][0]["custom"].get(k, 0) for r in measured)
                                          for k in (measured[0]["state"][0]["custom"] if measured[0]["state"] else {})},
        "state_rows_total_at_end": (measured[-1]["state"][0] or {}).get("rows_total") if measured[-1]["state"] else None,
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    if which == "job":
        from state_store.state import state_summary

        result["state"] = state_summary(spark, config.checkpoint, config.rules)
    log(f"{config.state_store} {which}: median {result['median_batch_s']} s/batch, "
        f"{result['median_state_bytes_written'] / 1e6:.1f} MB state written/batch")
    return result


def _run_fresh(which: str, provider: str, data_home: Path, home: Path, spark, args):
    """One query over a fresh copy of the dataset's raw_events in `home` (removed after); the session is made
    on first use. Returns (spark, result)."""
    shutil.copytree(data_home / "warehouse" / "raw_events", home / "warehouse" / "raw_events")
    config = SessionsConfig.from_env({**os.environ, "SESSIONS_HOME": str(home), "SESSIONS_STATE_STORE": provider,
                                      "SESSIONS_MAX_VERSIONS_PER_BATCH": "1"})
    if spark is None:
        spark = get_spark(config)
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "10000")
    try:
        return spark, run_one(which, spark, config, args)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def median_repeat(results: list[dict]) -> dict:
    """The repeat whose median s/batch is the median of the repeats' (the lower middle one for an even count): its
    figures -- phases, bytes, state -- stand for the query in the tables; every repeat stays in the JSON."""
    ranked = sorted(results, key=lambda r: r["median_batch_s"])
    return ranked[(len(ranked) - 1) // 2]


def write_markdown(path: Path, results: dict) -> None:
    s, m = results["settings"], results["machine"]
    lines = [f"# State scaling: job vs native `session_window`{' (QUICK smoke run)' if s['quick'] else ''}", "",
             f"Measured {results['date']} on {m['nproc']} cores ({m['cpu_model']}), PySpark {m['pyspark']}, "
             f"`local[2]`, {s['partitions']} state partitions, job operator {s.get('operator', 'python')} "
             f"({s['buckets']} state buckets if python). "
             f"{s['events_per_batch']:,} events per batch over {s['active']:,} active users, "
             f"{s['batch_minutes']} min of event time per batch; N sleeping users with an open session "
             f"each, their events {s.get('sleepers', 'frozen')} ("
             f"{'above the watermark for the whole run' if s.get('sleepers') == 'live' else 'below the watermark'}); "
             f"user ids {s.get('ids', 'prefixed')}; "
             f"median of {s['batches']} measured batches after {s['warmup']} warm-up; a discarded priming pass "
             f"per provider first; {s.get('repeats', 1)} repeat(s) of each job/native pair, order alternating "
             f"(job first in the first), the tables show the median repeat of each query and every repeat's ratio. "
             f"State MB written/batch = bytes of checkpoint state files written during the batch (by mtime).", "",
             "| provider | open users | job s/batch | native s/batch | job throughput / native | ratio per repeat | "
             "job state MB written/batch | native state MB written/batch | job state values MB | load 1m |",
             "|---|---:|---:|---:|---:|---|---:|---:|---:|---|"]
    for r in results["runs"]:
        job, native = r["job"], r["native"]
        pairs = r.get("repeats") or [{"job": job, "native": native}]
        ratios = ", ".join(f"{p['native']['median_batch_s'] / p['job']['median_batch_s']:.2f}x" for p in pairs)
        lines.append(
            f"| {r['provider']} | {r['sleepers']:,} | {job['median_batch_s']:.2f} | {native['median_batch_s']:.2f} "
            f"| {native['median_batch_s'] / job['median_batch_s']:.2f}x | {ratios} "
            f"| {job['median_state_bytes_written'] / 1e6:.2f} | {native['median_state_bytes_written'] / 1e6:.2f} "
            f"| {job['state']['state_value_bytes'] / 1e6:.1f} "
            f"| {job['loadavg_1m'][0]:.1f}-{native['loadavg_1m'][1]:.1f} |")
    lines += ["", "Where a measured batch's time goes (medians, ms). " + OPERATOR_TIMES_NOTE, "",
              "| provider | open users | query | trigger | addBatch | planning | latestOffset | walCommit "
              "| commitOffsets | op updates | op removals | op commit | inside Python fn (s) |",
              "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results["runs"]:
        for which in ("job", "native"):
            cells = r[which].get("phase_medians")
            if cells:
                lines.append(f"| {r['provider']} | {r['sleepers']:,} | {which} | " + " | ".join(cells.values()) + " |")
    lines += ["", "Growth from the smallest to the largest N (median s/batch):", ""]
    for provider in s["providers"]:
        runs = [r for r in results["runs"] if r["provider"] == provider]
        if len(runs) > 1:
            lo, hi = runs[0], runs[-1]
            lines.append(f"- {provider}: job {hi['job']['median_batch_s'] / lo['job']['median_batch_s']:.2f}x, "
                         f"native {hi['native']['median_batch_s'] / lo['native']['median_batch_s']:.2f}x "
                         f"({lo['sleepers']:,} -> {hi['sleepers']:,} open users)")
    lines.append("")
    path.write_text("\n".join(lines))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--users", type=lambda v: [int(x) for x in v.split(",")], help="open-user counts, comma list")
    parser.add_argument("--active", type=int)
    parser.add_argument("--events-per-batch", type=int)
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--batches", type=int)
    parser.add_argument("--batch-minutes", type=int, default=3)
    parser.add_argument("--sleepers", choices=("frozen", "live"), default="frozen",
                        help="sleepers' events below the watermark (frozen) or above it for the whole run (live)")
    parser.add_argument("--ids", choices=("prefixed", "interleaved"), default="prefixed",
                        help="user ids active-N / sleeper-N (grouped in key order) or user-<hex> shuffled (see above)")
    parser.add_argument("--provider", default="rocksdb,hdfs",
                        help="rocksdb, hdfs, both (= rocksdb,hdfs, the default) or a comma list giving the order")
    parser.add_argument("--repeats", type=int, default=1,
                        help="job/native pairs per provider and N, order alternating; medians across them")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--results-dir", type=Path, default=HERE / "results")
    parser.add_argument("--note", default="")
    parser.add_argument("--no-prime", dest="prime", action="store_false",
                        help="skip the discarded warm-up pass per provider")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.providers = throughput.parse_providers(parser, args.provider)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", "--conf spark.ui.showConsoleProgress=false pyspark-shell")
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    work = Path(tempfile.mkdtemp(prefix="sessions-scaling-"))
    date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    spark = None
    runs = []
    try:
        for sleepers in args.users:
            data_home = work / f"data-{sleepers}"
            data = prepare_data(data_home, sleepers, args)
            log(f"data for {sleepers:,} open users ready in {data['prepare_seconds']} s")
            for provider in args.providers:
                if sleepers == args.users[0] and args.prime:
                    # A throwaway pass per provider: JIT, Python workers and provider code warm before anything
                    # is measured (the first query in a JVM is slower whatever it is).
                    for which in ("job", "native"):
                        spark, _ = _run_fresh(which, provider, data_home, work / f"prime-{provider}-{which}", spark, args)
                    log(f"{provider}: primed (discarded)")
                run = {"provider": provider, "sleepers": sleepers, "data": data, "repeats": []}
                for k in range(args.repeats):
                    # Alternating order: a machine that speeds up or slows down over a pair favours neither query.
                    pair = {"order": ["job", "native"] if k % 2 == 0 else ["native", "job"]}
                    for which in pair["order"]:
                        spark, pair[which] = _run_fresh(which, provider, data_home,
                                                        work / f"{provider}-{sleepers}-{which}-{k}", spark, args)
                    run["repeats"].append(pair)
                for which in ("job", "native"):
                    run[which] = median_repeat([pair[which] for pair in run["repeats"]])
                runs.append(run)
            shutil.rmtree(data_home, ignore_errors=True)
        config = SessionsConfig.from_env({**os.environ, "SESSIONS_HOME": str(work)})
        results = {"date": date, "machine": machine_info(), "runs": runs, "settings": {
            "quick": args.quick, "users": args.users, "active": args.active, "events_per_batch": args.events_per_batch,
            "warmup": args.warmup, "batches": args.batches, "batch_minutes": args.batch_minutes,
            "sleepers": args.sleepers, "ids": args.ids, "repeats": args.repeats,
            "providers": args.providers, "partitions": config.state_partitions, "buckets": config.state_buckets,
            "operator": config.new_checkpoint_operator,
            "note": args.note}}
        args.results_dir.mkdir(parents=True, exist_ok=True)
        name = "state_scaling_quick" if args.quick else "state_scaling"
        (args.results_dir / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
        write_markdown(args.results_dir / f"{name}.md", results)
        print((args.results_dir / f"{name}.md").read_text())
        return 0
    finally:
        if spark is not None:
            spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
