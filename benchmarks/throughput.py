"""Steady-state throughput: the session-tracking job vs Spark's native `session_window`.

One run generates one clickstream (pipelines.core.sample_data), ingests it into a raw_events Delta table
with exactly one ingest commit per micro-batch, and then runs, one after the other on that same table:

  job     pipelines.job.stream.start_query: the "sessions_raw" source -> the stateful operator a new checkpoint
          gets (by default the JVM operator: flatMapGroupsWithState keyed by user,
          jvm/operator/src/main/java/sessions/SessionsOperator.java) -> foreachBatch MicroBatchSink (exactly-once
          Delta append)
  native  the same "sessions_raw" source -> withWatermark (same lateness) ->
          groupBy(session_window(event_time, gap), user_id) counting events and page views,
          append mode -> foreachBatch Delta append through the same idempotent_append

Both use the same state store provider, the same partitions, the same read limit (one ingest commit per
batch) and trigger availableNow. Throughput = sum(numInputRows) / sum(durationMs.triggerExecution) over
the measured batches (data batches after the warm-up batches), taken from query.recentProgress.

`--spec example` runs both on events that carry the contract's example fields (the generator's own `page`, a
`referrer` on most session starts and a few other events, a `revenue` double on purchase/order_completed events, which
replace a share of the clicks): the job runs under SESSIONS_SPEC = a spec file mapping those top-level keys and the
contract's six example attributes (EXAMPLE_SPEC), and the native query computes the same six attributes in its
`session_window` aggregation (native_attribute_aggs: min_by/max_by over the non-null rows, count_if, sum, max). Not
the same semantics (native has no dedup, no logout rule, a plain double sum), the same work asked of both.

State bytes written per batch: the bytes of the checkpoint files each batch's commit writes for its state version
(RocksDB changelog checkpointing: `<version>.changelog`; HDFS provider: `<version>.delta`), read from the
checkpoint after the run, beside RocksDB's own `rocksdbTotalBytesWritten` / `rocksdbPutCount` from the progress.

Run `python benchmarks/throughput.py --help`; `--quick` is a ~2 minute smoke run.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import pyarrow as pa  # noqa: E402

from pipelines.config import SessionsConfig  # noqa: E402
from pipelines.core.sample_data import arrival_order, generate_events, land  # noqa: E402
from pipelines.ingest import ingest  # noqa: E402
from pipelines.job.checkpoint import PROVIDER_CLASSES, directory_size  # noqa: E402
from pipelines.job.sink import SESSIONS_SCHEMA, ensure_table, idempotent_append  # noqa: E402

# Average events per generated session (1..12 events, +1 logout 30% of the time) and the duplicate rate
# of arrival_order; only used to size the generation, the batches are cut exactly afterwards.
EVENTS_PER_SESSION = 6.5 + 0.3
DUPLICATE_RATE = 0.01
LINES_PER_FILE = 50_000

FULL = {"events_per_batch": 200_000, "users": 50_000, "warmup": 2, "batches": 5}
QUICK = {"events_per_batch": 20_000, "users": 5_000, "warmup": 1, "batches": 3}

# The sessions table's shape minus what only the job knows (why a session ended, checkpoint incarnation).
NATIVE_SCHEMA = pa.schema([f for f in SESSIONS_SCHEMA if f.name not in ("end_reason", "incarnation")])

# `--spec example`: the contract's example attributes (CONTRACT.md "Session spec") over the generator's top-level
# keys; event_id, user_id, event_time and event_type keep their contract paths.
EXAMPLE_SPEC = """\
input:
  fields:
    page: {path: page, type: string}
    referrer: {path: referrer, type: string}
    revenue: {path: revenue, type: double}
attributes:
  landing_page: {first: page}
  exit_page: {last: page}
  referrer: {first: referrer}
  purchases: {count_if: {event_type: [purchase, order_completed]}}
  revenue: {sum: revenue}
  top_order: {max: revenue}
