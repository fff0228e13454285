"""What an auditor does after an erasure, as code: every file under every location the product writes, read for every
spelling of the user id -- and the Delta logs rewritten so that they spell it nowhere.

Reading (`scan`): Parquet files are decoded (every string value, nested ones too: a Delta checkpoint's statistics);
JSON documents and Delta commits line by line, decoded (a DELETE's predicate, statistics, a raw line's escapes);
landed `*.jsonl` lines by their decoded user_id; Spark's state store files decompressed first (StoreFiles: their raw
bytes hide most ids); anything else (leases, logs, offsets) as bytes (pipelines.ingest.erased.UserSpelling says what
counts as a mention). A file that cannot be read is named as unreadable, never passed as clean.

Rewriting (`scrub_delta_log`): a Delta DELETE records its predicate, and every add action the min/max statistics of
its file, in the table's log, which VACUUM never touches. Commits and checkpoints that name the user are rewritten in
place (atomically: a temporary file renamed over it; one PUT on S3) with the predicate replaced by "[erased]" and the
statistics that name the user dropped. Versions, actions and data files stay as they were, so time travel, the ingest
positions kept in commit metadata and both Delta engines read the table as before.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tempfile
import threading
import uuid
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipelines.ingest.erased import UserGroup, UserSpelling, text_tokens, value_tokens
from pipelines.storage import filesystem, is_s3
from state_store.audit_index import AuditIndex, may_name

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipelines.config import SessionsConfig
    from pipelines.job.store_file_text import StoreFileDecoder

__all__ = ["Findings", "StoreFiles", "Unreadable", "is_state_file", "mentions", "mentions_of", "scan", "scan_for",
           "scrub_delta_log", "token_texts"]

LOG_DIR = "_delta_log"
# Spark's state store files, version first (`12.delta`; checkpoint format v2 adds `_<unique id>`): the HDFS-backed
# provider's deltas and snapshots and RocksDB's changelogs (a compression codec's stream), RocksDB's snapshot zips
# (metadata and RocksDB's own small files) and its SST files (RocksDB's block format).
_STATE_STREAM = re.compile(r"^\d+(_[0-9a-f-]+)?\.(delta|snapshot|changelog)$")
_STATE_ZIP = re.compile(r"^\d+(_[0-9a-f-]+)?\.zip$")


class Unreadable(Exception):
    """A file an audit cannot read (so cannot say is free of the user)."""


class StoreFiles:
    """Spark's state store files as plain bytes, decoded by the libraries that wrote them (sessions.StoreFileText:
    Spark's compression codec by the stream's magic bytes, RocksDB's SST reader): in the driver's JVM where Spark
    runs, else -- given `config` -- in a JVM of their own with no Spark session (pipelines.job.store_file_text),
    which starts in a fraction of a session's time. `close` stops that JVM."""

    def __init__(self, spark: SparkSession | Callable[[], SparkSession] | None, *,
                 config: SessionsConfig | None = None) -> None:
        self._spark = spark  # a callable: Spark started when the live state is asked (or a file read without config)
        self._config = config
        self._decoder: StoreFileDecoder | None = None
        self._last: tuple[bytes, bytes] | None = None

    def __enter__(self) -> StoreFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def session(self) -> SparkSession | None:
        if callable(self._spark):
            self._spark = self._spark()
        return self._spark

    def plain(self, name: str, data: bytes) -> bytes:
        """The file's plain bytes; the last file's kept (the scan and the index read one file in turn)."""
        if self._last is not None and self._last[0] is data:
            return self._last[1]
        plain = self._decode(name, data)
        self._last = (data, plain)
        return plain

    def close(self) -> None:
        if self._decoder is not None:
            self._decoder.close()
            self._decoder = None

    def _decode(self, name: str, data: bytes) -> bytes:
        if self._config is not None and (self._spark is None or callable(self._spark)):
            from pipelines.job.store_file_text import StoreFileDecoder, StoreFileError  # a JVM: only when needed

            if self._decoder is None:
                self._decoder = StoreFileDecoder(self._config)
            try:
                return self._decoder.decode(name, data)
            except StoreFileError as error:
                raise Unreadable(str(error)) from None
        spark = self.session()
        if spark is None:
            raise Unreadable("a state store file is read through Spark, which this audit has not started")
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        # The JVM writes the plain bytes to a local file: py4j hands a returned byte array over a byte at a time.
        with tempfile.TemporaryDirectory(prefix="audit-") as work:
            out = os.path.join(work, "plain")
            try:
                text = jvm.sessions.StoreFileText
                if name.endswith(".sst"):
                    text.sstTo(bytearray(data), out)
                else:
                    text.streamTo(bytearray(data), spark.sparkContext._jsc.sc().conf(), out)
            except Exception as error:  # py4j's error, or the class missing (the operator's jar not built)
                from pipelines.job.runtime import error_line  # pyspark: never for a scan that reads no state file

                raise Unreadable(error_line(error)) from None
            with open(out, "rb") as handle:
                return handle.read()


