"""Landing -> raw_events: the replayable log the stream reads.

Every landed line becomes one row of the raw_events Delta table, valid or not (a rejected line keeps
its raw text and a reason), so the stream's exactly-once sink is the single writer of the quarantine
table and a replay from any source position reproduces it. Each ingest commit carries a monotone
`ingest_seq` (in the rows and in the commit metadata): the stream's offsets are ingest sequence
numbers, which OPTIMIZE and VACUUM of the raw table do not disturb. Decisions that depend on the moment
of ingest (the far-future rule) are made here and stored in the row, so a replay decides the same way.

Files still being written lose nothing (the contract: producers rename finished files in, but a slow
writer must not cost data):
- only complete lines are read: a line ends at its newline; a final line without one counts once it
  parses as a JSON object (a cut-off object never does) or once the file has not changed for
  SESSIONS_INGEST_SETTLE_SECONDS;
- a file is read on from where the previous ingest stopped: its position (inode, bytes and lines
  consumed) goes into the ingest commit's metadata -- the truth, replayed after a crash -- and into
  landing/_ingested/_positions.json, so appended lines are ingested once, with their true line numbers;
- a file is moved to _ingested/ only when all of it was read and it did not change during the read; a
  writer still holding it open appends to the moved file, whose new lines later ingests pick up (moved
  files are watched for TAIL_WATCH_S after their last change).
Landing on S3 holds objects, which are whole when they appear and never grow (and there are no symlinks):
each is read once, whole, and archived by copy + delete, crash-safe through the commit's `name:size:mtime`
identities.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import stat
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable, write_deltalake

from pipelines.config import SessionsConfig
from pipelines.locks import waiting_lease
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
    # The row's position in its ingest commit (1, 2, ...): with ingest_seq the key a late event carries through
    # the stream back to its line -- line_no alone repeats across the files of one commit. Null in tables
    # written before it existed (readers fall back to -line_no).
    ("line_key", pa.int64()),
    ("ingested_at", pa.timestamp("us", tz="UTC")),  # the commit's clock, which the far-future rule was judged by
])
INGESTED_DIR = "_ingested"
REFUSED_DIR = "_refused"        # symlinks and special files found in landing are moved here, unread
POSITIONS_FILE = "_positions.json"
HISTORY_PAGE = 50               # commits searched to roll the positions forward after a crash
TAIL_WATCH_S = 3600             # a moved file is watched for appended lines this long after its last change
HEAD_BYTES = 1024               # fingerprint of a file's first bytes: an inode reused by another file is not it
MAX_LINE_BYTES = 1 << 20        # longer lines are quarantined (line_too_long) with a preview, not parsed
RAW_PREVIEW_BYTES = 4096
BOM = b"\xef\xbb\xbf"


# ---- one line -------------------------------------------------------------------------------------


def _storable(text: str) -> bool:
    # json.loads turns a lone "\ud800" escape into a surrogate that no UTF-8 column can hold.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _identifier(record: Mapping[str, Any], name: str) -> tuple[str | None, str | None]:
    """(value, reject_reason): absent, null or blank is `missing_<name>`; anything but a string or an integer
    (679.5, true, a list) is `invalid_<name>`. Integers are kept as their decimal text."""
    value = record.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None, f"missing_{name}"
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None, f"invalid_{name}"
    text = str(value)
    return (text, None) if _storable(text) else (None, "invalid_utf8")


def parse_event_time(value: object) -> dt.datetime | None:
    """ISO-8601 with Z or an offset, to UTC at millisecond precision; None when not parseable."""
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.strip())
        if parsed.tzinfo is None:
            return None  # no offset: ambiguous, refuse rather than guess a zone
        parsed = parsed.astimezone(dt.timezone.utc)
    except (ValueError, OverflowError):  # OverflowError: 9999-12-31T23:00-05:00 is past the end of time in UTC
        return None
    return parsed.replace(microsecond=parsed.microsecond // 1000 * 1000)


def parse_line(line: str, future_limit: dt.datetime | None = None) -> tuple[dict[str, Any], str | None]:
    """Return (fields, reject_reason). reject_reason is None for a valid event; a rejected line keeps the fields
    read before the reason was found (for the quarantine row). An event_time after future_limit is
    `future_event_time`."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: thousands of nested brackets
        return {}, "malformed_json"
    if not isinstance(record, dict):
        return {}, "not_an_object"
    event_id, reason = _identifier(record, "event_id")
    if reason:
        return {}, reason
    user_id, reason = _identifier(record, "user_id")
    if reason:
        return {"event_id": event_id}, reason
    fields_: dict[str, Any] = {"event_id": event_id, "user_id": user_id}
    if record.get("event_time") in (None, ""):
        return fields_, "missing_event_time"
    event_time = parse_event_time(record.get("event_time"))
    if event_time is None:
        return fields_, "unparseable_event_time"
    fields_["event_time"] = event_time
    event_type, page = record.get("event_type"), record.get("page")
    if event_type is not None and not isinstance(event_type, str):
        return fields_, "invalid_event_type"  # it decides sessions (logout, page_view): never guessed
    if page is not None and not isinstance(page, str):
        page = json.dumps(page, separators=(",", ":"))  # informational only: kept, as JSON text
    if not _storable(event_type or "") or not _storable(page or ""):
        return fields_, "invalid_utf8"
    fields_.update(event_type=event_type, page=page)
    if future_limit is not None and event_time > future_limit:
        return fields_, "future_event_time"
    return fields_, None