"""
PURCHASE_TYPES = ("purchase", "order_completed")
_ARROW_TYPES = {"string": pa.string(), "long": pa.int64(), "double": pa.float64(), "boolean": pa.bool_()}


def log(message: str) -> None:
    print(f"[{dt.datetime.now().strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------
# Data: generate once, ingest once (one ingest commit = one micro-batch), copy per provider.

def make_config(home: Path, provider: str, args) -> SessionsConfig:
    env = dict(os.environ)
    env.pop("SESSIONS_SPEC", None)
    if getattr(args, "spec_path", None):
        env["SESSIONS_SPEC"] = str(args.spec_path)
    env.update({
        "SESSIONS_HOME": str(home),
        "SESSIONS_STATE_STORE": provider,
        "SESSIONS_MAX_VERSIONS_PER_BATCH": "1",
    })
    if args.partitions:
        env["SESSIONS_STATE_PARTITIONS"] = str(args.partitions)
    if args.buckets:
        env["SESSIONS_STATE_BUCKETS"] = str(args.buckets)
    return SessionsConfig.from_env(env)


def shape_example(events: list[dict]) -> list[dict]:
    """`--spec example`'s fields on the generated events (in generation order: per user, in time order), each derived
    from the event's id, so a duplicate (the same object twice in arrival order) carries the same ones: 1 click in 5
    becomes a purchase or order_completed with a `revenue` double; a `referrer` on 80% of session starts and 5% of
    the other events. `page` stays the generator's own (null on logouts)."""
    previous, previous_time = None, None
    for event in events:
        h = zlib.crc32(event["event_id"].encode())
        time_ = dt.datetime.fromisoformat(event["event_time"])
        starts = (previous is None or previous["user_id"] != event["user_id"] or previous["event_type"] == "logout"
                  or time_ - previous_time > dt.timedelta(minutes=30))
        if event["event_type"] == "click" and h % 10 < 2:
            event["event_type"] = PURCHASE_TYPES[h % 2]
        if event["event_type"] in PURCHASE_TYPES:
            event["revenue"] = round(5 + (h >> 8) % 20_000 / 100, 2)
        with_referrer = (h >> 4) % 5 != 0 if starts else (h >> 4) % 20 == 0
        if with_referrer:
            event["referrer"] = f"https://ref{(h >> 12) % 7}.example/"
        previous, previous_time = event, time_
    return events


def generate(args, sessions_per_user: int) -> list[dict]:
    events = generate_events(args.users, sessions_per_user, seed=args.seed)
    if args.spec == "example":
        events = shape_example(events)
    return arrival_order(events, seed=args.seed)


def prepare_data(home: Path, args) -> dict:
    """Generate the clickstream and ingest it into home/warehouse/raw_events, one commit per batch."""
    total_batches = args.warmup + args.batches
    wanted = total_batches * args.events_per_batch
    sessions_per_user = max(1, math.ceil(wanted / (args.users * EVENTS_PER_SESSION * (1 + DUPLICATE_RATE)) * 1.1))
    started = time.monotonic()
    events = generate(args, sessions_per_user)
    while len(events) < wanted:  # the estimate fell short (unusual seeds/sizes): generate more
        sessions_per_user += 1
        events = generate(args, sessions_per_user)
    generated = len(events)
    events = events[:wanted]  # arrival order: dropping the tail keeps every batch a contiguous time slice
    distinct_users = len({e["user_id"] for e in events})
    generate_s = time.monotonic() - started

    config = make_config(home, "rocksdb", args)
    files_per_batch = max(1, math.ceil(args.events_per_batch / LINES_PER_FILE))
    started = time.monotonic()
    ingested_rows = 0
    for b in range(total_batches):
        chunk = events[b * args.events_per_batch:(b + 1) * args.events_per_batch]
        per_file = math.ceil(len(chunk) / files_per_batch)
        for f in range(files_per_batch):
            lines = [json.dumps(e) for e in chunk[f * per_file:(f + 1) * per_file]]
            land(config.landing, f"bench-{b:05d}-{f:03d}.jsonl", lines)
        result = ingest(config, files_per_commit=files_per_batch)
        if result.first_seq != result.last_seq or result.rows != len(chunk):
            raise RuntimeError(f"batch {b}: expected one ingest commit of {len(chunk)} rows, got {result}")
        ingested_rows += result.rows
    ingest_s = time.monotonic() - started
    first, last = events[0]["event_time"], events[-1]["event_time"]
    if args.spec == "example":
        shaped = {
            "events_with_page": sum(e.get("page") is not None for e in events),
            "events_with_referrer": sum(e.get("referrer") is not None for e in events),
            "purchase_events": sum(e["event_type"] in PURCHASE_TYPES for e in events),
        }
    else:
        shaped = {}
    return {
        **shaped,
        "sessions_per_user_generated": sessions_per_user,
        "events_generated": generated,
        "events_used": len(events),
        "distinct_users": distinct_users,
        "ingest_commits": total_batches,
        "files_per_commit": files_per_batch,
        "ingested_rows": ingested_rows,
        "first_event_time_in_arrival_order": first,
        "last_event_time_in_arrival_order": last,
        "generate_seconds": round(generate_s, 1),
        "ingest_seconds": round(ingest_s, 1),
    }


def provider_home(work: Path, data_home: Path, provider: str) -> Path:
    home = work / provider
    raw = home / "warehouse" / "raw_events"
    raw.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(data_home / "warehouse" / "raw_events", raw)
    return home


# ---------------------------------------------------------------------------------------------------
# The two queries.

def _source_options(target_seq: int | None) -> dict:
    # targetSeq caps the source at that ingest commit (used by the priming pass only).
    return {"targetSeq": target_seq} if target_seq else {}


