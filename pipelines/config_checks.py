"""How a setting's text becomes a value, and the checks a value needs beyond its kind and bounds (locations, the
Spark master, the driver's memory, durations). Every refusal is a ConfigError naming the variable, in one line.

Apart from pipelines/config.py, which declares the settings themselves -- each once: variable, default, description
-- so that module stays the list of settings, and these readers and checks are the same for every setting."""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path

from pipelines.errors import ConfigError

__all__ = ["MAX_FLOAT", "MAX_INT", "check_directories", "check_driver_memory", "check_duration", "check_spark_master",
           "check_uri", "positive_seconds", "read_bool", "read_float", "read_int", "resolved_lease_uri"]

# Upper bounds of every number setting unless it declares its own: a Java int (several go to Spark as one), and for
# seconds, minutes and hours a billion (a wait of that many seconds still fits Python's thread timeouts).
MAX_INT = 2**31 - 1
MAX_FLOAT = 1e9


def read_int(env: Mapping[str, str], name: str, default: int | None, minimum: float = 1,
             maximum: float = MAX_INT) -> int | None:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be >= {minimum:g}")
    if value > maximum:
        raise ConfigError(f"{name}={value} must be <= {int(maximum)}")
    return value


def read_float(env: Mapping[str, str], name: str, default: float | None, minimum: float = 0,
               inclusive: bool = False, maximum: float = MAX_FLOAT) -> float | None:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"{name}={raw!r} is not a finite number")
    if value < minimum or (value == minimum and not inclusive):
        raise ConfigError(f"{name}={raw} must be {'>=' if inclusive else '>'} {minimum:g}")
    if value > maximum:
        raise ConfigError(f"{name}={raw} must be <= {maximum:g}")
    return value


def read_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw not in ("true", "false", "1", "0", "yes", "no"):
        raise ConfigError(f"{name}={raw!r}: expected true or false")
    return raw in ("true", "1", "yes")


def positive_seconds(value: object, label: str) -> float:
    """A wait or poll interval (`sessionctl run --poll-seconds`, Dagster's poll_seconds): finite, > 0 -- 0 would
    spin -- and at most MAX_FLOAT; a ConfigError naming `label` otherwise."""
    seconds = read_float({label: str(value)}, label, None)
    assert seconds is not None
    return seconds


def checked_checkpoint_uri(raw: str, *, home: Path) -> str:
    """SESSIONS_CHECKPOINT_URI: a path (made absolute), hdfs://namenode:port/path or s3a://bucket/prefix (s3:// is
    taken as s3a://); $SESSIONS_HOME/checkpoints when unset."""
    uri = raw.strip().removeprefix("file://").rstrip("/")
    scheme, separator, rest = uri.partition("://")
    if not separator:
        return str(Path(uri).resolve()) if uri else str(home / "checkpoints")
    host, _, path = rest.partition("/")
    if scheme not in ("hdfs", "s3a", "s3"):
        raise ConfigError(f"SESSIONS_CHECKPOINT_URI={raw!r}: the scheme {scheme}:// is not supported; expected a "
                          "shared path, hdfs://namenode:port/path or s3a://bucket/prefix")
    if not host or not path:
        raise ConfigError(f"SESSIONS_CHECKPOINT_URI={raw!r}: expected hdfs://namenode:port/path or "
                          "s3a://bucket/prefix (a host or bucket, then a path)")
    return f"s3a://{rest}" if scheme == "s3" else uri


def resolved_lease_uri(raw: str, checkpoint_uri: str) -> str:
    """SESSIONS_LEASE_URI: s3://bucket/prefix, hdfs://namenode:port/path or a path (made absolute); default `_leases`
    beside the checkpoint, on the checkpoint's own store (S3 for an s3a:// checkpoint, HDFS for an hdfs:// one:
    pipelines.coordination.lease_stores)."""
    uri = raw.strip().removeprefix("file://").rstrip("/")
    if not uri and checkpoint_uri.startswith("s3a://"):
        return "s3://" + checkpoint_uri.removeprefix("s3a://") + "/_leases"
    if not uri and checkpoint_uri.startswith("hdfs://"):
        return checkpoint_uri + "/_leases"
    if not uri:
        return str(Path(checkpoint_uri) / "_leases")
    if uri.startswith("s3://"):
        if not uri[len("s3://"):].split("/", 1)[0]:
            raise ConfigError(f"SESSIONS_LEASE_URI={raw!r}: expected s3://bucket/prefix")
        return uri
    if uri.startswith("hdfs://"):
        host, _, path = uri[len("hdfs://"):].partition("/")
        if not host or not path:
            raise ConfigError(f"SESSIONS_LEASE_URI={raw!r}: expected hdfs://namenode:port/path (a host, then a path)")
        return uri
    if "://" in uri:
        raise ConfigError(f"SESSIONS_LEASE_URI={raw!r}: expected a shared path, s3://bucket/prefix or "
                          "hdfs://namenode:port/path")
    return str(Path(uri).resolve())


