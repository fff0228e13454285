"""The Spark runtime of the job: the session (built, prepared, stopped in order) and the translation of Spark's
failures into the typed one line an operator acts on."""
from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from py4j.protocol import Py4JError
from pyspark import SparkConf, SparkContext
from pyspark.errors import PySparkException, PythonException
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession

from pipelines.config import REPO_ROOT, SessionsConfig
from pipelines.coordination.leases import Lease
from pipelines.errors import (
    CheckpointDamaged,
    RescaleIncomplete,
    SessionsError,
    StorageUnavailable,
    StreamFailed,
    unreadable_savepoint_file,
)
from pipelines.job.checkpoint import PROVIDER_CLASSES, inspect_checkpoint, rescale_command
from pipelines.job.operators.jvm import JVM_JAR
from pipelines.job.shipping import cluster_conf
from pipelines.job.task_files import share_aws_env
from pipelines.locations import CheckpointPath, hdfs_outage
from pipelines.storage import is_s3, seconds

__all__ = ["CLASS_ARCHIVE", "ERRORS_LOG", "JVM_STDERR_LOG", "LOCAL_FS_NO_FORK", "error_line", "explain_spark_failure", "get_spark", "log_traceback", "prepare_session", "rescale_incomplete", "runtime_jars", "spark_conf", "spark_failures", "start_jvm", "stop_spark", "stop_state_stores", "yield_cpu"]

LOG4J2 = Path(__file__).resolve().parent / "log4j2.properties"
ERRORS_LOG = "errors.log"  # Python tracebacks of Spark failures, beside Spark's own spark.log

# Spark error conditions (SparkThrowable.getCondition()) that mean a state store file is damaged or gone.
_DAMAGED_STATE_CONDITIONS = ("CANNOT_LOAD_STATE_STORE", "CANNOT_READ_STREAMING_STATE_FILE",
                             "STATE_STORE_CHECKSUM", "CANNOT_READ_CHECKPOINT", "CANNOT_READ_STATE_STORE")
_UNFINISHED_REPARTITION = "STREAMING_UNFINISHED_REPARTITION_DETECTED"


# Spark reads it when a query's state stores open; an existing checkpoint may switch either way (Spark loads a
# version from its newest snapshot plus the changelogs after it).
ROCKSDB_CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"


# Built by `make setup` (pipelines/job/class_archive.py): the JVM's classes pre-parsed, mapped at start instead of loaded.
CLASS_ARCHIVE = REPO_ROOT / "build" / "jvm" / "spark-classes.jsa"
RUNTIME_JARS_DIR = REPO_ROOT / "build" / "jars"  # filled by `make setup` from jvm/deps/pom.xml
S3A_JARS_DIR = REPO_ROOT / "build" / "jars-s3a"  # jvm/s3a/pom.xml: only for a checkpoint on S3


DELTA_SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"
DELTA_DEFAULT_SNAPSHOT_PARTITIONS = 50  # Delta Spark's Snapshot.defaultNumSnapshotPartitions


def java_options(config: SessionsConfig, class_archive_dump: Path | None = None) -> str:
    """The driver JVM's options (in local mode it runs the tasks too)."""
    options = [f"-Dlog4j2.configurationFile=file:{LOG4J2}", f"-Dsessions.log.dir={config.log_dir}",
               # The JVM's own warnings (e.g. a stale class archive) to its stderr -- the log -- not to stdout, where
               # sessionctl prints its JSON.
               "-Xlog:disable", "-Xlog:all=warning:stderr"]
    if class_archive_dump is not None:
        options.append(f"-XX:ArchiveClassesAtExit={class_archive_dump}")
    elif CLASS_ARCHIVE.exists():
        options.append(f"-XX:SharedArchiveFile={CLASS_ARCHIVE}")  # -Xshare:auto: one that does not fit is skipped
    return " ".join(options)


