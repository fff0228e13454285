"""Where things are stored: URIs (a local path or s3://bucket/prefix) and delta-rs options for them."""
from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs
from botocore.exceptions import BotoCoreError, ClientError
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import DeltaError

from pipelines.arrow_types import plain_field
from pipelines.config import SessionsConfig
from pipelines.errors import StorageUnavailable
from pipelines.locations import S3_LIMITS, RemotePath, s3_filesystem

__all__ = ["S3_ADVICE", "filesystem", "is_object_store_failure", "is_s3", "join", "object_store_errors", "open_table", "read_rows", "s3_endpoint", "s3_errors", "s3_failure", "s3_filesystem", "s3_limits", "s3_options", "seconds", "sql_literal", "storage_options", "table_exists"]


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *parts])


def storage_options(config: SessionsConfig, uri: str) -> dict[str, str] | None:
    """delta-rs/object_store options for an S3 URI: credentials and endpoint from the standard AWS_*
    variables (never logged), timeouts from the configuration; None for a local path."""
    return s3_options(uri, max_retries=config.s3_max_retries, retry_timeout=config.s3_retry_timeout, timeout=config.s3_timeout)


def aws_env() -> dict[str, str]:
    """This process's standard AWS_* variables (credentials, region, endpoint): what delta-rs, boto3 and Spark's
    Python workers are given for S3."""
    return {k: v for k, v in os.environ.items() if k.startswith("AWS_") and v}


def s3_options(uri: str, *, max_retries: int = 3, retry_timeout: str = "15s",
               timeout: str = "30s") -> dict[str, str] | None:
    """storage_options without a configuration at hand: default timeouts (storage_options passes the configured)."""
    if not is_s3(uri):
        return None
    options = aws_env()
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


@contextmanager
def s3_limits(config: SessionsConfig) -> Iterator[None]:
    """pyarrow S3 filesystems made in the block wait at most SESSIONS_S3_TIMEOUT per request and retry
    SESSIONS_S3_MAX_RETRIES times, as delta-rs's requests do (storage_options): a landing bucket that stopped
    answering fails an ingest in ~timeout x (retries + 1), not in pyarrow's 90 s."""
    token = S3_LIMITS.set((seconds(config.s3_timeout), config.s3_max_retries + 1))
    try:
        yield
    finally:
        S3_LIMITS.reset(token)


