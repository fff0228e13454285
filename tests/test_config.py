"""The one configuration object: defaults, every setting read from SESSIONS_*, bad values refused by name."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pipelines.config import ConfigError, SessionsConfig
from pipelines.coordination.job_leases import job_lock
from pipelines.errors import JobRunning, LifecycleBusy, SessionsError
from pipelines.job.runtime import spark_conf
from tests.kit.homes import tool

pytestmark = pytest.mark.tier("pure")

REPO = Path(__file__).resolve().parent.parent


def test_settings_reach_spark_and_operations(tmp_path):
    config = SessionsConfig.from_env({
        "SESSIONS_HOME": str(tmp_path), "SESSIONS_STATE_STORE": "HDFS", "SESSIONS_STATE_PARTITIONS": "6",
        "SESSIONS_SPARK_MASTER": "local[1]", "SESSIONS_MIN_BATCHES_TO_RETAIN": "7", "SESSIONS_SPARK_UI": "yes",
        "SESSIONS_AUTO_RESTORE": "true", "SESSIONS_STOP_TIMEOUT_S": "2.5", "SESSIONS_COMPACT_FILES": "9"})
    conf = spark_conf(config)
    assert conf["spark.master"] == "local[1]" and conf["spark.sql.shuffle.partitions"] == "6"
    assert conf["spark.sql.streaming.minBatchesToRetain"] == "7" and conf["spark.ui.enabled"] == "true"
    assert conf["spark.sql.streaming.stateStore.providerClass"].endswith("HDFSBackedStateStoreProvider")
    assert (config.auto_restore, config.stop_timeout_s, config.compact_files) == (True, 2.5, 9)
    defaults = SessionsConfig.from_env({"SESSIONS_HOME": str(tmp_path)})
    assert (defaults.state_store, defaults.gap_minutes, defaults.lateness_minutes, defaults.auto_restore) == \
        ("rocksdb", 30, 10, False)
    assert defaults.savepoint_uri == str(tmp_path.resolve() / "savepoints")


@pytest.mark.parametrize("master,in_process", [("local", True), ("local[2]", True), ("local[*]", True),
                                               ("local-cluster[2,1,1024]", False), ("spark://127.0.0.1:7077", False)])
def test_the_jvm_jar_and_the_no_fork_file_system_by_master(tmp_path, master, in_process):
    """In-process executors (local, local[n]) find the operator on the driver's class path and get the local file
    system without forks (tests/test_local_fs.py); executors in other JVMs (local-cluster, a cluster) get the jar
    shipped and Hadoop's own file system."""
    from pipelines.job.runtime import JVM_JAR, LOCAL_FS_NO_FORK, runtime_jars

    assert JVM_JAR.exists(), "make setup builds it"
    conf = spark_conf(SessionsConfig.from_env({"SESSIONS_HOME": str(tmp_path), "SESSIONS_SPARK_MASTER": master}))
    # The operator's jar first, then the JVM artifacts make setup fetched (Delta Spark).
    assert conf["spark.driver.extraClassPath"].split(":") == [str(JVM_JAR), *map(str, runtime_jars())]
    if not in_process:
        assert conf["spark.jars"].split(",") == [str(JVM_JAR), *map(str, runtime_jars())]
    assert ("spark.jars" in conf) is not in_process
    assert all((conf.get(key) == value) is in_process for key, value in LOCAL_FS_NO_FORK.items())


@pytest.mark.parametrize("master,partitions", [("local", "1"), ("local[2]", "2"), ("local[3,2]", "3"),
                                                ("local[64]", "50"), ("local-cluster[2,1,1024]", None),
                                                ("spark://127.0.0.1:7077", None)])
def test_delta_replays_a_tables_log_in_a_local_masters_threads(tmp_path, master, partitions):
    """Delta's log replay in as many partitions as a local master has threads (at most Delta's default, 50); a
    cluster keeps Delta's own default (the key unset)."""
    conf = spark_conf(SessionsConfig.from_env({"SESSIONS_HOME": str(tmp_path), "SESSIONS_SPARK_MASTER": master}))
    assert conf.get("spark.databricks.delta.snapshotPartitions") == partitions


