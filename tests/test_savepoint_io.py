"""Savepoints written, verified and read by the executors (state_store.savepoint.files), checked against what the driver
computes on its own from the same rows -- state_checksum of the rows read by delta-rs in this process, or of the
state read through Spark's state data source into this process -- and against the oracle's open sessions."""
from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from pipelines.core import state_format
from pipelines.core.sample_data import land
from pipelines.errors import SavepointFailed
from pipelines.ingest import ingest
from pipelines.job.stream import catch_up
from state_store.lifecycle import take_savepoint, validate_savepoint
from state_store.savepoint import chain
from state_store.savepoint import files as io
from state_store.savepoint import stats as savepoint_stats
from state_store.savepoint import take as savepointing
from state_store.savepoint.catalog import SavepointStore
from state_store.savepoint.checksum import combine_checksum, partial_checksum, signed, state_checksum
from state_store.savepoint.checksum import frame_checksum as io_checksum
from state_store.state import read_state
from testkit.lifecycle_expectations import live_state
from testkit.oracle import run_oracle
from tests.kit.datagen import in_order_chunks
from tests.kit.homes import make_config
from tests.kit.tables import iso_ms, open_sessions_of

pytestmark = pytest.mark.tier("spark")

GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000
UTC_US = pa.timestamp("us", tz="UTC")


def _canonical_rows(n: int, seed: int) -> pa.Table:
    rng = random.Random(seed)
    start = 1_790_000_000_000_000
    return pa.table({
        "user_id": [f"u{rng.randrange(50)}" + "é" * rng.randrange(3) for _ in range(n)],
        "session_start": pa.array([start + rng.randrange(10**9) for _ in range(n)], UTC_US),
        "event_id": [None if rng.random() < 0.2 else f"e{i}" for i in range(n)],
        "event_time": pa.array([start + rng.randrange(10**10) for _ in range(n)], UTC_US),
        "event_type": [rng.choice(["page_view", "click", "logout", None]) for _ in range(n)],
        "event_count": [rng.randrange(1, 9) for _ in range(n)],
        "page_views": [rng.randrange(0, 9) for _ in range(n)],
    }, schema=state_format.CANONICAL_SCHEMA)


# ---- pure: the checksum's shares --------------------------------------------------------------------

def _known_rows() -> tuple[pa.Table, pa.Table]:
    """Canonical and v1 rows whose checksums were recorded before the executors' checksum existed."""
    rows = pa.table({"user_id": ["u1", "u2", "ü3"],
                     "session_start": pa.array([1_700_000_000_123_456, 1_700_000_001_000_000, 5], UTC_US),
                     "event_id": [None, "e2", "e3"],
                     "event_time": pa.array([1_700_000_000_123_456, None, 7], UTC_US),
                     "event_type": ["a", None, "logout"], "event_count": [1, 2, 3], "page_views": [0, 1, None]},
                    schema=state_format.CANONICAL_SCHEMA)
    v1 = pa.table({"user_id": ["u1", "u2"], "event_id": ["a", "b"], "event_time": pa.array([1, 2], UTC_US),
                   "event_type": [None, "x"]}, schema=state_format.V1_SCHEMA)
    return rows, v1


@pytest.mark.tier("pure")
def test_checksums_of_existing_savepoints_are_unchanged():
    """Values computed with the driver-only implementation before the executors' checksum existed (git HEAD
    2d037ae's state_checksum): catalog rows written then must still verify."""
    rows, v1 = _known_rows()
    assert state_checksum(rows) == "siphash64:3:c7c38eb32ee540a7"
    assert state_checksum(v1) == "siphash64:2:75eab36e8fdfe9a2"
    assert state_checksum(rows.slice(0, 0)) == "siphash64:0:0000000000000000"


