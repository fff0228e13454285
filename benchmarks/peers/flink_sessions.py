"""Flink SQL peer of the sessions job: gap-only sessions over a directory of JSONL, one bounded run.

Run by the Flink venv's python (`make peers` creates benchmarks/peers/.venv-flink), never by the product's .venv:

    benchmarks/peers/.venv-flink/bin/python benchmarks/peers/flink_sessions.py \
        --input DIR --output DIR --checkpoints DIR --backend rocksdb|hashmap [--exclude-user U]

The job (Flink SQL, streaming mode, local mini-cluster in the gateway JVM pyflink starts):

  source  `filesystem` connector over --input, 'format' = 'json'; event_time declared TIMESTAMP_LTZ(3) and parsed by
          the JSON format itself ('json.timestamp-format.standard' = 'ISO-8601': "2026-11-01T08:00:37Z");
          WATERMARK FOR event_time AS event_time - INTERVAL lateness. The source is bounded: when it has read
          everything it emits the MAX watermark, which closes every session that is still open.
  window  SESSION(TABLE events PARTITION BY user_id, DESCRIPTOR(event_time), INTERVAL gap) window TVF,
          GROUP BY user_id, window_start, window_end: COUNT(*) and page views (COUNT(*) FILTER page_view).
  sink    `filesystem` connector, 'format' = 'csv', into --output; the part files are committed by checkpoints
          (the last one when the bounded input ends), then counted here.

Settings, and why (all recorded in the JSON line):
  parallelism.default = 2                  2 cores; the product runs local[2].
  state.backend.type = rocksdb | hashmap   the argument. RocksDB is the product's default provider; hashmap keeps
                                           state as objects on the heap (like Spark's HDFS-backed provider).
  execution.checkpointing.interval = 10 s  checkpoints on, as in production; at 10 s a run of the default 2M events
  execution.checkpointing.dir              takes a handful; every checkpoint is a full/incremental state snapshot.
  execution.checkpointing.incremental      true for rocksdb (uploads only new SST files: what a Flink engineer sets
                                           for RocksDB in production); hashmap snapshots are always full.
  taskmanager.memory.managed.size = 1g     RocksDB's block cache and write buffers come out of managed memory
                                           (state.backend.rocksdb.memory.managed, default true). The local
                                           mini-cluster's default is only 128 MB for all slots; 1 GB is what a
                                           small production TaskManager gives. Unused by hashmap (set anyway).
  JVM_ARGS = -Xmx4g                        the gateway JVM (which hosts the mini-cluster) gets the same heap as
                                           the product's Spark driver (SESSIONS_SPARK_DRIVER_MEMORY 4g).
  pipeline.object-reuse = true             no defensive copies between chained operators (safe here: no UDFs
                                           hold records).
  table.local-time-zone = UTC
  state.backend.rocksdb.timer-service.factory: left at its default (ROCKSDB). HEAP (`--set`) was tried once on the
                                           2M-event file: 66 s net job runtime against 72 s, on a machine whose load
                                           rose meanwhile; not adopted (benchmarks/README.md).
  NOT set: table.exec.mini-batch.* and table.optimizer.agg-phase-strategy. Flink's tuning page: mini-batch and
  local-global aggregation apply to group aggregations and window TVF aggregations *except session window TVF
  aggregation*; window TVF aggregation buffers records per window by itself (in managed memory) regardless of
  the mini-batch options.

Prints one JSON line on stdout: wall seconds (this script: start to job end, gateway JVM start included), Flink's
own net job runtime, the sessions written (without --exclude-user's), their events and page views, the number of
completed checkpoints (from the run's own Flink log) and the settings.
"""
from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import re
import sys
import time
from pathlib import Path

STARTED = time.monotonic()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--input", required=True, help="directory of *.jsonl (read by the filesystem connector)")
    p.add_argument("--output", required=True, help="sink directory (created; must not hold earlier output)")
    p.add_argument("--checkpoints", required=True, help="checkpoint directory")
    p.add_argument("--backend", choices=("rocksdb", "hashmap"), required=True)
    p.add_argument("--gap-minutes", type=int, default=30)
    p.add_argument("--lateness-minutes", type=int, default=10)
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--checkpoint-interval", default="10 s")
    p.add_argument("--managed-memory", default="1g", help="taskmanager.memory.managed.size")
    p.add_argument("--heap", default="4g", help="-Xmx of the gateway JVM that hosts the mini-cluster")
    p.add_argument("--exclude-user", default=None, help="a user_id whose sessions are not counted (the sentinel)")
    p.add_argument("--log-dir", default=None, help="Flink's log directory for this run (default: OUTPUT/../flink-log)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any further Flink option (recorded in the settings), e.g. "
                        "state.backend.rocksdb.timer-service.factory=HEAP")
    return p.parse_args(argv)


def settings_for(args: argparse.Namespace) -> dict[str, str]:
    conf = {
        "parallelism.default": str(args.parallelism),
        "state.backend.type": args.backend,
        "execution.checkpointing.interval": args.checkpoint_interval,
        "execution.checkpointing.dir": Path(args.checkpoints).resolve().as_uri(),
        "execution.checkpointing.incremental": "true" if args.backend == "rocksdb" else "false",
        "taskmanager.memory.managed.size": args.managed_memory,
        "pipeline.object-reuse": "true",
        "table.local-time-zone": "UTC",
    }
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"flink_sessions: --set {item!r} is not KEY=VALUE")
        conf[key.strip()] = value.strip()
    return conf


