"""Landing and tables on S3 (the real moto endpoint), without Spark: ingest reads S3 objects into raw_events
on S3 and archives them; a crash between the archive's copy and its delete neither loses nor doubles a file."""
from __future__ import annotations

import json

import boto3
import pyarrow.fs as pafs
import pytest

from pipelines.ingest import ingest
from pipelines.ingest import s3 as ingest_s3
from pipelines.storage import open_table
from tests.kit.homes import make_config
from tests.kit.waits import wait_until

pytestmark = pytest.mark.tier("e2e")


def _put(client, key: str, lines: list[str]) -> None:
    client.put_object(Bucket="warehouse", Key=key, Body="".join(line + "\n" for line in lines).encode())


def test_s3_landing_is_ingested_once_even_when_the_archive_is_interrupted(tmp_path, s3_endpoint, monkeypatch):
    prefix = f"{tmp_path.name}"
    config = make_config(tmp_path, SESSIONS_WAREHOUSE_URI=f"s3://warehouse/{prefix}/tables",
                         SESSIONS_LANDING_URI=f"s3://warehouse/{prefix}/landing")
    client = boto3.client("s3", endpoint_url=s3_endpoint["env"]["AWS_ENDPOINT_URL"])
    event = {"user_id": "u1", "event_time": "2026-11-01T10:00:00Z", "event_type": "page_view", "page": "/"}
    files = {f"f{i}.jsonl": [json.dumps({**event, "event_id": f"e{i}-{n}"}) for n in range(3)] + ["not json"]
             for i in range(3)}
    for name, lines in files.items():
        _put(client, f"{prefix}/landing/{name}", lines)

    real_filesystem = ingest_s3.filesystem

    class DiesBeforeTheDelete:
        """The real S3 filesystem, except that the process 'dies' at the first delete (after the copy)."""

        def __init__(self, fs: pafs.FileSystem) -> None:
            self.fs = fs

        def __getattr__(self, name: str):
            return getattr(self.fs, name)

        def delete_file(self, path: str) -> None:
            raise KeyboardInterrupt(f"killed between the copy and the delete of {path}")

    monkeypatch.setattr(ingest_s3, "filesystem",
                        lambda uri: (lambda fs, path: (DiesBeforeTheDelete(fs), path))(*real_filesystem(uri)))
    with pytest.raises(KeyboardInterrupt):
        ingest(config, files_per_commit=1)
    monkeypatch.setattr(ingest_s3, "filesystem", real_filesystem)
    result = ingest(config, files_per_commit=1)
    assert result.files == 2  # the interrupted file was already committed: only archived now

    raw = open_table(config, config.raw_events_table).to_pyarrow_table()
    assert raw.num_rows == sum(len(lines) for lines in files.values())
    got = sorted(zip(raw["source_file"].to_pylist(), raw["line_no"].to_pylist()))
    assert got == sorted((name, n) for name, lines in files.items() for n in range(1, len(lines) + 1))
    assert raw["reject_reason"].to_pylist().count("malformed_json") == len(files)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="warehouse", Prefix=f"{prefix}/landing/")["Contents"]
            if not o["Key"].endswith("/")]
    assert all("/_ingested/" in key for key in keys)
    assert sorted(key.rsplit("/", 1)[1] for key in keys) == sorted(files)  # archived once each, none twice


def test_s3_object_put_again_under_the_same_name_and_size_is_ingested(tmp_path, s3_endpoint):
    """A producer that re-puts `batch.jsonl` with new lines of the same length: a new object (new LastModified),
    not the one already ingested -- its lines must reach raw_events, not be archived unread."""
    prefix = f"{tmp_path.name}"
    config = make_config(tmp_path, SESSIONS_WAREHOUSE_URI=f"s3://warehouse/{prefix}/tables",
                         SESSIONS_LANDING_URI=f"s3://warehouse/{prefix}/landing")
    client = boto3.client("s3", endpoint_url=s3_endpoint["env"]["AWS_ENDPOINT_URL"])
    event = {"user_id": "u1", "event_time": "2026-11-01T10:00:00Z", "event_type": "page_view", "page": "/"}
    first = [json.dumps({**event, "event_id": "a1"})]
    second = [json.dumps({**event, "event_id": "b1"})]  # same length as the first
    assert len(first[0]) == len(second[0])
    key = f"{prefix}/landing/batch.jsonl"
    _put(client, key, first)
    put_at = client.head_object(Bucket="warehouse", Key=key)["LastModified"]
    assert ingest(config).rows == 1

    def put_again() -> bool:  # S3's LastModified has whole seconds: put until it is a later one than the first's
        _put(client, key, second)
        return client.head_object(Bucket="warehouse", Key=key)["LastModified"] > put_at

    wait_until(put_again, timeout_s=30, interval_s=0.2, what="a re-put with a later LastModified")
    assert ingest(config).rows == 1
    raw = open_table(config, config.raw_events_table).to_pyarrow_table()
    assert sorted(raw["event_id"].to_pylist()) == ["a1", "b1"]
    archived = sorted(client.get_object(Bucket="warehouse", Key=o["Key"])["Body"].read().decode()
                      for o in client.list_objects_v2(Bucket="warehouse", Prefix=f"{prefix}/landing/_ingested/")
                      ["Contents"] if not o["Key"].endswith("/"))
    assert archived == sorted(line + "\n" for line in first + second)  # both archived, neither overwritten
