"""Erasure checked the way an auditor checks it: after `forget`, the user's id is searched byte by byte in every file
under the home (tables and their Delta logs and checkpoints, savepoints, the Spark checkpoint, landing, leases, logs),
Parquet decoded, with a scanner written here and sharing nothing with the product's own `forget --verify`; the job
is compared with the oracle run on the stream without the user. Then the cases an auditor tried: ids spelled with
escapes or as integers in landed lines, a file still being written, and the user's events arriving after the erasure
(a late producer, a backlog), which must not bring the user back."""
from __future__ import annotations

import io
import json
import os
import re
import struct
import zipfile
from pathlib import Path

import lz4.block
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pipelines.core.sample_data import land
from pipelines.ingest.erased import UserGroup, UserSpelling, user_hash
from pipelines.job.checkpoint import inspect_checkpoint
from pipelines.job.stream import catch_up
from pipelines.storage import sql_literal
from state_store.audit import mentions_of, token_texts
from state_store.audit_index import Bloom, may_name
from state_store.erasure import forget
from state_store.lifecycle import take_savepoint
from state_store.verification import verify_forgotten, verify_forgotten_many
from testkit.oracle import run_oracle
from tests.kit.datagen import BASE_MS, land_files, line, make_event, stream_scenario, with_users
from tests.kit.homes import make_config
from tests.kit.tables import assert_late_keys, read_open_sessions, read_quarantine, read_sessions

pytestmark = pytest.mark.tier("spark")

GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000
SEED, CUT = 7, 3
OPEN_USER = "auditee-7q"     # seed 7's u4 renamed: closed sessions, late events, an open session at CUT
CLOSED_USER = "closedonly-7"  # closed sessions only: not in the live state when it is forgotten


def _lz4_blocks(data: bytes) -> bytes:
    """lz4-java's LZ4BlockOutputStream (Spark's default state codec): 'LZ4Block', a token, compressed and plain
    lengths and a checksum (little-endian ints), then the block, raw (token 0x1_) or LZ4 (0x2_)."""
    out, i = bytearray(), 0
    while i < len(data):
        assert data[i:i + 8] == b"LZ4Block", data[i:i + 8]
        token = data[i + 8]
        compressed, plain, _ = struct.unpack_from("<iii", data, i + 9)
        block, i = data[i + 21:i + 21 + compressed], i + 21 + compressed
        if plain:
            out += block if token & 0xF0 == 0x10 else lz4.block.decompress(block, uncompressed_size=plain)
    return bytes(out)


def _sst_entries(path: Path) -> bytes:
    """Every key and value of a RocksDB SST file, read one by one with rocksdbjni through py4j."""
    jvm = SparkSession.getActiveSession().sparkContext._jvm
    jvm.org.rocksdb.RocksDB.loadLibrary()
    reader = jvm.org.rocksdb.SstFileReader(jvm.org.rocksdb.Options())
    reader.open(str(path))
    entries = reader.newIterator(jvm.org.rocksdb.ReadOptions())
    out = bytearray()
    entries.seekToFirst()
    while entries.isValid():
        out += bytes(entries.key()) + b"\x00" + bytes(entries.value()) + b"\x00"
        entries.next()
    reader.close()
    return bytes(out)


def _plain(path: Path, data: bytes) -> bytes:
    """A file's bytes as an auditor reads them: Spark's state store files decompressed, snapshot zips unpacked."""
    if path.suffix == ".sst":
        return _sst_entries(path)
    if data[:8] == b"LZ4Block":
        return _lz4_blocks(data)
    if path.suffix == ".zip" and data[:2] == b"PK":
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return b"\x00".join(archive.read(member) for member in archive.namelist())
    return data


def auditor_grep(root: Path, user_id: str) -> dict[str, int]:
    """Files under `root` that spell `user_id`: its UTF-8 bytes, JSON-escaped or SQL-quoted, with no identifier
    character on either side; Parquet files also decoded (every value of every column, nested ones too), state store
    files decompressed."""
    return auditor_grep_all(root, [user_id])[user_id]


