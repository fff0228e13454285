"""Where things are stored: URIs (a local path or s3://bucket/prefix) and delta-rs options for them."""
from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlparse

import pyarrow.fs as pafs
from botocore.exceptions import BotoCoreError, ClientError
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from pipelines.config import SessionsConfig
from pipelines.errors import StorageUnavailable


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *parts])


def storage_options(config: SessionsConfig, uri: str) -> dict[str, str] | None:
    """delta-rs/object_store options for an S3 URI: credentials and endpoint from the standard AWS_*
    variables (never logged), timeouts from the configuration; None for a local path."""
    return s3_options(uri, config.s3_max_retries, config.s3_retry_timeout, config.s3_timeout)


def s3_options(uri: str, max_retries: int = 3, retry_timeout: str = "15s",
               timeout: str = "30s") -> dict[str, str] | None:
    """storage_options without a configuration at hand (the stream source, in Spark): default timeouts."""
    if not is_s3(uri):
        return None
    options = {k: v for k, v in os.environ.items() if k.startswith("AWS_") and v}
    if options.get("AWS_ENDPOINT_URL", "").startswith("http://"):
        options.setdefault("AWS_ALLOW_HTTP", "true")
    options.setdefault("AWS_CONDITIONAL_PUT", "etag")  # safe concurrent commits on S3
    options.setdefault("AWS_REGION", os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
    options.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # else delta-rs probes instance metadata
    options.setdefault("max_retries", str(max_retries))
    options.setdefault("retry_timeout", retry_timeout)
    options.setdefault("connect_timeout", "5s")
    options.setdefault("timeout", timeout)
    return options


def s3_filesystem() -> pafs.S3FileSystem:
    """pyarrow's S3 filesystem from this process's standard AWS_* variables (driver or executor alike: executors
    get them through spark.executorEnv, see pipelines.shipping)."""
    env = os.environ
    endpoint = env.get("AWS_ENDPOINT_URL", "")
    scheme, _, host = endpoint.partition("://") if "://" in endpoint else ("https", "", endpoint)
    return pafs.S3FileSystem(
        access_key=env.get("AWS_ACCESS_KEY_ID"), secret_key=env.get("AWS_SECRET_ACCESS_KEY"),
        session_token=env.get("AWS_SESSION_TOKEN"),
        region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
        endpoint_override=host or None, scheme=scheme, connect_timeout=5, request_timeout=30)


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path in it) for a local path, file:// URI or s3://bucket/key."""
    if is_s3(uri):
        return s3_filesystem(), uri[len("s3://"):]
    return pafs.LocalFileSystem(), uri.removeprefix("file://")


def table_exists(config: SessionsConfig, uri: str) -> bool:
    return bool(DeltaTable.is_deltatable(uri, storage_options=storage_options(config, uri)))


def open_table(config: SessionsConfig, uri: str) -> DeltaTable:
    return DeltaTable(uri, storage_options=storage_options(config, uri))


def s3_endpoint() -> str:
    """The S3 endpoint this process talks to, for every s3:// URI alike (AWS_ENDPOINT_URL, else AWS's own)."""
    return os.environ.get("AWS_ENDPOINT_URL") or "the AWS S3 endpoint"


def _probe(uri: str) -> None:
    """Fail in a second, not after the client's retries, when the S3 endpoint refuses connections."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if not is_s3(uri) or not endpoint:
        return
    parsed = urlparse(endpoint)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname or "localhost", port), timeout=3).close()
    except OSError as error:
        raise StorageUnavailable(f"S3 endpoint {endpoint} is unreachable for {uri} "
                                 f"({error.strerror or type(error).__name__}): start it or fix AWS_ENDPOINT_URL, "
                                 "then run the command again") from None


def _cause(error: BaseException) -> str:
    text = " ".join(str(error).split())
    for needle, said in (("Connection refused", "connection refused"), ("timed out", "timed out"),
                         ("error sending request", "no answer"), ("InvalidAccessKeyId", "invalid access key"),
                         ("SignatureDoesNotMatch", "wrong secret key"), ("NoSuchBucket", "no such bucket")):
        if needle in text:
            return said
    return f"{type(error).__name__}: {text[:200]}"


@contextmanager
def s3_errors(uri: str) -> Iterator[None]:
    """Turn an object store failure on `uri` into StorageUnavailable (one line: endpoint, URI, cause, what to do)."""
    if not is_s3(uri):
        yield
        return
    _probe(uri)
    try:
        yield
    except (OSError, DeltaError, BotoCoreError, ClientError) as error:
        raise StorageUnavailable(f"S3 at {s3_endpoint()} failed for {uri} ({_cause(error)}): check the endpoint "
                                 "and the AWS_* credentials, then run the command again") from None