def spark_conf(config: SessionsConfig, class_archive_dump: Path | None = None) -> dict[str, str]:
    """Spark settings for the job; shared by the CLI's session and Dagster's PySparkResource."""
    return {
        "spark.master": config.spark_master,
        "spark.app.name": "sessions",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(config.state_partitions),
        "spark.sql.streaming.stateStore.providerClass": PROVIDER_CLASSES[config.state_store],
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.enabled": str(config.spark_ui).lower(),
        "spark.ui.showConsoleProgress": "false",  # sessionctl prints JSON; a progress bar would garble it
        "spark.driver.memory": config.spark_driver_memory,
        # How long stopping the query may wait for its batch; the runbook waits a little longer for the lock.
        "spark.sql.streaming.stopTimeout": str(int(config.stop_timeout_s * 1000)),
        "spark.sql.streaming.minBatchesToRetain": str(config.min_batches_to_retain),
        ROCKSDB_CHANGELOG: str(config.rocksdb_changelog).lower(),
        # Spark's log to a file (pipelines/log4j2.properties): the terminal gets sessionctl's one line.
        "spark.driver.extraJavaOptions": java_options(config, class_archive_dump),
        **cluster_conf(config.spark_master),
        # Hadoop's S3A for a checkpoint on S3, and for the stream's source reading raw_events from an S3 warehouse.
        **jvm_jar_conf(config.spark_master,
                       s3a=config.checkpoint_uri.startswith("s3a://") or is_s3(config.warehouse_uri)),
        **s3a_conf(config),
        **delta_sql_conf(config.spark_master),
        # A client of a NameNode without HA retries a call when the NameNode restarts (Hadoop's default for such a
        # client: fail at once): 1 s apart for 30 s, then 10 s apart for 5 min more.
        "spark.hadoop.dfs.client.retry.policy.enabled": "true",
        "spark.hadoop.dfs.client.retry.policy.spec": "1000,30,10000,30",
    }


def delta_sql_conf(master: str) -> dict[str, str]:
    """Delta Spark's SQL in the job's session -- OPTIMIZE, DELETE, UPDATE, ZORDER BY, VACUUM on `delta.`<uri>`` -- as
    Delta documents it, so that users (and Dagster assets sharing the session) run Delta's commands on the product's
    tables where the product runs. Nothing without the Delta Spark jar `make setup` fetches."""
    if not any("delta-spark" in jar.name for jar in runtime_jars()):
        return {}
    conf = {"spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
            "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog"}
    threads = local_threads(master)
    if threads is not None:
        # Delta replays a table's log into 50 partitions by default (a cluster's figure): on a local master every
        # commit and every read of a table then runs 50 tasks on a few threads: a small table's append and read took
        # 5-6x as long on local[2] (benchmarks/delta_log_replay.py). A local master replays it in as many partitions as it has threads; a
        # cluster keeps Delta's default.
        conf[DELTA_SNAPSHOT_PARTITIONS] = str(min(threads, DELTA_DEFAULT_SNAPSHOT_PARTITIONS))
    return conf


def local_threads(master: str) -> int | None:
    """The task threads of a local master (`local`, `local[4]`, `local[*]`, `local[4,2]`); None for any other."""
    found = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master.strip())
    if found is None:
        return None
    threads = found.group(1)
    if threads is None:
        return 1
    if threads == "*":
        return os.cpu_count() or 1
    return max(1, int(threads))


