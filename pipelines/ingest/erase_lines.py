"""Erased users' lines out of every landed file: pending ones, files still being written, archived and refused ones,
on a local path or S3.

A line that names an erased user (pipelines.ingest.erased.UserGroup.line_user: its decoded user_id, any spelling) is
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
from pipelines.ingest.erased import UserGroup
from pipelines.ingest.positions import HEAD_BYTES, INGESTED_DIR, POSITIONS_FILE, digest
from pipelines.storage import filesystem, is_s3

__all__ = ["erase_landed_lines", "erase_landed_lines_of"]


def _landed_files(config: SessionsConfig) -> Iterator[tuple[pafs.FileSystem, str]]:
    fs, root = filesystem(config.landing_uri)
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return
    for info in infos:
        if info.type == pafs.FileType.File and not info.base_name.startswith("_"):
            yield fs, info.path


def _spans(data: bytes, users: UserGroup) -> list[tuple[int, int, str]]:
    """(start, end, user) of each complete line (ending with a newline) that names one of `users`; an unfinished last
    line is left to the writer (ingest drops it if it names U)."""
    spans: list[tuple[int, int, str]] = []
    for start, end in users.lines_to_read(data):
        line = data[start:end]
        named = users.line_user(line) if end < len(data) and line.strip() else None
        if named is not None:
            spans.append((start, end, named))
    return spans


def erase_landed_lines(config: SessionsConfig, user_ids: Sequence[str], *, count_only: bool = False) -> int:
    """Blank every complete landed line that names one of `user_ids`; the lines found. `count_only`: change nothing."""
    return sum(erase_landed_lines_of(config, user_ids, count_only=count_only).values())


def erase_landed_lines_of(config: SessionsConfig, user_ids: Sequence[str], *, count_only: bool = False
                          ) -> dict[str, int]:
    """Blank every complete landed line that names one of `user_ids`, in one pass over each landed file; the lines
    found per user. `count_only`: change nothing."""
    users = UserGroup.of(user_ids)
    found = dict.fromkeys(sorted(users.ids), 0)
    if not users.users:
        return found
    heads: dict[int, str] = {}
    for fs, path in _landed_files(config):
        with fs.open_input_stream(path) as handle:
            data = handle.read()
        if not users.could_be_in(data):
            continue
        spans = _spans(data, users)
        for _, _, named in spans:
            found[named] += 1
        if not spans or count_only:
            continue
        if is_s3(config.landing_uri):
            cleaned = bytearray(data)
            for start, end, _ in spans:
                cleaned[start:end] = b" " * (end - start)
            with fs.open_output_stream(path) as handle:
                handle.write(bytes(cleaned))
            continue
        # In place, below the end: a writer appending to this file (O_APPEND) keeps every byte it writes.
        fd = os.open(path, os.O_WRONLY)
        try:
            for start, end, _ in spans:
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