def auditor_grep_all(root: Path, user_ids: list[str]) -> dict[str, dict[str, int]]:
    """auditor_grep for many users at once: each file read and decoded once, searched for every spelling of every
    user in one pattern (user id -> files -> hits)."""
    owner: dict[bytes, str] = {}
    for user_id in user_ids:
        forms = {user_id, json.dumps(user_id)[1:-1], user_id.replace("'", "''")}
        forms |= {json.dumps(form)[1:-1] for form in set(forms)}
        owner.update({form.encode(): user_id for form in forms})
    forms = b"|".join(re.escape(form) for form in sorted(owner, key=len, reverse=True))
    pattern = re.compile(rb"(?<![0-9A-Za-z_.\-])(" + forms + rb")(?![0-9A-Za-z_.\-])")
    found: dict[str, dict[str, int]] = {user_id: {} for user_id in user_ids}

    def count(path: Path, data: bytes) -> None:
        for hit in pattern.findall(data):
            files = found[owner[hit]]
            files[str(path.relative_to(root))] = files.get(str(path.relative_to(root)), 0) + 1

    for path in root.rglob("*"):
        if not path.is_file():
            continue
        count(path, _plain(path, path.read_bytes()))
        if path.suffix == ".parquet":
            try:
                decoded = json.dumps(pq.read_table(path).to_pylist(), default=str, ensure_ascii=False)
            except pa.ArrowInvalid:
                continue
            count(path, decoded.encode())
    return found


def _renamed(batches: list[list[dict]], old: str, new: str) -> list[list[dict]]:
    return [[{**e, "user_id": new} if e["user_id"] == old else e for e in batch] for batch in batches]


def _without(batches: list[list[dict]], *users: str) -> list[list[dict]]:
    return [[e for e in batch if e["user_id"] not in users] for batch in batches]


def _scenario() -> list[list[dict]]:
    batches = _renamed(stream_scenario(SEED, 6, False, GAP_MS, LATENESS_MS), "u4", OPEN_USER)
    first = min(e["event_time_ms"] for e in batches[0])
    batches[0] = [make_event(CLOSED_USER, f"c{i}", first + i * 60_000, "page_view") for i in range(2)] + batches[0]
    return batches


# The bulk erasure's other 98 users, two events each (cheap), placed so that the stream without them has the same
# watermarks (tests.kit.datagen.with_users): closed sessions only, open sessions only, integer ids (landed as JSON
# numbers), non-ASCII ids (landed \u-escaped or as UTF-8), and users whose only lines were landed but not yet ingested
# when they are forgotten.
BULK = {"closed": [f"bulk-closed-{i:02d}" for i in range(30)], "open": [f"bulk-open-{i:02d}" for i in range(30)],
        "integer": [str(7_300_000 + i) for i in range(20)], "non_ascii": [f"jörg-ß-{i}" for i in range(6)]
        + [f"用户-{i}" for i in range(6)], "pending": [f"bulk-pending-{i}" for i in range(6)]}


def _bulk_lines(events: list[dict]) -> list[str]:
    """Landed lines: integer ids as JSON numbers, non-ASCII ids escaped (ensure_ascii) or as UTF-8 by turns."""
    lines = []
    for n, event in enumerate(events):
        record = json.loads(line(event))
        if event["user_id"] in BULK["integer"]:
            record["user_id"] = int(event["user_id"])
        lines.append(json.dumps(record, ensure_ascii=n % 2 == 0))
    return lines


def _bulk_scenario() -> tuple[list[list[dict]], list[dict]]:
    """_scenario() with the BULK users' events added to its first three batches, and the pending users' events."""
    closed = BULK["closed"] + BULK["integer"][::2] + BULK["non_ascii"][::2]
    opened = BULK["open"] + BULK["integer"][1::2] + BULK["non_ascii"][1::2]
    batches = with_users(_scenario(), closed, opened, GAP_MS, LATENESS_MS)
    third_max = max(e["event_time_ms"] for e in batches[2])
    pending = [make_event(u, f"{u}-e{k}", third_max - 5 * 60_000 + i * 1_000 + k * 60_000, "page_view")
               for i, u in enumerate(BULK["pending"]) for k in range(2)]
    return batches, pending


def _assert_oracle_without(spark, config, batches, *users: str) -> None:
    expected = run_oracle(_without(batches, *users), GAP_MS, LATENESS_MS)
    assert read_sessions(config) == sorted(expected.closed)
    assert read_open_sessions(spark, config) == sorted(expected.open_sessions)
    assert_late_keys(config, expected)