def start_job(spark, config: SessionsConfig, target_seq: int | None = None):
    from pipelines.job.startup import checkpoint_metadata, ensure_tables
    from pipelines.job.stream import start_query

    ensure_tables(config)
    meta, operator = checkpoint_metadata(config)
    query, sink = start_query(spark, config, meta, operator, trigger={"availableNow": True}, source_options=_source_options(target_seq))
    return query, lambda: {"sessions_written": sink.sessions_written, "quarantined": sink.quarantined}


class NativeSink:
    """foreachBatch target for the native query: one exactly-once Delta append per batch, like the job's."""

    def __init__(self, uri: str, app_id: str, attributes=()):
        self.uri, self.app_id = uri, app_id
        self.attributes = tuple(attributes)
        self.schema = native_schema(self.attributes)
        self.sessions_written = 0

    def __call__(self, batch_df, batch_id: int) -> None:
        rows = batch_df.toArrow()
        n = rows.num_rows
        if not n:
            return
        out = pa.table({
            "session_id": rows["session_id"], "user_id": rows["user_id"],
            "session_start": rows["session_start"].cast(pa.timestamp("us", tz="UTC")),
            "session_end": rows["session_end"].cast(pa.timestamp("us", tz="UTC")),
            "event_count": rows["event_count"].cast(pa.int64()),
            "page_views": rows["page_views"].cast(pa.int64()),
            "batch_id": pa.array([batch_id] * n, pa.int64()),
            "written_version": pa.nulls(n, pa.int64()),
            **{a.name: rows[a.name].cast(_ARROW_TYPES[a.result_type]) for a in self.attributes},
        }, schema=self.schema)
        if idempotent_append(self.uri, out, self.app_id, batch_id):
            self.sessions_written += n


def native_schema(attributes) -> pa.Schema:
    """NATIVE_SCHEMA, then a column per attribute (the type the job's sessions table gives it)."""
    return pa.schema([*NATIVE_SCHEMA, *(pa.field(a.name, _ARROW_TYPES[a.result_type]) for a in attributes)])


def native_attribute_aggs(attributes) -> list:
    """The spec's attributes as Spark aggregates over a session window's rows. first/last: the field of the row with
    the least/greatest (event_time, event_id) among the rows where it is not null (min_by/max_by skip a null ordering);
    count_if over the event types; sum/min/max skip nulls. Not the job's semantics exactly (no dedup, a double sum
    in arrival order rather than an exact one), the same work."""
    from pyspark.sql import functions as F

    aggs = []
    for a in attributes:
        value = F.col(f"field_{a.field}") if a.field else None
        order = F.when(value.isNotNull(), F.struct("event_time", "event_id")) if a.field else None
        if a.aggregate == "first":
            agg = F.min_by(value, order)
        elif a.aggregate == "last":
            agg = F.max_by(value, order)
        elif a.aggregate == "count_if":
            agg = F.count_if(F.col("event_type").isin(list(a.event_types))).cast("long")
        elif a.aggregate == "sum":
            agg = F.sum(value)
        elif a.aggregate == "min":
            agg = F.min(value)
        elif a.aggregate == "max":
            agg = F.max(value)
        else:  # pragma: no cover - the spec's parser admits no other
            raise ValueError(f"attribute {a.name}: aggregate {a.aggregate!r}")
        aggs.append(agg.alias(a.name))
    return aggs


def start_native(spark, config: SessionsConfig, target_seq: int | None = None):
    from pyspark.sql import functions as F

    from pipelines.job.stream import raw_events_stream

    checkpoint = config.home / "checkpoints" / "native"
    checkpoint.mkdir(parents=True, exist_ok=True)
    out_uri = config.table_uri("native_sessions")
    attributes = config.session_spec.attributes
    ensure_table(out_uri, native_schema(attributes))

    # The job's own source and session settings.
    events = raw_events_stream(spark, config.with_(max_versions_per_batch=config.max_versions_per_batch or 1),
                               source_options=_source_options(target_seq))
    valid = (events.withWatermark("event_time", f"{config.rules.lateness_ms} milliseconds")
             .where(F.col("origin") == "event"))  # the source hands over no rejected line (pipelines.job.source)
    sessions = (valid.groupBy(F.session_window("event_time", f"{config.rules.gap_ms} milliseconds").alias("w"), "user_id")
                .agg(F.count(F.lit(1)).alias("event_count"),
                     F.sum(F.when(F.col("event_type") == "page_view", 1).otherwise(0)).cast("long").alias("page_views"),
                     *native_attribute_aggs(attributes)))
    end = F.col("w.end") - F.expr(f"INTERVAL {config.rules.gap_ms} MILLISECONDS")  # session_window end = last event + gap
    output = sessions.select(
        F.substring(F.sha2(F.concat_ws("\u001f", "user_id", F.unix_millis("w.start").cast("string")), 256), 1, 32)
        .alias("session_id"),
        "user_id", F.col("w.start").alias("session_start"), end.alias("session_end"), "event_count", "page_views",
        *(a.name for a in attributes),
    )
    sink = NativeSink(out_uri, "native-sessions", attributes)
    query = (output.writeStream.queryName("native_session_window")
             .outputMode("append")
             .option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True)
             .foreachBatch(sink)
             .start())
    return query, lambda: {"sessions_written": sink.sessions_written}


