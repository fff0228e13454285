"""A small Delta table's append and read as the job's session does them, with Delta's log replayed in its default 50
partitions and in the local master's threads (`spark.databricks.delta.snapshotPartitions`, which the job sets on a
local master: pipelines.job.runtime.delta_sql_conf). Rounds alternate (A B A B) in one SparkSession, each on a fresh
table: `--appends` appends of 100 rows, each followed by a count, timed as a whole.

    .venv/bin/python benchmarks/delta_log_replay.py [--rounds 2] [--appends 15] [--partitions 50,2]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pipelines.config import SessionsConfig  # noqa: E402
from pipelines.job.runtime import DELTA_SNAPSHOT_PARTITIONS, get_spark  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--appends", type=int, default=15)
    parser.add_argument("--partitions", default="50,2")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results" / "delta_snapshot_partitions")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="delta-log-replay-"))
    spark = get_spark(SessionsConfig.from_env({"SESSIONS_HOME": str(work / "home")}))
    rows = spark.range(100).selectExpr("cast(id as string) user_id", "id v")
    runs: dict[str, list[float]] = {p: [] for p in args.partitions.split(",")}
    load = [os.getloadavg()[0]]
    for round_ in range(args.rounds):
        for partitions in runs:
            spark.conf.set(DELTA_SNAPSHOT_PARTITIONS, partitions)
            table = str(work / f"t-{round_}-{partitions}")
            rows.write.format("delta").save(table)
            started = time.monotonic()
            for _ in range(args.appends):
                rows.write.format("delta").mode("append").save(table)
                spark.read.format("delta").load(table).count()
            runs[partitions].append(round(time.monotonic() - started, 2))
            load.append(os.getloadavg()[0])
    out = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "appends": args.appends,
           "seconds": runs, "loadavg_1m": load}
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / "delta_log_replay.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
