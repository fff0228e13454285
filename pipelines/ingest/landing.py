"""The landing layout the landing sources (local, S3) share: _ingested/ and _refused/, their day folders, LandedFile."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

__all__ = ["INGESTED_DIR", "REFUSED_DIR", "LandedFile", "archive_day"]

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