def _verify_indexed_as_full(spark, config, users: list[str]) -> list:
    """`forget --verify` of `users` with the audit index over every file (built by the first run, used by the
    second) says exactly what reading every file and asking the live state says (--full); and a user no file names
    is verified clean with most files not read and the live state not asked."""
    full = verify_forgotten_many(config, spark, users, full=True)
    for _ in range(2):
        indexed = verify_forgotten_many(config, spark, users, index_min_bytes=0)
        assert [(c.clean, c.found, c.files) for c in indexed] == [(c.clean, c.found, c.files) for c in full]
    nobody = verify_forgotten_many(config, spark, ["nobody-at-all"], index_min_bytes=0)[0]
    assert nobody.clean and nobody.files_skipped > 2 * nobody.files_read, (nobody.files_skipped, nobody.files_read)
    assert not nobody.live_state_asked  # no file of the checkpoint names the user: its state cannot hold them
    return full


@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_no_byte_of_100_users_erased_in_one_forget_is_left_in_the_home(spark, tmp_path, provider):
    """One forget of 100 users of every kind: the auditor's scanner finds none of them anywhere in the home, `forget
    --verify` says each is clean, the erasure log has one row per user under its keyed hash, and the job is the
    oracle's without them, after more data too."""
    config = make_config(tmp_path, provider)
    batches, pending = _bulk_scenario()
    erased = [OPEN_USER, CLOSED_USER, *(u for kind in BULK.values() for u in kind)]
    assert len(set(erased)) == 100
    cut = run_oracle(batches[:CUT], GAP_MS, LATENESS_MS)
    assert any(s[1] == OPEN_USER for s in cut.open_sessions)
    assert any(s[1] == CLOSED_USER for s in cut.closed) and all(s[1] != CLOSED_USER for s in cut.open_sessions)

    land_files(config, [_bulk_lines(b) for b in batches[:2]])
    catch_up(config, spark)
    take_savepoint(config, spark=spark)
    land_files(config, [_bulk_lines(batches[2])], start=2)
    catch_up(config, spark)
    take_savepoint(config, spark=spark)  # incremental: a chain of two tables
    DeltaTable(config.raw_events_table).create_checkpoint()  # a Delta checkpoint holding the statistics
    land(Path(config.landing), "pending-00002.jsonl", _bulk_lines(pending))  # landed, not ingested
    os.utime(Path(config.landing) / "pending-00002.jsonl", (1_700_000_025, 1_700_000_025))

    home = Path(config.home)
    before = auditor_grep_all(home, erased)
    # The scanner finds them where they are (it can fail): OPEN_USER sorts first, so it is a min statistic.
    assert any("_delta_log" in f for f in before[OPEN_USER]), before[OPEN_USER]
    assert all(any(f.startswith("landing/") for f in before[user]) for user in erased), \
        [user for user in erased if not any(f.startswith("landing/") for f in before[user])]
    for user in (OPEN_USER, CLOSED_USER, BULK["open"][0], BULK["integer"][1], BULK["non_ascii"][1]):
        assert any(f.startswith("checkpoints/") for f in before[user]), (user, before[user])
    assert not any(check.clean for check in _verify_indexed_as_full(spark, config, erased))

    result = forget(config, erased, spark=spark)
    assert [u.user_hash for u in result.users] == [user_hash(config, user) for user in erased]
    by_user = dict(zip(erased, result.users))
    assert all(by_user[u].removed["landed_lines"] == 2 and by_user[u].removed["raw_events"] == 0
               for u in BULK["pending"])
    assert all(by_user[u].removed["live_state_events"] == 2 for u in BULK["open"])
    assert all(by_user[u].removed["raw_events"] == 2 and by_user[u].removed["sessions"] == 1 for u in BULK["closed"])
    assert result.removed["raw_events"] == sum(u.removed["raw_events"] for u in result.users)
    assert not any(user in json.dumps(result.to_dict(), ensure_ascii=False) for user in erased)
    after = auditor_grep_all(home, erased)
    assert {user: files for user, files in after.items() if files} == {}
    checks = _verify_indexed_as_full(spark, config, erased)
    assert all(check.clean for check in checks), [(c.found, c.files) for c in checks if not c.clean][:3]
    log = DeltaTable(config.table_uri("erasure_log")).to_pyarrow_table().to_pylist()
    complete = [row for row in log if row["status"] == "complete"]
    assert sorted(row["user_hash"] for row in complete) == sorted(u.user_hash for u in result.users)
    assert {row["erasure_id"] for row in log} == {result.erasure_id}

    # Both tables' histories still read, old versions included, by delta-rs.
    assert len(DeltaTable(config.raw_events_table).history()) > 3
    assert DeltaTable(config.raw_events_table, version=1).version() == 1
    land_files(config, [_bulk_lines(b) for b in _without(batches[CUT:], *erased)], start=CUT)
    catch_up(config, spark)
    _assert_oracle_without(spark, config, batches, *erased)


