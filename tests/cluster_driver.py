"""The library's lifecycle on a standalone cluster, in ONE driver JVM (tests/test_cluster.py runs it as a process
with SESSIONS_SPARK_MASTER set): catch-up -> savepoint -> more -> restore -> rescale -> catch-up. The CLI's own
path on the cluster is `sessionctl run` and `compact`, which the test runs itself; one application here instead of
six saves five driver and executor start-ups.

argv: a JSON file {"bucket": ..., "prefix": ..., "parts": [[line, ...], ...]} -- parts 0..3 are landed (an S3 put
is atomic: the object appears complete, the contract's rename-in) at the points of the sequence; prints one JSON
line with each step's result."""
from __future__ import annotations

import json
import sys
import time

import boto3

from pipelines.config import SessionsConfig
from pipelines.job.runtime import get_spark, stop_spark
from pipelines.job.stream import catch_up
from state_store.lifecycle import restore, take_savepoint
from state_store.rescale import rescale


def main(spec_path: str) -> None:
    spec = json.loads(open(spec_path).read())
    s3 = boto3.client("s3")

    def land(i: int) -> None:
        body = "".join(line + "\n" for line in spec["parts"][i]).encode()
        s3.put_object(Bucket=spec["bucket"], Key=f"{spec['prefix']}/landing/part-{i:04d}.jsonl", Body=body)

    seconds: dict[str, float] = {}  # where the driver's time went, step by step (reported, not checked)
    began = time.monotonic()

    def timed(step: str) -> None:
        nonlocal began
        seconds[step] = round(time.monotonic() - began, 1)
        began = time.monotonic()

    config = SessionsConfig.from_env()
    spark = get_spark(config)
    timed("spark")
    try:
        land(0)
        land(1)
        catch_up(config, spark)
        timed("catch-up 1")
        saved = take_savepoint(config, spark=spark)
        timed("savepoint")
        land(2)
        catch_up(config, spark)  # its sessions are rolled back by the restore and written again after it
        timed("catch-up 2")
        restored = restore(config, "latest", spark=spark)
        timed("restore")
        rescaled = rescale(config, 3, spark=spark)
        timed("rescale")
        land(3)
        catch_up(config, spark)
        timed("catch-up 3")
        print(json.dumps({"savepoint": saved.to_dict(catalog=True), "restore": restored.to_dict(),
                          "rescale": rescaled.to_dict(), "seconds": seconds}, default=str))
    finally:
        stop_spark(spark)


if __name__ == "__main__":
    main(sys.argv[1])