def checkpoint_dir(config: SessionsConfig, which: str) -> Path:
    return config.checkpoint if which == "job" else config.home / "checkpoints" / "native"




def batch_record(progress: dict) -> dict:
    """One micro-batch from its progress: Spark's `durationMs` phases, and per state operator its rows, memory and
    times (`allUpdatesTimeMs`, `allRemovalsTimeMs`, `commitTimeMs`: see OPERATOR_TIMES_NOTE) with the provider's
    custom metrics (RocksDB: commit, flush, checkpoint and compaction latencies, bytes written)."""
    ops = progress.get("stateOperators") or []
    return {
        "batch_id": progress["batchId"],
        "input_rows": int(progress.get("numInputRows") or 0),
        "trigger_ms": int((progress.get("durationMs") or {}).get("triggerExecution") or 0),
        "duration_ms": progress.get("durationMs") or {},
        "watermark": (progress.get("eventTime") or {}).get("watermark"),
        "state": [{
            "operator": op.get("operatorName"),
            "rows_total": op.get("numRowsTotal"),
            "rows_updated": op.get("numRowsUpdated"),
            "rows_removed": op.get("numRowsRemoved"),
            "memory_used_bytes": op.get("memoryUsedBytes"),
            "rows_dropped_by_watermark": op.get("numRowsDroppedByWatermark"),
            "all_updates_ms": op.get("allUpdatesTimeMs"),
            "all_removals_ms": op.get("allRemovalsTimeMs"),
            "commit_ms": op.get("commitTimeMs"),
            "custom": op.get("customMetrics") or {},
        } for op in ops],
    }


# A state store's file for one version: RocksDB's changelog (`<version>.changelog`, `<version>_<id>.changelog` in
# checkpoint format 2) or snapshot (`.zip` + its SST files), the HDFS provider's `.delta` / `.snapshot`.
_VERSION_FILE = re.compile(r"^(\d+)(?:_[^.]*)?\.(changelog|delta)$")


def state_bytes_per_version(state_dir: Path) -> dict[int, int]:
    """Bytes of the changelog/delta files of each state version under a checkpoint's state dir (all operators and
    partitions): what a batch's commit writes to the checkpoint. Snapshots (written by the provider's maintenance
    in the background, not by the batch) are not counted here."""
    out: dict[int, int] = {}
    if state_dir.exists():
        for path in state_dir.rglob("*"):
            match = _VERSION_FILE.match(path.name)
            if match and path.is_file():
                version = int(match.group(1))
                out[version] = out.get(version, 0) + path.stat().st_size
    return out


def state_written_summary(batches: list[dict]) -> dict:
    """Medians over the measured batches: checkpoint bytes written (changelog/delta of the batch's version) and
    RocksDB's own write counters from the progress (uncompressed bytes put, puts)."""
    measured = [b for b in batches if b.get("role") == "measured"]

    def median_of(values):
        values = [v for v in values if v is not None]
        return int(statistics.median(values)) if values else None

    def custom(b, key):
        values = [op["custom"].get(key) for op in b["state"] if key in op["custom"]]
        return sum(values) if values else None

    return {
        "median_state_checkpoint_bytes_per_batch": median_of([b.get("state_checkpoint_bytes") for b in measured]),
        "median_rocksdb_bytes_written_per_batch": median_of([custom(b, "rocksdbTotalBytesWritten") for b in measured]),
        "median_rocksdb_puts_per_batch": median_of([custom(b, "rocksdbPutCount") for b in measured]),
        "median_state_memory_used_bytes": median_of([sum(op.get("memory_used_bytes") or 0 for op in b["state"])
                                                     if b["state"] else None for b in measured]),
    }


def prime(which: str, spark, config: SessionsConfig, batches: int) -> dict:
    """A throwaway pass over the first `batches` ingest commits in its own checkpoint: JIT, Python
    workers, provider code and delta-rs get warm before anything is measured, whatever runs first."""
    started = time.monotonic()
    query, _ = (start_job if which == "job" else start_native)(spark, config, target_seq=batches)
    query.awaitTermination()
    if query.exception():
        raise RuntimeError(f"priming {which} query failed: {query.exception()}")
    rows = sum(int(p.numInputRows) for p in query.recentProgress)
    log(f"{config.state_store}: primed {which} with {rows} events in {time.monotonic() - started:.0f} s (discarded)")
    return {"events": rows, "seconds": round(time.monotonic() - started, 1)}