def classify_line(raw: bytes, future_limit: dt.datetime | None = None) -> tuple[dict[str, Any], str | None, str] | None:
    """One landed line (without its newline) -> (fields, reject_reason, text), or None for a blank line."""
    line = raw.rstrip(b"\r")
    if line.startswith(BOM):  # a BOM opens files written by some Windows tools (and lines of concatenated ones)
        line = line[len(BOM):]
    if not line.strip():
        return None
    if len(line) > MAX_LINE_BYTES:
        preview = line[:RAW_PREVIEW_BYTES].decode("utf-8", errors="backslashreplace")
        return {}, "line_too_long", f"{preview}... [cut: the line has {len(line)} bytes]"
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        # Never guess: the bytes stay readable as backslash escapes (b"\xff" -> "\\xff").
        return {}, "invalid_utf8", line.decode("utf-8", errors="backslashreplace")
    fields_, reason = parse_line(text, future_limit)
    return fields_, reason, text


# ---- file positions ---------------------------------------------------------------------------------


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


def _digest(data: bytes) -> str:
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
                        head=_digest(data[:HEAD_BYTES]), head_len=min(HEAD_BYTES, len(data)),
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


def _save_positions(config: SessionsConfig, positions: Positions) -> None:
    path = _positions_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as handle:
        handle.write(positions.to_json())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


# ---- reading files ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowSource:
    """What becomes raw_events rows from one landed file: its complete lines, or one row for a refused file."""
    name: str
    lines: list[tuple[int, bytes]]    # (line_no, bytes without the newline)
    refused: str | None = None
    refused_raw: str | None = None


@dataclass(frozen=True)
class FileRead:
    """What one ingest read from one file (or refused to read)."""
    position: FilePosition            # after this read
    mtime_ns: int
    size: int
    lines: list[tuple[int, bytes]]    # (line_no, bytes without the newline) of the complete lines read
    continued: bool                   # read on from a known position (not a file seen for the first time)
    archive: bool                     # in landing, read to the end, unchanged during the read: move it
    refused_raw: str | None = None    # what a refused entry is (for its quarantine row)

    def rows(self) -> RowSource:
        return RowSource(self.position.name, self.lines,
                         self.position.refused if self.refused_raw is not None else None, self.refused_raw)


def _is_json_object(tail: bytes) -> bool:
    try:
        return isinstance(json.loads(tail.removeprefix(BOM).decode("utf-8")), dict)
    except (ValueError, RecursionError):
        return False


def _split(body: bytes, lines_before: int, open_before: bool) -> tuple[list[tuple[int, bytes]], int, bool]:
    """Complete lines of body numbered on from lines_before -> (lines, lines consumed, last line unterminated).
    After an unterminated line (taken as a whole JSON object) the newline that follows closes that same line."""
    if not body:
        return [], lines_before, open_before
    segments = body.split(b"\n")
    terminated = segments[-1] == b""
    if terminated:
        segments.pop()
    first = lines_before if open_before else lines_before + 1
    return [(first + k, s) for k, s in enumerate(segments)], first + len(segments) - 1, not terminated


