"""Landing -> raw_events: the replayable log the stream reads.

Every landed line becomes one row of the raw_events Delta table, valid or not (a rejected line keeps
its raw text and a reason), so the stream's exactly-once sink is the single writer of the quarantine
table and a replay from any source position reproduces it. Each ingest commit carries a monotone
`ingest_seq` (in the rows and in the commit metadata): the stream's offsets are ingest sequence
numbers, which OPTIMIZE and VACUUM of the raw table do not disturb.
"""
from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake

from pipelines.config import SessionsConfig

RAW_SCHEMA = pa.schema([
    ("event_id", pa.string()),
    ("user_id", pa.string()),
    ("event_time", pa.timestamp("us", tz="UTC")),
    ("event_type", pa.string()),
    ("page", pa.string()),
    ("source_file", pa.string()),
    ("line_no", pa.int64()),
    ("ingest_seq", pa.int64()),
    ("reject_reason", pa.string()),  # null for a valid event
    ("raw", pa.string()),            # the line as landed, kept only for rejected lines
])
INGESTED_DIR = "_ingested"
HISTORY_PAGE = 50  # commits searched for files ingested just before a crash


@contextmanager
def file_lock(path: Path):
    """An exclusive advisory lock; blocks until the holder (another process) lets go."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _as_id(value) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (str, int)):
        text = str(value)
        return text if text.strip() else None
    return None


def parse_event_time(value) -> dt.datetime | None:
    """ISO-8601 with Z or an offset, to UTC at millisecond precision; None when not parseable."""
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None  # no offset: ambiguous, refuse rather than guess a zone
    parsed = parsed.astimezone(dt.timezone.utc)
    return parsed.replace(microsecond=parsed.microsecond // 1000 * 1000)


def parse_line(line: str) -> tuple[dict, str | None]:
    """Return (fields, reject_reason). reject_reason is None for a valid event."""
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}, "malformed_json"
    if not isinstance(record, dict):
        return {}, "not_an_object"
    event_id, user_id = _as_id(record.get("event_id")), _as_id(record.get("user_id"))
    if event_id is None:
        return {}, "missing_event_id"
    if user_id is None:
        return {"event_id": event_id}, "missing_user_id"
    if record.get("event_time") in (None, ""):
        return {"event_id": event_id, "user_id": user_id}, "missing_event_time"
    event_time = parse_event_time(record.get("event_time"))
    if event_time is None:
        return {"event_id": event_id, "user_id": user_id}, "unparseable_event_time"
    event_type, page = record.get("event_type"), record.get("page")
    return {
        "event_id": event_id,
        "user_id": user_id,
        "event_time": event_time,
        "event_type": event_type if isinstance(event_type, str) else None,
        "page": page if isinstance(page, str) else None,
    }, None


def parse_file(path: Path, seq: int) -> pa.Table:
    columns: dict[str, list] = {field.name: [] for field in RAW_SCHEMA}
    with open(path, "rb") as handle:
        for line_no, raw_bytes in enumerate(handle, start=1):
            raw = raw_bytes.decode("utf-8", errors="replace").rstrip("\r\n")
            if not raw.strip():
                continue  # blank lines carry nothing to keep
            fields, reason = parse_line(raw)
            for name in ("event_id", "user_id", "event_time", "event_type", "page"):
                columns[name].append(fields.get(name))
            columns["source_file"].append(path.name)
            columns["line_no"].append(line_no)
            columns["ingest_seq"].append(seq)
            columns["reject_reason"].append(reason)
            columns["raw"].append(raw if reason else None)
    return pa.table(columns, schema=RAW_SCHEMA)


def latest_ingest_seq(table_uri: str) -> tuple[int, set[str]]:
    """The newest ingest sequence number, and the files of the most recent ingest commits.

    The number comes from the data files' statistics (max of ingest_seq), so it survives OPTIMIZE,
    VACUUM and log cleanup; the file names (to skip a file committed just before a crash) come from
    the newest commits only.
    """
    if not DeltaTable.is_deltatable(table_uri):
        return 0, set()
    table = DeltaTable(table_uri)
    adds = pa.table(table.get_add_actions(flatten=True))
    seq = 0
    if adds.num_rows:
        seq = int(pc.max(adds["max.ingest_seq"]).as_py() or 0)
    recent_files: set[str] = set()
    for commit in table.history(limit=HISTORY_PAGE):
        if "ingest_seq" in commit:
            seq = max(seq, int(commit["ingest_seq"]))
            recent_files.update(json.loads(commit.get("ingested_files", "[]")))
    return seq, recent_files


@dataclass(frozen=True)
class IngestResult:
    files: int
    rows: int
    rejected: int
    first_seq: int | None
    last_seq: int


def landed_files(config: SessionsConfig) -> list[Path]:
    if not config.landing.exists():
        return []
    files = [p for p in config.landing.glob("*.jsonl") if p.is_file()]
    return sorted(files, key=lambda p: (p.stat().st_mtime_ns, p.name))


def _identity(path: Path) -> str:
    # Name and size: a later file that reuses a name is still ingested.
    return f"{path.name}:{path.stat().st_size}"


def _archive(config: SessionsConfig, path: Path) -> None:
    target_dir = config.landing / INGESTED_DIR / dt.date.today().isoformat()
    target_dir.mkdir(parents=True, exist_ok=True)
    target, n = target_dir / path.name, 1
    while target.exists():
        target, n = target_dir / f"{path.stem}.{n}{path.suffix}", n + 1
    shutil.move(str(path), str(target))


def ingest(config: SessionsConfig, files_per_commit: int = 16) -> IngestResult:
    """Append every landed file to raw_events, then move it to landing/_ingested/<day>/.

    Crash-safe: a file is committed together with its name in the commit metadata; a file found in
    landing that a recent commit already holds (crash before the move) is only moved.
    """
    table_uri = config.raw_events_table
    files = rows = rejected = 0
    first_seq = None
    with file_lock(config.lock_dir / "ingest.lock"):
        seq, already = latest_ingest_seq(table_uri)
        pending = []
        for path in landed_files(config):
            if _identity(path) in already:
                _archive(config, path)
            else:
                pending.append(path)
        for start in range(0, len(pending), max(1, files_per_commit)):
            chunk = pending[start:start + max(1, files_per_commit)]
            seq += 1
            table = pa.concat_tables([parse_file(p, seq) for p in chunk])
            os.makedirs(config.warehouse, exist_ok=True)
            write_deltalake(
                table_uri, table, mode="append",
                commit_properties=CommitProperties(custom_metadata={
                    "ingest_seq": str(seq),
                    "ingested_files": json.dumps([_identity(p) for p in chunk]),
                }),
            )
            for path in chunk:
                _archive(config, path)
            first_seq = seq if first_seq is None else first_seq
            files += len(chunk)
            rows += table.num_rows
            rejected += table.num_rows - table["reject_reason"].null_count
    return IngestResult(files, rows, rejected, first_seq, seq)
