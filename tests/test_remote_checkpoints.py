"""The Spark checkpoint on S3 (Hadoop's S3A against the suite's S3 endpoint, moto on loopback) and on a real HDFS
(NameNode and DataNode on loopback, tests/hdfs_cluster.py), on both state store providers: catch-up, a savepoint,
more data, a restore to the savepoint and its replay end exactly once against the oracle (testkit/oracle.py), with the
driver reading the checkpoint's logs without a JVM (pipelines.locations: WebHDFS, pyarrow's S3).

The S3A jars join Spark's class path only in a JVM started for an s3a:// checkpoint (pipelines.job.runtime): the
suite's shared session is started as one (tests/conftest.py), and one test runs a `sessionctl` process to show the
product's own JVM gets them."""
from __future__ import annotations

import hashlib
import json
import subprocess

import pytest

from pipelines.job.checkpoint import inspect_checkpoint
from pipelines.locations import RemotePath
from testkit.oracle import run_oracle
from tests.kit.datagen import land_batches, stream_scenario
from tests.kit.homes import SESSIONCTL, config_env, make_config
from tests.kit.storages import s3a_session
from tests.kit.tables import assert_late_keys, read_sessions

pytestmark = pytest.mark.tier("subprocess")

GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000


def _sessionctl(config, *args: str, env: dict[str, str]) -> dict:
    done = subprocess.run([str(SESSIONCTL), *args], env=config_env(config, **env), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _assert_exactly_once(config, batches) -> None:
    expected = run_oracle(batches, GAP_MS, LATENESS_MS)
    got = read_sessions(config)
    assert len({row[0] for row in got}) == len(got), "a session_id was written more than once"
    assert got == sorted(expected.closed)
    assert_late_keys(config, expected)


def _s3_bucket(s3_endpoint, name: str) -> str:
    import boto3

    boto3.client("s3", endpoint_url=s3_endpoint["env"]["AWS_ENDPOINT_URL"]).create_bucket(Bucket=name)
    return name


@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_checkpoint_on_s3_catch_up_savepoint_restore_exactly_once(spark, s3_endpoint, tmp_path, provider):
    from pipelines.job.stream import catch_up
    from state_store.lifecycle import restore, take_savepoint
    from state_store.rescale import rescale
    from state_store.status import status

    s3a_session(spark, s3_endpoint)
    bucket = _s3_bucket(s3_endpoint, f"checkpoints-{provider}")
    native = provider == "hdfs"  # the HDFS-backed provider's savepoint keeps a native copy: its restore copies it back
    # ... with the savepoints on S3 too: each native file copied by S3 itself, both ways
    store = {"SESSIONS_SAVEPOINT_URI": f"s3://{_s3_bucket(s3_endpoint, 'savepoints-s3')}/sp"} if native else {}
    config = make_config(tmp_path, provider, SESSIONS_CHECKPOINT_URI=f"s3://{bucket}/job", **store)
    assert str(config.checkpoint) == f"s3a://{bucket}/job/sessions"  # s3:// is taken as Hadoop's s3a://
    assert config.lease_uri == f"s3://{bucket}/job/_leases"  # the leases beside it, with S3's conditional writes
    batches = stream_scenario(7, 6, False, GAP_MS, LATENESS_MS)

    land_batches(config, batches[:3])
    catch_up(config, spark)
    saved = take_savepoint(config, spark=spark, native_copy=native)
    assert bool(saved.native_checksum) == native
    if native:
        _assert_copied_by_s3(s3_endpoint, config, saved)
    land_batches(config, batches[3:], start=3)
    catch_up(config, spark)
    assert rescale(config, 3, spark=spark).partitions_after == 3
    _assert_exactly_once(config, batches)

    restored = restore(config, saved.savepoint_id, spark=spark)
    assert restored.verified and restored.rows == saved.rows
    assert restored.method == ("native" if native else "canonical")
    assert restored.previous_checkpoint and restored.previous_checkpoint.startswith(f"s3a://{bucket}/job/sessions.replaced-")
    catch_up(config, spark)  # replays what came after the savepoint
    _assert_exactly_once(config, batches)
    info = inspect_checkpoint(config.checkpoint)  # the driver's read of the logs on S3, no JVM
    assert isinstance(config.checkpoint, RemotePath) and info.provider == provider
    assert info.last_committed_batch is not None and info.source_offset and info.source_offset["seq"] == len(batches)
    assert status(config, spark=spark, with_state=True).state_files > 0  # listed on S3 through pyarrow


def _assert_copied_by_s3(s3_endpoint, config, saved) -> None:
    """Every file of the native copy was copied by S3 (CopyObject with a SHA-256 it computed; a file streamed by a
    client carries none), and each file's bytes, read back, hash to its manifest's value."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint["env"]["AWS_ENDPOINT_URL"])
    bucket, _, prefix = config.savepoint_uri.removeprefix("s3://").partition("/")
    folder = f"{prefix}/native/{saved.savepoint_id}"
    manifest = json.loads(client.get_object(Bucket=bucket, Key=f"{folder}/_native.json")["Body"].read())
    assert len(manifest["files"]) == saved.native_files > 0
    for entry in manifest["files"]:
        head = client.head_object(Bucket=bucket, Key=f"{folder}/{entry['path']}", ChecksumMode="ENABLED")
        assert head.get("ChecksumSHA256"), entry["path"]
        data = client.get_object(Bucket=bucket, Key=f"{folder}/{entry['path']}")["Body"].read()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (entry["size"], entry["sha256"]), entry["path"]


def test_a_sessionctl_process_runs_a_checkpoint_on_s3(s3_endpoint, tmp_path):
    """The product's own JVM, started for an s3a:// checkpoint, has Hadoop's S3A on its class path and its endpoint
    from AWS_* (pipelines.job.runtime): `sessionctl catch-up`, then `status` reading the logs on S3 without Spark."""
    bucket = _s3_bucket(s3_endpoint, "checkpoints-process")
    env = {"SESSIONS_CHECKPOINT_URI": f"s3a://{bucket}/job", **s3_endpoint["env"]}
    config = make_config(tmp_path, "rocksdb", **env)
    batches = stream_scenario(2, 3, False, GAP_MS, LATENESS_MS)
    land_batches(config, batches)
    caught_up = _sessionctl(config, "catch-up", env=env)
    assert caught_up["batches"] == len(batches) + 1  # one batch per landed file, then the one that settles them
    report = _sessionctl(config, "status", "--no-state", "--json", env=env)
    assert report["checkpoint"] == f"s3a://{bucket}/job/sessions"
    assert report["last_committed_batch"] == caught_up["last_committed_batch"] == len(batches)
    _assert_exactly_once(config, batches)


@pytest.mark.tier("e2e")
def test_a_checkpoint_on_s3_survives_the_garbage_collector(spark, s3_endpoint, tmp_path):
    """Spark's own checkpoint file manager reads S3 through a FileContext, whose S3A binding closes its file system
    when it is finalized: a read still under way then fails ("Connection pool shut down", "Client manager is
    closed"), at random in a long run. The product's manager (sessions.CheckpointFiles, every session's
    spark.sql.streaming.checkpointFileManagerClass) reads S3 through Hadoop's cached file system, and keeps Spark's
    choice elsewhere."""
    import gc

    from py4j.protocol import Py4JJavaError

    s3a_session(spark, s3_endpoint)
    bucket = _s3_bucket(s3_endpoint, "checkpoint-files")
    jvm = spark.sparkContext._jvm
    hadoop = spark._jsparkSession.sessionState().newHadoopConf()  # the conf Spark's streaming code reads
    create = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.create
    Path = jvm.org.apache.hadoop.fs.Path
    assert create(Path(f"s3a://{bucket}/a"), hadoop).delegate().getClass().getSuperclass().getSimpleName() == \
        "FileSystemBasedCheckpointFileManager"
    assert create(Path(f"file://{tmp_path}/a"), hadoop).delegate().getClass().getSimpleName() == \
        "FileContextBasedCheckpointFileManager"

    # A stream of the product's manager, the manager let go of and collected: the stream reads on.
    path = Path(f"s3a://{bucket}/{tmp_path.name}/1")
    data = b"state" * 800_000  # 4 MB: past what one GET reads ahead
    manager = create(path.getParent(), hadoop)
    out = manager.createAtomic(path, True)
    out.write(bytearray(data))
    out.close()
    stream = manager.open(path)
    assert stream.read() == data[0]  # the first GET
    del manager, out
    gc.collect()  # py4j drops the JVM's reference of a collected proxy
    for _ in range(3):  # an object with a finalizer is freed by the collection after the one that found it
        jvm.java.lang.System.gc()
        jvm.java.lang.System.runFinalization()
    stream.seek(3_000_000)  # a new GET
    assert bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream)) == data[3_000_000:]
    stream.close()

    # An overwrite overwrites (a batch run again writes its state file again): S3A's own rename refuses an existing
    # destination, and Spark's FileSystem-based manager would keep the old file without a word.
    manager = create(path.getParent(), hadoop)
    again = Path(f"s3a://{bucket}/{tmp_path.name}/2")
    for content in (b"first", b"again"):
        out = manager.createAtomic(again, True)
        out.write(bytearray(content))
        out.close()
    stream = manager.open(again)
    assert bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream)) == b"again"
    stream.close()
    assert sorted(status.getPath().getName() for status in manager.list(path.getParent())) == ["1", "2"]  # no temp

    # Why: a stream opened through S3A's FileContext binding, the binding finalized (called here rather than left to
    # a collection's timing). A Hadoop without this finalizer fails here, and the manager can go back to Spark's.
    binding = jvm.org.apache.hadoop.fs.AbstractFileSystem.get(path.toUri(), hadoop)
    stream = binding.open(path)
    finalize = jvm.java.lang.Class.forName("org.apache.hadoop.fs.s3a.S3A").getDeclaredMethod("finalize", None)
    finalize.setAccessible(True)
    finalize.invoke(binding, None)
    with pytest.raises(Py4JJavaError, match="closed|shut down"):
        stream.seek(3_000_000)
        stream.read()


def _hdfs_env(hdfs, name: str) -> dict[str, str]:
    """The checkpoint on HDFS, and with it the leases (no SESSIONS_LEASE_URI: `_leases` beside the checkpoint)."""
    return {"SESSIONS_CHECKPOINT_URI": f"{hdfs.uri}/jobs/{name}",
            "SESSIONS_WEBHDFS_ADDRESS": hdfs.webhdfs.removeprefix("http://")}


def _hdfs_config(tmp_path, hdfs, provider: str, name: str):
    config = make_config(tmp_path, provider, **_hdfs_env(hdfs, name))
    assert config.lease_uri == f"{hdfs.uri}/jobs/{name}/_leases"
    return config


@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_checkpoint_on_hdfs_every_lifecycle_operation_exactly_once(spark, hdfs, tmp_path, provider):
    from pipelines.job.stream import catch_up
    from state_store.kernel import replaced_checkpoints
    from state_store.lifecycle import restore, take_savepoint
    from state_store.maintenance import compact
    from state_store.rescale import rescale
    from state_store.status import status

    config = _hdfs_config(tmp_path, hdfs, provider, f"lifecycle-{provider}")
    assert isinstance(config.checkpoint, RemotePath) and str(config.checkpoint).startswith("hdfs://127.0.0.1:")
    batches = stream_scenario(8, 7, False, GAP_MS, LATENESS_MS)

    land_batches(config, batches[:3])
    catch_up(config, spark)
    native = provider == "rocksdb"  # RocksDB's savepoint keeps a native copy: its restore copies it back from HDFS
    saved = take_savepoint(config, spark=spark, native_copy=native)
    land_batches(config, batches[3:5], start=3)
    catch_up(config, spark)
    assert rescale(config, 3, spark=spark).partitions_after == 3
    hdfs.restart_namenode()  # between two runs: the next one finds its checkpoint as it was
    land_batches(config, batches[5:], start=5)
    catch_up(config, spark)
    _assert_exactly_once(config, batches)
    assert inspect_checkpoint(config.checkpoint).partitions == 3

    restored = restore(config, saved.savepoint_id, spark=spark)
    assert restored.verified and restored.rows == saved.rows
    assert restored.method == ("native" if native else "canonical")
    assert restored.previous_checkpoint and restored.previous_checkpoint.startswith(f"{config.checkpoint}.replaced-")
    catch_up(config, spark)  # the replay after the savepoint, exactly once again
    _assert_exactly_once(config, batches)
    report = status(config, spark=spark, with_state=True)
    assert report.last_committed_batch == inspect_checkpoint(config.checkpoint).last_committed_batch
    assert report.state_files and report.state_files > 0  # counted on HDFS through WebHDFS

    assert [p.name for p in replaced_checkpoints(config)]  # the set-aside checkpoint, on HDFS
    compact(config)
    assert replaced_checkpoints(config) == []  # removed from HDFS by compaction


@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_sessionctl_catch_up_keeps_its_leases_beside_an_hdfs_checkpoint(hdfs, tmp_path, provider):
    """`sessionctl catch-up` with the checkpoint on HDFS and no SESSIONS_LEASE_URI: the job and ingest leases live in
    `_leases` beside the checkpoint, on HDFS (pipelines.coordination.lease_stores.HdfsStore), and are released at its
    end; the sessions are the oracle's, each once."""
    from pipelines.coordination.lease_stores import HdfsStore, store_for
    from pipelines.coordination.leases import LeaseInfo, live_holder

    env = _hdfs_env(hdfs, f"catch-up-{provider}-{tmp_path.name}")
    config = _hdfs_config(tmp_path, hdfs, provider, f"catch-up-{provider}-{tmp_path.name}")
    batches = stream_scenario(4, 3, False, GAP_MS, LATENESS_MS)
    land_batches(config, batches)
    caught_up = _sessionctl(config, "catch-up", env=env)
    assert caught_up["batches"] == len(batches) + 1 and caught_up["lease_epoch"] == 1
    _assert_exactly_once(config, batches)
    store = store_for(config.lease_uri)
    assert isinstance(store, HdfsStore)
    records = sorted(store.names(""))  # one job lease epoch; an ingest lease epoch per ingest
    assert records[-1] == "job.lease.epoch-000000000001" and records[0] == "ingest.lease.epoch-000000000001", records
    for record_name in (records[-1], records[-2]):  # the newest of each
        record = store.read(record_name)
        info = LeaseInfo.parse(record.data) if record else None
        assert info is not None and info.released and info.what in ("catch-up", "ingest"), info
    assert live_holder(config.lease_uri, "job") is None and live_holder(config.lease_uri, "ingest") is None
    report = _sessionctl(config, "status", "--no-state", "--json", env=env)
    assert report["last_committed_batch"] == caught_up["last_committed_batch"] == len(batches)


def test_checkpoint_on_hdfs_rides_out_a_datanode_restart(spark, hdfs, tmp_path):
    from pipelines.job.stream import catch_up

    config = _hdfs_config(tmp_path, hdfs, "rocksdb", "datanode")
    batches = stream_scenario(9, 4, False, GAP_MS, LATENESS_MS)
    land_batches(config, batches[:2])
    catch_up(config, spark)
    hdfs.stop_datanode(0)
    hdfs.restart_datanode(0)
    land_batches(config, batches[2:], start=2)
    catch_up(config, spark)
    _assert_exactly_once(config, batches)


@pytest.mark.tier("pure")
def test_an_hdfs_checkpoint_keeps_its_leases_beside_it_on_hdfs(tmp_path):
    from pipelines.coordination.lease_stores import HdfsStore, store_for
    from pipelines.errors import ConfigError

    config = make_config(tmp_path, SESSIONS_CHECKPOINT_URI="hdfs://nn:8020/x")
    assert config.lease_uri == "hdfs://nn:8020/x/_leases" and isinstance(store_for(config.lease_uri), HdfsStore)
    assert store_for(config.lease_dir).where("job.lease") == "hdfs://nn:8020/x/_leases/job.lease"  # Path() ate a slash
    # SESSIONS_LEASE_URI still decides: a shared path, or another HDFS directory.
    assert make_config(tmp_path, SESSIONS_CHECKPOINT_URI="hdfs://nn:8020/x",
                       SESSIONS_LEASE_URI=str(tmp_path / "leases")).lease_uri == str(tmp_path / "leases")
    assert make_config(tmp_path, SESSIONS_LEASE_URI="hdfs://nn:8020/l/").lease_uri == "hdfs://nn:8020/l"
    with pytest.raises(ConfigError, match="expected hdfs://namenode:port/path"):
        make_config(tmp_path, SESSIONS_CHECKPOINT_URI="hdfs:///x", SESSIONS_LEASE_URI=str(tmp_path))


def test_a_running_stream_rides_out_a_namenode_restart_and_a_datanode_outage(hdfs, tmp_path):
    """`sessionctl run` with its checkpoint on HDFS: the NameNode restarts between two landed files while the stream
    runs (Hadoop's client retries its calls, pipelines.job.runtime); then the only DataNode goes down, the stream's
    next batch cannot write its offset log, and `run` says so in one line and waits, restarting the query from its
    checkpoint until the DataNode is back (as it does for S3). Ctrl-C stops it with exit 0. The sessions: the oracle's,
    each once."""
    import signal

    from pipelines.core.sample_data import land
    from pipelines.ingest import latest_ingest_seq
    from pipelines.storage import table_exists
    from testkit.lifecycle_expectations import expected_closed_sessions
    from tests.kit.datagen import in_order_chunks
    from tests.kit.waits import still_running, stream_caught_up, wait_until

    def ingested(config) -> int:  # landed files ingested so far (one ingest commit each)
        return latest_ingest_seq(config.raw_events_table) if table_exists(config, config.raw_events_table) else 0

    # The leases on a local path: with them on this HDFS, a DataNode outage longer than the lease TTL would (rightly)
    # fence the stream, which could renew its lease nowhere.
    env = {"SESSIONS_CHECKPOINT_URI": f"{hdfs.uri}/running", "SESSIONS_LEASE_URI": str(tmp_path / "leases"),
           "SESSIONS_WEBHDFS_ADDRESS": hdfs.webhdfs.removeprefix("http://")}
    config = make_config(tmp_path, "rocksdb", **env)
    chunks = in_order_chunks(40, seed=5, parts=3)
    log = tmp_path / "run.err"
    with open(log, "w") as err:
        run = subprocess.Popen([str(SESSIONCTL), "run", "--poll-seconds", "1"], env=config_env(config, **env),
                               stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        for i, chunk in enumerate(chunks):
            land(config.landing, f"part-{i:04d}.jsonl", [json.dumps(e) for e in chunk])
            wait_until(lambda n=i + 1: still_running(run, log) and ingested(config) == n and stream_caught_up(config),
                       timeout_s=240, what=f"the stream to take part {i}")
            if i == 0:
                hdfs.restart_namenode()  # the stream is running: its next batch meets the restarted NameNode
            if i == 1:  # the only DataNode down while the stream runs: no write can succeed until it is back
                hdfs.stop_datanode(0)
                land(config.landing, "part-0002.jsonl", [json.dumps(e) for e in chunks[2]])
                wait_until(lambda: ingested(config) == 3, timeout_s=120, what="the ingest of part 2")
                wait_until(lambda: "no DataNode to write to" in log.read_text(), timeout_s=120,
                           what="the stream to meet the DataNode's absence")
                assert still_running(run, log)  # it waits for HDFS, as for S3 (pipelines.job.run_retries)
                hdfs.restart_datanode(0)
                break
        wait_until(lambda: still_running(run, log) and stream_caught_up(config), timeout_s=240, what="after the DataNode")
        assert read_sessions(config) == expected_closed_sessions(chunks, GAP_MS, LATENESS_MS)
    finally:
        run.send_signal(signal.SIGINT)
        out, _ = run.communicate(timeout=120)
    assert run.returncode == 0, log.read_text()[-3000:]
