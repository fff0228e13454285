"""S3 landing objects as a source: listing, reading each whole, archiving by copy + delete, commit identities.

Landing on S3 holds objects, which are whole when they appear and never grow (and there are no symlinks):
each is read once, whole, and archived by copy + delete, crash-safe through the commit's `name:size:mtime`
identities.

A landing bucket that does not answer (or refuses) fails the ingest with StorageUnavailable naming the landing URI
and the cause -- `run` retries it with backoff (pipelines.job.stream) --; requests wait at most SESSIONS_S3_TIMEOUT,
retried SESSIONS_S3_MAX_RETRIES times. What was committed before stays committed; an object committed but not yet
archived is only archived by the next ingest.
"""
from __future__ import annotations

import json
from functools import partial

import pyarrow.fs as pafs
from deltalake import DeltaTable

from pipelines.config import SessionsConfig
from pipelines.ingest.appender import Appender, Ingested
from pipelines.ingest.lines import split_lines
from pipelines.ingest.positions import INGESTED_DIR, LandedFile, archive_day
from pipelines.ingest.table import (
    HISTORY_PAGE,
    LargeInput,
    ParsedSpan,
    RowSource,
    Span,
    span_from,
)
from pipelines.storage import filesystem, s3_errors, s3_limits

__all__ = ["ingest"]


def landed_objects(config: SessionsConfig) -> list[LandedFile]:
    """The *.jsonl objects directly under the landing prefix, oldest first."""
    found = []
    fs, root = filesystem(config.landing_uri)
    if fs.get_file_info(root).type == pafs.FileType.NotFound:
        return []
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=False)):
        if info.type == pafs.FileType.File and info.base_name.endswith(".jsonl"):
            found.append(LandedFile(info.base_name, info.size or 0, info.mtime_ns or 0, f"s3://{info.path}"))
    return sorted(found, key=lambda f: (f.mtime_ns, f.name))


def _recent_identities(table: DeltaTable | None) -> set[str]:
    """Identities of the objects the newest commits hold (an object committed just before a crash)."""
    if table is None:
        return set()
    found: set[str] = set()
    for commit in table.history(limit=HISTORY_PAGE):
        found.update(json.loads(commit.get("ingested_files", "[]")))
    return found


def _read_object(file: LandedFile) -> bytes:
    fs, path = filesystem(file.location)
    with fs.open_input_stream(path) as stream:
        return bytes(stream.read())


def _same_bytes(fs: pafs.FileSystem, a: str, b: str) -> bool:
    """Only asked when an archived object of the same name and size exists (rare): compare the contents."""
    with fs.open_input_stream(a) as first, fs.open_input_stream(b) as second:
        while True:
            left, right = first.read(1 << 20), second.read(1 << 20)
            if left != right:
                return False
            if not left:
                return True


def _archive_object(config: SessionsConfig, file: LandedFile) -> None:
    """Move to landing/_ingested/<UTC day>/ by a copy then a delete: a kill between the two leaves the object in
    landing, where the next ingest finds it already committed and only archives it."""
    fs, root = filesystem(config.landing_uri)
    target_dir = f"{root}/{INGESTED_DIR}/{archive_day()}"
    fs.create_dir(target_dir, recursive=True)
    stem, suffix = file.name.rsplit(".", 1)
    _, source = filesystem(file.location)
    target, n = f"{target_dir}/{file.name}", 1
    while (found := fs.get_file_info(target)).type != pafs.FileType.NotFound:
        if found.size == file.size and _same_bytes(fs, source, target):
            fs.delete_file(source)  # our own copy from an archive a kill interrupted: finish it
            return
        target, n = f"{target_dir}/{stem}.{n}.{suffix}", n + 1
    fs.copy_file(source, target)
    fs.delete_file(source)


def _same_metadata(metadata: dict[str, str], _: ParsedSpan) -> dict[str, str]:
    return metadata  # an object's identity does not depend on what the tasks found


def ingest(config: SessionsConfig, table: DeltaTable | None, appender: Appender, step: int,
           large: LargeInput = "read") -> Ingested:
    """Every object whole (an object is complete when it appears: its last line needs no newline). Every object
    listed is committed and archived (or this raised): none is refused, none left waiting -- but for an object of
    at least SESSIONS_INGEST_TASK_MIB, which `large` may leave for Spark tasks ("defer", with every later object:
    ingest order stays landing order) or give to them (IngestTasks: a commit of its own). The landing's failures
    are StorageUnavailable (raw_events' own, in the warehouse, are the appender's)."""
    landing = config.landing_uri
    already = _recent_identities(table)
    pending = []
    by_tasks = 0
    large_from = span_from(config, table, large)  # None also while the tasks cannot write this table (usable)
    with s3_limits(config):
        with s3_errors(landing):  # probes the endpoint first: refused connections fail in a second
            listed = landed_objects(config)
        for file in listed:
            if file.identity in already or file.legacy_identity in already:
                with s3_errors(landing, probe=False):
                    _archive_object(config, file)
            else:
                pending.append(file)
        if large == "defer" and large_from is not None:
            cut = next((k for k, f in enumerate(pending) if f.size >= large_from), len(pending))
            deferred, pending = len(pending) - cut, pending[:cut]
        else:
            deferred = 0
        chunk: list[LandedFile] = []

        def commit() -> None:
            if chunk:
                with s3_errors(landing, probe=False):
                    sources = [RowSource(f.name, split_lines(_read_object(f), 0, False)[0]) for f in chunk]
                appender.append(sources, {"ingested_files": json.dumps([f.identity for f in chunk])})
                with s3_errors(landing, probe=False):
                    for file in chunk:
                        _archive_object(config, file)
                chunk.clear()

        for file in pending:
            if large_from is not None and file.size >= large_from and not isinstance(large, str):
                commit()
                metadata = {"ingested_files": json.dumps([file.identity])}
                appender.append_by_tasks(partial(large, Span(file.name, file.location, 0, file.size, 0, False)),
                                         partial(_same_metadata, metadata))
                by_tasks += 1
                with s3_errors(landing, probe=False):
                    _archive_object(config, file)
                continue
            chunk.append(file)
            if len(chunk) == step:
                commit()
        commit()
    return Ingested(len(pending), 0, deferred, deferred, by_tasks)