def s3a_conf(config: SessionsConfig | None = None) -> dict[str, str]:
    """Hadoop's S3A filesystem (a checkpoint on S3; the stream's source on an S3 warehouse) on the endpoint and region
    of the standard AWS_* variables, as every other S3 client here; credentials from the same variables (S3A's default
    provider chain reads them). With `config`, its requests wait and retry as SESSIONS_S3_TIMEOUT and
    SESSIONS_S3_MAX_RETRIES say, as delta-rs's do: S3A's defaults (a 200 s socket timeout, 7 retries of 5 attempts)
    would hold a stream minutes on an endpoint that stopped answering before `run` can ride the outage out."""
    env = os.environ
    conf = {"spark.hadoop.fs.s3a.endpoint.region": env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
            # S3A's classic input stream, not Hadoop 3.5's default "analytics" one: the analytics accelerator gives up
            # on a block read past its own timeout (the socket closed under it, the read failed, no retry) when the
            # host is busy -- it failed a restore's read of its own checkpoint; the classic stream reopens and retries.
            "spark.hadoop.fs.s3a.input.stream.type": "classic"}
    endpoint = env.get("AWS_ENDPOINT_URL")
    if endpoint:  # an S3-compatible endpoint (MinIO, moto, Ceph): path-style requests, TLS as its URL says
        conf.update({"spark.hadoop.fs.s3a.endpoint": endpoint, "spark.hadoop.fs.s3a.path.style.access": "true",
                     "spark.hadoop.fs.s3a.connection.ssl.enabled": str(endpoint.startswith("https")).lower(),
                     # No "Expect: 100-continue", and local files (RocksDB's SSTs) uploaded through S3A's own output
                     # stream rather than the transfer manager's: S3-compatible servers answer 100-continue unevenly
                     # (the transfer manager took moto's interim 100 for an upload's final status and failed a
                     # rescale's state commit).
                     "spark.hadoop.fs.s3a.connection.expect.continue": "false",
                     "spark.hadoop.fs.s3a.optimized.copy.from.local.enabled": "false"})
    if config is not None:
        # Hadoop reads "ms" but not object_store's "min": the durations in milliseconds. Uploads keep their own
        # (part upload) timeout: a large RocksDB file takes longer than one small request.
        timeout_ms = f"{round(seconds(config.s3_timeout) * 1000)}ms"
        retries = str(config.s3_max_retries)
        conf.update({"spark.hadoop.fs.s3a.connection.timeout": timeout_ms,
                     "spark.hadoop.fs.s3a.connection.establish.timeout": "5s",  # as delta-rs's connect_timeout
                     "spark.hadoop.fs.s3a.attempts.maximum": retries, "spark.hadoop.fs.s3a.retry.limit": retries})
    return conf


def jvm_jar_conf(master: str, *, s3a: bool = False) -> dict[str, str]:
    """The JVM operator's jar (the default operator; SESSIONS_OPERATOR) on the driver's class path from its start --
    in local mode the executors are the driver, and the local file system below must be loadable before Spark reads
    any path --; on a cluster Spark also ships it to the executors (spark.jars). With `s3a`, Hadoop's S3A filesystem
    too (a checkpoint on S3)."""
    jars = ([JVM_JAR] if JVM_JAR.exists() else []) + runtime_jars() + (sorted(S3A_JARS_DIR.glob("*.jar")) if s3a else [])
    if not jars:
        return {}
    class_path = ":".join(str(jar) for jar in jars)
    checkpoint_files = CHECKPOINT_FILES if JVM_JAR.exists() else {}
    local_fs = LOCAL_FS_NO_FORK if JVM_JAR.exists() else {}
    if master == "local" or master.startswith("local["):  # not local-cluster[...]: its executors are other JVMs
        return {"spark.driver.extraClassPath": class_path, **checkpoint_files, **local_fs}
    return {"spark.driver.extraClassPath": class_path, "spark.jars": ",".join(str(jar) for jar in jars),
            **checkpoint_files}


def runtime_jars() -> list[Path]:
    """The JVM artifacts `make setup` fetched with Maven (jvm/deps/pom.xml: Delta Spark), in a fixed order."""
    return sorted(RUNTIME_JARS_DIR.glob("*.jar"))


# Spark's checkpoint file manager, but through Hadoop's cached FileSystem on S3 (jvm/operator/src/main/java/sessions/
# CheckpointFiles.java): a FileContext's S3A file system is closed by the garbage collector, under a read at random.
_CHECKPOINT_FILE_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
CHECKPOINT_FILES = {_CHECKPOINT_FILE_MANAGER: "sessions.CheckpointFiles"}