@pytest.mark.parametrize("provider, changelog", [("hdfs", "true"), ("rocksdb", "true"), ("rocksdb", "false")],
                         ids=["hdfs", "rocksdb-changelogs", "rocksdb-ssts"])
def test_verify_reads_the_compressed_state_files(spark, tmp_path, provider, changelog):
    """Users with sequential ids, all open in the state. Spark compresses its state files (LZ4 deltas and changelogs;
    RocksDB's SST blocks), whose raw bytes hide most ids (an earlier id's prefix becomes a back-reference). `forget
    --verify` finds each sampled user in the checkpoint's state files, where the oracle keeps it open; after a forget
    it says clean as the auditor does; a state file it cannot decode keeps it from saying clean, named."""
    config = make_config(tmp_path, provider, SESSIONS_ROCKSDB_CHANGELOG=changelog)
    users = [f"user-{i}" for i in range(300)]
    events = [make_event(u, f"{u}-e{k}", BASE_MS + k * 60_000 + n, "page_view")
              for n, u in enumerate(users) for k in range(2)]
    land_files(config, [[line(e) for e in events]])
    catch_up(config, spark)
    assert {s[1] for s in run_oracle([events], GAP_MS, LATENESS_MS).open_sessions} == set(users)

    kind = {"hdfs": ".delta", "true": ".changelog", "false": ".sst"}["hdfs" if provider == "hdfs" else changelog]
    state_files = [p for p in Path(config.home).rglob(f"*{kind}") if "state" in p.parts]
    assert state_files
    sample = users[::25]
    hidden = 0
    for n, user in enumerate(sample):
        # Decoded in this Spark's JVM (given), or in a JVM of their own (Spark only to be started: then it is, to ask
        # the live state, since the files name the user)
        check = verify_forgotten(config, spark if n % 2 else (lambda: spark), user)
        assert any(f.startswith("checkpoint:state/") and f.endswith(kind) for f in check.files), (user, check.files)
        assert not check.clean and check.unreadable == {}
        spelled = re.compile(re.escape(user.encode()) + rb"(?![0-9])")
        hidden += not any(spelled.search(p.read_bytes()) for p in state_files)
    assert hidden > len(sample) // 2, "the raw bytes alone would have shown most users: the case is not exercised"

    forget(config, sample[1], spark=spark)
    started = []
    check = verify_forgotten(config, lambda: started.append(1) or spark, sample[1])
    assert check.clean and not check.live_state_asked and not started, check  # the forget's new files: no Spark
    assert verify_forgotten(config, spark, sample[1], full=True).clean
    assert auditor_grep(Path(config.home), sample[1]) == {}
    stray = Path(config.home) / "copied" / "state" / "0" / "0" / "7.delta"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"LZ4Block" + bytes(40))  # a truncated or foreign file where a state file would be
    for given in (spark, lambda: spark):
        check = verify_forgotten(config, given, sample[1])
        assert not check.clean and list(check.unreadable) == ["home:copied/state/0/0/7.delta"], check.unreadable


SPELLINGS = [
    # (user id as forgotten, how its lines spell it)
    ("12345", lambda e: json.dumps({**e, "user_id": 12345})),
    ("jörg-ö", lambda e: json.dumps({**e, "user_id": "jörg-ö"})),  # \u00f6 escapes (ensure_ascii)
    ('a"b\\c', lambda e: json.dumps({**e, "user_id": 'a"b\\c'}, ensure_ascii=False)),
    ("u-10", lambda e: json.dumps({**e, "user_id": "u-10"}).replace('"u-10"', '"u\\u002d10"')),
]


