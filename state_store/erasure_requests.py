"""Erasure requests as a compliance workflow drops them: files named `*.users` at SESSIONS_ERASURE_REQUESTS_URI (a
path or s3://bucket/prefix; default $SESSIONS_HOME/erasure_requests), one user id per line, blank lines ignored.

A file counts once its name ends in `.users`: write it under another name and rename it (a rename is atomic; an S3
put is whole). Name it after the ticket, not the user: the name is what Dagster's sensor puts in a run's config.
`sessionctl forget --requests` and the Dagster sensor `erasure_requests` erase the users of every pending file in one
erasure (state_store.erasure: about the cost of one user), then delete those files -- they name the users, and a
verify reads them as it reads everything the product keeps. Killed between the two, the same command finishes it
(the erasure is idempotent). A file that cannot be read as UTF-8 text is left where it is and named with why."""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field

import pyarrow.fs as pafs
from pyspark.sql import SparkSession

from pipelines.config import SessionsConfig
from pipelines.errors import Result
from pipelines.storage import filesystem
from state_store.erasure import ForgetResult, forget

__all__ = ["REQUEST_SUFFIX", "ErasureRequests", "RequestedErasure", "close_requests", "forget_requested",
           "read_requests"]

REQUEST_SUFFIX = ".users"


@dataclass(frozen=True)
class ErasureRequests:
    """Request files read: their names (sorted), their users (each once, in file order) and the files refused."""
    files: list[str]
    user_ids: list[str] = field(repr=False)  # never in a result or a log line: the forget's result hashes them
    refused: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RequestedErasure(Result):
    """`forget --requests`: the request files erased and deleted, how many users they named, the erasure (None when
    no file named a user), and the files left in place with why."""
    files: list[str]
    users: int
    erasure: ForgetResult | None
    refused: dict[str, str]


def pending_files(config: SessionsConfig) -> list[str]:
    """The names of the complete request files (`*.users`), sorted."""
    fs, root = filesystem(config.erasure_requests_uri)
    infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    return sorted(info.base_name for info in infos
                  if info.type == pafs.FileType.File and info.base_name.endswith(REQUEST_SUFFIX))


def read_requests(config: SessionsConfig, files: Sequence[str] | None = None) -> ErasureRequests:
    """The request files `files` (names; None: every pending one) and their users. A file named but gone (a run that
    erased it already) counts for nothing; one not UTF-8 text, or not named `*.users`, is refused."""
    fs, root = filesystem(config.erasure_requests_uri)
    names = pending_files(config) if files is None else sorted(set(files))
    users: dict[str, None] = {}
    read, refused = [], {}
    for name in names:
        if "/" in name or not name.endswith(REQUEST_SUFFIX):
            refused[name] = f"not a request file: a name in {config.erasure_requests_uri} ending in {REQUEST_SUFFIX}"
            continue
        try:
            with fs.open_input_stream(f"{root}/{name}") as handle:
                text = handle.read().decode("utf-8")
        except FileNotFoundError:
            continue
        except UnicodeDecodeError as error:
            refused[name] = f"not UTF-8 text (byte {error.start}): left in place"
            continue
        read.append(name)
        users.update(dict.fromkeys(line.strip() for line in text.splitlines() if line.strip()))
    return ErasureRequests(read, list(users), refused)


def close_requests(config: SessionsConfig, requests: ErasureRequests) -> None:
    """The request files of an erasure that completed, deleted (gone already: nothing)."""
    fs, root = filesystem(config.erasure_requests_uri)
    for name in requests.files:
        with suppress(FileNotFoundError):
            fs.delete_file(f"{root}/{name}")


def forget_requested(config: SessionsConfig, files: Sequence[str] | None = None, *,
                     spark: SparkSession | None = None, timeout_s: float | None = None) -> RequestedErasure:
    """Every user of the request files `files` (None: every pending one) erased in one forget (a running stream does it
    between two batches), then those files deleted."""
    requests = read_requests(config, files)
    erased = forget(config, requests.user_ids, spark=spark, timeout_s=timeout_s) if requests.user_ids else None
    close_requests(config, requests)
    return RequestedErasure(requests.files, len(requests.user_ids), erased, requests.refused)