def ddl(args: argparse.Namespace) -> tuple[str, str, str]:
    source = f"""
        CREATE TABLE events (
            event_id STRING,
            user_id STRING,
            event_time TIMESTAMP_LTZ(3),
            event_type STRING,
            page STRING,
            WATERMARK FOR event_time AS event_time - INTERVAL '{args.lateness_minutes}' MINUTE
        ) WITH (
            'connector' = 'filesystem',
            'path' = '{Path(args.input).resolve().as_uri()}',
            'format' = 'json',
            'json.timestamp-format.standard' = 'ISO-8601',
            'json.fail-on-missing-field' = 'false',
            'json.ignore-parse-errors' = 'false'
        )"""
    sink = f"""
        CREATE TABLE sessions_out (
            user_id STRING,
            window_start TIMESTAMP(3),
            window_end TIMESTAMP(3),
            event_count BIGINT,
            page_views BIGINT
        ) WITH (
            'connector' = 'filesystem',
            'path' = '{Path(args.output).resolve().as_uri()}',
            'format' = 'csv'
        )"""
    insert = f"""
        INSERT INTO sessions_out
        SELECT user_id, window_start, window_end,
               COUNT(*) AS event_count,
               COUNT(*) FILTER (WHERE event_type = 'page_view') AS page_views
        FROM TABLE(SESSION(TABLE events PARTITION BY user_id, DESCRIPTOR(event_time),
                           INTERVAL '{args.gap_minutes}' MINUTE))
        GROUP BY user_id, window_start, window_end"""
    return source, sink, insert


def count_output(output: Path, exclude_user: str | None) -> dict[str, int]:
    """Committed part files only: in-progress/pending ones are hidden ('.part-...') until a checkpoint commits them."""
    sessions = events = page_views = excluded = files = 0
    for path in sorted(output.rglob("*")):
        if not path.is_file() or path.name.startswith((".", "_")):
            continue
        files += 1
        with path.open(newline="") as fh:
            for row in csv.reader(fh):
                if not row:
                    continue
                if exclude_user is not None and row[0] == exclude_user:
                    excluded += 1
                    continue
                sessions += 1
                events += int(row[3])
                page_views += int(row[4])
    hidden = sum(1 for p in output.rglob(".*") if p.is_file())
    return {"sessions": sessions, "events_in_sessions": events, "page_views": page_views,
            "excluded_sessions": excluded, "part_files": files, "uncommitted_part_files": hidden}


def checkpoint_stats(log_dir: Path) -> dict[str, object]:
    completed, durations, sizes, splits = 0, [], [], 0
    pattern = re.compile(r"Completed checkpoint (\d+) for job \S+ \((\d+) bytes, .*?checkpointDuration=(\d+) ms")
    for log in glob.glob(str(log_dir / "*.log")):
        for line in Path(log).read_text(errors="replace").splitlines():
            if "Assigned split to subtask" in line:  # the file source's splits (one per file unless split)
                splits += 1
            m = pattern.search(line)
            if m:
                completed += 1
                sizes.append(int(m.group(2)))
                durations.append(int(m.group(3)))
    return {"completed_checkpoints": completed, "checkpoint_duration_ms": durations, "checkpoint_bytes": sizes,
            "source_splits": splits}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    output = Path(args.output)
    if output.exists() and any(output.iterdir()):
        print(f"flink_sessions: {output} is not empty", file=sys.stderr)
        return 2
    output.mkdir(parents=True, exist_ok=True)
    Path(args.checkpoints).mkdir(parents=True, exist_ok=True)
    log_dir = Path(args.log_dir) if args.log_dir else output.parent / "flink-log"
    log_dir.mkdir(parents=True, exist_ok=True)
    # Read by pyflink when it launches the gateway JVM (pyflink_gateway_server.py): heap and log location.
    os.environ["JVM_ARGS"] = f"-Xmx{args.heap} -Xms{args.heap}"
    os.environ["FLINK_LOG_DIR"] = str(log_dir.resolve())

    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment

    conf = Configuration()
    settings = settings_for(args)
    for key, value in settings.items():
        conf.set_string(key, value)
    env_settings = EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(conf).build()
    t_env = TableEnvironment.create(env_settings)
    source, sink, insert = ddl(args)
    t_env.execute_sql(source)
    t_env.execute_sql(sink)
    plan = t_env.explain_sql(insert)
    physical = plan.split("== Optimized Execution Plan ==")[-1]
    operators = sorted(set(re.findall(r"^\s*[+-]*\s*(\w+)\(", physical, flags=re.M)))

    submitted = time.monotonic()
    result = t_env.execute_sql(insert)
    job = result.get_job_client()
    execution = job.get_job_execution_result().result()
    finished = time.monotonic()
    net_runtime_ms = execution.get_net_runtime()

    counts = count_output(output, args.exclude_user)
    line = {
        "engine": "flink-sql",
        "backend": args.backend,
        "wall_s": round(finished - STARTED, 3),
        "startup_s": round(submitted - STARTED, 3),
        "submit_to_end_s": round(finished - submitted, 3),
        "job_net_runtime_s": round(net_runtime_ms / 1000, 3),
        **counts,
        **checkpoint_stats(log_dir),
        "settings": {**settings, "JVM_ARGS": os.environ["JVM_ARGS"], "gap_minutes": args.gap_minutes,
                     "lateness_minutes": args.lateness_minutes},
        "plan_operators": operators,
        "flink_version": _flink_version(),
    }
    print(json.dumps(line), flush=True)
    return 0


def _flink_version() -> str:
    try:
        from importlib.metadata import version
        return version("apache-flink")
    except Exception:  # noqa: BLE001 - informational only
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