# Ids an index must not lose: escapes, quotes, integers (and JSON's -0), non-ASCII, separators inside, one letter.
TRICKY = ["12345", "0", "jörg-ö", 'a"b\\c', "u-10", "O'Brien", "x y", "🙂", "a", "user@example.com", "naïve.1"]


def _escaped(user: str) -> str:
    """Every character of `user` as a JSON \\u escape (a producer's way: nothing of the id left in plain bytes)."""
    return "".join(f"\\u{ord(c):04x}" if ord(c) < 0x10000 else json.dumps(c)[1:-1] for c in user)


def _spellings(user: str) -> dict[str, bytes]:
    """One file per way the product's files (or a producer) can name `user`, each naming it that way only."""
    noise = [{"user_id": "someone-else", "page": "/caf\u00e9"}]
    lines = {"plain": json.dumps({"user_id": user}), "utf8": json.dumps({"user_id": user}, ensure_ascii=False),
             "escaped": '{"user_id": "' + _escaped(user) + '"}', "bom": '\ufeff{"\\u0075ser_id": "' + _escaped(user) + '"}',
             "broken": '{"user_id": "' + _escaped(user) + '", "page": '}
    if user.lstrip("-").isdigit():
        lines["integer"] = '{"user_id": ' + ("-0" if user == "0" else user) + "}"
    files = {f"landing/{way}.jsonl": "\n".join([json.dumps(noise[0]), text, "tail"]).encode()
             for way, text in lines.items()}
    columns: dict[str, pa.Array] = {
        "plain": pa.array([user, "someone-else"]),
        "raw": pa.array(['{"user_id": "' + _escaped(user) + '"}', "{}"]),
        "predicate": pa.array([f"user_id IN ({sql_literal(user)}, 'someone-else')", ""]),
        "raw_predicate": pa.array(["raw = " + sql_literal('{"\\u0075ser_id": "' + _escaped(user) + '"}'), ""]),
        "nested_raw": pa.array(['{"user_id": ' + json.dumps(json.dumps({"user_id": user})) + "}", ""]),
        "stats": pa.array([{"minValues": [("user_id", user)]}, None],
                          pa.struct([("minValues", pa.map_(pa.string(), pa.string()))])),
        "listed": pa.array([['{"k": "' + _escaped(user) + '"}'], []], pa.list_(pa.string())),
    }
    if user.isdigit():  # JSON's -0 is the integer 0
        number = "-0" if user == "0" else user
        columns["raw_integer"] = pa.array(['{"user_id": ' + number + ', "p": "\\u00e9"}', ""])
        columns["raw_integer_plain"] = pa.array(['{"user_id": ' + number + "}", ""])
        columns["listed_integer"] = pa.array([['{"user_id": ' + number + "}"], []], pa.list_(pa.string()))
    for way, column in columns.items():
        sink = pa.BufferOutputStream()
        pq.write_table(pa.table({"c": column}), sink, compression="gzip", write_statistics=False)  # no plain id left
        files[f"raw_events/_delta_log/{way}.checkpoint.parquet"] = sink.getvalue().to_pybytes()
    files["raw_events/_delta_log/0.json"] = json.dumps(
        {"commitInfo": {"operationParameters": {"predicate": f"user_id = {sql_literal(user)}"}}}).encode()
    files["home/logs/a.log"] = f"[{user}]".encode()
    return files


@pytest.mark.tier("pure")
def test_the_audit_index_never_skips_a_file_that_names_the_user():
    """The audit index's one promise: whenever the scan finds U in a file, the file's Bloom filter (of the runs of id
    bytes token_texts gives) says "maybe" for U -- each file naming U in one way only, for every way and tricky ids.
    And it is of use: for the users a file does not hold, it mostly says no."""
    absent = [f"absent-{i}" for i in range(40)] + ["u-11", "jörg", "O'Brie", "123456", "b", "x", "1"]
    found_in = 0
    for user in TRICKY:
        for path, data in _spellings(user).items():
            bloom = Bloom.of(token_texts(path, data))
            if mentions_of(path, data, [UserSpelling(user)])[user]:
                found_in += 1
                assert may_name(bloom, UserSpelling(user)), (path, user)
            assert sum(may_name(bloom, UserSpelling(u)) for u in absent) <= 4, (path, "the index skips too little")
    assert found_in == 14 * len(TRICKY) + 8, found_in  # the scan finds every way: the promise is put to the test