@pytest.mark.tier("pure")
def test_partial_checksums_of_any_split_combine_to_the_whole():
    rows = _canonical_rows(5000, seed=3)
    whole = state_checksum(rows)
    rng = random.Random(5)
    for _ in range(5):
        order = rows.take(pa.array(rng.sample(range(rows.num_rows), rows.num_rows)))
        cuts = sorted(rng.sample(range(1, rows.num_rows), 7))
        shares = [order.slice(a, b - a) for a, b in zip([0, *cuts], [*cuts, rows.num_rows])]
        parts = [partial_checksum(share) for share in shares] + [partial_checksum(rows.slice(0, 0))]
        assert combine_checksum(parts) == whole
        # as Spark carries them: signed longs
        assert combine_checksum((n, signed(s)) for n, s in parts) == whole
        assert combine_checksum(parts[1:]) != whole


# SipHash-2-4 as the paper specifies it (Aumasson & Bernstein, "SipHash: a fast short-input PRF", 2012), written
# here so that the checksum is held against a computation sharing no code with state_store.savepoint.checksum or
# pandas; the rows are framed from that module's docstring, not with its helpers.
_MASK64 = (1 << 64) - 1


def _rotl(x: int, bits: int) -> int:
    return ((x << bits) | (x >> (64 - bits))) & _MASK64


def _siphash24(key: bytes, message: bytes) -> int:
    k0, k1 = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:], "little")
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]

    def sip_round() -> None:
        v[0] = (v[0] + v[1]) & _MASK64
        v[1] = _rotl(v[1], 13) ^ v[0]
        v[0] = _rotl(v[0], 32)
        v[2] = (v[2] + v[3]) & _MASK64
        v[3] = _rotl(v[3], 16) ^ v[2]
        v[0] = (v[0] + v[3]) & _MASK64
        v[3] = _rotl(v[3], 21) ^ v[0]
        v[2] = (v[2] + v[1]) & _MASK64
        v[1] = _rotl(v[1], 17) ^ v[2]
        v[2] = _rotl(v[2], 32)

    # the last block: the message's remaining bytes, its length modulo 256 in the top byte
    tail = len(message) - len(message) % 8
    blocks = [int.from_bytes(message[i:i + 8], "little") for i in range(0, tail, 8)]
    blocks.append(int.from_bytes(message[tail:], "little") | (len(message) & 0xFF) << 56)
    for m in blocks:
        v[3] ^= m
        for _ in range(2):  # c = 2 compression rounds
            sip_round()
        v[0] ^= m
    v[2] ^= 0xFF
    for _ in range(4):  # d = 4 finalization rounds
        sip_round()
    return v[0] ^ v[1] ^ v[2] ^ v[3]


# The reference implementation's test vectors (vectors.h, vectors_sip64): key 00 01 .. 0f, the i-th message the i
# bytes 00 01 .. i-1, each the tag's 8 bytes in hex. The paper's appendix gives the 15-byte one (index 15).
_SIPHASH24_VECTORS = (
    "310e0edd47db6f72", "fd67dc93c539f874", "5a4fa9d909806c0d", "2d7efbd796666785", "b7877127e09427cf",
    "8da699cd64557618", "cee3fe586e46c9cb", "37d1018bf50002ab", "6224939a79f5f593", "b0e4a90bdf82009e",
    "f3b9dd94c5bb5d7a", "a7ad6b22462fb3f4", "fbe50e86bc8f1e75", "903d84c02756ea14", "eef27a8e90ca23f7",
    "e545be4961ca29a1", "db9bc2577fcc2a3f", "9447be2cf5e99a69", "9cd38d96f0b3c14b", "bd6179a71dc96dbb",
    "98eea21af25cd6be", "c7673b2eb0cbf2d0", "883ea3e395675393", "c8ce5ccd8c030ca8", "94af49f6c650adb8",
    "eab8858ade92e1bc", "f315bb5bb835d817", "adcf6b0763612e2f", "a5c91da7acaa4dde", "716595876650a2a6",
    "28ef495c53a387ad", "42c341d8fa92d832", "ce7cf2722f512771", "e37859f94623f3a7", "381205bb1ab0e012",
    "ae97a10fd434e015", "b4a31508beff4d31", "81396229f0907902", "4d0cf49ee5d4dcca", "5c73336a76d8bf9a",
    "d0a704536ba93e0e", "925958fcd6420cad", "a915c29bc8067318", "952b79f3bc0aa6d4", "f21df2e41d4535f9",
    "87577519048f53a9", "10a56cf5dfcd9adb", "eb75095ccd986cd0", "51a9cb9ecba312e6", "96afadfc2ce666c7",
    "72fe52975a4364ee", "5a1645b276d592a1", "b274cb8ebf87870a", "6f9bb4203de7b381", "eaecb2a30b22a87f",
    "9924a43cc1315724", "bd838d3aafbf8db7", "0b1a2a3265d51aea", "135079a3231ce660", "932b2846e4d70666",
    "e1915f5cb1eca46c", "f325965ca16d629f", "575ff28e60381be5", "724506eb4c328a95",
)