@dataclass
class Findings:
    """Mentions of the user per file (relative to the scanned root), by kind of file, and the files that could not
    be read (relative path -> why)."""
    files: dict[str, int] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)

    def add(self, path: str, count: int) -> None:
        if count:
            self.files[path] = self.files.get(path, 0) + count

    def total(self) -> int:
        return sum(self.files.values())


def _file_infos(uri: str) -> Iterator[tuple[pafs.FileSystem, pafs.FileInfo]]:
    fs, root = filesystem(uri)
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    except (FileNotFoundError, NotADirectoryError):
        return
    for info in infos:
        if info.type == pafs.FileType.File:
            yield fs, info


def _files(uri: str) -> Iterator[tuple[pafs.FileSystem, str]]:
    for fs, info in _file_infos(uri):
        yield fs, info.path


def _read(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_stream(path) as handle:
        return bytes(handle.read())


_decoded = threading.local()  # the file being scanned, decoded once for the scan and the index (scan_for clears it)


def _parquet_table(data: bytes) -> pa.Table:
    last = getattr(_decoded, "parquet", None)
    if last is not None and last[0] is data:
        return last[1]
    _decoded.parquet = None  # the previous file's table goes before this one is decoded
    table = pq.read_table(pa.BufferReader(data))
    _decoded.parquet = (data, table)
    return table


def _holding_any(text: pa.Array | pa.ChunkedArray, needles: list[str]) -> pa.Array | pa.ChunkedArray:
    """Which strings hold any of `needles`: a literal search each (faster than a regex), one regex past eight."""
    needles = list(dict.fromkeys(needles))
    if len(needles) > 8:
        return pc.match_substring_regex(text, "|".join(re.escape(needle) for needle in needles))
    found = pc.match_substring(text, needles[0])
    for needle in needles[1:]:
        found = pc.or_(found, pc.match_substring(text, needle))
    return found


def _parquet_mentions(data: bytes, users: Sequence[UserSpelling], *, nested: bool) -> dict[str, int]:
    """Mentions of each user in one Parquet file, decoded once (its bytes, when it is not Parquet after all)."""
    try:
        table = _parquet_table(data)
    except Exception:  # noqa: BLE001 -- not Parquet after all (or damaged): judged by its bytes
        return {user.user_id: user.in_bytes(data) for user in users}
    found = dict.fromkeys((user.user_id for user in users), 0)
    for column in table.columns:
        kind = column.type
        if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
            # One pass for all users: the values that are a user's id or could spell one (an id inside, or an
            # escape), counted once each; then each such distinct value judged per user (UserSpelling.matching).
            text = pc.fill_null(column.cast(pa.string()), "")
            maybe = _holding_any(text, ["\\", *(form.decode() for user in users for form in user.byte_forms())])
            for item in pc.value_counts(pc.filter(text, maybe)).to_pylist():
                value, times = item["values"], item["counts"]
                for user in users:
                    if value == user.user_id or user.names(value):
                        found[user.user_id] += times
        elif nested and (pa.types.is_struct(kind) or pa.types.is_list(kind) or pa.types.is_map(kind)):
            values = [value for value in column.to_pylist() if value is not None]
            for user in users:
                found[user.user_id] += sum(1 for value in values if user.in_value(value))
    return found


def _json_lines_mentions(data: bytes, users: Sequence[UserSpelling]) -> dict[str, int]:
    found = dict.fromkeys((user.user_id for user in users), 0)
    for line in data.splitlines():
        if not line.strip():
            continue
        candidates = [user for user in users if user.could_be_in(line)]
        if not candidates:
            continue
        try:
            decoded = json.loads(line)
        except ValueError:
            text = line.decode("utf-8", "replace")
            for user in candidates:
                found[user.user_id] += int(user.names(text))
            continue
        for user in candidates:
            found[user.user_id] += int(user.in_value(decoded))
    return found


def _landed_mentions(data: bytes, users: Sequence[UserSpelling]) -> dict[str, int]:
    """Landed lines by their decoded user_id (UserGroup.line_user), each line that may name one decoded once."""
    group = UserGroup.of(user.user_id for user in users)
    found = dict.fromkeys((user.user_id for user in users), 0)
    for start, end in group.lines_to_read(data):
        line = data[start:end]
        named = group.line_user(line) if line.strip() else None
        if named is not None:
            found[named] += 1
    return found


def mentions(path: str, data: bytes, user: UserSpelling, *, store_files: StoreFiles | None = None) -> int:
    """How often one file (its path and bytes) names the user, read as its kind of file is read (Unreadable: a state
    store file that cannot be decoded)."""
    return mentions_of(path, data, [user], store_files=store_files)[user.user_id]


def mentions_of(path: str, data: bytes, users: Sequence[UserSpelling], *, store_files: StoreFiles | None = None
                ) -> dict[str, int]:
    """How often one file names each of `users` (user id -> mentions), the file read and decoded once as its kind of
    file is read (Unreadable: a state store file that cannot be decoded)."""
    name = path.rsplit("/", 1)[-1]
    none = dict.fromkeys((user.user_id for user in users), 0)
    if not data or not users:
        return none
    if _STATE_STREAM.match(name) or name.endswith(".sst"):
        plain = (store_files or StoreFiles(None)).plain(name, data)
        return {user.user_id: user.in_bytes(plain) for user in users}
    if _STATE_ZIP.match(name):
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                members = [(member, archive.read(member)) for member in archive.namelist()]
        except (zipfile.BadZipFile, OSError) as error:
            raise Unreadable(f"not a readable zip: {error}") from None
        for member, content in members:
            for user_id, count in mentions_of(f"{path}/{member}", content, users, store_files=store_files).items():
                none[user_id] += count
        return none
    if name.endswith(".parquet"):
        return _parquet_mentions(data, users, nested=f"/{LOG_DIR}/" in path)
    if name.endswith(".jsonl"):
        return _landed_mentions(data, users)
    candidates = [user for user in users if user.could_be_in(data)]
    if not candidates:
        return none
    if f"/{LOG_DIR}/" in path and (name.endswith(".json") or name.endswith(".crc")):
        return {**none, **_json_lines_mentions(data, candidates)}
    return {**none, **{user.user_id: user.in_bytes(data) for user in candidates}}


def is_state_file(path: str) -> bool:
    """Whether a file is one of Spark's state store files (read decoded, through the JVM)."""
    name = path.rsplit("/", 1)[-1]
    return bool(_STATE_STREAM.match(name) or _STATE_ZIP.match(name)) or name.endswith(".sst")


def token_texts(path: str, data: bytes, *, store_files: StoreFiles | None = None) -> list[bytes]:
    """Texts whose runs of id bytes are the tokens by which one file can name a user, read as mentions_of reads it:
    whenever mentions_of finds U in it, every run of one of U's spellings is a run of these texts
    (UserSpelling.pieces). For the audit's index."""
    name = path.rsplit("/", 1)[-1]
    if _STATE_STREAM.match(name) or name.endswith(".sst"):
        return [(store_files or StoreFiles(None)).plain(name, data)]
    if _STATE_ZIP.match(name):
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                return [text for member in archive.namelist()
                        for text in token_texts(f"{path}/{member}", archive.read(member), store_files=store_files)]
        except (zipfile.BadZipFile, OSError) as error:
            raise Unreadable(f"not a readable zip: {error}") from None
    if name.endswith(".parquet"):
        # Its values as _parquet_mentions reads them; its bytes where they are not Parquet after all (then read so)
        return _parquet_texts(data) or [data]
    decoded: set[bytes] = {b"0"} if b"-0" in data else set()  # JSON's -0 is the integer 0
    if b"\\" in data or b"''" in data or not data.isascii():
        # JSON lines (landed, Delta commits) and any text: a line that decodes to other bytes than its own (an escape,
        # a doubled quote, another encoding) decoded as UserGroup.line_user and UserSpelling.names decode it.
        for line in data.split(b"\n"):
            if b"\\" in line or b"''" in line or not line.isascii():
                with contextlib.suppress(ValueError, RecursionError):
                    value_tokens(json.loads(line), decoded)
                text_tokens(line.decode("utf-8", "replace"), decoded)
    return [data, b"\n".join(decoded)]


def _parquet_texts(data: bytes) -> list[bytes]:
    """Parquet's string values as _parquet_mentions reads them (nested ones decoded); none where `data` is not
    Parquet."""
    try:
        table = _parquet_table(data)
    except Exception:  # noqa: BLE001 -- not Parquet after all: its bytes are read as they are
        return []
    texts: list[bytes] = []
    decoded: set[bytes] = set()
    for column in table.columns:
        kind = column.type
        if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
            values = pc.fill_null(column.cast(pa.large_string()), "").combine_chunks()
            texts.append(_joined(values))
            if b"\\" in texts[-1] or b"''" in texts[-1]:  # the lines keep each value apart: '\n' + "'" is not "''"
                for value in pc.unique(pc.filter(values, _holding_any(values, ["\\", "''"]))).to_pylist():
                    text_tokens(value, decoded)
        elif pa.types.is_struct(kind) or pa.types.is_list(kind) or pa.types.is_map(kind):
            for value in column.to_pylist():
                value_tokens(value, decoded)
    return [*texts, b"0" if any(b"-0" in text for text in texts) else b"", b"\n".join(decoded)]


def _joined(values: pa.LargeStringArray) -> bytes:
    """The values, one per line, in Arrow (no Python string each); each once where a sample of them repeats (a
    column of a few distinct values), all of them where most are distinct (finding the distinct ones costs more
    than hashing the repeats)."""
    sample = values.slice(0, 1 << 16)
    if len(pc.unique(sample)) * 4 < len(sample):
        values = pc.unique(values)
    listed = pa.LargeListArray.from_arrays(pa.array([0, len(values)], pa.int64()), values)
    return pc.binary_join(listed, pa.scalar("\n", pa.large_string()))[0].as_buffer().to_pybytes()


def scan(uri: str, user: UserSpelling, *, seen: set[str] | None = None, store_files: StoreFiles | None = None
         ) -> Findings:
    """Every file under `uri`, read for the user (`seen`: paths read already under another root, skipped;
    `store_files`: how Spark's state store files are decoded -- without it they are unreadable)."""
    return scan_for(uri, [user], seen=seen, store_files=store_files)[user.user_id]


def scan_for(uri: str, users: Sequence[UserSpelling], *, seen: set[str] | None = None,
             store_files: StoreFiles | None = None, index: AuditIndex | None = None) -> dict[str, Findings]:
    """Every file under `uri`, read once for all of `users` (user id -> findings; a file that cannot be read is
    unreadable for each of them). `seen` and `store_files` as for `scan`. With `index`, a file its entry says names
    none of them is not read, and a large file read in full gets an entry (state_store.audit_index); the index's own
    files are not read."""
    findings = {user.user_id: Findings() for user in users}
    _, root = filesystem(uri)
    for fs, info in _file_infos(uri):
        path = info.path
        if index is not None and path.startswith(str(index.root) + "/"):
            continue
        if seen is not None:
            if path in seen:
                continue
            seen.add(path)
        relative = os.path.relpath(path, root) if not is_s3(uri) else path[len(root):].lstrip("/")
        bloom = index.lookup(path, info, any_size=is_state_file(path)) if index is not None else None
        if index is not None and bloom is not None and not any(may_name(bloom, user) for user in users):
            index.skipped += 1
            continue
        try:
            data = _read(fs, path)
            for user_id, count in mentions_of(path, data, users, store_files=store_files).items():
                findings[user_id].add(relative, count)
            if index is not None and bloom is None and index.covers(path, info, any_size=is_state_file(path)):
                index.add(path, info, token_texts(path, data, store_files=store_files))
        except Unreadable as why:
            for found in findings.values():
                found.unreadable[relative] = str(why)
        finally:
            _decoded.parquet = None  # not kept past its file
    return findings


def _write_atomically(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    if isinstance(fs, pafs.LocalFileSystem):
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    else:  # an object store: one PUT replaces the object whole
        with fs.open_output_stream(path) as handle:
            handle.write(data)


def _scrub_commit(data: bytes, users: list[UserSpelling]) -> bytes | None:
    lines, changed = [], False
    for line in data.split(b"\n"):
        if line.strip() and any(u.could_be_in(line) for u in users):
            action = json.loads(line)
            for user in users:
                action, touched = user.scrub(action)
                changed = changed or touched
            line = json.dumps(action, separators=(",", ":"), ensure_ascii=False).encode()
        lines.append(line)
    return b"\n".join(lines) if changed else None


def _scrub_checkpoint(data: bytes, users: list[UserSpelling]) -> bytes | None:
    table = pq.read_table(pa.BufferReader(data))
    rows, changed = table.to_pylist(), False
    for i, row in enumerate(rows):
        for user in users:
            row, touched = user.scrub(row)
            changed = changed or touched
        rows[i] = row
    if not changed:
        return None
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), sink)
    return sink.getvalue().to_pybytes()


