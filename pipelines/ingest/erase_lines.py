"""Erased users' lines out of every landed file: pending ones, files still being written, archived and refused ones,
on a local path or S3.

A line that names an erased user (pipelines.ingest.erased.UserSpelling.line_names: its decoded user_id, any spelling) is
overwritten with spaces: the file keeps its size and line count, so the ingest positions kept for it stay true (a
blank line is no event). Only complete lines are touched: a file still being written is written to in place, at
offsets below its end, so a writer appending to it loses nothing; its head fingerprint in the positions file is
updated, so ingest goes on reading it where it was (and does not take it for another file).
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence

import pyarrow.fs as pafs

from pipelines.config import SessionsConfig
from pipelines.ingest.erased import UserSpelling
from pipelines.ingest.positions import HEAD_BYTES, INGESTED_DIR, POSITIONS_FILE, digest
from pipelines.storage import filesystem, is_s3

__all__ = ["erase_landed_lines"]


def _landed_files(config: SessionsConfig) -> Iterator[tuple[pafs.FileSystem, str]]:
    fs, root = filesystem(config.landing_uri)
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return
    for info in infos:
        if info.type == pafs.FileType.File and not info.base_name.startswith("_"):
            yield fs, info.path


def _spans(data: bytes, users: Sequence[UserSpelling]) -> list[tuple[int, int]]:
    """(start, end) of each complete line (ending with a newline) that names one of `users`."""
    spans: list[tuple[int, int]] = []
    start = 0
    while True:
        end = data.find(b"\n", start)
        if end < 0:
            return spans  # an unfinished last line is left to the writer; ingest drops it if it names U
        line = data[start:end]
        if line.strip() and any(user.line_names(line) for user in users):
            spans.append((start, end))
        start = end + 1


def erase_landed_lines(config: SessionsConfig, user_ids: Sequence[str], *, count_only: bool = False) -> int:
    """Blank every complete landed line that names one of `user_ids`; the lines found. `count_only`: change nothing."""
    users = [UserSpelling(u) for u in user_ids if u]
    if not users:
        return 0
    found = 0
    heads: dict[int, str] = {}
    for fs, path in _landed_files(config):
        with fs.open_input_stream(path) as handle:
            data = handle.read()
        if not any(user.could_be_in(data) for user in users):
            continue
        spans = _spans(data, users)
        found += len(spans)
        if not spans or count_only:
            continue
        if is_s3(config.landing_uri):
            cleaned = bytearray(data)
            for start, end in spans:
                cleaned[start:end] = b" " * (end - start)
            with fs.open_output_stream(path) as handle:
                handle.write(bytes(cleaned))
            continue
        # In place, below the end: a writer appending to this file (O_APPEND) keeps every byte it writes.
        fd = os.open(path, os.O_WRONLY)
        try:
            for start, end in spans:
                os.pwrite(fd, b" " * (end - start), start)
            os.fsync(fd)
            if spans[0][0] < HEAD_BYTES:
                heads[os.fstat(fd).st_ino] = path
        finally:
            os.close(fd)
    if heads:
        _refresh_heads(config, heads)
    return found


def _refresh_heads(config: SessionsConfig, heads: dict[int, str]) -> None:
    """The head fingerprints of rewritten files in landing/_ingested/_positions.json (the file ingest keeps)."""
    path = config.landing / INGESTED_DIR / POSITIONS_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    changed = False
    for item in data.get("files", []):
        where = heads.get(int(item.get("ino", -1)))
        if where is None or not item.get("head_len"):
            continue
        with open(where, "rb") as handle:
            item["head"] = digest(handle.read(HEAD_BYTES)[:int(item["head_len"])])
        changed = True
    if changed:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
