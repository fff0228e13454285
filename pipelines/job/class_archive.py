"""The Spark JVM's class archive (Java's AppCDS), built by `make setup`: `python -m pipelines.job.class_archive PATH`.

Every sessionctl command that starts Spark loads ~15k JVM classes from the pyspark wheel's jars, and verifies and
links them, while the catch-up's ingest competes for the same cores. A dynamic CDS archive holds them pre-parsed:
a JVM started with `-XX:SharedArchiveFile` maps it instead (pipelines.job.runtime.java_options; measured in README
"Performance"). The archive is made by one training run -- a small catch-up on each state store provider -- in a
JVM started with `-XX:ArchiveClassesAtExit`, which writes the classes it loaded when it exits.

The archive is only valid for the JDK and the class path it was made with; a JVM given a stale one (a JDK or
pyspark upgrade without `make setup`) says so in the log (jvm-stderr.log) and starts without it.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from pyspark import SparkContext

from pipelines.config import SessionsConfig
from pipelines.core.sample_data import land_sample
from pipelines.job.runtime import JVM_STDERR_LOG, get_spark, stop_spark
from pipelines.job.stream import catch_up

__all__ = ["build", "main"]


def build(archive: Path) -> Path:
    archive = archive.resolve()
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.unlink(missing_ok=True)
    work = tempfile.mkdtemp(prefix="class-archive-")  # kept if the archive is not written: its logs say why
    configs = [SessionsConfig.from_env({"SESSIONS_HOME": f"{work}/{provider}", "SESSIONS_STATE_STORE": provider})
               for provider in ("rocksdb", "hdfs")]
    spark = get_spark(configs[0], class_archive_dump=archive)
    gateway = SparkContext._gateway
    for config in configs:
        for seed in (1, 2):  # a first batch on empty state, then one that reads state and fires timers
            land_sample(config.landing, users=200, sessions_per_user=2, files=2, seed=seed)
            catch_up(config, spark)
    stop_spark(spark)
    # The JVM writes the archive when it exits: it does once its py4j gateway and its stdin are closed.
    assert gateway is not None
    process = gateway.proc
    gateway.shutdown()
    process.stdin.close()
    process.wait(timeout=300)
    if not archive.exists() or archive.stat().st_size == 0:
        raise RuntimeError(f"the JVM did not write {archive}: see {configs[0].log_dir / JVM_STDERR_LOG}")
    shutil.rmtree(work, ignore_errors=True)
    return archive


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m pipelines.job.class_archive PATH", file=sys.stderr)
        return 2
    started = time.monotonic()
    path = build(Path(args[0]))
    print(f"class archive {path}: {path.stat().st_size / 2**20:.0f} MiB in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