@pytest.mark.tier("pure")
def test_the_lines_searched_for_are_the_lines_every_line_decoded_names(monkeypatch):
    """UserGroup.lines_to_read finds lines by searching the bytes: what it hands over, decoded, names exactly the
    users that decoding every line finds -- every spelling, broken lines, an unfinished last line, 200 users -- and a
    search per needle and the one-pass automaton hand over the same lines."""
    import pipelines.ingest.erased as erased

    spelled = [spell({"event_id": f"e{n}", "page": "/"}) for n, (_, spell) in enumerate(SPELLINGS)]
    others = [json.dumps({"user_id": f"n{i}", "page": "/caf\u00e9"}) for i in range(5)]  # escapes, other users
    broken = ['{"user_id": "12345", "page": ', "not json 12345", '{"user_id": "u\\u002d10" oops']
    data = "\n".join([*others[:2], *spelled, *broken, *others[2:], '{"user_id": "jörg-ö"']).encode()  # unfinished
    for users in ([u for u, _ in SPELLINGS], ["12345"], ["u-10", "nobody"], [f"x{i}" for i in range(200)] + ["u-10"]):
        group = UserGroup.of(users)
        every = [(line, group.line_user(line)) for line in data.split(b"\n")]
        searched = [data[start:end] for start, end in group.lines_to_read(data)]
        assert [(line, group.line_user(line)) for line in searched if group.line_user(line)] == \
            [(line, user) for line, user in every if user]
        by_way = {}
        for way, most in (("find", 10**6), ("automaton", 0)):
            monkeypatch.setattr(erased, "_FIND_NEEDLES", most)
            by_way[way] = UserGroup.of(users).lines_to_read(data)
        assert by_way["find"] == by_way["automaton"] and by_way["find"], users


def test_landed_lines_of_any_spelling_are_erased_and_neighbours_kept(spark, tmp_path):
    config = make_config(tmp_path, "rocksdb")
    lines, events = [], []
    for n, (user, spell) in enumerate(SPELLINGS):
        for i in range(3):
            event = {k: v for k, v in make_event(user, f"s{n}-{i}", BASE_MS + i * 60_000, "page_view").items()
                     if k != "event_time_ms"}
            lines.append(spell(event))
        # A rejected line naming the user (no event_time): its raw text goes to the quarantine.
        lines.append(spell({"event_id": f"bad{n}", "page": "/"}))
    neighbour = [make_event("u-1", f"n{i}", BASE_MS + i * 60_000, "page_view") for i in range(3)]
    events += neighbour
    lines += [line(e) for e in neighbour]
    land_files(config, [lines])
    catch_up(config, spark)
    assert len(read_quarantine(config)) == len(SPELLINGS)

    users = [user for user, _ in SPELLINGS]  # all in one forget: one DELETE per table, one pass over each file
    assert not any(check.clean for check in verify_forgotten_many(config, spark, users))
    result = forget(config, users, spark=spark)
    assert [u.removed["quarantine"] for u in result.users] == [1] * len(SPELLINGS)  # each one's rejected line
    assert all(check.clean for check in verify_forgotten_many(config, spark, users))
    decoded = [json.loads(raw) for path in Path(config.landing).rglob("*.jsonl")
               for raw in path.read_bytes().split(b"\n") if raw.strip()]
    assert sorted(str(d["user_id"]) for d in decoded) == ["u-1"] * 3
    assert len(read_quarantine(config)) == 0
    assert {s[1] for s in read_sessions(config)} | {s[1] for s in read_open_sessions(spark, config)} == {"u-1"}
    assert auditor_grep(Path(config.home), "u-1"), "the neighbour u-1 is kept"