@pytest.mark.parametrize("name,value,says", [
    ("SESSIONS_STATE_STORE", "memory", "expected one of rocksdb, hdfs"),
    ("SESSIONS_STATE_PARTITIONS", "0", "must be >= 1"),
    ("SESSIONS_GAP_MINUTES", "half an hour", "is not an integer"),
    ("SESSIONS_AUTO_RESTORE", "maybe", "expected true or false"),
    ("SESSIONS_SAVEPOINT_MAX_AGE_HOURS", "-1", "must be > 0"),
    ("SESSIONS_MAX_VERSIONS_PER_BATCH", "abc", "is not an integer"),
    ("SESSIONS_MAX_FUTURE_MINUTES", "-5", "must be >= 0"),
    ("SESSIONS_HOME", "", "set but empty"),
    # Locations: `s3://` once became the relative path ./s3: (and any other scheme a directory of its name)
    ("SESSIONS_LEASE_URI", "s3://", "names no bucket: expected s3://bucket/prefix"),
    ("SESSIONS_LEASE_URI", "s3:", "names no bucket"),
    ("SESSIONS_LEASE_URI", "hdfs:///leases", "expected hdfs://namenode:port/path"),
    ("SESSIONS_LEASE_URI", "gs://b/leases", "expected a local path, s3://bucket/prefix or hdfs://namenode:port/path"),
    ("SESSIONS_SAVEPOINT_URI", "s3:///prefix", "names no bucket"),
    ("SESSIONS_WAREHOUSE_URI", "gs://bucket/w", "the scheme gs:// is not supported"),
    ("SESSIONS_LANDING_URI", "S3://bucket/l", "the scheme S3:// is not supported"),
    # Leases: a holder renews every TTL/3
    ("SESSIONS_LEASE_TTL_S", "0.001", "is too short: at least 1 s"),
    ("SESSIONS_LEASE_TTL_S", "0.9", "is too short"),
    # Spark: refused here, not as "Java gateway process exited"
    ("SESSIONS_SPARK_MASTER", "nonsense", "is not a Spark master"),
    ("SESSIONS_SPARK_MASTER", "local[0]", "is not a Spark master"),
    ("SESSIONS_SPARK_MASTER", "spark://host", "is not a Spark master"),
    ("SESSIONS_SPARK_MASTER", "LOCAL", "is not a Spark master"),
    ("SESSIONS_SPARK_DRIVER_MEMORY", "0", "is not a size"),
    ("SESSIONS_SPARK_DRIVER_MEMORY", "0g", "is not a size"),
    ("SESSIONS_SPARK_DRIVER_MEMORY", "4096", "is not a size"),  # bytes to the JVM's -Xmx
    ("SESSIONS_SPARK_DRIVER_MEMORY", "4gb", "is not a size"),  # -Xmx4gb: an invalid heap size
    ("SESSIONS_SPARK_DRIVER_MEMORY", "100m", "is too small: between 512m"),
    ("SESSIONS_SPARK_DRIVER_MEMORY", "100t", "is too large"),
])
def test_bad_values_are_refused_by_name(tmp_path, name, value, says):
    with pytest.raises(ConfigError, match=says) as error:
        SessionsConfig.from_env({"SESSIONS_HOME": str(tmp_path), name: value})  # (an empty HOME replaces it)
    assert name in str(error.value)


@pytest.mark.parametrize("name,value", [
    ("SESSIONS_SPARK_MASTER", "local"), ("SESSIONS_SPARK_MASTER", "local[*]"), ("SESSIONS_SPARK_MASTER", "local[4,2]"),
    ("SESSIONS_SPARK_MASTER", "local[*,3]"), ("SESSIONS_SPARK_MASTER", "local-cluster[2,1,1024]"),
    ("SESSIONS_SPARK_MASTER", "spark://10.0.0.1:7077"), ("SESSIONS_SPARK_MASTER", "spark://a.example:7077,b:7077"),
    ("SESSIONS_SPARK_MASTER", "k8s://https://kubernetes.default.svc"), ("SESSIONS_SPARK_MASTER", "yarn"),
    ("SESSIONS_SPARK_DRIVER_MEMORY", "512m"), ("SESSIONS_SPARK_DRIVER_MEMORY", "2g"),
    ("SESSIONS_SPARK_DRIVER_MEMORY", "4G"), ("SESSIONS_SPARK_DRIVER_MEMORY", "1048576k"),
    ("SESSIONS_LEASE_TTL_S", "1.0"), ("SESSIONS_LEASE_URI", "s3://bucket"), ("SESSIONS_LEASE_URI", "file:///shared/l"),
    ("SESSIONS_LEASE_URI", "hdfs://nn:8020/leases"),
    ("SESSIONS_SAVEPOINT_URI", "s3://bucket/prefix"),
])
def test_good_values_are_taken(tmp_path, name, value):
    config = SessionsConfig.from_env({"SESSIONS_HOME": str(tmp_path), name: value})
    assert str(getattr(config, name.removeprefix("SESSIONS_").lower())).endswith(value.removeprefix("file://"))


