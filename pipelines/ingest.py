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
import io
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable, write_deltalake

from pipelines.config import SessionsConfig
from pipelines.storage import filesystem, is_s3, storage_options

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
    return parse_lines(path.read_bytes(), path.name, seq)


def parse_lines(data: bytes, name: str, seq: int) -> pa.Table:
    columns: dict[str, list] = {field.name: [] for field in RAW_SCHEMA}
    for line_no, raw_bytes in enumerate(io.BytesIO(data), start=1):  # lines end at \n only, as in a file
        raw = raw_bytes.decode("utf-8", errors="replace").rstrip("\r\n")
        if not raw.strip():
            continue  # blank lines carry nothing to keep
        fields, reason = parse_line(raw)
        for column in ("event_id", "user_id", "event_time", "event_type", "page"):
            columns[column].append(fields.get(column))
        columns["source_file"].append(name)
        columns["line_no"].append(line_no)
        columns["ingest_seq"].append(seq)
        columns["reject_reason"].append(reason)
        columns["raw"].append(raw if reason else None)
    return pa.table(columns, schema=RAW_SCHEMA)


def latest_ingest_seq(table_uri: str, storage_options: dict[str, str] | None = None) -> tuple[int, set[str]]:
    """The newest ingest sequence number, and the files of the most recent ingest commits.

    The number comes from the data files' statistics (max of ingest_seq), so it survives OPTIMIZE,
    VACUUM and log cleanup; the file names (to skip a file committed just before a crash) come from
    the newest commits only.
    """
    if not DeltaTable.is_deltatable(table_uri, storage_options=storage_options):
        return 0, set()
    table = DeltaTable(table_uri, storage_options=storage_options)
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


@dataclass(frozen=True)
class LandedFile:
    """A landed file, local or an S3 object: what ingest reads, commits and archives."""
    name: str
    size: int
    mtime_ns: int
    location: str  # local path or s3://bucket/key

    @property
    def identity(self) -> str:
        # Name and size: a later file that reuses a name is still ingested.
        return f"{self.name}:{self.size}"


def landed_files(config: SessionsConfig) -> list[LandedFile]:
    """The *.jsonl files directly in landing, oldest first (local directory or S3 prefix alike)."""
    fs, root = filesystem(config.landing_uri)
    if fs.get_file_info(root).type == pafs.FileType.NotFound:
        return []
    found = []
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=False)):
        if info.type == pafs.FileType.File and info.base_name.endswith(".jsonl"):
            location = f"s3://{info.path}" if is_s3(config.landing_uri) else info.path
            found.append(LandedFile(info.base_name, info.size or 0, info.mtime_ns or 0, location))
    return sorted(found, key=lambda f: (f.mtime_ns, f.name))


def _read(file: LandedFile) -> bytes:
    fs, path = filesystem(file.location)
    with fs.open_input_stream(path) as stream:
        return bytes(stream.read())


def _archive(config: SessionsConfig, file: LandedFile) -> None:
    """Move to landing/_ingested/<UTC day>/. On S3 a copy then a delete: a kill between the two leaves the
    object in landing, where the next ingest finds it already committed and only archives it."""
    fs, root = filesystem(config.landing_uri)
    target_dir = f"{root}/{INGESTED_DIR}/{dt.datetime.now(dt.timezone.utc).date().isoformat()}"
    fs.create_dir(target_dir, recursive=True)
    stem, suffix = file.name.rsplit(".", 1)
    _, source = filesystem(file.location)
    target, n = f"{target_dir}/{file.name}", 1
    while (found := fs.get_file_info(target)).type != pafs.FileType.NotFound:
        if is_s3(config.landing_uri) and found.size == file.size:
            fs.delete_file(source)  # our own copy from an archive a kill interrupted: finish it
            return
        target, n = f"{target_dir}/{stem}.{n}.{suffix}", n + 1
    if is_s3(config.landing_uri):
        fs.copy_file(source, target)
        fs.delete_file(source)
    else:
        fs.move(source, target)


def ingest(config: SessionsConfig, files_per_commit: int = 16) -> IngestResult:
    """Append every landed file to raw_events, then move it to landing/_ingested/<day>/.

    Crash-safe: a file is committed together with its name in the commit metadata; a file found in
    landing that a recent commit already holds (crash before the move) is only moved.
    """
    table_uri = config.raw_events_table
    files = rows = rejected = 0
    first_seq = None
    with file_lock(config.lock_dir / "ingest.lock"):
        options = storage_options(config, table_uri)
        seq, already = latest_ingest_seq(table_uri, options)
        pending = []
        for file in landed_files(config):
            if file.identity in already:
                _archive(config, file)
            else:
                pending.append(file)
        for start in range(0, len(pending), max(1, files_per_commit)):
            chunk = pending[start:start + max(1, files_per_commit)]
            seq += 1
            table = pa.concat_tables([parse_lines(_read(f), f.name, seq) for f in chunk])
            if not is_s3(table_uri):
                os.makedirs(table_uri, exist_ok=True)
            write_deltalake(
                table_uri, table, mode="append", storage_options=options,
                commit_properties=CommitProperties(custom_metadata={
                    "ingest_seq": str(seq),
                    "ingested_files": json.dumps([f.identity for f in chunk]),
                }),
            )
            for file in chunk:
                _archive(config, file)
            first_seq = seq if first_seq is None else first_seq
            files += len(chunk)
            rows += table.num_rows
            rejected += table.num_rows - table["reject_reason"].null_count
    return IngestResult(files, rows, rejected, first_seq, seq)