def test_a_file_still_being_written_and_events_arriving_after_the_erasure(spark, tmp_path):
    """U's complete lines in a file still being written are blanked in place (the writer's later bytes kept); the
    rest of that file, a late producer's file and a replayed backlog bring U's older events: dropped at ingest,
    counted in the erasure log under the keyed hash, their lines blanked; everyone else is the oracle's."""
    config = make_config(tmp_path, "rocksdb")
    user = "grower-3"
    batches = _renamed(stream_scenario(SEED, 6, False, GAP_MS, LATENESS_MS), "u4", user)
    land_files(config, [[line(e) for e in b] for b in batches[:CUT - 1]])
    growing = Path(config.landing) / "growing.jsonl"
    # The file ends inside a last line of U's (never the newest event: the watermarks stay the oracle's).
    extra = make_event(user, "grow-x", min(e["event_time_ms"] for e in batches[CUT - 1]), "page_view")
    text = "".join(line(e) + "\n" for e in batches[CUT - 1]) + line(extra) + "\n"
    cut_at = text.index('"user_id"', len(text) - len(line(extra)))
    growing.write_text(text[:cut_at])
    catch_up(config, spark)
    assert any(s[1] == user for s in read_open_sessions(spark, config))

    result = forget(config, user, spark=spark)
    assert result.removed["landed_lines"] > 0
    assert auditor_grep(Path(config.home), user) == {}
    with open(growing, "a") as handle:  # the writer goes on where it was
        handle.write(text[cut_at:])
    # The rest of the stream, U's events included (a late producer), and a re-delivered copy of the first file.
    land_files(config, [[line(e) for e in b] for b in batches[CUT:]], start=CUT)
    replay = Path(config.landing) / "replayed.jsonl"
    replay.write_text("".join(line(e) + "\n" for e in batches[0] if e["user_id"] == user))
    catch_up(config, spark)

    assert verify_forgotten(config, spark, user).clean
    assert auditor_grep(Path(config.home), user) == {}
    log = DeltaTable(config.table_uri("erasure_log")).to_pyarrow_table().to_pylist()
    dropped = sum(json.loads(r["removed"])["events_dropped"] for r in log if r["status"] == "dropped_at_ingest")
    later = 1 + sum(1 for b in batches[CUT:] for e in b if e["user_id"] == user) + \
        sum(1 for e in batches[0] if e["user_id"] == user)
    assert dropped == later and all(r["user_hash"] == result.user_hash for r in log)
    expected = run_oracle(_without(batches, user), GAP_MS, LATENESS_MS)
    assert read_sessions(config) == sorted(expected.closed)
    assert read_open_sessions(spark, config) == sorted(expected.open_sessions)


@pytest.mark.tier("pure")
def test_the_standing_erasure_keeps_newer_events_unless_told(tmp_path):
    """Events of an erased user at or before the erasure are dropped; newer ones are new data, unless
    SESSIONS_ERASURE_DROPS_NEWER; rejected lines are judged by the user their raw text names."""
    import datetime as dt

    from pipelines.ingest.erased import COMPLETE, ErasedUsers, log_erasure, user_hash

    config = make_config(tmp_path)
    at = dt.datetime(2026, 11, 2, tzinfo=dt.timezone.utc)
    log_erasure(config, erasure_id="er-1", hashed=user_hash(config, "gone"), status=COMPLETE, removed={}, at=at)
    at_us = int(at.timestamp() * 1e6)
    users = pa.array(["gone", "gone", "kept", None, None])
    times = pa.array([at_us, at_us + 1, at_us - 5, None, None], pa.int64())
    raw = pa.array([None, None, None, '{"user_id": "go\\u006ee", "event_id": 1}', '{"user_id": "kept"'])
    mask = ErasedUsers.load(config).drop_mask(users, times, raw)
    assert mask.to_pylist() == [True, False, False, True, False]
    strict = make_config(tmp_path, SESSIONS_ERASURE_DROPS_NEWER="true")
    assert ErasedUsers.load(strict).drop_mask(users, times, raw).to_pylist() == [True, True, False, True, False]
    assert os.path.exists(Path(config.home) / "erasure.key")


def _s3_objects(prefix: str) -> dict[str, bytes]:
    import boto3

    bucket, _, key = prefix[len("s3://"):].partition("/")
    client = boto3.client("s3")
    found = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
        for item in page.get("Contents", []):
            found[f"s3://{bucket}/{item['Key']}"] = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
    return found


def _land_s3(config, batches: list[list[dict]], start: int) -> None:
    import boto3

    from pipelines.ingest import ingest

    bucket, _, prefix = config.landing_uri[len("s3://"):].partition("/")
    for i, batch in enumerate(batches):
        boto3.client("s3").put_object(Bucket=bucket, Key=f"{prefix}/part-{start + i:05d}.jsonl",
                                      Body="".join(line(e) + "\n" for e in batch).encode())
        ingest(config, files_per_commit=1)