@pytest.mark.tier("subprocess")
def test_cli_reports_a_bad_setting_in_one_line(tmp_path):
    env = {**os.environ, "SESSIONS_HOME": str(tmp_path), "SESSIONS_STATE_STORE": "memory"}
    done = subprocess.run([tool("sessionctl"), "status", "--json"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and "SESSIONS_STATE_STORE='memory'" in done.stderr


def test_a_bad_setting_and_a_held_lock_are_expected_errors(tmp_path):
    """One base type for what sessionctl prints as one line and Dagster turns into a Failure."""
    with pytest.raises(SessionsError):
        SessionsConfig.from_env({"SESSIONS_HOME": str(tmp_path), "SESSIONS_GAP_MINUTES": "0"})
    config = SessionsConfig.from_env({"SESSIONS_HOME": str(tmp_path)})
    with job_lock(config, "run"), pytest.raises(JobRunning, match="the job is running: run \\(pid") as busy, \
            job_lock(config, "savepoint"):
        pass
    assert busy.value.holder.startswith("run (pid") and busy.value.lock.endswith("_leases/job.lease")
    with job_lock(config, "compaction", name="lifecycle"), pytest.raises(LifecycleBusy, match="another lifecycle"), \
            job_lock(config, "restore", name="lifecycle"):
        pass


def test_the_dagster_resource_has_every_setting(tmp_path, monkeypatch):
    """SessionsResource declares every setting of SessionsConfig: one optional field per setting, in the same order,
    of the setting's kind; a field left unset is the setting's default (unset = SESSIONS_<NAME>, then SessionsConfig's
    default), and a field set on the resource is the setting the library gets."""
    from dataclasses import fields

    from assets.resources import SessionsResource
    from pipelines.config import ENV_ONLY_SETTINGS

    declared = [(name, field.annotation, field.default) for name, field in SessionsResource.model_fields.items()]
    assert declared == [(setting.name, setting.metadata.get("kind", str) | None, None)
                        for setting in fields(SessionsConfig)
                        if setting.repr and setting.name not in ENV_ONLY_SETTINGS], \
        "SessionsResource and SessionsConfig differ"
    assert ENV_ONLY_SETTINGS == ("spark_master",) and not set(ENV_ONLY_SETTINGS) & set(SessionsResource.model_fields)
    secret = [setting.name for setting in fields(SessionsConfig) if not setting.repr]
    assert secret == ["erasure_key", "kafka_conf"] and not set(secret) & set(SessionsResource.model_fields)
    for name in [name for name in os.environ if name.startswith("SESSIONS_")]:
        monkeypatch.delenv(name)
    assert SessionsResource(home=str(tmp_path)).config() == SessionsConfig.from_env({"SESSIONS_HOME": str(tmp_path)})
    resource = SessionsResource(home=str(tmp_path), warehouse_uri=str(tmp_path / "tables"),
                                landing_uri=str(tmp_path / "drop"), checkpoint_uri=str(tmp_path / "shared"),
                                lease_ttl_s=5.5, ingest_settle_seconds=3, spark_ui=True, gap_minutes=20)
    config = resource.config()
    assert (config.warehouse_uri, config.landing_uri, config.checkpoint_uri) == \
        (str(tmp_path / "tables"), str(tmp_path / "drop"), str((tmp_path / "shared").resolve()))
    assert (config.lease_ttl_s, config.ingest_settle_seconds, config.spark_ui, config.gap_minutes) == (5.5, 3, True, 20)