# file:// paths through Hadoop's local file system minus its child processes (jvm/operator/src/main/java/sessions/
# LocalFileSystemNoFork.java: without Hadoop's native library every chmod and link-status read forks a process).
# Local masters only: executors of a cluster would load it from the shipped jar, which no test here can vouch for.
LOCAL_FS_NO_FORK = {
    "spark.hadoop.fs.file.impl": "sessions.LocalFileSystemNoFork$Checked",
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "sessions.LocalFileSystemNoFork$CheckedFs",
}


@contextmanager
def fenced_logs(spark: SparkSession, checkpoint: CheckpointPath, lease: Lease) -> Iterator[None]:
    """Spark's own writes of `checkpoint`'s query logs (offsets, commits) fenced by `lease` in the JVM (jvm/operator/
    src/main/java/sessions/Fence.java): refused once the lease's last renewal is older than its TTL. A process
    resumed after a pause past its TTL thus plans no batch into a checkpoint that another holder took over, whichever
    of Spark's thread and the lease's wakes first. Where the session has not our checkpoint file manager, nothing; nor
    inside a block of this kind with the same lease (a restore between a running stream's batches): the outer one
    fences and stays in charge."""
    if lease.observed or spark.conf.get(_CHECKPOINT_FILE_MANAGER, "") != CHECKPOINT_FILES[_CHECKPOINT_FILE_MANAGER]:
        yield
        return
    fence: Any = spark.sparkContext._jvm.sessions.Fence  # type: ignore[union-attr]
    where = str(checkpoint)
    lease.observe(lambda seconds: fence.hold(where, int(seconds * 1000)))
    try:
        yield
    finally:
        lease.observe(None)
        with suppress(Py4JError):
            fence.release(where)


JVM_STDERR_LOG = "jvm-stderr.log"  # what the JVM and the Python processes it starts write to their stderr


def _launch(config: SessionsConfig, class_archive_dump: Path | None = None) -> Any:
    """This process's Spark JVM (pyspark's gateway to it), launched with the job's settings. Its stderr -- and so that
    of the Python processes it starts (workers), whose own output, e.g. a worker's traceback when a Ctrl-C stops the
    query under it, would otherwise land on the operator's terminal -- goes to the log."""
    conf = SparkConf(loadDefaults=False)
    for key, value in spark_conf(config, class_archive_dump).items():
        conf.set(key, value)
    path = config.log_dir / JVM_STDERR_LOG
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        stderr = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:  # a read-only home: a command that only reads still runs, its JVM's output dropped
        stderr = os.open(os.devnull, os.O_WRONLY)
    try:
        return launch_gateway(conf, popen_kwargs={"stderr": stderr})
    finally:
        os.close(stderr)


def yield_cpu(nice: int) -> bool:
    """Lower this process's CPU priority to `nice` before it starts its JVM, which inherits it with its Python
    workers (the thread that starts them does: Linux keeps nice per thread). False where nothing changed: `nice` 0,
    already that low, or a JVM already running or launched here (it would not inherit it)."""

    current = os.getpriority(os.PRIO_PROCESS, 0)
    if nice <= current or SparkContext._active_spark_context is not None or _AHEAD is not None:
        return False
    os.setpriority(os.PRIO_PROCESS, 0, nice)
    return True


class _JvmAhead:
    """This process's Spark JVM launched in a thread before its first session is asked for (start_jvm)."""

    def __init__(self, config: SessionsConfig) -> None:
        self.gateway: Any = None
        self.taken = False
        self._thread = threading.Thread(target=self._run, args=(config,), name="spark-jvm-ahead", daemon=True)
        self._thread.start()

    def _run(self, config: SessionsConfig) -> None:
        with suppress(Exception):  # a launch that failed is launched again by get_spark, which reports it
            self.gateway = _launch(config)

    def launched(self) -> Any:
        """The gateway once launched, or None if that failed."""
        self._thread.join()
        return self.gateway

    def take(self) -> Any:
        """launched(), now this process's (a session's) and not to be discarded."""
        self.taken = True
        return self.launched()

    def discard(self) -> None:
        """A JVM no session took (the command ended before it needed one): stopped now, not left to notice its
        closed stdin after this process is gone."""
        self._thread.join(timeout=60)
        process = getattr(self.gateway, "proc", None)
        if process is not None:
            with suppress(Exception):
                process.kill()
                process.wait(timeout=10)


