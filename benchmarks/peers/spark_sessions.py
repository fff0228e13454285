"""Native Spark peer of the sessions job: Spark's own file source and `session_window`, one availableNow run.

Run by the product's venv (it needs only pyspark and pyarrow), as a subprocess of benchmarks/end_to_end.py so that
it has a JVM of its own, as `sessionctl catch-up` has:

    .venv/bin/python benchmarks/peers/spark_sessions.py --input DIR --output DIR --checkpoint DIR \
        --provider rocksdb|hdfs [--exclude-user U]

The query: spark.readStream.schema(event_id, user_id, event_time TIMESTAMP, event_type, page).json(--input)
-> withWatermark(event_time, lateness) -> groupBy(session_window(event_time, gap), user_id) with count(*) and page
views -> append mode -> parquet files in --output, trigger availableNow, checkpoint in --checkpoint. Session
settings as the product's session (pipelines.job.runtime.spark_conf): local[2], 4g driver, UTC, shuffle partitions = 4
(the job's default state partitions), the state store provider of --provider.

Prints one JSON line on stdout: wall seconds (script start to query end, JVM start included), the time from JVM
ready to query end, the sessions written (without --exclude-user's) with their events and page views, and every
micro-batch's numInputRows, durationMs phases, watermark and state operator metrics from query.recentProgress.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

STARTED = time.monotonic()

PROVIDER_CLASSES = {  # as pipelines.job.checkpoint.PROVIDER_CLASSES (not imported: this peer does not load the product)
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--input", required=True, help="directory of *.jsonl")
    p.add_argument("--output", required=True, help="parquet output directory")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--provider", choices=tuple(PROVIDER_CLASSES), required=True)
    p.add_argument("--gap-minutes", type=int, default=30)
    p.add_argument("--lateness-minutes", type=int, default=10)
    p.add_argument("--partitions", type=int, default=4, help="spark.sql.shuffle.partitions (= state partitions)")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--driver-memory", default="4g")
    p.add_argument("--exclude-user", default=None)
    return p.parse_args(argv)


def batch_record(progress: dict) -> dict:
    ops = progress.get("stateOperators") or []
    return {
        "batchId": progress.get("batchId"),
        "numInputRows": progress.get("numInputRows"),
        "durationMs": progress.get("durationMs"),
        "watermark": (progress.get("eventTime") or {}).get("watermark"),
        "stateOperators": [{k: op.get(k) for k in ("numRowsTotal", "numRowsUpdated", "numRowsRemoved",
                                                     "numRowsDroppedByWatermark", "memoryUsedBytes",
                                                     "allUpdatesTimeMs", "allRemovalsTimeMs", "commitTimeMs")}
                           for op in ops],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType, TimestampType

    spark = (SparkSession.builder.master(args.master).appName("native-sessions")
             .config("spark.driver.memory", args.driver_memory)
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.shuffle.partitions", str(args.partitions))
             .config("spark.sql.streaming.stateStore.providerClass", PROVIDER_CLASSES[args.provider])
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    jvm_ready = time.monotonic()

    schema = StructType([StructField("event_id", StringType()), StructField("user_id", StringType()),
                         StructField("event_time", TimestampType()), StructField("event_type", StringType()),
                         StructField("page", StringType())])
    events = spark.readStream.schema(schema).json(args.input)
    gap = f"{args.gap_minutes} minutes"
    sessions = (events.withWatermark("event_time", f"{args.lateness_minutes} minutes")
                .groupBy(F.session_window("event_time", gap).alias("w"), "user_id")
                .agg(F.count(F.lit(1)).alias("event_count"),
                     F.sum(F.when(F.col("event_type") == "page_view", 1).otherwise(0)).cast("long").alias("page_views")))
    out = sessions.select("user_id", F.col("w.start").alias("session_start"), F.col("w.end").alias("window_end"),
                          "event_count", "page_views")
    query = (out.writeStream.format("parquet").outputMode("append")
             .option("path", args.output).option("checkpointLocation", args.checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    finished = time.monotonic()
    if query.exception() is not None:
        print(json.dumps({"error": str(query.exception())}), flush=True)
        return 1
    batches = [batch_record(json.loads(p.json)) for p in query.recentProgress]
    spark.stop()

    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    table = ds.dataset(args.output, format="parquet", exclude_invalid_files=True).to_table()
    excluded = 0
    if args.exclude_user is not None and table.num_rows:
        mask = pc.equal(table["user_id"], args.exclude_user)
        excluded = pc.sum(mask.cast("int64")).as_py() or 0
        table = table.filter(pc.invert(mask))
    line = {
        "engine": "spark-native",
        "provider": args.provider,
        "wall_s": round(finished - STARTED, 3),
        "jvm_start_s": round(jvm_ready - STARTED, 3),
        "query_s": round(finished - jvm_ready, 3),
        "sessions": table.num_rows,
        "events_in_sessions": int(pc.sum(table["event_count"]).as_py() or 0) if table.num_rows else 0,
        "page_views": int(pc.sum(table["page_views"]).as_py() or 0) if table.num_rows else 0,
        "excluded_sessions": excluded,
        "batches": batches,
        "trigger_execution_ms_total": sum((b["durationMs"] or {}).get("triggerExecution", 0) for b in batches),
        "settings": {"master": args.master, "driver_memory": args.driver_memory, "shuffle_partitions": args.partitions,
                     "provider": args.provider, "gap_minutes": args.gap_minutes,
                     "lateness_minutes": args.lateness_minutes, "sink": "parquet (file sink, append)"},
    }
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