def run_query(which: str, spark, config: SessionsConfig, args) -> dict:
    log(f"{config.state_store}: starting {which} query")
    load_before = os.getloadavg()
    started = time.monotonic()
    query, counters = (start_job if which == "job" else start_native)(spark, config)
    query.awaitTermination()
    wall = time.monotonic() - started
    load_after = os.getloadavg()
    if query.exception():
        raise RuntimeError(f"{which} query failed: {query.exception()}")
    progresses = sorted((json.loads(p.json) for p in query.recentProgress), key=lambda p: p["batchId"])
    batches = [batch_record(p) for p in progresses]
    data = [b for b in batches if b["input_rows"] > 0]
    expected = args.warmup + args.batches
    if len(data) != expected:
        raise RuntimeError(f"{which}: expected {expected} data batches, progress shows {len(data)} "
                           f"(batches: {[(b['batch_id'], b['input_rows']) for b in batches]})")
    measured = data[args.warmup:]
    rows = sum(b["input_rows"] for b in measured)
    ms = sum(b["trigger_ms"] for b in measured)
    for b in batches:
        b["role"] = ("measured" if b in measured else "warmup" if b in data else "no-data")
    per_version = state_bytes_per_version(checkpoint_dir(config, which) / "state")
    for b in batches:  # batch N commits state version N + 1
        b["state_checkpoint_bytes"] = per_version.get(b["batch_id"] + 1)
    state_files, state_bytes = directory_size(checkpoint_dir(config, which) / "state")
    state_at_end = None
    if which == "job":
        try:  # open users/events the job keeps, read through the state data source (not timed)
            from state_store.state import state_summary

            state_at_end = state_summary(spark, config.checkpoint, config.rules)
        except Exception as exc:  # noqa: BLE001 - informational only
            state_at_end = {"error": str(exc).splitlines()[0][:200]}
    result = {
        "events_per_s": round(rows / (ms / 1000.0), 1) if ms else None,
        "measured_batches": len(measured),
        "measured_events": rows,
        "measured_seconds": round(ms / 1000.0, 3),
        "mean_batch_seconds": round(ms / 1000.0 / len(measured), 3),
        "min_max_batch_seconds": [min(b["trigger_ms"] for b in measured) / 1000.0,
                                  max(b["trigger_ms"] for b in measured) / 1000.0],
        "wall_seconds_incl_startup_and_warmup": round(wall, 1),
        "state_dir_files_at_end": state_files,
        "state_dir_bytes_at_end": state_bytes,
        **state_written_summary(batches),
        **({"state_at_end": state_at_end} if state_at_end is not None else {}),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "batches": batches,
        **counters(),
    }
    log(f"{config.state_store}: {which}: {result['events_per_s']} events/s over {len(measured)} batches "
        f"({rows} events in {ms / 1000.0:.1f} s; wall {wall:.0f} s)")
    return result


# ---------------------------------------------------------------------------------------------------
# Reporting.

