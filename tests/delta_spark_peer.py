"""Delta Spark as a second engine, in its own process: a SparkSession configured as Delta Lake asks (its SQL
extension and catalog, static settings the product's shared session does not carry) with the jars `make setup`
fetched. Reads each table given (rows, rows at version 0, columns), appends one of its rows to a copy, and prints
the answers as one JSON line. Usage: python tests/delta_spark_peer.py '{"name": ["uri", "copy"], ...}'"""
from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession

from pipelines.job.runtime import runtime_jars


def main() -> None:
    tables = json.loads(sys.argv[1])
    jars = ",".join(str(jar) for jar in runtime_jars())
    spark = (SparkSession.builder.master("local[1]").config("spark.jars", jars)
             .config("spark.driver.extraClassPath", jars.replace(",", ":"))
             .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
             .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
             # Tables of a few hundred rows: one partition for Delta's log replay and every shuffle, not 50 tasks
             # per stage (a test of what Delta Spark reads, not of its speed).
             .config("spark.sql.shuffle.partitions", "1").config("spark.databricks.delta.snapshotPartitions", "1")
             .config("spark.ui.enabled", "false").getOrCreate())
    answers = {}
    for name, (uri, copy) in tables.items():
        frame = spark.read.format("delta").load(uri)
        answers[name] = {"rows": frame.count(), "columns": sorted(frame.columns),
                         "rows_v0": spark.read.format("delta").option("versionAsOf", 0).load(uri).count()}
        frame.limit(1).write.format("delta").mode("append").save(copy)
        answers[name]["copy_rows_after_append"] = spark.read.format("delta").load(copy).count()
    print(json.dumps(answers))
    spark.stop()


if __name__ == "__main__":
    main()
