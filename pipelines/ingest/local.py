"""The local landing directory as a source: tail-reading landed files, refusals, moves to _ingested/ and _refused/.

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
"""
from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import BinaryIO

from deltalake import DeltaTable

from pipelines.config import SessionsConfig
from pipelines.ingest.appender import Appender, Ingested
from pipelines.ingest.lines import Lines, is_json_object, split_lines
from pipelines.ingest.positions import (
    HEAD_BYTES,
    INGESTED_DIR,
    REFUSED_DIR,
    FilePosition,
    LandedFile,
    Positions,
    archive_day,
    digest,
    load_positions,
    save_positions,
)
from pipelines.ingest.table import (
    LargeInput,
    ParsedSpan,
    RowSource,
    Span,
    open_raw_table,
    span_from,
)

__all__ = ["ingest"]

NO_LINES = Lines.from_pairs([])
TAIL_WATCH_S = 3600             # a moved file is watched for appended lines this long after its last change
# A file is read at most this much at a time (cut at a line's end; a longer line is read whole): a larger one is
# ingested in several commits, so ingest's memory is bounded by this, not by the size of the largest landed file.
READ_CHUNK_BYTES = 32 * 1024 * 1024
# A file's final newline is looked for this far back from its end when its lines go to Spark tasks (a Span): a
# longer last line than that (past MAX_LINE_BYTES: quarantined anyway) is read here instead.
TAIL_SCAN_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class FileRead:
    """What one ingest read from one file (or refused to read)."""
    position: FilePosition            # after this read
    mtime_ns: int
    size: int
    lines: Lines                      # the complete lines read
    continued: bool                   # read on from a known position (not a file seen for the first time)
    archive: bool                     # in landing, read to the end, unchanged during the read: move it
    refused_raw: str | None = None    # what a refused entry is (for its quarantine row)
    more: bool = False                # stopped at READ_CHUNK_BYTES: the rest is read by the next round
    span: Span | None = None          # the lines are Spark tasks' to read (position.lines: known once they did)

    def rows(self) -> RowSource:
        return RowSource(self.position.name, self.lines,
                         self.position.refused if self.refused_raw is not None else None, self.refused_raw)