def machine_info() -> dict:
    def cmd(*argv):
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            return (out.stdout + out.stderr).strip()
        except Exception as exc:  # noqa: BLE001 - informational only
            return f"unavailable: {exc}"

    cpu_model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_total_gb = None
    try:
        kb = int(next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal")).split()[1])
        mem_total_gb = round(kb / 1024 / 1024, 1)
    except (OSError, StopIteration, ValueError):
        pass
    import pyspark

    nproc = cmd("nproc")
    return {
        "nproc": int(nproc) if nproc.isdigit() else os.cpu_count(),
        "cpu_model": cpu_model,
        "mem_total_gb": mem_total_gb,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "java": cmd("java", "-version").splitlines()[0] if cmd("java", "-version") else None,
    }


def _fmt(n) -> str:
    if n is None:
        return "-"
    return f"{n:,.0f}"


def _mb(n) -> str:
    return "-" if n is None else f"{n / 1e6:.1f}"


PHASES = ("triggerExecution", "addBatch", "queryPlanning", "latestOffset", "walCommit", "commitOffsets")
OPERATOR_TIMES = ("all_updates_ms", "all_removals_ms", "commit_ms")
# What the three operator times measure (read in Spark 4.2's FlatMapGroupsWithStateExecBase): they are not the same
# span for the two queries, so the tables say so rather than invite subtracting one column from another.
OPERATOR_TIMES_NOTE = (
    "op updates, op removals and op commit are the state operator's allUpdatesTimeMs, allRemovalsTimeMs and "
    "commitTimeMs, summed over its tasks. For the job (flatMapGroupsWithState) Spark measures "
    "updates from the first input row to the end of the timer pass, so **its updates include its removals** "
    "(removals = the timer pass: every key of the partition read to find timeouts below the watermark) and the "
    "job's own data work is updates minus removals; native's session-window operator reports the two apart "
    "(updates = restoring and saving the batch's windows, removals = evicting closed ones).")


def phase_medians(measured: list[dict]) -> list[str]:
    """Table cells: median ms of each durationMs phase and operator time, and of python_fn_s, over batches."""
    def median_of(values: list) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    if not measured:
        return []
    cells = [median_of([b["duration_ms"].get(name) for b in measured]) for name in PHASES]
    cells += [median_of([sum(o.get(name) or 0 for o in b["state"]) if b["state"] else None for b in measured])
              for name in OPERATOR_TIMES]
    python = median_of([b.get("python_fn_s") for b in measured])
    return ["" if v is None else f"{v:,.0f}" for v in cells] + ["" if python is None else f"{python:.2f}"]


def write_markdown(path: Path, results: dict) -> None:
    s, m = results["settings"], results["machine"]
    title = "QUICK smoke run (small scale; not a steady-state figure)" if s["quick"] else "Full run"
    lines = [
        f"# Throughput: job vs native `session_window` -- {title}",
        "",
        f"Measured {results['date']} on {m['nproc']} cores ({m['cpu_model']}, {m['mem_total_gb']} GB), "
        f"Spark master `{s['master']}`, PySpark {m['pyspark']}, {m['java']}.",
        *([f"Note: {s['note']}"] if s["note"] else []),
        f"Settings: {s['events_per_batch']:,} events per micro-batch over {s['users']:,} users, "
        f"{s['warmup']} warm-up + {s['batches']} measured batches, {s['partitions']} state partitions, "
        f"job operator {s.get('operator', 'python')} ({s['buckets']} state buckets if python), "
        f"gap {s['gap_minutes']} min, lateness {s['lateness_minutes']} min, "
        f"order {s['order']}, seed {s['seed']}, priming pass {s['prime_batches']} batches per provider (discarded).",
        f"Session spec: **{s.get('spec', 'default')}**" + (
            " -- the contract's six example attributes in both queries (the job under SESSIONS_SPEC, native in its "
            "session_window aggregation with min_by/max_by/count_if/sum/max; the spec is in the JSON's settings)."
            if s.get("spec") == "example" else " (no SESSIONS_SPEC, no attributes)."),
        "Throughput = sum(numInputRows) / sum(durationMs.triggerExecution) over the measured batches.",
        "",
        "| provider | job events/s | native events/s | job / native | job s/batch | native s/batch "
        "| load avg 1m (job; native) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for run in results["runs"]:
        job, native = run["job"], run["native"]
        ratio = "-" if run["ratio_job_over_native"] is None else f"{run['ratio_job_over_native']:.3f}"
        lines.append(f"| {run['provider']} | {_fmt(job['events_per_s'])} | {_fmt(native['events_per_s'])} | {ratio} "
                     f"| {job['mean_batch_seconds']:.2f} | {native['mean_batch_seconds']:.2f} "
                     f"| {job['loadavg_before'][0]:.1f}-{job['loadavg_after'][0]:.1f}; "
                     f"{native['loadavg_before'][0]:.1f}-{native['loadavg_after'][0]:.1f} |")
    lines += ["", "## Where a measured batch's time goes (medians, ms)", "",
              "Spark's `durationMs` phases (addBatch = the operator and the sink) and the state operator's own "
              "times. " + OPERATOR_TIMES_NOTE, "",
              "| provider | query | trigger | addBatch | planning | latestOffset | walCommit | commitOffsets "
              "| op updates | op removals | op commit | inside Python fn (s) |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in results["runs"]:
        for which in ("job", "native"):
            row = phase_medians([b for b in run[which]["batches"] if b.get("role") == "measured"])
            if row:
                lines.append(f"| {run['provider']} | {which} | " + " | ".join(row) + " |")
    lines += ["", "## State bytes written per measured batch (medians)", "",
              "Checkpoint = bytes of the checkpoint files the batch's commit writes for its state version (RocksDB "
              "changelog / HDFS delta files, all partitions; background snapshots not counted). RocksDB bytes/puts = "
              "the provider's rocksdbTotalBytesWritten / rocksdbPutCount (uncompressed keys and values put). Memory = "
              "memoryUsedBytes (held, not written).", "",
              "| provider | query | checkpoint bytes/batch | RocksDB bytes written/batch | RocksDB puts/batch "
              "| memory used |",
              "|---|---|---:|---:|---:|---:|"]
    for run in results["runs"]:
        for which in ("job", "native"):
            q = run[which]
            lines.append(f"| {run['provider']} | {which} | {_fmt(q.get('median_state_checkpoint_bytes_per_batch'))} "
                         f"| {_fmt(q.get('median_rocksdb_bytes_written_per_batch'))} "
                         f"| {_fmt(q.get('median_rocksdb_puts_per_batch'))} "
                         f"| {_fmt(q.get('median_state_memory_used_bytes'))} |")
    lines += ["", "## Per-batch state (from query progress)", "",
              "Job state rows: with the JVM operator one per open user (its open rows in StateCodec's binary "
              "value), with the Python operator hash buckets of users (zstd Arrow IPC); either holds the events "
              "above the watermark and one frozen prefix per session for what is below. Native state rows are "
              "open session windows. Memory = state operator memoryUsedBytes.", "",
              "| provider | query | batch | role | input rows | s | state rows | state MB | checkpoint bytes written |",
              "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for run in results["runs"]:
        for which in ("job", "native"):
            for b in run[which]["batches"]:
                op = b["state"][0] if b["state"] else {}
                lines.append(f"| {run['provider']} | {which} | {b['batch_id']} | {b['role']} | {b['input_rows']:,} "
                             f"| {b['trigger_ms'] / 1000:.2f} | {_fmt(op.get('rows_total'))} "
                             f"| {_mb(op.get('memory_used_bytes'))} | {_fmt(b.get('state_checkpoint_bytes'))} |")
    lines += ["", "Sessions written (all batches): " + "; ".join(
        f"{r['provider']}: job {r['job']['sessions_written']:,}, native {r['native']['sessions_written']:,}"
        for r in results["runs"]) + " (the native query has no dedup and no logout rule, so counts differ).", ""]
    for r in results["runs"]:
        end = r["job"].get("state_at_end") or {}
        if "open_events" in end:
            lines.append(f"Job state after the run ({r['provider']}): {end['open_users']:,} users with "
                         f"{end['open_sessions']:,} open sessions and {end['open_events']:,} open events, held as "
                         f"{end['state_rows']:,} rows ({end['frozen_prefixes']:,} frozen prefixes) in "
                         f"{end['state_keys']} buckets, {_mb(end['state_value_bytes'])} MB of values; checkpoint state dir "
                         f"{_mb(r['job']['state_dir_bytes_at_end'])} MB (native: {_mb(r['native']['state_dir_bytes_at_end'])} MB).")
    lines.append("")
    path.write_text("\n".join(lines))


# ---------------------------------------------------------------------------------------------------

def parse_providers(parser: argparse.ArgumentParser, value: str) -> list[str]:
    """`--provider`: rocksdb, hdfs, both (= rocksdb,hdfs) or a comma list giving the order (every benchmark)."""
    names = ["rocksdb", "hdfs"] if value == "both" else [p.strip().lower() for p in value.split(",")]
    if not names or any(p not in PROVIDER_CLASSES for p in names) or len(set(names)) != len(names):
        parser.error(f"--provider {value!r}: expected rocksdb, hdfs, both or a comma list of distinct providers")
    return names


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke run (~2 min): defaults become {QUICK}")
    parser.add_argument("--events-per-batch", type=int, help=f"events per micro-batch (full default {FULL['events_per_batch']})")
    parser.add_argument("--users", type=int, help=f"distinct users (full default {FULL['users']})")
    parser.add_argument("--batches", type=int, help=f"measured batches (full default {FULL['batches']})")
    parser.add_argument("--warmup", type=int, help=f"warm-up batches discarded (full default {FULL['warmup']})")
    parser.add_argument("--provider", default="rocksdb",
                        help="state store provider: rocksdb (default), hdfs, both (= rocksdb,hdfs) or a comma list "
                             "giving the order, e.g. hdfs,rocksdb; every provider runs on the same data")
    parser.add_argument("--partitions", type=int, help="state/shuffle partitions (default: SESSIONS_STATE_PARTITIONS or 4)")
    parser.add_argument("--buckets", type=int, help="job state buckets (default: SESSIONS_STATE_BUCKETS or 64)")
    parser.add_argument("--order", choices=["job-first", "native-first"], default="job-first",
                        help="which query runs first for each provider (default job-first)")
    parser.add_argument("--prime-batches", type=int, default=2,
                        help="before measuring each provider, run both queries over this many batches in a throwaway "
                             "checkpoint (warms the JVM and Python workers; 0 = off; default 2)")
    parser.add_argument("--spec", choices=["default", "example"], default="default",
                        help="default: no SESSIONS_SPEC (the contract's fields, no attributes); example: events with "
                             "page/referrer/revenue and the contract's six example attributes in both queries "
                             "(EXAMPLE_SPEC; the native query computes them in its session_window aggregation)")
    parser.add_argument("--seed", type=int, default=7, help="generator seed (default 7)")
    parser.add_argument("--master", default=None, help="Spark master (default: SESSIONS_SPARK_MASTER or local[2])")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="where data and checkpoints go (default: a fresh temp dir, removed afterwards)")
    parser.add_argument("--keep", action="store_true", help="keep the work dir")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results",
                        help="where throughput.json and throughput.md go (default benchmarks/results)")
    parser.add_argument("--note", default="",
                        help="free text for the results, e.g. 'shared CPU: a test suite ran at the same time'")
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in ("events_per_batch", "users", "batches"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1")
    args.providers = parse_providers(parser, args.provider)
    args.prime_batches = max(0, min(args.prime_batches, args.warmup + args.batches))
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.master:
        os.environ["SESSIONS_SPARK_MASTER"] = args.master
    # Quieter logs: no console progress bars, and no per-task pandas FutureWarning from PySpark's own
    # serializer in the Python workers (they inherit this environment). Neither changes the work done.
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", "--conf spark.ui.showConsoleProgress=false pyspark-shell")
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    providers = args.providers
    order = ["job", "native"] if args.order == "job-first" else ["native", "job"]
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="sessions-bench-"))
    if args.work_dir and work.exists() and any(work.iterdir()):
        raise SystemExit(f"--work-dir {work} is not empty; give an empty or new directory")
    work.mkdir(parents=True, exist_ok=True)
    args.spec_path = None
    if args.spec == "example":
        args.spec_path = work / "spec.yaml"
        args.spec_path.write_text(EXAMPLE_SPEC)
    date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    started = time.monotonic()
    try:
        log(f"work dir {work}; generating {(args.warmup + args.batches) * args.events_per_batch:,} events "
            f"over {args.users:,} users")
        data_home = work / "data"
        data = prepare_data(data_home, args)
        log(f"data ready: {data}")

        from pipelines.job.runtime import get_spark

        first = make_config(provider_home(work, data_home, providers[0]), providers[0], args)
        spark = get_spark(first)
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "10000")
        runs = []
        for provider in providers:
            config = first if provider == providers[0] else make_config(
                provider_home(work, data_home, provider), provider, args)
            run = {"provider": provider}
            if args.prime_batches:
                prime_config = make_config(provider_home(work, data_home, f"prime-{provider}"), provider, args)
                run["priming"] = {which: prime(which, spark, prime_config, args.prime_batches) for which in order}
            for which in order:
                run[which] = run_query(which, spark, config, args)
            job_eps, native_eps = run["job"]["events_per_s"], run["native"]["events_per_s"]
            run["ratio_job_over_native"] = round(job_eps / native_eps, 4) if job_eps and native_eps else None
            runs.append(run)
        config = first
        results = {
            "date": date,
            "machine": machine_info(),
            "settings": {
                "quick": args.quick, "events_per_batch": args.events_per_batch, "users": args.users,
                "warmup": args.warmup, "batches": args.batches, "providers": providers,
                "partitions": config.state_partitions, "buckets": config.state_buckets, "operator": config.new_checkpoint_operator,
                "gap_minutes": config.gap_minutes, "lateness_minutes": config.lateness_minutes,
                "master": os.environ.get("SESSIONS_SPARK_MASTER", "local[2]"), "order": args.order,
                "prime_batches": args.prime_batches, "spec": args.spec,
                **({"spec_text": EXAMPLE_SPEC} if args.spec == "example" else {}),
                "seed": args.seed, "trigger": "availableNow, one raw_events ingest commit per batch",
                "note": args.note,
                "command": shlex.join([Path(sys.argv[0]).name] + list(argv if argv is not None else sys.argv[1:])),
            },
            "method": "events/s = sum(numInputRows) / sum(durationMs.triggerExecution) over measured batches "
                      "(data batches after the warm-up ones) from query.recentProgress",
            "data": data,
            "runs": runs,
            "total_seconds": round(time.monotonic() - started, 1),
        }
        spark.stop()
        args.results_dir.mkdir(parents=True, exist_ok=True)
        (args.results_dir / "throughput.json").write_text(json.dumps(results, indent=2) + "\n")
        write_markdown(args.results_dir / "throughput.md", results)
        log(f"wrote {args.results_dir / 'throughput.json'} and throughput.md in {results['total_seconds']} s")
        for run in runs:
            print(json.dumps({"provider": run["provider"], "spec": args.spec,
                              "job_events_per_s": run["job"]["events_per_s"],
                              "native_events_per_s": run["native"]["events_per_s"],
                              "ratio_job_over_native": run["ratio_job_over_native"], "quick": args.quick,
                              "job_state_checkpoint_bytes_per_batch": run["job"]["median_state_checkpoint_bytes_per_batch"],
                              "native_state_checkpoint_bytes_per_batch":
                                  run["native"]["median_state_checkpoint_bytes_per_batch"]}))
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"kept {work}")


if __name__ == "__main__":
    sys.exit(main())