_AHEAD: _JvmAhead | None = None


def start_jvm(config: SessionsConfig) -> None:
    """Launch this process's Spark JVM now, in the background, for a command that will ask for a session of `config`
    (get_spark) after its imports and checks: the JVM's own start (about a second) runs beside them. After any CPU
    priority change (yield_cpu): the JVM inherits the launching thread's. Nothing when a JVM is up or on its way."""
    global _AHEAD
    if _AHEAD is None and SparkContext._gateway is None:
        _python_for_workers()
        _AHEAD = _JvmAhead(config)


def _python_for_workers() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def get_spark(config: SessionsConfig, class_archive_dump: Path | None = None) -> SparkSession:
    _python_for_workers()
    builder = SparkSession.builder
    for key, value in spark_conf(config, class_archive_dump).items():
        builder = builder.config(key, value)
    # pyspark installs a SIGINT handler that raises KeyboardInterrupt inside whatever py4j call runs; a handler of
    # the caller's own (sessionctl run: Ctrl-C = stop between batches) is kept.
    own = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None

    with SparkContext._lock:
        if SparkContext._gateway is None:  # the first session of this process: its JVM, unless start_jvm launched it
            ahead = _AHEAD.take() if _AHEAD is not None and not _AHEAD.taken and class_archive_dump is None else None
            SparkContext._gateway = ahead or _launch(config, class_archive_dump)
            SparkContext._jvm = SparkContext._gateway.jvm
    spark = builder.getOrCreate()
    if callable(own) and own is not signal.default_int_handler:
        signal.signal(signal.SIGINT, own)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def prepare_session(spark: SparkSession, config: SessionsConfig) -> None:
    # SQL confs are read when a query starts; an existing checkpoint's own values still win.
    spark.conf.set("spark.sql.shuffle.partitions", str(config.state_partitions))
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDER_CLASSES[config.state_store])
    spark.conf.set(ROCKSDB_CHANGELOG, str(config.rocksdb_changelog).lower())
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    # The query's Python functions (the sink's and the quarantine's writers) with this process's AWS_* variables.
    share_aws_env(spark, config.warehouse_uri)


def stop_spark(spark: SparkSession | None = None) -> None:
    """Stop the session in order before the process exits: the queries, then the state stores (RocksDB instances
    and the maintenance thread that works on them), then the context. A JVM left to exit on its own when Python
    goes away runs its shutdown hooks while that native code still runs, and can crash with a fatal-error banner."""
    if _AHEAD is not None and not _AHEAD.taken:
        _AHEAD.discard()
    spark = spark or SparkSession.getActiveSession()
    if spark is None:
        return
    with suppress(Exception):  # best effort on the way out: nothing to report to an operator here
        for query in spark.streams.active:
            query.stop()
    with suppress(Exception):
        stop_state_stores(spark)
    server = None
    with suppress(Exception):
        server = _take_accumulator_server(spark)
        spark.stop()
    if server is not None:
        threading.Thread(target=server.shutdown, name="accumulator-server-shutdown", daemon=True).start()


def stop_state_stores(spark: SparkSession) -> None:
    """Close this JVM's state store providers and stop their maintenance thread (Spark's `StateStore.stop()`; the
    next stateful query loads what it needs again). A provider of a query that stopped still uploads a snapshot in the
    background (RocksDB with changelog checkpointing) to the directory it was loaded from: before a restore gives that
    directory to a new checkpoint, nothing of this JVM may still write there. Under a local master the executors are
    this JVM; on a cluster, a stream's executors belong to its own application (sessionctl, a Dagster run)."""
    jvm: Any = spark.sparkContext._jvm
    store = jvm.java.lang.Class.forName("org.apache.spark.sql.execution.streaming.state.StateStore$")
    store.getField("MODULE$").get(None).stop()