def read_file(landing: Path, rel: str, known: FilePosition | None, now: float, settle_s: float,
              span_from: int | None = None) -> FileRead | None:
    """Read a regular file's new complete lines, at most READ_CHUNK_BYTES of them (see the module docstring); None
    when it is gone or not a regular file any more. With at least `span_from` new bytes, only their end is read
    here: the complete lines are a Span for Spark tasks."""
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
                     and known.bytes <= before.st_size and digest(head[:known.head_len]) == known.head)
        if known is None or not continued:
            known = FilePosition(ino=before.st_ino, name=Path(rel).name, path=rel)
        remaining = before.st_size - known.bytes
        if span_from is not None and remaining >= span_from:
            planned = _span(landing, rel, handle, known, head, continued, before, now, settle_s)
            if planned is not None:
                return planned
        handle.seek(known.bytes)
        data = handle.read(min(remaining, READ_CHUNK_BYTES))
        while len(data) < remaining and b"\n" not in data:  # a line longer than a chunk: read on to its end
            data += handle.read(min(remaining - len(data), READ_CHUNK_BYTES))
        more = len(data) < remaining
        after = os.fstat(fd)
    unchanged = (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    body = data[:data.rfind(b"\n") + 1]
    tail = data[len(body):]
    quiet = now - before.st_mtime_ns / 1e9 >= settle_s
    if tail and unchanged and not more and (quiet or is_json_object(tail)):
        body = data  # the final line is complete: a whole object, or nothing was added to it for settle_s
    lines, consumed_lines, open_line = split_lines(body, known.lines, known.open_line)
    consumed = known.bytes + len(body)
    position = replace(known, path=rel, bytes=consumed, lines=consumed_lines, open_line=open_line,
                       head=digest(head[:min(HEAD_BYTES, consumed)]), head_len=min(HEAD_BYTES, consumed))
    in_landing = not rel.startswith(f"{INGESTED_DIR}/")
    return FileRead(position, before.st_mtime_ns, after.st_size, lines, continued,
                    archive=in_landing and unchanged and consumed == after.st_size, more=more)


def _span(landing: Path, rel: str, handle: BinaryIO, known: FilePosition, head: bytes, continued: bool,
          before: os.stat_result, now: float, settle_s: float) -> FileRead | None:
    """read_file's plan for Spark tasks: the body's end found from the file's end (its last newline, or the end
    itself when the final line is complete by read_file's rule); None when no newline is within TAIL_SCAN_BYTES."""
    end = before.st_size
    scanned, last_newline = end, -1
    while scanned > known.bytes and end - scanned < TAIL_SCAN_BYTES and last_newline < 0:
        step = min(1 << 20, scanned - known.bytes)
        handle.seek(scanned - step)
        block = handle.read(step)
        scanned -= step
        if (at := block.rfind(b"\n")) >= 0:
            last_newline = scanned + at
    if last_newline < 0:
        return None
    handle.seek(last_newline + 1)
    tail = handle.read(end - last_newline - 1)
    after = os.fstat(handle.fileno())
    unchanged = (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    quiet = now - before.st_mtime_ns / 1e9 >= settle_s
    complete = bool(tail) and unchanged and (quiet or is_json_object(tail))
    consumed = end if complete else last_newline + 1
    span = Span(Path(rel).name, str(landing / rel), known.bytes, consumed, known.lines, known.open_line)
    position = replace(known, path=rel, bytes=consumed, open_line=complete,
                       head=digest(head[:min(HEAD_BYTES, consumed)]), head_len=min(HEAD_BYTES, consumed))
    in_landing = not rel.startswith(f"{INGESTED_DIR}/")
    return FileRead(position, before.st_mtime_ns, after.st_size, NO_LINES, continued,
                    archive=in_landing and unchanged and consumed == after.st_size, span=span)


def _scan_landing(config: SessionsConfig, positions: Positions, now: float,
                  span_from: int | None = None) -> list[FileRead]:
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
                reads.append(FileRead(replace(known, path=entry.name), info.st_mtime_ns, 0, NO_LINES, True, archive=True))
            else:
                what = (f"symlink to {os.readlink(entry.path)}" if stat.S_ISLNK(info.st_mode)
                        else f"not a regular file (mode {stat.filemode(info.st_mode)})")
                position = FilePosition(ino=info.st_ino, name=entry.name, path=entry.name, refused=reason)
                reads.append(FileRead(position, info.st_mtime_ns, 0, NO_LINES, False, archive=True, refused_raw=what))
            continue
        read = read_file(landing, entry.name, known, now, config.ingest_settle_seconds, span_from)
        if read is not None:
            reads.append(read)
    return reads


def _scan_moved(config: SessionsConfig, positions: Positions, now: float, seen: set[int],
                span_from: int | None = None) -> list[FileRead]:
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
        read = read_file(config.landing, known.path, known, now, config.ingest_settle_seconds, span_from)
        if read is not None and read.continued:
            reads.append(read)
    return reads


def landed_files(config: SessionsConfig) -> list[LandedFile]:
    """The regular *.jsonl files directly in landing, oldest first (symlinks and special files are refused by
    ingest, never read)."""
    found = []
    if config.landing.is_dir():
        for path in config.landing.glob("*.jsonl"):
            try:
                local = path.lstat()
            except OSError:
                continue
            if stat.S_ISREG(local.st_mode):
                found.append(LandedFile(path.name, local.st_size, local.st_mtime_ns, str(path)))
    return sorted(found, key=lambda f: (f.mtime_ns, f.name))


def _move_target(config: SessionsConfig, name: str, refused: bool, taken: set[Path]) -> Path:
    target_dir = config.landing / (REFUSED_DIR if refused else INGESTED_DIR) / archive_day()
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


def ingest(config: SessionsConfig, table: DeltaTable | None, appender: Appender, step: int,
           large: LargeInput = "read") -> Ingested:
    """New complete lines of landed and moved files; refusals; then positions, then moves -- in rounds while a file
    has more than READ_CHUNK_BYTES to read, each round's commits and positions as crash-safe as a whole ingest's.
    A file with at least SESSIONS_INGEST_TASK_MIB new bytes is what `large` says (pipelines.ingest.ingest)."""
    read_from: set[int] = set()
    refused = by_tasks = 0
    while True:
        found, more = _round(config, table, appender, step, read_from, large)
        refused += found.refused
        by_tasks += found.by_tasks
        if not more:
            return Ingested(len(read_from), refused, found.waiting, found.deferred, by_tasks)
        table = open_raw_table(config)  # the round committed: its positions are at the table's newest seq


def _round(config: SessionsConfig, table: DeltaTable | None, appender: Appender, step: int,
           read_from: set[int], large: LargeInput) -> tuple[Ingested, bool]:
    """One scan of landing: its reads committed, positions saved, finished files moved; whether a read stopped short
    of a file's end (`more`). The inodes of files with lines read are added to `read_from`."""
    positions = load_positions(config, table, appender.seq)
    loaded = positions.to_json()
    now = time.time()
    large_from = span_from(config, table, large)
    reads = _scan_landing(config, positions, now, large_from)
    seen = {read.position.ino for read in reads}
    reads += _scan_moved(config, positions, now, seen, large_from)
    seen |= {read.position.ino for read in reads}
    reads.sort(key=lambda read: (read.mtime_ns, read.position.name))
    deferred = 0
    if large == "defer" and (cut := next((k for k, read in enumerate(reads) if read.span), None)) is not None:
        # Left with every later file, in order: their events must not reach the stream before the large file's.
        deferred = len(reads) - cut
        reads = reads[:cut]
    reads = _commit_reads(reads, appender, step, large)
    if any(read.lines or read.refused_raw is not None or read.span for read in reads) and positions.table_id is None:
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
        save_positions(config, positions)  # before the moves: a position always says where its file is going
    for source, target, read in moves:
        try:
            info = source.lstat()
        except OSError:
            continue
        if info.st_ino != read.position.ino or (read.position.refused is None and info.st_size != read.size):
            continue  # replaced or grown since the read: the next ingest looks again (the position is kept)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(source, target)  # the same filesystem: the inode (and a writer's handle) moves with it
    read_from |= {read.position.ino for read in reads if read.lines or read.span}
    refused = sum(1 for read in reads if read.refused_raw is not None)
    more = any(read.more for read in reads)
    by_tasks = sum(1 for read in reads if read.span)
    waiting = 0 if more else len(landed_files(config))
    return Ingested(len(read_from), refused, waiting, deferred, by_tasks), more


def _commit_reads(reads: list[FileRead], appender: Appender, step: int, large: LargeInput) -> list[FileRead]:
    """The reads with something to commit, committed in order: up to `step` files read here per commit, a Span in a
    commit of its own (its tasks key its rows by line number, unique in one file only). Returns the reads, a Span's
    position completed by the lines its tasks found."""
    done: list[FileRead] = []
    chunk: list[FileRead] = []

    def flush() -> None:
        if chunk:
            appender.append([read.rows() for read in chunk],
                            {"file_positions": json.dumps([read.position.to_json() for read in chunk])})
            chunk.clear()

    for read in reads:
        if read.span is not None and not isinstance(large, str):
            flush()
            read = _spanned(read, appender.append_by_tasks(partial(large, read.span), partial(_span_metadata, read)))
        elif read.lines or read.refused_raw is not None:
            chunk.append(read)
            if len(chunk) == step:
                flush()
        done.append(read)
    flush()
    return done


def _span_metadata(read: FileRead, parsed: ParsedSpan) -> dict[str, str]:
    return {"file_positions": json.dumps([_spanned(read, parsed).position.to_json()])}


def _spanned(read: FileRead, parsed: ParsedSpan) -> FileRead:
    return replace(read, position=replace(read.position, lines=parsed.lines))