def read_file(landing: Path, rel: str, known: FilePosition | None, now: float, settle_s: float) -> FileRead | None:
    """Read a regular file's new complete lines (see the module docstring); None when it is gone or not a
    regular file any more."""
    try:
        # O_NOFOLLOW: a symlink swapped in after the scan is not followed; O_NONBLOCK: nor does a FIFO block us.
        fd = os.open(landing / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            return None
        head = handle.read(HEAD_BYTES)
        continued = (known is not None and known.refused is None and known.ino == before.st_ino
                     and known.bytes <= before.st_size and _digest(head[:known.head_len]) == known.head)
        if known is None or not continued:
            known = FilePosition(ino=before.st_ino, name=Path(rel).name, path=rel)
        handle.seek(known.bytes)
        data = handle.read(before.st_size - known.bytes)
        after = os.fstat(fd)
    unchanged = (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    body = data[:data.rfind(b"\n") + 1]
    tail = data[len(body):]
    quiet = now - before.st_mtime_ns / 1e9 >= settle_s
    if tail and unchanged and (quiet or _is_json_object(tail)):
        body = data  # the final line is complete: a whole object, or nothing was added to it for settle_s
    lines, consumed_lines, open_line = _split(body, known.lines, known.open_line)
    consumed = known.bytes + len(body)
    position = replace(known, path=rel, bytes=consumed, lines=consumed_lines, open_line=open_line,
                       head=_digest(head[:min(HEAD_BYTES, consumed)]), head_len=min(HEAD_BYTES, consumed))
    in_landing = not rel.startswith(f"{INGESTED_DIR}/")
    return FileRead(position, before.st_mtime_ns, after.st_size, lines, continued,
                    archive=in_landing and unchanged and consumed == after.st_size)


def _scan_landing(config: SessionsConfig, positions: Positions, now: float) -> list[FileRead]:
    landing, reads = config.landing, []
    if not landing.is_dir():
        return []
    inodes: set[int] = set()
    for entry in os.scandir(landing):
        if not entry.name.endswith(".jsonl"):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue  # gone since the listing
        if stat.S_ISDIR(info.st_mode) or info.st_ino in inodes:
            continue  # a second hard link to a file is the same file: read once, moved at a later ingest
        inodes.add(info.st_ino)
        known = positions.files.get(info.st_ino)
        if not stat.S_ISREG(info.st_mode):
            # Never read: a symlink may point anywhere (outside landing, at a secret, at a file ingested
            # already); a FIFO or device has no end. Reported once (a quarantine row, line 0), moved aside.
            reason = "refused_symlink" if stat.S_ISLNK(info.st_mode) else "refused_special_file"
            if known is not None and known.refused == reason and known.name == entry.name:
                # Reported by a commit already (a crash came before its move): only moved now.
                reads.append(FileRead(replace(known, path=entry.name), info.st_mtime_ns, 0, [], True, archive=True))
            else:
                what = (f"symlink to {os.readlink(entry.path)}" if stat.S_ISLNK(info.st_mode)
                        else f"not a regular file (mode {stat.filemode(info.st_mode)})")
                position = FilePosition(ino=info.st_ino, name=entry.name, path=entry.name, refused=reason)
                reads.append(FileRead(position, info.st_mtime_ns, 0, [], False, archive=True, refused_raw=what))
            continue
        read = read_file(landing, entry.name, known, now, config.ingest_settle_seconds)
        if read is not None:
            reads.append(read)
    return reads


def _scan_moved(config: SessionsConfig, positions: Positions, now: float, seen: set[int]) -> list[FileRead]:
    """Files moved to _ingested/ that grew since (a writer still holding them open)."""
    reads = []
    for known in list(positions.files.values()):
        if known.refused or known.ino in seen or not known.path.startswith(f"{INGESTED_DIR}/"):
            continue
        try:
            info = (config.landing / known.path).lstat()
        except OSError:
            continue
        if info.st_ino != known.ino or info.st_size == known.bytes:
            continue  # another file now, or nothing new: the cheap common case, no read
        read = read_file(config.landing, known.path, known, now, config.ingest_settle_seconds)
        if read is not None and read.continued:
            reads.append(read)
    return reads


# ---- the ingest ---------------------------------------------------------------------------------------


def _rows(sources: list[RowSource], seq: int, ingested_at: dt.datetime, max_future: dt.timedelta) -> pa.Table:
    columns: dict[str, list[Any]] = {f.name: [] for f in RAW_SCHEMA}
    future_limit = ingested_at + max_future

    def add(fields_: Mapping[str, Any], source_file: str, line_no: int, reason: str | None, raw: str | None) -> None:
        for name in ("event_id", "user_id", "event_time", "event_type", "page"):
            columns[name].append(fields_.get(name))
        columns["source_file"].append(source_file)
        columns["line_no"].append(line_no)
        columns["reject_reason"].append(reason)
        columns["raw"].append(raw)
        columns["line_key"].append(len(columns["line_key"]) + 1)

    for source in sources:
        if source.refused is not None:
            add({}, source.name, 0, source.refused, source.refused_raw)
        for line_no, raw_bytes in source.lines:
            classified = classify_line(raw_bytes, future_limit)
            if classified is not None:  # blank lines carry nothing to keep (they keep their numbers)
                fields_, reason, text = classified
                add(fields_, source.name, line_no, reason, text if reason else None)
    n = len(columns["line_key"])
    columns["ingest_seq"] = [seq] * n
    columns["ingested_at"] = [ingested_at] * n
    return pa.table(columns, schema=RAW_SCHEMA)


def latest_ingest_seq(table_uri: str, storage_options: dict[str, str] | None = None) -> int:
    """The newest ingest sequence number: the data files' statistics (max of ingest_seq) survive OPTIMIZE,
    VACUUM and log cleanup; the newest commits' metadata covers the rest."""
    if not DeltaTable.is_deltatable(table_uri, storage_options=storage_options):
        return 0
    return _latest_seq(DeltaTable(table_uri, storage_options=storage_options))


def _latest_seq(table: DeltaTable) -> int:
    adds = pa.table(table.get_add_actions(flatten=True))
    seq = int(pc.max(adds["max.ingest_seq"]).as_py() or 0) if adds.num_rows else 0
    for commit in table.history(limit=HISTORY_PAGE):
        if "ingest_seq" in commit:
            seq = max(seq, int(commit["ingest_seq"]))
    return seq


@dataclass(frozen=True)
class IngestResult:
    files: int           # files with lines ingested (a growing file counts at each ingest that read some)
    rows: int
    rejected: int
    first_seq: int | None
    last_seq: int
    refused: int = 0     # symlinks and special files moved to landing/_refused/
    waiting: int = 0     # files left in landing: still being written (or an unfinished last line)


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


def landed_files(config: SessionsConfig) -> list[LandedFile]:
    """The *.jsonl files directly in landing, oldest first (local directory or S3 prefix alike); locally only
    regular files (symlinks and special files are refused by ingest, never read)."""
    found = []
    if is_s3(config.landing_uri):
        fs, root = filesystem(config.landing_uri)
        if fs.get_file_info(root).type == pafs.FileType.NotFound:
            return []
        for info in fs.get_file_info(pafs.FileSelector(root, recursive=False)):
            if info.type == pafs.FileType.File and info.base_name.endswith(".jsonl"):
                found.append(LandedFile(info.base_name, info.size or 0, info.mtime_ns or 0, f"s3://{info.path}"))
    elif config.landing.is_dir():
        for path in config.landing.glob("*.jsonl"):
            try:
                local = path.lstat()
            except OSError:
                continue
            if stat.S_ISREG(local.st_mode):
                found.append(LandedFile(path.name, local.st_size, local.st_mtime_ns, str(path)))
    return sorted(found, key=lambda f: (f.mtime_ns, f.name))


def _today() -> str:
    return dt.datetime.now(dt.timezone.utc).date().isoformat()


def _move_target(config: SessionsConfig, name: str, refused: bool, taken: set[Path]) -> Path:
    target_dir = config.landing / (REFUSED_DIR if refused else INGESTED_DIR) / _today()
    target, n = target_dir / name, 1
    stem, suffix = os.path.splitext(name)
    while target.exists() or target.is_symlink() or target in taken:
        target, n = target_dir / f"{stem}.{n}{suffix}", n + 1
    taken.add(target)
    return target


def _prune(positions: Positions, landing: Path, now: float, seen: set[int]) -> None:
    """Forget files that left landing, and moved files quiet for longer than the watch."""
    for ino, known in list(positions.files.items()):
        if ino in seen:
            continue
        if not known.path.startswith(f"{INGESTED_DIR}/") or known.refused:
            del positions.files[ino]
            continue
        try:
            info = (landing / known.path).lstat()
        except OSError:
            del positions.files[ino]
            continue
        if info.st_ino != ino or now - info.st_mtime >= TAIL_WATCH_S:
            del positions.files[ino]


class _Appender:
    """Appends ingest commits to raw_events, each with the next ingest_seq."""

    def __init__(self, config: SessionsConfig, seq: int):
        self.config, self.uri = config, config.raw_events_table
        self.options = storage_options(config, self.uri)
        self.seq, self.rows, self.rejected = seq, 0, 0
        self.first_seq: int | None = None

    def append(self, sources: list[RowSource], metadata: dict[str, str]) -> None:
        self.seq += 1
        ingested_at = dt.datetime.now(dt.timezone.utc)
        batch = _rows(sources, self.seq, ingested_at, dt.timedelta(milliseconds=self.config.max_future_ms))
        if not is_s3(self.uri):
            os.makedirs(self.uri, exist_ok=True)
        write_deltalake(
            self.uri, batch, mode="append", storage_options=self.options,
            schema_mode="merge",  # tables written before line_key and ingested_at get the columns
            commit_properties=CommitProperties(custom_metadata={"ingest_seq": str(self.seq), **metadata}),
        )
        self.first_seq = self.seq if self.first_seq is None else self.first_seq
        self.rows += batch.num_rows
        self.rejected += batch.num_rows - batch["reject_reason"].null_count

    def table_id(self) -> str:
        return str(DeltaTable(self.uri, storage_options=self.options).metadata().id)


def ingest(config: SessionsConfig, files_per_commit: int = 16) -> IngestResult:
    """Append the new complete lines of every landed file to raw_events and move finished files to
    landing/_ingested/<UTC day>/ (see the module docstring).

    Crash-safe: each commit carries what it holds (local files: their positions; S3 objects: `name:size:mtime`); after
    a crash the positions are rolled forward from the commits, and an object already committed is only archived.
    """
    # Catch-up and run hold the job lease already; this one serialises direct callers (tests, benchmarks).
    with waiting_lease(config.lease_dir, "ingest", "ingest", config.lease_ttl_s):
        uri = config.raw_events_table
        options = storage_options(config, uri)
        table = DeltaTable(uri, storage_options=options) if DeltaTable.is_deltatable(uri, storage_options=options) else None
        appender = _Appender(config, _latest_seq(table) if table is not None else 0)
        if is_s3(config.landing_uri):  # every object listed is committed and archived (or this raised)
            files, refused, waiting = _ingest_objects(config, table, appender, max(1, files_per_commit)), 0, 0
        else:
            files, refused = _ingest_local(config, table, appender, max(1, files_per_commit))
            waiting = len(landed_files(config))
    return IngestResult(files, appender.rows, appender.rejected, appender.first_seq, appender.seq, refused, waiting)


def _ingest_local(config: SessionsConfig, table: DeltaTable | None, appender: _Appender, step: int) -> tuple[int, int]:
    """Local landing: new complete lines of landed and moved files; refusals; then positions, then moves."""
    positions = load_positions(config, table, appender.seq)
    loaded = positions.to_json()
    now = time.time()
    reads = _scan_landing(config, positions, now)
    seen = {read.position.ino for read in reads}
    reads += _scan_moved(config, positions, now, seen)
    seen |= {read.position.ino for read in reads}
    reads.sort(key=lambda read: (read.mtime_ns, read.position.name))
    pending = [read for read in reads if read.lines or read.refused_raw is not None]
    for start in range(0, len(pending), step):
        chunk = pending[start:start + step]
        appender.append([read.rows() for read in chunk],
                        {"file_positions": json.dumps([read.position.to_json() for read in chunk])})
    if pending and positions.table_id is None:
        positions.table_id = appender.table_id()
    positions.seq = appender.seq
    moves: list[tuple[Path, Path, FileRead]] = []
    taken: set[Path] = set()
    for read in reads:
        position = read.position
        if read.archive:
            target = _move_target(config, position.name, position.refused is not None, taken)
            position = replace(position, path=str(target.relative_to(config.landing)))
            moves.append((config.landing / read.position.path, target, read))
        positions.files[position.ino] = position
    _prune(positions, config.landing, now, seen)
    if positions.to_json() != loaded:
        _save_positions(config, positions)  # before the moves: a position always says where its file is going
    for source, target, read in moves:
        try:
            info = source.lstat()
        except OSError:
            continue
        if info.st_ino != read.position.ino or (read.position.refused is None and info.st_size != read.size):
            continue  # replaced or grown since the read: the next ingest looks again (the position is kept)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(source, target)  # the same filesystem: the inode (and a writer's handle) moves with it
    files = len({read.position.ino for read in pending if read.lines})
    return files, sum(1 for read in reads if read.refused_raw is not None)


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
    target_dir = f"{root}/{INGESTED_DIR}/{_today()}"
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


def _ingest_objects(config: SessionsConfig, table: DeltaTable | None, appender: _Appender, step: int) -> int:
    """S3 landing: every object whole (an object is complete when it appears: its last line needs no newline)."""
    already = _recent_identities(table)
    pending = []
    for file in landed_files(config):
        if file.identity in already or file.legacy_identity in already:
            _archive_object(config, file)
        else:
            pending.append(file)
    for start in range(0, len(pending), step):
        chunk = pending[start:start + step]
        sources = [RowSource(f.name, _split(_read_object(f), 0, False)[0]) for f in chunk]
        appender.append(sources, {"ingested_files": json.dumps([f.identity for f in chunk])})
        for file in chunk:
            _archive_object(config, file)
    return len(pending)