def seconds(duration: str) -> float:
    """An object_store duration ("30s", "500ms", "2min", "1h"; a bare number is seconds) in seconds; 30 for one it
    does not read (object_store reads more forms)."""
    text = duration.strip().lower()
    try:
        for suffix, factor in (("ms", 0.001), ("min", 60.0), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
            if text.endswith(suffix):
                return float(text[: -len(suffix)]) * factor
        return float(text)
    except ValueError:
        return 30.0


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path in it) for a local path, file:// URI, s3://bucket/key, or a checkpoint's s3a:// or hdfs://
    (pipelines.locations: WebHDFS)."""
    if is_s3(uri) or uri.startswith("s3a://"):
        return s3_filesystem(), uri.partition("://")[2]
    if uri.startswith("hdfs://"):
        remote = RemotePath(uri)
        return pafs.PyFileSystem(pafs.FSSpecHandler(remote.fs)), remote.key
    return pafs.LocalFileSystem(), uri.removeprefix("file://")


def table_exists(config: SessionsConfig, uri: str) -> bool:
    return bool(DeltaTable.is_deltatable(uri, storage_options=storage_options(config, uri)))


def open_table(config: SessionsConfig, uri: str) -> DeltaTable:
    return DeltaTable(uri, storage_options=storage_options(config, uri))


def sql_literal(text: str) -> str:
    """A string as a SQL literal, for delta-rs predicates and queries."""
    return "'" + text.replace("'", "''") + "'"


def read_rows(table: DeltaTable, *, columns: Sequence[str] | None = None, where: str | None = None) -> pa.Table:
    """A Delta table's rows (`columns`, those matching the SQL predicate `where`), read by delta-rs itself, in Rust,
    and cast to the table's own Arrow types (DataFusion reads strings as string_view).

    Not `to_pyarrow_table` / `to_pyarrow_dataset`: they scan a pyarrow dataset over a Python filesystem, and an Arrow
    pool thread may still be releasing that filesystem's Python handler when the interpreter exits, which aborts the
    process after its work is done (`terminate called without an active exception`, exit 134; delta-io/delta-rs#2184,
    apache/arrow#36389)."""
    schema = pa.schema(table.schema().to_arrow())
    names = list(columns) if columns is not None else schema.names
    select = ", ".join('"' + name.replace('"', '""') + '"' for name in names)
    query = f"SELECT {select} FROM rows" + (f" WHERE {where}" if where else "")
    # The result's Arrow stream, read straight into pyarrow: `pa.table()` of it would first ask whether it is a pandas
    # DataFrame, which imports pandas (about half of `sessionctl savepoints`' CPU, tests/test_clean_exit.py).
    read = pa.RecordBatchReader.from_stream(QueryBuilder().register("rows", table).execute(query)).read_all()
    return read.select(names).cast(pa.schema([plain_field(schema.field(name)) for name in names]))


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


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _cause(error: BaseException | str) -> str:
    text = " ".join(_ANSI.sub("", str(error)).split())
    for needle, said in (("Connection refused", "connection refused"), ("tcp connect error", "connection refused"),
                         ("Could not connect to server", "connection refused"), ("timed out", "timed out"),
                         ("Timeout was reached", "timed out"), ("error sending request", "no answer"),
                         ("InvalidAccessKeyId", "invalid access key"), ("SignatureDoesNotMatch", "wrong secret key"),
                         ("NoSuchBucket", "no such bucket"), ("AccessDenied", "access denied"),
                         ("SlowDown", "slow down (throttled)"), ("ServiceUnavailable", "service unavailable"),
                         ("InternalError", "internal error")):
        if needle in text:
            return said
    name = type(error).__name__ if isinstance(error, BaseException) else "error"
    return f"{name}: {text[:200]}"


S3_ADVICE = ": check the endpoint and the AWS_* credentials, then run the command again"


def s3_failure(error: BaseException | str, uri: str, advice: str = S3_ADVICE) -> StorageUnavailable:
    """The one line of an object store failure on `uri`: endpoint, URI, cause (and what to do)."""
    return StorageUnavailable(f"S3 at {s3_endpoint()} failed for {uri} ({_cause(error)}){advice}")


@contextmanager
def s3_errors(uri: str, probe: bool = True) -> Iterator[None]:
    """Turn an object store failure on `uri` into StorageUnavailable (one line: endpoint, URI, cause, what to do).
    `probe`: first fail in a second when the endpoint refuses connections (once per operation is enough)."""
    if not is_s3(uri):
        yield
        return
    if probe:
        _probe(uri)
    try:
        yield
    except (OSError, DeltaError, BotoCoreError, ClientError) as error:
        raise s3_failure(error, uri) from None


# What an S3 client's failure says, in whichever process it happened (the driver; or a Spark Python worker, whose
# traceback reaches the query's failure as text): delta-rs/object_store's, pyarrow's (the AWS SDK's), botocore's,
# Hadoop's S3A (the stream's source on an S3 warehouse, a checkpoint on S3) and the AWS SDK under it, and this
# module's own StorageUnavailable line.
_OBJECT_STORE_MARKERS = ("Generic S3 error", "AWS Error", "curlCode", "EndpointConnectionError",
                         "Could not connect to the endpoint URL", "StorageUnavailable",
                         "org.apache.hadoop.fs.s3a.AWS", "SdkClientException", "ApiCallTimeoutException",
                         "ApiCallAttemptTimeoutException")


def is_object_store_failure(error: BaseException | str) -> bool:
    """Whether `error` (or a failure's text) is an S3 client's failure -- the endpoint did not answer, refused or
    throttled -- rather than one of the data or the program: the run loop rides those out (pipelines.job.stream)."""
    if isinstance(error, (StorageUnavailable, BotoCoreError, ClientError)):
        return True
    text = str(error)
    return any(marker in text for marker in _OBJECT_STORE_MARKERS) or (
        f"S3 at {s3_endpoint()} failed for" in text)


@contextmanager
def object_store_errors(uri: str) -> Iterator[None]:
    """Like s3_errors, narrower: only what is_object_store_failure recognises becomes StorageUnavailable (for code
    that also reads local files, whose errors stay what they are). Nothing for a local `uri`."""
    if not is_s3(uri):
        yield
        return
    try:
        yield
    except StorageUnavailable:
        raise
    except Exception as error:
        if is_object_store_failure(error):
            raise s3_failure(error, uri) from None
        raise