def _dump(tmp_path: Path, name: str, *prefixes: str) -> Path:
    """The auditor's copy of the objects under `prefixes`, to scan like a local home."""
    root = tmp_path / name
    for prefix in prefixes:
        for uri, data in _s3_objects(prefix).items():
            if not data:
                continue  # a directory marker
            (root / uri[len("s3://"):]).parent.mkdir(parents=True, exist_ok=True)
            (root / uri[len("s3://"):]).write_bytes(data)
    return root


def test_savepoints_and_landing_on_s3_keep_no_byte_of_the_user(spark, tmp_path, s3_endpoint):
    """The same audit with the savepoints and the landed files on S3 (a real S3 HTTP API): every object read back."""
    config = make_config(tmp_path, "rocksdb", SESSIONS_LANDING_URI=f"s3://warehouse/{tmp_path.name}/landing",
                         SESSIONS_SAVEPOINT_URI=f"s3://savepoints/{tmp_path.name}")
    batches = _scenario()
    _land_s3(config, batches[:CUT], 0)
    catch_up(config, spark)
    take_savepoint(config, spark=spark)
    before = auditor_grep(_dump(tmp_path, "before", config.landing_uri, config.savepoint_uri), OPEN_USER)
    assert any("_delta_log" in f for f in before) and any("landing/_ingested" in f for f in before), before

    forget(config, OPEN_USER, spark=spark)
    assert auditor_grep(_dump(tmp_path, "after", config.landing_uri, config.savepoint_uri), OPEN_USER) == {}
    assert auditor_grep(Path(config.home), OPEN_USER) == {}
    assert verify_forgotten(config, spark, OPEN_USER).clean
    _land_s3(config, _without(batches[CUT:], OPEN_USER), CUT)
    catch_up(config, spark)
    _assert_oracle_without(spark, config, batches, OPEN_USER)


def test_a_damaged_savepoint_neither_blocks_the_erasure_nor_keeps_the_user(spark, tmp_path):
    """One savepoint of a chain with a truncated data file: forget still erases U everywhere (the damaged table's
    files that name U go: it cannot be restored anyway), counts it, takes no savepoint, and a second forget of
    another user works too. The live checkpoint is rebuilt only when a file of it names a user: a user with closed
    sessions only is not in the live state but in the versions the checkpoint retains (rebuilt); one landed after
    the last batch is in none of its files (left as it is), and the auditor finds no byte of either."""
    from state_store.savepoint.catalog import SavepointStore

    config = make_config(tmp_path, "rocksdb")
    batches = _scenario()
    land_files(config, [[line(e) for e in b] for b in batches[:2]])
    catch_up(config, spark)
    first = take_savepoint(config, spark=spark, full=True)
    land_files(config, [[line(e) for e in batches[2]]], start=2)
    catch_up(config, spark)
    take_savepoint(config, spark=spark)
    store = SavepointStore.of(config)
    victim = next(p for p in Path(store.state_uri(first.savepoint_id)).rglob("*.parquet") if "_delta_log" not in str(p))
    victim.write_bytes(victim.read_bytes()[:40])  # truncated

    count = len(store.list())
    result = forget(config, CLOSED_USER, spark=spark)
    assert result.removed["savepoints_damaged"] >= 1
    assert (result.removed["live_state_events"], result.removed["state_rebuilt"]) == (0, 1)
    assert len(store.list()) == count  # no savepoint: the state partition is rewritten in place
    assert auditor_grep(Path(config.home), CLOSED_USER) == {}
    assert verify_forgotten(config, spark, CLOSED_USER).clean
    assert forget(config, OPEN_USER, spark=spark).removed["state_rebuilt"] == 1
    assert auditor_grep(Path(config.home), OPEN_USER) == {}

    late = "landed-after-9"
    land_files(config, [[line(make_event(late, f"late-{i}", BASE_MS + i * 60_000, "page_view")) for i in range(3)]],
               start=3)
    count, batch = len(store.list()), inspect_checkpoint(config.checkpoint).last_committed_batch
    result = forget(config, late, spark=spark)
    assert (result.removed["state_rebuilt"], result.removed["landed_lines"]) == (0, 3)
    assert len(store.list()) == count and inspect_checkpoint(config.checkpoint).last_committed_batch == batch
    assert auditor_grep(Path(config.home), late) == {}