def _take_accumulator_server(spark: SparkSession) -> Any:
    """PySpark's context stop shuts its accumulator server down with socketserver's `shutdown()`, which waits for
    `serve_forever`'s next poll (every 0.5 s): 0.28-0.46 s of every sessionctl exit, measured, after 0.11-0.14 s for
    stopping the JVM's context. Taken from the context before `spark.stop()`, the server is shut down in a daemon
    thread after it: an exiting process does not wait for it; one that goes on has it closed within the poll."""
    context: Any = spark.sparkContext
    server = getattr(context, "_accumulatorServer", None)  # pyspark 4.2's attribute; None: nothing to take
    if server is not None:
        context._accumulatorServer = None
    return server


# ---- failures ------------------------------------------------------------------------------------

def _java_throwable(error: BaseException) -> Any:
    return getattr(error, "java_exception", None) or getattr(error, "_origin", None)


def error_conditions(error: BaseException) -> list[str]:
    """Spark's error conditions along the error and its Java cause chain (outermost first)."""
    found: list[str] = []
    if isinstance(error, PySparkException):
        with suppress(Exception):
            condition = error.getCondition()
            if condition:
                found.append(str(condition))
    throwable = _java_throwable(error)
    for _ in range(20):  # a cause chain is short; bound it anyway
        if throwable is None:
            break
        with suppress(Exception):
            condition = throwable.getCondition()
            if condition:
                found.append(str(condition))
        try:
            throwable = throwable.getCause()
        except Exception:  # noqa: BLE001 -- not a Java object (or the gateway is gone): stop walking
            break
    return found


def explain_spark_failure(error: BaseException, config: SessionsConfig) -> SessionsError:
    """A failure inside Spark (a query, a read, a repartition), as the one line an operator can act on.
    Spark's error conditions decide first; text is matched only for exceptions that carry none (Hadoop's)."""
    conditions = error_conditions(error)
    text = str(error)
    log = f"details in {config.log_dir / ERRORS_LOG} and {config.log_dir / 'spark.log'}"
    if _UNFINISHED_REPARTITION in conditions or (not conditions and _UNFINISHED_REPARTITION in text):
        finish = rescale_command(inspect_checkpoint(config.checkpoint)) or "sessionctl rescale --partitions N"
        return rescale_incomplete(finish, f" ({log})")
    damaged = any(c.startswith(_DAMAGED_STATE_CONDITIONS) for c in conditions) or "ChecksumException" in text \
        or "CANNOT_LOAD_STATE_STORE" in text
    if damaged:
        found = re.search(r"(state/\d+/\d+/[^\s:,]+)", text)
        where = f"the state store file {found.group(1)} of {config.checkpoint}" if found else \
            f"the state store in {config.checkpoint}"
        # A changelog (RocksDB's changelog checkpointing) is read without a checksum and Spark's message does not
        # name it: the reader in the stack says which kind of file it was.
        cause = ("checksum error" if "Checksum" in text else
                 "a changelog file is truncated or corrupt" if "ChangelogReader" in text else
                 "missing" if "FileNotFound" in text or "does not exist" in text else "cannot be read")
        return CheckpointDamaged(f"{where} is damaged ({cause}): `sessionctl restore --savepoint latest` rebuilds the "
                                 f"state from the newest savepoint and replays what came after it ({log})")
    unreadable = unreadable_savepoint_file(text)  # an executor could not read a savepoint's data file
    if unreadable is not None:
        return unreadable
    # Python code that ran in a worker and raised (a PythonException: "An exception was thrown from the Python
    # worker") is no worker that failed to start: its own exception is the cause.
    raised = isinstance(error, PythonException) or _PYTHON_RAISED in text
    if any(c.startswith("PYTHON_WORKER") for c in conditions) or _WORKER_START.search(text) or \
            (not raised and re.search("python worker", text, re.IGNORECASE)):
        said = re.search(r"Error from python worker:\s*\n\s*(.+)", text)
        detail = f" (it said: {said.group(1).strip()[:200]})" if said else ""
        return StreamFailed(f"a Spark Python worker failed to start or connect back{detail}: check PYSPARK_PYTHON "
                            f"({os.environ.get('PYSPARK_PYTHON', sys.executable)}) and the machine's load, then run "
                            f"the command again; nothing was committed by the failed step ({log})")
    if raised:
        return StreamFailed(f"Spark failed: in an executor: {_python_exception_line(text)} ({log})")
    outage = hdfs_outage(config.checkpoint, text)  # Hadoop's client gave up on the checkpoint's NameNode or DataNodes
    if outage is not None:
        return StorageUnavailable(f"{outage} ({log})")
    return StreamFailed(f"Spark failed: {_java_cause(text) or _first_line(text, error)} ({log})")


