"""The landing layout the landing sources (local, S3) share -- _ingested/ and _refused/, their day folders,
LandedFile -- and the positions file (landing/_ingested/_positions.json): how far each local landed file has been
ingested.

A file's position (inode, bytes and lines consumed) goes into the ingest commit's metadata -- the truth,
replayed after a crash -- and into this file, so appended lines are ingested once, with their true line numbers.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from pipelines.config import SessionsConfig
from pipelines.ingest.table import HISTORY_PAGE

__all__ = ["HEAD_BYTES", "INGESTED_DIR", "POSITIONS_FILE", "REFUSED_DIR", "FilePosition", "LandedFile", "Positions", "archive_day", "digest",
           "load_positions", "save_positions"]

INGESTED_DIR = "_ingested"
REFUSED_DIR = "_refused"        # symlinks and special files found in landing are moved here, unread


def archive_day() -> str:
    """The UTC day folder under _ingested/ (or _refused/) a file archived now goes to."""
    return dt.datetime.now(dt.timezone.utc).date().isoformat()


@dataclass(frozen=True)
class LandedFile:
    """A landed file, local or an S3 object: what ingest reads, commits and archives."""
    name: str
    size: int
    mtime_ns: int
    location: str  # local path or s3://bucket/key

    @property
    def identity(self) -> str:
        # Name, size and modification time (an S3 object's LastModified): a later object that reuses the name --
        # even with the same size -- is a new put with a new time, and is ingested.
        return f"{self.name}:{self.size}:{self.mtime_ns}"

    @property
    def legacy_identity(self) -> str:
        """What commits of builds before the modification time was recorded hold."""
        return f"{self.name}:{self.size}"


POSITIONS_FILE = "_positions.json"
HEAD_BYTES = 1024               # fingerprint of a file's first bytes: an inode reused by another file is not it


@dataclass(frozen=True)
class FilePosition:
    """How far a landed file has been ingested. Kept in each ingest commit's metadata and in the positions file."""
    ino: int
    name: str              # the name it landed under: source_file of its rows
    path: str              # where it is now, relative to landing
    bytes: int = 0         # consumed
    lines: int = 0         # consumed (blank lines too): the next line is number lines + 1
    head: str = ""         # sha256 of its first head_len bytes
    head_len: int = 0
    open_line: bool = False  # the last line taken had no newline yet (a whole JSON object)
    refused: str | None = None  # a symlink or special file: reported once, moved to _refused/, never read

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FilePosition:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class Positions:
    table_id: str | None = None  # the raw table they belong to: a new table starts from nothing
    seq: int = 0                 # the ingest commit they include
    files: dict[int, FilePosition] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"table_id": self.table_id, "seq": self.seq,
                           "files": [p.to_json() for p in sorted(self.files.values(), key=lambda p: p.ino)]})


def _positions_path(config: SessionsConfig) -> Path:
    return config.landing / INGESTED_DIR / POSITIONS_FILE


def digest(data: bytes) -> str:
    """The head fingerprint of FilePosition.head."""
    return hashlib.sha256(data).hexdigest()


def _legacy_position(landing: Path, identity: str) -> FilePosition | None:
    """A commit written before positions existed names its files `name:size`; such a file still in landing
    (a crash before the move) is fully ingested."""
    name, _, size = identity.rpartition(":")
    path = landing / name
    try:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_size != int(size):
            return None
        data = path.read_bytes()
    except (OSError, ValueError):
        return None
    return FilePosition(ino=info.st_ino, name=name, path=name, bytes=len(data),
                        lines=data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1),
                        head=digest(data[:HEAD_BYTES]), head_len=min(HEAD_BYTES, len(data)),
                        open_line=bool(data) and not data.endswith(b"\n"))


def load_positions(config: SessionsConfig, table: DeltaTable | None, latest_seq: int) -> Positions:
    """The positions file, rolled forward with the commits it does not include yet (a crash between a commit and
    the file's update); empty for another raw table."""
    path = _positions_path(config)
    positions = Positions()
    if path.exists():
        try:
            data = json.loads(path.read_text())
            positions = Positions(data.get("table_id"), int(data.get("seq", 0)),
                                  {int(p["ino"]): FilePosition.from_json(p) for p in data.get("files", [])})
        except (ValueError, KeyError, TypeError):
            positions = Positions()  # unreadable: rebuilt from the recent commits below
    table_id = str(table.metadata().id) if table is not None else None
    if positions.table_id is not None and positions.table_id != table_id:
        positions = Positions()
    if table is None or positions.seq >= latest_seq:
        positions.table_id = table_id
        return positions
    commits = [c for c in table.history(limit=HISTORY_PAGE) if int(c.get("ingest_seq", 0)) > positions.seq]
    for commit in sorted(commits, key=lambda c: int(c["ingest_seq"])):
        if "file_positions" in commit:
            for item in json.loads(commit["file_positions"]):
                position = FilePosition.from_json(item)
                positions.files[position.ino] = position
        else:
            for identity in json.loads(commit.get("ingested_files", "[]")):
                legacy = _legacy_position(config.landing, identity)
                if legacy is not None:
                    positions.files[legacy.ino] = legacy
    positions.table_id, positions.seq = table_id, latest_seq
    return positions


def save_positions(config: SessionsConfig, positions: Positions) -> None:
    path = _positions_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as handle:
        handle.write(positions.to_json())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