_SCHEME_ONLY = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:/*")  # "s3:", "s3:/", "s3://": a scheme, nothing after it


def check_uri(*, name: str, raw: str, hdfs: bool = False) -> None:
    """A data location given as a URI: file://, or s3:// with a bucket (with `hdfs`, hdfs:// too: resolved_lease_uri
    checks its form); a ConfigError naming `name` otherwise. Without this, `s3://` loses its slashes on the way and
    becomes the relative path `./s3:` in the working directory, and an unsupported scheme (gs://, hdfs://) a local
    directory of that name."""
    text = raw.strip()
    scheme, separator, rest = text.partition("://")
    if not separator and not _SCHEME_ONLY.fullmatch(text):
        return  # a path
    scheme = scheme.rstrip(":/")
    if scheme == "file" or (hdfs and scheme == "hdfs"):
        return
    if scheme == "s3":
        if not rest.split("/", 1)[0]:
            raise ConfigError(f"{name}={raw!r} names no bucket: expected s3://bucket/prefix")
        return
    expected = "a local path, s3://bucket/prefix or hdfs://namenode:port/path (schemes in lower case)" if hdfs else \
        "a local path or s3://bucket/prefix (s3 in lower case)"
    raise ConfigError(f"{name}={raw!r}: the scheme {scheme}:// is not supported; expected {expected}")


# A duration as object_store (delta-rs's S3 client) reads it: "30s", "500ms", "2min", "1h 30m" (humantime's units).
_DURATION = re.compile(r"\s*(\d+(\.\d+)?\s*(nsec|ns|usec|us|msec|ms|seconds|second|secs|sec|s|minutes|minute|mins|min|m|hours|"
                       r"hour|hrs|hr|h|days|day|d|weeks|week|w)\s*)+")


def check_duration(*, name: str, value: str) -> None:
    """A duration object_store reads at the first S3 request: refused now, naming the variable `name`."""
    if not _DURATION.fullmatch(value):
        raise ConfigError(f"{name}={value!r} is not a duration: a number and a unit, such as 30s, 500ms, 2min or 1h")


def check_directories(*, env: Mapping[str, str], locations: Mapping[str, str]) -> None:
    """`locations`: each data location's variable and where it resolved to. A local one that names a file, or lies
    under one, is refused here in one line, not at the first write as NotADirectoryError."""
    for name, location in locations.items():
        uri = location.removeprefix("file://")
        if "://" in uri:
            continue
        given = f"{name}={env[name].strip()!r}" if (env.get(name) or "").strip() else f"{name} (unset: {uri})"
        for path in (Path(uri), *Path(uri).parents):
            try:
                if not path.exists():
                    continue
                if not path.is_dir():
                    what = "is a file" if path == Path(uri) else f"lies under {path}, a file"
                    raise ConfigError(f"{given} {what}, not a directory: point it at a directory")
            except OSError:  # not readable: the command that uses it says so
                pass
            break


# Spark's masters this job runs on (a typo otherwise surfaces as "Java gateway process exited" with no hint why).
_SPARK_MASTER = re.compile(
    r"local(\[(\*|[1-9]\d*)(,\s*[1-9]\d*)?\])?"             # local, local[N], local[*], local[N,F], local[*,F]
    r"|local-cluster\[[1-9]\d*,\s*[1-9]\d*,\s*[1-9]\d*\]"   # local-cluster[workers,cores,MiB] (tests)
    r"|spark://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):\d{1,5}(,(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):\d{1,5})*"
    r"|k8s://\S+|yarn")
# The driver's heap as the JVM's -Xmx takes it (Spark passes it on as is): a unit, no "b" after it ("4gb" is an
# invalid heap size there), and a bare number would be bytes. Spark refuses a heap under 450 MiB when it starts
# (UnifiedMemoryManager), again only as "Java gateway process exited".
_MEMORY = re.compile(r"([1-9]\d*)([kmgt])")
_MEMORY_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
MIN_DRIVER_MEMORY, MAX_DRIVER_MEMORY = 512 << 20, 64 << 40


def check_spark_master(master: str) -> None:
    """SESSIONS_SPARK_MASTER: one of the masters this job runs on; a ConfigError naming the variable otherwise."""
    if not _SPARK_MASTER.fullmatch(master):
        raise ConfigError(f"SESSIONS_SPARK_MASTER={master!r} is not a Spark master: expected local, local[N], local[*], "
                          "local[N,F], spark://host:port[,host:port], k8s://https://host:port or yarn")


def check_driver_memory(memory: str) -> None:
    """SESSIONS_SPARK_DRIVER_MEMORY: a size with a unit, 512m to 64t; a ConfigError naming the variable otherwise."""
    found = _MEMORY.fullmatch(memory.strip().lower())
    if found is None:
        raise ConfigError(f"SESSIONS_SPARK_DRIVER_MEMORY={memory!r} is not a size: a positive number and a unit, such "
                          "as 4g or 4096m")
    size = int(found.group(1)) * _MEMORY_UNITS[found.group(2)]
    if not MIN_DRIVER_MEMORY <= size <= MAX_DRIVER_MEMORY:
        raise ConfigError(f"SESSIONS_SPARK_DRIVER_MEMORY={memory!r} is too {'small' if size < MIN_DRIVER_MEMORY else 'large'}"
                          ": between 512m (Spark's driver needs at least 450 MiB) and 64t")
