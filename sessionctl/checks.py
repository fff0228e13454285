"""sessionctl's checks of what it is given: arguments in one line each (argparse's usage block is no one line), and
the failures no layer below turned into their one line. Light: no pyspark, deltalake or pyarrow imported here."""
from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
import tempfile
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any, NoReturn

from pipelines.config import MAX_PARTITIONS, PATH_SETTINGS, SessionsConfig
from pipelines.config_checks import MAX_INT, positive_seconds
from pipelines.errors import ConfigError, HomeNotWritable, SessionsError
from pipelines.settings import env_name

__all__ = ["PARTITIONS", "SECONDS", "LogFile", "Parser", "check_writable", "checked", "count", "object_store_failure",
           "unwritable_location", "user_id"]


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


def count(minimum: int, *, maximum: int = MAX_INT) -> Callable[[str], Any]:
    """An argparse type: an integer from `minimum` to `maximum` (default MAX_INT, what Spark takes as a count)."""
    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"n={text!r} is not an integer") from None
        if not minimum <= value <= maximum:
            raise ConfigError(f"n={value} must be between {minimum} and {maximum}")
        return value
    return checked(check)


# `restore/rescale --partitions`: refused while parsing, before a pre-flight could call a count Spark cannot take
# restorable (the library bounds it the same way: StateOperator.max_partitions).
PARTITIONS = count(1, maximum=MAX_PARTITIONS)


def user_id(text: str) -> str:
    """An argparse type: a user id that is not empty (an empty one matches nothing, or everything)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("a user id, not an empty string")
    return text


def users_file(path: str) -> list[str]:
    """An argparse type: a file of user ids, one per line (surrounding whitespace and blank lines ignored), read now;
    a missing, unreadable or empty file is the argument's one-line refusal."""
    try:
        with open(path, encoding="utf-8") as handle:
            ids = [line.strip() for line in handle]
    except FileNotFoundError:
        raise argparse.ArgumentTypeError(f"no such file: {path}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {getattr(error, 'strerror', None) or error}") from None
    ids = [user for user in ids if user]
    if not ids:
        raise argparse.ArgumentTypeError(f"{path} lists no user id (one per line; blank lines are ignored)")
    return ids


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


# What a command that writes may not find writable: a read-only mount (a backup, a replica's snapshot) or another
# user's home. The commands that only read -- status, savepoints, state, restore --dry-run, forget --verify -- run there.
_READ_ONLY_HINT = "the commands that only read (status, savepoints, state, restore --dry-run) work on it"
_UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def _local_locations(config: SessionsConfig) -> list[tuple[str, Path]]:
    """The local data locations, SESSIONS_HOME first, by the variable that sets each."""
    found = [("SESSIONS_HOME", config.home)]
    for setting in PATH_SETTINGS[1:]:
        uri = str(getattr(config, setting)).removeprefix("file://")
        if "://" not in uri:
            found.append((env_name(setting), Path(uri)))
    return found


def check_writable(config: SessionsConfig, *, command: str) -> None:
    """Before a command that writes starts anything: every local data location (or the directory it would be made in)
    takes a file, else HomeNotWritable in one line -- not a traceback from whichever write came first (a log file, a
    lease, Spark's checkpoint). The probe is an unnamed temporary file (O_TMPFILE): nothing appears, not even in
    landing."""
    for name, path in _local_locations(config):
        try:
            existing = next(p for p in (path, *path.parents) if p.exists())
            with tempfile.TemporaryFile(dir=existing):
                pass
        except OSError as error:
            if error.errno not in _UNWRITABLE:
                continue  # not a permission or read-only mount: the command's own error says what it is
            raise HomeNotWritable(f"{name} {path} is not writable ({error.strerror}): `sessionctl {command}` writes "
                                  f"there; {_READ_ONLY_HINT}") from None


def unwritable_location(config: SessionsConfig, error: BaseException, *, command: str) -> HomeNotWritable | None:
    """A write refused under a local data location (read-only, no permission) that no check before caught -- the
    erasure key `forget --verify` creates on first use -- as its one line; None for anything else."""
    if not isinstance(error, OSError) or error.errno not in _UNWRITABLE or not error.filename:
        return None
    target = Path(os.fsdecode(error.filename))
    for name, path in _local_locations(config):
        if target == path or path in target.parents:
            return HomeNotWritable(f"{name} {path} is not writable ({error.strerror}): `sessionctl {command}` needs "
                                   f"to write {target}; {_READ_ONLY_HINT}")
    return None