def scrub_delta_log(uri: str, user_ids: list[str]) -> int:
    """Rewrite the commits and checkpoints of one Delta table's log that name any of `user_ids`; the files
    rewritten."""
    users = [UserSpelling(u) for u in user_ids]
    rewritten = 0
    sizes: dict[str, int] = {}
    fs, root = filesystem(uri)
    for _, path in _files(f"{uri.rstrip('/')}/{LOG_DIR}"):
        name = path.rsplit("/", 1)[-1]
        if not (name.endswith(".json") or name.endswith(".checkpoint.parquet") or ".checkpoint." in name):
            continue
        data = _read(fs, path)
        if name.endswith(".json"):
            if not any(u.could_be_in(data) for u in users):
                continue
            cleaned = _scrub_commit(data, users)
        elif name.endswith(".parquet"):
            if not any(_parquet_mentions(data, users, nested=True).values()):
                continue
            cleaned = _scrub_checkpoint(data, users)
        else:
            continue
        if cleaned is not None:
            _write_atomically(fs, path, cleaned)
            sizes[name] = len(cleaned)
            rewritten += 1
    _fix_last_checkpoint(fs, f"{root.rstrip('/')}/{LOG_DIR}/_last_checkpoint", sizes)
    return rewritten


def _fix_last_checkpoint(fs: pafs.FileSystem, path: str, sizes: dict[str, int]) -> None:
    """_last_checkpoint records the size of its checkpoint file: kept true for a rewritten one."""
    if not any(".checkpoint." in name for name in sizes):
        return
    try:
        last = json.loads(_read(fs, path))
    except (OSError, FileNotFoundError, ValueError):
        return
    name = f"{int(last.get('version', -1)):020d}.checkpoint.parquet"
    if name in sizes and "sizeInBytes" in last:
        last["sizeInBytes"] = sizes[name]
        _write_atomically(fs, path, json.dumps(last, separators=(",", ":")).encode())
