"""sessionctl's checks of what it is given: arguments in one line each (argparse's usage block is no one line), and
the failures no layer below turned into their one line. Light: no pyspark, deltalake or pyarrow imported here."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from contextlib import suppress
from typing import Any, NoReturn

from pipelines.config import MAX_INT, SessionsConfig, positive_seconds
from pipelines.errors import ConfigError, SessionsError


class LogFile(logging.FileHandler):
    """errors.log, where a record that cannot be written (a full disk, a read-only log directory) is dropped: never
    logging's own "--- Logging error ---" traceback on stderr beside, or instead of, the command's one line."""

    def handleError(self, record: logging.LogRecord) -> None:
        pass

    def flush(self) -> None:
        with suppress(OSError, ValueError):  # what a failed write left in the buffer, again at close
            super().flush()

    def close(self) -> None:
        with suppress(OSError, ValueError):
            super().close()


class Parser(argparse.ArgumentParser):
    """A bad argument is one line too, `sessionctl <command>: argument --x: why` (exit 2), not usage plus error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def checked(check: Callable[[str], object]) -> Callable[[str], Any]:
    """An argparse type from a check that raises ConfigError("LABEL=value ..."): argparse names the argument."""
    def parse(text: str) -> Any:
        try:
            return check(text)
        except ConfigError as error:
            raise argparse.ArgumentTypeError(str(error).split("=", 1)[-1]) from None
    return parse


SECONDS = checked(lambda text: positive_seconds(text, "seconds"))


def count(minimum: int) -> Callable[[str], Any]:
    """An argparse type: an integer from `minimum` to MAX_INT (what Spark takes as a count)."""
    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"n={text!r} is not an integer") from None
        if not minimum <= value <= MAX_INT:
            raise ConfigError(f"n={value} must be between {minimum} and {MAX_INT}")
        return value
    return checked(check)


def user_id(text: str) -> str:
    """An argparse type: a user id that is not empty (an empty one matches nothing, or everything)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("a user id, not an empty string")
    return text


def object_store_failure(config: SessionsConfig, error: Exception) -> SessionsError | None:
    """An object store (S3) failure that no layer below turned into its one line -- `status` reading a table on an
    endpoint that is down -- as the line the library gives (pipelines.storage.s3_errors); None for anything else,
    which is no expected error and stays a traceback. Only when a location is on S3, and only the S3 clients' own
    failures: delta-rs's and pyarrow's OSError carry no errno (a local one does), botocore's have their types."""
    uris = [uri for uri in (config.warehouse_uri, config.savepoint_uri, config.landing_uri, config.lease_uri)
            if uri.startswith("s3://")]
    kinds: list[type[BaseException]] = []
    for module, names in (("deltalake.exceptions", ("DeltaError",)), ("botocore.exceptions", ("BotoCoreError",
                                                                                              "ClientError"))):
        loaded = sys.modules.get(module)  # not imported: not what failed
        kinds += [getattr(loaded, name) for name in names if loaded is not None and hasattr(loaded, name)]
    client = (type(error) is OSError and error.errno is None) or isinstance(error, tuple(kinds))
    if not uris or not client:
        return None
    from pipelines.storage import s3_errors

    text = str(error)
    buckets = {uri: uri[len("s3://"):].split("/", 1)[0] for uri in uris}
    named = [uri for uri, bucket in buckets.items() if f"/{bucket}" in text or f"s3://{bucket}" in text]
    botocore = type(error).__module__.startswith("botocore")
    if not (named or botocore or "S3" in text or os.environ.get("AWS_ENDPOINT_URL", "\0") in text):
        return None  # e.g. a local Delta table's own error beside savepoints on S3: not the object store's
    uri = (named or uris)[0]
    try:
        with s3_errors(uri):  # probes the endpoint first: "unreachable" at once when it refuses connections
            raise error
    except SessionsError as translated:
        return translated
    return None  # not reached: s3_errors translates every kind admitted above
