"""Where things are stored: URIs (a local path or s3://bucket/prefix) and delta-rs options for them."""
from __future__ import annotations

import os

from pipelines.config import SessionsConfig


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *parts])


def storage_options(config: SessionsConfig, uri: str) -> dict[str, str] | None:
    """delta-rs/object_store options for an S3 URI: credentials and endpoint from the standard AWS_*
    variables (never logged), timeouts from the configuration; None for a local path."""
    if not is_s3(uri):
        return None
    options = {k: v for k, v in os.environ.items() if k.startswith("AWS_") and v}
    if options.get("AWS_ENDPOINT_URL", "").startswith("http://"):
        options.setdefault("AWS_ALLOW_HTTP", "true")
    options.setdefault("AWS_CONDITIONAL_PUT", "etag")  # safe concurrent commits on S3
    options.setdefault("AWS_REGION", os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
    options.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # else delta-rs probes instance metadata
    options.setdefault("max_retries", str(config.s3_max_retries))
    options.setdefault("retry_timeout", config.s3_retry_timeout)
    options.setdefault("connect_timeout", "5s")
    options.setdefault("timeout", config.s3_timeout)
    return options