def error_line(error: BaseException) -> str:
    """One line that says what went wrong: for a Py4JJavaError the Java exception it wraps (and its innermost
    cause), not "An error occurred while calling oN.load."."""
    text = str(error)
    return _java_cause(text) or f"{type(error).__name__}: {_first_line(text, error)}"


def _first_line(text: str, error: BaseException) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)[:300]


def _java_cause(text: str) -> str | None:
    """A Py4JJavaError's text starts with "An error occurred while calling oN.method." -- which says nothing; the
    exception it wraps, and its innermost `Caused by:`, do."""
    if not text.startswith("An error occurred while calling"):
        return None
    lines = [line.strip() for line in text.splitlines()]
    thrown = next((line.lstrip(": ").strip() for line in lines[1:] if line.startswith(":")), "")
    causes = [line.removeprefix("Caused by:").strip() for line in lines if line.startswith("Caused by:")]
    if not thrown and not causes:
        return None
    call = re.match(r"An error occurred while calling \S+?\.(\w+)", text)
    said = thrown[:240] + (f"; caused by {causes[-1][:240]}" if causes and causes[-1] != thrown else "")
    return f"{call.group(1) if call else 'a call'} raised {said}"


_PYTHON_RAISED = "An exception was thrown from the Python worker"
# What Spark says when a worker process did not start, connect back or stay up (whatever the exception's type).
_WORKER_START = re.compile(r"Error from python worker|Python worker exited unexpectedly|failed to connect back|"
                           r"pyspark\.daemon", re.IGNORECASE)


def _python_exception_line(text: str) -> str:
    """The exception line of the Python traceback an executor sent back: the first unindented line after its last
    "Traceback" header (the frames are indented; a chained exception's own traceback comes last), not the JVM's
    lines after it."""
    tail = text.rsplit("Traceback (most recent call last):", 1)[-1]
    lines = [line for line in tail.splitlines() if line.strip() and not line[0].isspace()]
    return (lines[0] if lines else "its Python code failed").strip()[:300]


def rescale_incomplete(finish: str, suffix: str = "") -> RescaleIncomplete:
    return RescaleIncomplete(f"a rescale was interrupted after Spark began repartitioning the checkpoint: finish it "
                             f"with `{finish}` (or `sessionctl restore --savepoint latest`) before running the job"
                             f"{suffix}", next_step=finish)


def log_traceback(config: SessionsConfig) -> None:
    """Append the exception being handled to $SESSIONS_HOME/logs/errors.log (where the one line points). A log that
    cannot be written (a full disk, a read-only or missing log directory) is skipped: it never replaces the one line
    of the error being handled."""
    with suppress(OSError):
        config.log_dir.mkdir(parents=True, exist_ok=True)
        with (config.log_dir / ERRORS_LOG).open("a") as log:
            log.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')} pid {os.getpid()}\n{traceback.format_exc()}\n")


@contextmanager
def spark_failures(config: SessionsConfig) -> Iterator[None]:
    """Spark's own exceptions raised in the block become the typed one line (explain_spark_failure); the whole
    traceback is appended to $SESSIONS_HOME/logs/errors.log, where that line points."""
    try:
        yield
    except (PySparkException, Py4JError) as error:
        log_traceback(config)
        raise explain_spark_failure(error, config) from None
