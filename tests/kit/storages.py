"""Where a test's Spark checkpoint lives (`STORAGES`, `checkpoint_env`) and the suite's Spark session pointed at the
S3 endpoint (`s3a_session`)."""
from __future__ import annotations

import pytest

# Where the Spark checkpoint lives: a local path; the real HDFS (tests/hdfs_cluster.py: the state store's files and
# logs written through Hadoop's HDFS client, the driver's reads through WebHDFS); S3 (Hadoop's S3A against the
# suite's S3 endpoint, the driver's reads through pyarrow).
STORAGES = ["local", pytest.param("hdfs", marks=pytest.mark.tier("e2e")), pytest.param("s3", marks=pytest.mark.tier("e2e"))]


def checkpoint_env(request, spark, storage: str, tmp_path) -> dict[str, str]:
    """The settings that put the checkpoint on `storage` (none for a local path). A remote checkpoint's state store
    providers are unloaded from the shared session when the test ends: left loaded, their maintenance thread goes on
    uploading to HDFS or S3 after the test, and one caught in a later test's injected outage (a SIGSTOPped endpoint)
    held a restore's unload of the state stores (Spark waits up to its maintenance shutdown timeout, 300 s)."""
    if storage != "local":
        from pipelines.job.runtime import stop_state_stores

        request.addfinalizer(lambda: stop_state_stores(spark))
    if storage == "hdfs":  # the leases beside the checkpoint, on HDFS (no SESSIONS_LEASE_URI)
        hdfs = request.getfixturevalue("hdfs")
        return {"SESSIONS_CHECKPOINT_URI": f"{hdfs.uri}/oracle/{tmp_path.name}",
                "SESSIONS_WEBHDFS_ADDRESS": hdfs.webhdfs.removeprefix("http://")}
    if storage == "s3":
        import boto3

        s3_endpoint = request.getfixturevalue("s3_endpoint")
        s3a_session(spark, s3_endpoint)
        client = boto3.client("s3", endpoint_url=s3_endpoint["env"]["AWS_ENDPOINT_URL"])
        if "oracle" not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
            client.create_bucket(Bucket="oracle")
        return {"SESSIONS_CHECKPOINT_URI": f"s3a://oracle/{tmp_path.name}"}  # the endpoint: the fixture's AWS_* variables
    return {}


def s3a_session(spark, s3_endpoint) -> None:
    """The suite's shared session (its JVM started before the S3 endpoint) pointed at it: what spark_conf sets from
    the AWS_* variables for a JVM started with them (pipelines.job.runtime.s3a_conf), plus the credentials S3A
    would read from that JVM's environment."""
    import pytest

    from pipelines.job.runtime import s3a_conf

    hadoop = spark.sparkContext._jsc.hadoopConfiguration()  # noqa: SLF001
    env = s3_endpoint["env"]
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        conf = s3a_conf()
    for key, value in {**conf, "spark.hadoop.fs.s3a.access.key": env["AWS_ACCESS_KEY_ID"],
                       "spark.hadoop.fs.s3a.secret.key": env["AWS_SECRET_ACCESS_KEY"]}.items():
        hadoop.set(key.removeprefix("spark.hadoop."), value)
