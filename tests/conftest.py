"""Shared fixtures and helpers for the pipeline tests.

Fixtures
--------
``spark``        (session scope) the one SparkSession of the test run, made by ``pipelines.job.runtime.get_spark``.
                 It serves both state store providers: the provider is chosen per query start from the
                 config passed to ``catch_up(config, spark)``.
``make_config``  tests.kit.homes.make_config(tmp_path, provider="rocksdb", **env), as a fixture.
``postgres_server`` (session scope) a real PostgreSQL 15 on 127.0.0.1 (Debian's binaries, own temp dir, free
                 port, password auth): a ``PostgresServer`` with ``create_database(name)`` and
                 ``dagster_env(database)`` (the DAGSTER_PG_* variables of deploy/dagster.yaml).
``s3_endpoint``  (session scope) a real S3 HTTP API on loopback (moto server in its own process) with the
                 buckets ``savepoints`` and ``warehouse``; while it lives, the AWS_* variables of this process
                 point delta-rs and boto3 at it. Yields {"process", "port", "env"}; SIGSTOP/SIGCONT of the
                 process is an injected outage.

What tests import lives in tests/kit/ (its __init__ says which module owns which helper); this file holds the
fixtures, the environment every Spark JVM of the run starts with, and the tiers and depths of the tests.
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hdfs_cluster import hdfs  # noqa: F401 -- the `hdfs` fixture (a local HDFS, session scope)
from tests.kafka_broker import kafka_broker  # noqa: F401 -- the session's Apache Kafka broker (fixture)
from tests.kit.homes import REPO, free_port, make_config, tool
from tests.kit.servers import PG_BIN, PostgresServer, _as_postgres_user
from tests.kit.waits import wait_until

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# The suite's driver JVMs (this process's and every sessionctl / Dagster run it starts, through the environment) are
# short-lived and the suite is CPU-bound on 2 cores: the C1 compiler alone spends less CPU compiling than it saves
# (measured: benchmarks/README.md, "The test suite's own time"). Spark reads SPARK_SUBMIT_OPTS into the driver's command line;
# production JVMs keep the default (tiered C2) compilation.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")

# The JVM operator's tests jar (jvm/operator/src/test/java but the JUnit tests, built by `make setup`: CoreHarness,
# the py4j harness of tests/test_jvm_operator.py), never in the product's jar nor on a product run's class path, on
# that of the suite's Spark JVMs (this process's and those it starts: the environment). Spark's launcher puts
# SPARK_DIST_CLASSPATH last, after the pyspark wheel's jars: the class archive `make setup` made for the product's class
# path is still mapped (spark.driver.extraClassPath comes before those jars, and a JVM whose class path differs from
# the archive's before its end does not map it). Not spark.jars: that class loader is not the product jar's, and
# CoreHarness calls package-private code of the operator.
TESTS_JAR = REPO / "build" / "jvm" / "sessions-operator-tests.jar"
_dist_class_path = [path for path in os.environ.get("SPARK_DIST_CLASSPATH", "").split(os.pathsep) if path]
if str(TESTS_JAR) not in _dist_class_path:  # pytest-xdist's workers inherit the controller's
    os.environ["SPARK_DIST_CLASSPATH"] = os.pathsep.join([*_dist_class_path, str(TESTS_JAR)])


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """The one SparkSession (local[2]) for the whole test run; both providers share it."""
    from pipelines.job.runtime import get_spark

    home = tmp_path_factory.mktemp("spark-home")
    # The session of a job whose checkpoint is on S3: Hadoop's S3A on its class path (appended: the class archive
    # still fits), so tests run checkpoints on S3 in it too (tests/test_remote_checkpoints.py: s3a_session).
    session = get_spark(make_config(home, SESSIONS_CHECKPOINT_URI="s3a://suite/checkpoints"))
    yield session


@pytest.fixture(name="make_config")
def _make_config_fixture():
    """The make_config(tmp_path, provider="rocksdb", **env) helper (see the module docstring)."""
    return make_config


S3_BUCKETS = ("savepoints", "warehouse")


@pytest.fixture(scope="session")
def s3_endpoint():
    """A real S3 HTTP API on loopback (moto server, its own process), shared by the whole test run."""
    import boto3

    port = free_port()
    server = subprocess.Popen([tool("moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
           "AWS_ALLOW_HTTP": "true", "AWS_EC2_METADATA_DISABLED": "true", "SESSIONS_S3_TIMEOUT": "5s",
           "SESSIONS_S3_RETRY_TIMEOUT": "5s", "SESSIONS_S3_MAX_RETRIES": "1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)

    def buckets_made() -> bool:
        if server.poll() is not None:
            raise RuntimeError(f"the moto server exited with {server.returncode}")
        try:
            client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
            for bucket in S3_BUCKETS:
                client.create_bucket(Bucket=bucket)
        except Exception:  # noqa: BLE001 -- not listening yet
            return False
        return True

    wait_until(buckets_made, timeout_s=30, interval_s=0.3, what="the S3 endpoint to make the suite's buckets")
    yield {"process": server, "port": port, "env": env}
    server.kill()
    server.wait()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    """A real Spark standalone cluster on loopback (deploy/local-cluster: a master and two 1-core workers,
    separate JVMs), shared by the test run. Yields {"master": "spark://...", "dir": Path} (logs, work dirs)."""
    root = tmp_path_factory.mktemp("cluster")
    port, ui_port = free_port(), free_port()
    script = str(REPO / "deploy" / "local-cluster")
    env = {**os.environ, "VENV_PY": sys.executable}
    started = subprocess.run([script, "start", "--dir", str(root), "--port", str(port), "--ui-port", str(ui_port),
                              "--workers", "2", "--cores", "1", "--memory", "2g"],
                             env=env, capture_output=True, text=True, timeout=120)
    if started.returncode != 0:
        subprocess.run([script, "stop", "--dir", str(root)], env=env, timeout=60)
        raise RuntimeError(f"local cluster did not start: {started.stderr}")
    yield {"master": started.stdout.strip(), "dir": root, "ui_port": ui_port}
    subprocess.run([script, "stop", "--dir", str(root)], env=env, timeout=60)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """PostgreSQL 15 (Debian's server binaries at PG_BIN) in its own temp dir on a free loopback port, for the
    whole test run; stopped (fast shutdown) and removed at the end. Nothing listens beyond 127.0.0.1."""
    if not (PG_BIN / "pg_ctl").exists():
        pytest.fail(f"PostgreSQL server binaries not found in {PG_BIN}: apt-get install postgresql-15 "
                    "(or point SESSIONS_TEST_PG_BIN at a PostgreSQL bin directory)")
    # Not under pytest's tmp dir: that one is private to root and the postgres user could not enter it.
    root = Path(tempfile.mkdtemp(prefix="sessions-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    server = PostgresServer(host="127.0.0.1", port=free_port(), user="sessions_test",
                            password=secrets.token_hex(16), data_dir=root / "data")
    password_file = root / "password"
    password_file.write_text(server.password + "\n")
    if os.geteuid() == 0:
        shutil.chown(password_file, "postgres", "postgres")
    log = root / "postgres.log"

    def run(args: list[str]) -> None:
        done = subprocess.run(_as_postgres_user(args), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stderr[-2000:]}{tail}")

    run([str(PG_BIN / "initdb"), "-D", str(server.data_dir), "-U", server.user, f"--pwfile={password_file}",
         "--auth-host=scram-sha-256", "--auth-local=peer", "-E", "UTF8", "--locale=C.UTF-8"])
    password_file.unlink()
    # fsync off: a throw-away test cluster, a crash loses nothing we need and commits get cheap.
    options = (f"-c listen_addresses={server.host} -p {server.port} -c unix_socket_directories={root} "
               "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
    run([str(PG_BIN / "pg_ctl"), "-D", str(server.data_dir), "-l", str(log), "-o", options, "-w", "-t", "60", "start"])
    try:
        yield server
    finally:
        run([str(PG_BIN / "pg_ctl"), "-D", str(server.data_dir), "-m", "fast", "-w", "-t", "60", "stop"])
        shutil.rmtree(root, ignore_errors=True)


# --- Test tiers: every test is pure, spark, subprocess or e2e ----------------------------------------------------
# Markers registered in pyproject.toml; which make target runs which tests: the depth, below.
#   pure        no JVM: the pure core, config, locks, oracle
#   spark       Spark in-process, through the session-scoped `spark` fixture
#   subprocess  its own JVM/Python through `sessionctl` or other subprocesses (kill -9, Ctrl-C, one-line CLI errors)
#   e2e         servers: Dagster webserver/daemon, PostgreSQL, chromium, a standalone Spark cluster, moto S3, and the
#               crash campaign
# Each test module says its tier: `pytestmark = pytest.mark.tier("spark")`; a test that differs carries its own
# `@pytest.mark.tier("subprocess")`, and a parametrized case that differs is named in the module's TIER_OF_CASE
# ({"test_x[rocksdb]": "subprocess"}). A module without a tier fails the collection.
TIERS = ("pure", "spark", "subprocess", "e2e")  # cheapest first
# Fixtures that set a tier's floor: a test using one is at least that tier, whatever its mark says (a test added
# to a pure module that takes `spark` still leaves the pure tier JVM-free).
FIXTURE_TIERS = {"spark": "spark", "s3_endpoint": "e2e", "spark_cluster": "e2e", "postgres_server": "e2e", "hdfs": "e2e",
                 "kafka_broker": "e2e"}


def _tier_of(item: pytest.Item) -> str | None:
    cases = getattr(getattr(item, "module", None), "TIER_OF_CASE", {})
    marker = item.get_closest_marker("tier")
    tier = cases.get(item.name) or (marker.args[0] if marker and marker.args else None)
    if tier not in TIERS:
        return tier  # refused by the caller
    for fixture in getattr(item, "fixturenames", ()):
        floor = FIXTURE_TIERS.get(fixture)
        if floor and TIERS.index(floor) > TIERS.index(tier):
            tier = floor
    return tier


# --- Depth: which make target runs a test -------------------------------------------------------------------------
#   fast   `make test-fast` (under 3 min): the pure tier and FAST_MODULES' in-process cases -- the core scenarios
#          against the oracle on a local checkpoint
#   long   `make test-long` (CI runs it after `make test`): every e2e test -- the storage matrix on HDFS and S3, the
#          crash campaigns, the standalone cluster, Kafka's broker, the Dagster stack and the browser -- and LONG's
#          process tests: kills inside a running stream's recovery, the benchmarks' smoke runs
#   `make test` (under 15 min) runs every test that is not long.
FAST_MODULES = frozenset({"test_stream_vs_oracle", "test_bad_input", "test_hostile_input", "test_savepoint_io",
                          "test_ingest_tasks", "test_preflight", "test_local_fs", "test_jvm_operator"})
LONG = {  # module -> its test functions in the long depth (every case of each), or single cases ("test_x[hdfs]")
    "test_online_lifecycle": frozenset({
        "test_rescale_of_a_running_stream_between_two_batches", "test_restore_of_a_running_stream_between_two_batches",
        "test_a_running_stream_killed_inside_its_rescale_loses_nothing",
        "test_a_running_stream_killed_inside_its_restore_loses_nothing",
        "test_savepoints_of_a_running_stream_and_stop_with_savepoint_restore_exactly_once",
        "test_ctrl_c_at_random_moments_is_one_line_or_the_summary"}),
    "test_erasure": frozenset({"test_a_bulk_forget_killed_midway_is_finished_by_running_it_again"}),
    "test_crash_restart": frozenset({"test_sigkill_mid_run_then_restart_is_exactly_once"}),
    "test_benchmarks_run": frozenset({"test_state_scaling_benchmark_holds_every_open_user_in_both_operators",
                                      "test_throughput_benchmark_measures_both_queries_on_the_same_batches"}),
    "test_compact_while_running": frozenset({"test_compaction_beside_a_running_stream_is_exactly_once"}),
    "test_class_archive": frozenset({"test_an_archive_that_does_not_fit_is_skipped_and_said_in_the_log"}),
    "test_dagster_dev": frozenset({"test_dagster_dev_stops_within_ten_seconds_on_ctrl_c"}),
    "test_ingest_tasks": frozenset({
        "test_a_catch_up_killed_between_the_tasks_files_and_the_ingest_commit_loses_and_repeats_nothing"}),
    "test_restore_marker": frozenset({"test_a_killed_restore_is_reported_and_finished_by_its_command"}),
    "test_interrupted_rescale": frozenset({
        "test_a_rescale_killed_inside_the_repartition_is_finished_by_the_next_rescale"}),
    "test_native_savepoints": frozenset({"test_kills_inside_a_native_savepoint_and_a_native_restore_lose_nothing"}),
    "test_read_only_home": frozenset({"test_reads_work_on_a_read_only_home"}),
    "test_incremental_savepoints": frozenset({"test_a_chain_that_starts_at_a_restored_rocksdb_checkpoint",
                                              "test_compact_folds_a_chain_and_keeps_what_kept_savepoints_need",
                                              "test_erasure_rewrites_every_table_of_a_chain",
                                              "test_policy_full_every_k_forced_full_new_lineage_and_chain_share"}),
    # Delta Spark on the product's tables: every rewrite, then every command (make test keeps the readers' own tests:
    # test_data_files, and test_erasure's restore over files delta-rs rewrote)
    "test_rewritten_tables": frozenset({"test_every_command_after_delta_spark_rewrote_the_tables"}),
    "test_delta_engines": frozenset({"test_delta_spark_and_delta_rs_read_and_append_every_table"}),
    # The session spec's attributes: make test runs each on rocksdb; the HDFS-backed provider's cases and the Dagster
    # surface's here (make test keeps the running stream's own spec change: the code path session_stream runs)
    "test_session_attributes": frozenset({
        "test_epoch_millisecond_times_integer_users_and_every_field_type[hdfs]",
        "test_attributes_survive_a_canonical_savepoint_and_its_restore[hdfs]",
        "test_the_dagster_resource_takes_the_spec"}),
    "test_previous_release": frozenset({
        "test_the_previous_releases_checkpoint_continues_and_its_savepoint_restores[hdfs]",
        "test_the_previous_releases_checkpoint_and_savepoint_under_a_spec_with_attributes[hdfs]"}),
}


def _depth_of(item: pytest.Item, tier: str) -> str | None:
    module = item.path.stem
    long = LONG.get(module, ())
    if tier == "e2e" or getattr(item, "originalname", item.name) in long or item.name in long:
        return "long"
    if tier == "pure" or (tier == "spark" and module in FAST_MODULES):
        return "fast"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks every test with its tier (the module's `tier` mark, a test's own, or TIER_OF_CASE) and its depth."""
    for item in items:
        tier = _tier_of(item)
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid} has {'the tier ' + repr(tier) if tier else 'no tier'}: give its "
                                    f"module `pytestmark = pytest.mark.tier(...)` with one of {', '.join(TIERS)} "
                                    f"(see the comment above TIERS in tests/conftest.py)")
        item.add_marker(getattr(pytest.mark, tier))
        depth = _depth_of(item, tier)
        if depth:
            item.add_marker(getattr(pytest.mark, depth))
    # A name in LONG that its module (when collected) no longer has: a renamed test would land in `make test` unseen.
    found: dict[str, set[str]] = {}
    for item in items:
        found.setdefault(item.path.stem, set()).update({getattr(item, "originalname", item.name), item.name})
    stale = sorted(f"{module}::{name}" for module, names in LONG.items() if module in found
                   for name in names - found[module])
    if stale:
        raise pytest.UsageError(f"tests/conftest.py LONG names tests that do not exist: {', '.join(stale)}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A failure whose one line points at a home's errors.log carries that log's tail into the report: the run's
    temporary directories are gone by the time a CI log is read."""
    import re

    report = yield
    if report.failed and call.excinfo is not None:
        found = re.search(r"details in (\S+errors\.log)", str(call.excinfo.value))
        log = Path(found.group(1)) if found else None
        if log is not None and log.exists():
            tail = log.read_text(errors="replace").splitlines()[-80:]
            report.sections.append(("errors.log (tail)", "\n".join(tail)))
    return report