def _reference_checksum(rows: pa.Table) -> str:
    """state_checksum as state_store.savepoint.checksum's docstring defines it, computed field by field."""
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    total = 0
    for row in rows.to_pylist():
        texts = []
        for field in rows.schema:
            value = row[field.name]
            if value is None:
                texts.append("\x00" if field.name == "event_type" else "")
            elif pa.types.is_timestamp(field.type):
                assert field.type.unit == "us", field  # the savepoint schemas' unit
                texts.append(str((value - epoch) // dt.timedelta(microseconds=1)))
            elif isinstance(value, int):  # a bool too: "0" / "1"
                texts.append(str(int(value)))
            else:
                texts.append(value)
        h = _siphash24(b"0123456789123456", "\x1f".join(texts).encode("utf-8"))
        h ^= h >> 30  # splitmix64's finalizer
        h = (h * 0xBF58476D1CE4E5B9) & _MASK64
        h ^= h >> 27
        h = (h * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 31
        total = (total + h) & _MASK64
    return f"siphash64:{rows.num_rows}:{total:016x}"


@pytest.mark.tier("pure")
def test_the_tests_siphash_matches_the_reference_vectors():
    assert len(_SIPHASH24_VECTORS) == 64
    key = bytes(range(16))
    for i, tag in enumerate(_SIPHASH24_VECTORS):
        assert _siphash24(key, bytes(range(i))).to_bytes(8, "little").hex() == tag, i
    assert _siphash24(key, bytes(range(15))) == 0xA129CA6149BE45E5  # the paper's appendix, as a number


@pytest.mark.tier("pure")
def test_checksum_equals_an_independent_siphash_of_the_documented_framing():
    rows, v1 = _known_rows()
    # int64 extremes, timestamps from year 1 to 9999, multi-block and 4-byte UTF-8 text, the separator and U+0000
    # in values
    first, last = -62_135_596_800_000_000, 253_402_300_799_999_999  # 0001-01-01, 9999-12-31T23:59:59.999999
    edges = pa.table({
        "user_id": ["", "ü" * 40 + "\U0001f600", "a\x1fb", "x" * 8],
        "session_start": pa.array([0, -1, first, last], UTC_US),
        "event_id": [None, "", "e\x00", "e" * 16],
        "event_time": pa.array([None, -86_400_000_001, 1, 1_790_000_000_000_001], UTC_US),
        "event_type": [None, "\x00", "", "page_view"],
        "event_count": [2**63 - 1, -(2**63), 0, None],
        "page_views": [None, 0, -1, 1],
    }, schema=state_format.CANONICAL_SCHEMA)
    for table in (rows, v1, edges, _canonical_rows(300, seed=21), rows.slice(0, 0), v1.slice(0, 0)):
        assert state_checksum(table) == _reference_checksum(table), table.schema.names
    # the recorded values (test_checksums_of_existing_savepoints_are_unchanged) follow from the documentation alone
    assert _reference_checksum(rows) == "siphash64:3:c7c38eb32ee540a7"
    assert _reference_checksum(v1) == "siphash64:2:75eab36e8fdfe9a2"


def test_the_jvm_checksum_equals_pythons(spark):
    """frame_checksum (the operator jar's sessions.Checksum, in the tasks) against state_checksum (pandas' SipHash in
    this process) and the test's own reference, on rows built where the two could part: the framing's edge values, and
    attributes whose JSON Python and Jackson spell differently (key order, blanks, doubles, escapes, big integers, NaN,
    empty objects)."""
    rows, _ = _known_rows()
    first, last = -62_135_596_800_000_000, 253_402_300_799_999_999
    edges = pa.table({
        "user_id": ["", "ü" * 40 + "\U0001f600", "a\x1fb", "x" * 8],
        "session_start": pa.array([0, -1, first, last], UTC_US),
        "event_id": [None, "", "e\x00", "e" * 16],
        "event_time": pa.array([None, -86_400_000_001, 1, 1_790_000_000_000_001], UTC_US),
        "event_type": [None, "\x00", "", "page_view"],
        "event_count": [2**63 - 1, -(2**63), 0, None],
        "page_views": [None, 0, -1, 1],
    }, schema=state_format.CANONICAL_SCHEMA)
    rng = random.Random(5)
    texts = [None, "{}", '{"b": 1, "a": [0.5, 1e-7]}', '{"x": 5e-324, "y": 1e16, "z": -0.0, "w": 1234567890123456789012}',
             '{"s": "tab\\tquote\\"\u00e9\\u0001", "n": null, "t": true, "f": false}', '{"a": NaN, "i": -Infinity}',
             '{"\\ud834\\udd1e": 1, "\\uffff": 2}', '{"l": 12345678.9, "m": 0.0001, "k": 1.0E-5, "j": 1.0E7}', "[]",
             *(json.dumps({f"k{i}": rng.uniform(-1e6, 1e6) * 10 ** rng.randrange(-30, 30), "c": [rng.random(), 2.0]})
               for i in range(300))]
    n = len(texts)
    canonical = _canonical_rows(n, seed=8)
    with_attributes = canonical.append_column("attributes", pa.array(texts, pa.string()))
    for table in (rows, edges, canonical, with_attributes, rows.slice(0, 0)):
        frame = spark.createDataFrame(table).repartition(3)
        assert io_checksum(frame) == (table.num_rows, state_checksum(table)), table.schema.names
    assert io_checksum(spark.createDataFrame(edges)) == (4, _reference_checksum(edges))


@pytest.mark.tier("pure")
def test_file_statistics_bound_every_value():
    rows = _canonical_rows(3000, seed=9)
    long_max = "z" * 80
    rows = pa.concat_tables([rows, pa.table({
        "user_id": [long_max, "é" * 40], "session_start": pa.array([1, 2], UTC_US), "event_id": [None, None],
        "event_time": pa.array([999, 1_001], UTC_US), "event_type": [None, None], "event_count": [1, 1],
        "page_views": [0, 0]}, schema=state_format.CANONICAL_SCHEMA)])
    stats = savepoint_stats.FileStats()
    for share in (rows.slice(0, 1000), rows.slice(1000)):
        stats.update(share)
    got = json.loads(stats.to_json(rows.num_rows))
    assert got["numRecords"] == rows.num_rows
    assert got["nullCount"] == {name: rows[name].null_count for name in rows.column_names}
    assert "user_id" not in got["maxValues"]  # longer than 64 bytes: unknown rather than wrong
    assert len(got["minValues"]["user_id"].encode()) <= savepoint_stats.STATS_STRING_BYTES
    for name in rows.column_names:
        values = [v for v in rows[name].to_pylist() if v is not None]
        low, high = got["minValues"].get(name), got["maxValues"].get(name)
        if pa.types.is_timestamp(rows.schema.field(name).type):
            low = dt.datetime.fromisoformat(low.replace("Z", "+00:00"))
            high = dt.datetime.fromisoformat(high.replace("Z", "+00:00"))
        assert low is not None and all(low <= v for v in values), name
        assert high is None or all(v <= high for v in values), name


# ---- with Spark --------------------------------------------------------------------------------------

def _job(tmp_path: Path, spark, provider: str, parts: int = 3, **env):
    config = make_config(tmp_path, provider, **env)
    chunks = in_order_chunks(users=40, seed=17, parts=4)[:parts]
    for i, chunk in enumerate(chunks):
        land(config.landing, f"part-{i:04d}.jsonl", [json.dumps(e) for e in chunk])
        ingest(config, files_per_commit=1)
    catch_up(config, spark)
    return config, chunks


def _oracle_open(chunks: list[list[dict]]) -> list[tuple]:
    batches = [[{**e, "event_time_ms": iso_ms(e["event_time"])} for e in chunk] for chunk in chunks]
    return sorted(run_oracle(batches, GAP_MS, LATENESS_MS).open_sessions)


@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_savepoint_by_the_executors_equals_the_driver_side_state(tmp_path, spark, provider):
    config, chunks = _job(tmp_path, spark, provider)
    saved = take_savepoint(config, spark=spark)
    store = SavepointStore.of(config)

    # The live state read into this process (the old savepoint's path) and the table read by delta-rs here: the same
    # rows, count and checksum as the catalog row the executors' pass produced.
    live = live_state(spark, config.checkpoint, batch_id=saved.batch_id)
    table = store.read_state(saved.savepoint_id)
    assert saved.rows == live.num_rows == table.num_rows > 0
    assert saved.checksum == state_checksum(live) == state_checksum(table)
    assert table.sort_by(state_format.CANONICAL_SORT).equals(live.cast(table.schema))
    assert saved.bytes == sum(pa.table(DeltaTable(saved.uri).get_add_actions(flatten=True))["size_bytes"].to_pylist())

    # Read back by the executors for a restore: the same count and checksum, and the oracle's open sessions.
    rows = chain.savepoint_rows(spark, store, saved.savepoint_id)
    read = rows.toArrow()
    assert read.num_rows == table.num_rows and state_checksum(read) == state_checksum(table)
    assert chain.savepoint_checksum(spark, store, saved.savepoint_id) == (saved.rows, saved.checksum)
    assert open_sessions_of(rows.collect()) == _oracle_open(chunks) != []
    validate_savepoint(config, saved.savepoint_id)  # restore's check agrees: it raises SavepointDamaged else


def test_many_files_per_task_and_their_statistics(tmp_path, spark):
    config, _ = _job(tmp_path, spark, "rocksdb", parts=2)
    store = SavepointStore.of(config)
    live = live_state(spark, config.checkpoint, batch_id=None)
    written = io.write_state_files(spark, read_state(spark, config.checkpoint), store.state_uri("many"),
                                   file_rows=25, group_rows=10)
    assert len(written.files) >= live.num_rows // 25 and written.rows == live.num_rows
    assert written.checksum == state_checksum(live)
    io.commit_state_files(written, None)
    table = DeltaTable(store.state_uri("many"))
    assert sorted(Path(u).name for u in table.file_uris()) == sorted(f["path"] for f in written.files)
    assert state_checksum(table.to_pyarrow_table()) == written.checksum
    # delta-rs skips files by the statistics the executors wrote: a skipped file with a matching row would lose it
    for user in sorted(set(live["user_id"].to_pylist()))[:5]:
        expected = live.filter(pc.equal(live["user_id"], user))
        got = table.to_pyarrow_table(filters=[("user_id", "=", user)])
        assert state_checksum(got) == state_checksum(expected.cast(got.schema))
    latest = pc.max(live["event_time"]).as_py()
    got = table.to_pyarrow_table(filters=[("event_time", ">=", latest)])
    assert got.num_rows == pc.sum(pc.equal(live["event_time"], latest)).as_py() > 0


def test_empty_state_and_v1_savepoints(tmp_path, spark):
    store = SavepointStore(str(tmp_path / "savepoints"))
    empty = spark.createDataFrame([], io.CANONICAL_DDL)
    written = io.write_state_files(spark, empty, store.state_uri("empty"))
    io.commit_state_files(written, None)
    assert written.files == () and written.checksum == state_checksum(state_format.CANONICAL_SCHEMA.empty_table())
    assert io.verify_state_files(spark, store, "empty", 0, written.checksum).files == ()
    assert chain.savepoint_rows(spark, store, "empty").count() == 0

    v1 = pa.table({"user_id": ["u1", "u1", "u2"], "event_id": ["a", "b", "c"],
                   "event_time": pa.array([1_000_000, 2_000_000, 3_000_000], UTC_US),
                   "event_type": ["page_view", None, "logout"]}, schema=state_format.V1_SCHEMA)
    write_deltalake(store.state_uri("v1"), v1.slice(0, 2))
    write_deltalake(store.state_uri("v1"), v1.slice(2), mode="append")  # two files
    assert chain.savepoint_checksum(spark, store, "v1") == (3, state_checksum(store.read_state("v1")))
    upgraded = chain.savepoint_rows(spark, store, "v1").toArrow()
    assert state_checksum(upgraded) == state_checksum(state_format.upgrade_v1(v1))


def test_failed_writes_are_never_listed_or_committed(tmp_path, spark, monkeypatch):
    config, _ = _job(tmp_path, spark, "rocksdb", parts=2)
    store = SavepointStore.of(config)
    first = take_savepoint(config, spark=spark)

    # A task that fails after its share went out (its file is on disk): no table, no complete savepoint. (The class
    # is local, so it travels to the executors by value with the task.)
    class FailsOnceItsFileIsWritten(io._DataFile):
        def close(self):
            done = super().close()
            if self.name.startswith("part-00001-"):
                raise RuntimeError("injected: executor lost after writing")
            return done

    def rows_in_two_tasks(spark_, checkpoint, batch_id=None, op=None):
        return read_state(spark_, checkpoint, batch_id=batch_id, op=op).repartition(2)

    monkeypatch.setattr(savepointing, "read_state", rows_in_two_tasks)
    monkeypatch.setattr(io, "_DataFile", FailsOnceItsFileIsWritten)
    with pytest.raises(SavepointFailed, match="not listed as complete.*RuntimeError: injected: executor lost"):
        take_savepoint(config, spark=spark, full=True)  # (an incremental one has no change to write here)
    monkeypatch.undo()
    failed = store.list()[0]
    assert failed.status == "failed" and failed.savepoint_id != first.savepoint_id
    assert list(Path(store.state_uri(failed.savepoint_id)).glob("*.parquet")), "the failed tasks wrote files"
    assert not store.exists(failed.savepoint_id)  # ... that no Delta log references

    # A file changed between the commit and the re-read (one event's type, same count): the verification sees it.
    real_commit = savepointing.commit_state_files

    def commit_then_damage(written, options):
        real_commit(written, options)
        path = Path(written.uri) / written.files[0]["path"]
        rows = pq.read_table(path)
        types = rows["event_type"].to_pylist()
        types[0] = "logout" if types[0] != "logout" else "page_view"
        pq.write_table(rows.set_column(rows.schema.get_field_index("event_type"), "event_type",
                                       pa.array(types, pa.string())), path)

    monkeypatch.setattr(savepointing, "commit_state_files", commit_then_damage)
    with pytest.raises(SavepointFailed, match="not listed as complete.*does not match the live state"):
        take_savepoint(config, spark=spark, full=True)
    monkeypatch.undo()
    assert [s.savepoint_id for s in store.list() if s.status == "complete"] == [first.savepoint_id]
    assert store.get("latest").savepoint_id == first.savepoint_id
    again = take_savepoint(config, spark=spark)
    assert (again.rows, again.checksum) == (first.rows, first.checksum)


def test_savepoint_on_s3_is_written_and_read_by_the_executors(tmp_path, spark, s3_endpoint):
    """The session's JVM (and its Python workers) started before the S3 endpoint's AWS_* variables were set: the
    executors get them from share_aws_env."""
    config, chunks = _job(tmp_path, spark, "rocksdb", SESSIONS_SAVEPOINT_URI=f"s3://savepoints/{tmp_path.name}")
    saved = take_savepoint(config, spark=spark)
    store = SavepointStore.of(config)
    assert saved.uri.startswith("s3://savepoints/")
    table = store.read_state(saved.savepoint_id)
    assert (saved.rows, saved.checksum) == (table.num_rows, state_checksum(table))
    assert saved.checksum == state_checksum(live_state(spark, config.checkpoint, batch_id=saved.batch_id))
    rows = chain.savepoint_rows(spark, store, saved.savepoint_id)
    assert open_sessions_of(rows.collect()) == _oracle_open(chunks)
    validate_savepoint(config, saved.savepoint_id)  # raises SavepointDamaged unless the files match the catalog
