"""The audit's index: for each large file `forget --verify` has read, a Bloom filter of the runs of id bytes by which it
can name a user (state_store.audit.token_texts), so that a later verify reads only the files that may hold the user, not the
whole warehouse.

An entry belongs to one file as it was: its path, size and modification time name the entry, so a file rewritten,
appended to or replaced has none and is read in full (then indexed again). A Bloom filter answers "maybe" or "no",
never a wrong "no": a file is skipped only when, for every spelling of the user, one of its runs of id bytes is not in
the filter -- which cannot be if the file names the user (pipelines.ingest.erased.UserSpelling.pieces). Entries are
files of hex digits only, in $SESSIONS_HOME/audit-index: no byte of any user, and the scan skips them (`--full` reads
them too). A home that cannot be written keeps no index; verify then reads everything, as before.
"""
from __future__ import annotations

import functools
import hashlib
import os
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs

from pipelines.ingest.erased import ID_BYTES, UserSpelling, is_id_byte

__all__ = ["INDEX_DIR", "MIN_BYTES", "AuditIndex", "Bloom"]

INDEX_DIR = "audit-index"
MIN_BYTES = 256 * 1024   # smaller files are read every time: an entry would save little and a listing costs the same
_FORMAT = "bloom-v2"  # in every entry's name: entries of another hashing are never read, and are deleted
_HASHES = 5               # with 10 to 20 bits a run: 1% to 0.1% false "maybe" per run
_BITS_PER_TOKEN = 10
_CHUNK = 1 << 20          # bytes tokenized at once (the arrays are a few times this)
_BASE = 0x100000001B3     # odd: invertible modulo 2**64
_UNBASE = pow(_BASE, -1, 1 << 64)
# Each byte's value in a run's polynomial (its value + 1), 0 for the bytes between runs: one lookup gives both.
_VALUES = np.where(ID_BYTES, np.arange(1, 257, dtype=np.uint64), np.uint64(0))


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every bit of a polynomial hash spread over the word."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _run_hashes(data: bytes) -> np.ndarray:
    """A 64-bit hash of each run of id bytes in `data` (the runs of pipelines.ingest.erased.id_tokens), found and hashed
    by numpy rather than as one Python object per token; a run found twice is there twice."""
    found = [np.empty(0, dtype=np.uint64)]
    start = 0
    while start < len(data):
        end = min(len(data), start + _CHUNK)
        while end < len(data) and is_id_byte(data[end]):  # a chunk ends between two runs
            end += 1
        found.append(_chunk_hashes(np.frombuffer(data, dtype=np.uint8, count=end - start, offset=start)))
        start = end
    return np.concatenate(found)


@functools.lru_cache(maxsize=8)
def _powers(base: int, count: int) -> np.ndarray:
    """base**0 .. base**(count-1) modulo 2**64, by doubling (numpy's cumprod is slow on uint64); the last few kept."""
    out = np.ones(max(count, 1), dtype=np.uint64)
    filled = 1
    with np.errstate(over="ignore"):
        while filled < count:
            more = min(filled, count - filled)
            out[filled:filled + more] = out[:more] * np.uint64(pow(base, filled, 1 << 64))
            filled += more
    out.flags.writeable = False
    return out[:count]


def _powers_for(base: int, count: int) -> np.ndarray:
    # A chunk runs on past _CHUNK to the end of its last run: a few bytes, or a long run's length (then computed).
    return _powers(base, 2 * _CHUNK)[:count] if count <= 2 * _CHUNK else _powers(base, count)


def _chunk_hashes(chunk: np.ndarray) -> np.ndarray:
    values = _VALUES[chunk]
    edges = np.diff((values != 0).view(np.int8), prepend=np.int8(0), append=np.int8(0))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    if not len(starts):
        return np.empty(0, dtype=np.uint64)
    with np.errstate(over="ignore"):  # arithmetic modulo 2**64 is the point
        # sum(v_i * base**i) over a run, times base**-start: sum(v_i * base**(i - start)), its polynomial
        values *= _powers_for(_BASE, len(chunk))
        sums = np.add.reduceat(values, starts)  # 0 between runs: each sum is its run's alone
        return _mix(sums * _powers_for(_UNBASE, len(chunk))[starts] ^ (ends - starts).astype(np.uint64))


def _distinct(hashes: np.ndarray) -> int:
    """How many distinct runs: counted, or past a million runs estimated from the 1/64 whose hash starts with six
    zero bits (a sample of the distinct runs, by value). A low estimate costs only false "maybe"s."""
    if len(hashes) < 1 << 20:
        return len(np.unique(hashes))
    return 64 * len(np.unique(hashes[hashes >> np.uint64(58) == 0]))


@dataclass(frozen=True)
class Bloom:
    """A Bloom filter over runs of id bytes: `_HASHES` positions per run from the two halves of its hash (double
    hashing)."""
    bits: np.ndarray  # uint8, little bit order

    @classmethod
    def of(cls, texts: Iterable[bytes]) -> Bloom:
        """The filter of every run of id bytes in `texts`."""
        hashes = np.concatenate([np.empty(0, dtype=np.uint64), *map(_run_hashes, texts)])
        # Sized by the distinct runs, a power of two (positions by a mask): 10 to 20 bits a run.
        size = 1 << min(32, max(10, (_BITS_PER_TOKEN * _distinct(hashes) - 1).bit_length()))
        marks = np.zeros(size, dtype=bool)
        for positions in cls._positions(hashes, size):
            marks[positions] = True
        return cls(np.packbits(marks, bitorder="little"))

    @staticmethod
    def _positions(hashes: np.ndarray, size: int) -> Iterator[np.ndarray]:
        """The runs' k-th positions, for each k: one pass each (faster than all at once, whose arrays are k times
        larger)."""
        # size: a power of two up to 2**32, so arithmetic modulo 2**32 then the mask is arithmetic modulo size
        mask = np.uint32(size - 1)
        at = hashes.astype(np.uint32)
        step = (hashes >> np.uint64(32)).astype(np.uint32) | np.uint32(1)
        with np.errstate(over="ignore"):
            for _ in range(_HASHES):
                yield at & mask
                at += step

    def may_hold(self, runs: Iterable[bytes]) -> bool:
        """False only if one of `runs` (each a run of id bytes) was never added."""
        hashes = _run_hashes(b"\n".join(runs))
        if not len(hashes):
            return True
        return all(bool(np.all((self.bits[at >> np.uint32(3)] >> (at & np.uint32(7)).astype(np.uint8)) & 1))
                   for at in self._positions(hashes, len(self.bits) * 8))

    def hex(self) -> bytes:
        return self.bits.tobytes().hex().encode()

    @classmethod
    def from_hex(cls, data: bytes) -> Bloom:
        return cls(np.frombuffer(bytes.fromhex(data.decode("ascii")), dtype=np.uint8))


def may_name(bloom: Bloom, user: UserSpelling) -> bool:
    """Whether a file whose tokens are `bloom` may name the user: some spelling has all its runs there."""
    return any(bloom.may_hold(pieces) for pieces in user.pieces())


class AuditIndex:
    """The entries of one home's index: looked up by a file's identity, added for files read in full (written by the
    time `close` or `finish` returns: `with AuditIndex(home) as index`), and the ones no current file has dropped at
    the end (`finish`)."""

    def __init__(self, home: Path, *, min_bytes: int = MIN_BYTES) -> None:
        self.root = home / INDEX_DIR
        self.min_bytes = min_bytes
        self.skipped = 0  # files not read: their entry says no user of the scan can be in them
        self._used: set[str] = set()
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None  # the entry being written: one at a time
        try:
            self._names = {entry.name for entry in os.scandir(self.root)}
        except OSError:
            self._names = set()

    @staticmethod
    def _name(path: str, info: pafs.FileInfo) -> str | None:
        if info.size is None or info.mtime_ns is None:
            return None  # no identity to trust: read every time
        return hashlib.sha256(f"{_FORMAT}\0{path}\0{info.size}\0{info.mtime_ns}".encode()).hexdigest()[:40]

    def covers(self, path: str, info: pafs.FileInfo, *, any_size: bool = False) -> bool:
        """Whether the file has (or gets) an entry: a large one, or any size with `any_size` (Spark's state files,
        whose reading starts a JVM)."""
        return (any_size or (info.size or 0) >= self.min_bytes) and self._name(path, info) is not None

    def lookup(self, path: str, info: pafs.FileInfo, *, any_size: bool = False) -> Bloom | None:
        name = self._name(path, info) if self.covers(path, info, any_size=any_size) else None
        if name is None or name not in self._names:
            return None
        try:
            bloom = Bloom.from_hex((self.root / name).read_bytes())
        except (OSError, ValueError):
            return None  # damaged or going: read the file
        self._used.add(name)
        return bloom

    def add(self, path: str, info: pafs.FileInfo, texts: list[bytes]) -> None:
        """The entry of a file just read in full (not kept when the home cannot be written), made in a thread of its
        own while the scan reads on (numpy's hashing leaves the interpreter free); at most one file's behind."""
        name = self._name(path, info)
        if name is None:
            return
        self._used.add(name)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-index")
        self._wait()
        self._pending = self._pool.submit(self._write, name, texts)

    def _write(self, name: str, texts: list[bytes]) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = self.root / f".{name}.{uuid.uuid4().hex}.tmp"
            tmp.write_bytes(Bloom.of(texts).hex())
            os.replace(tmp, self.root / name)
        except OSError:
            return
        self._names.add(name)

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Every entry added, written (or not kept); the thread gone."""
        try:
            self._wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None

    def __enter__(self) -> AuditIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def finish(self) -> None:
        """Every entry added, written; then the entries of files that are gone or changed (none of this scan's files
        had them) dropped."""
        self.close()
        for name in self._names - self._used:
            try:
                (self.root / name).unlink()
            except OSError:
                continue
