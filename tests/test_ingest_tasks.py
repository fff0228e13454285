"""A large landed file read and parsed by Spark tasks (pipelines.job.ingest_tasks) gives the rows the ingesting
process gives when it reads the file itself -- the independent expectation here -- line by line, hostile lines and
all: the same reasons, line numbers, positions and archive moves; then a catch-up of a large file is the oracle's
sessions, and the ingest order stays the files' order when a large file waits for the session."""
from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import os
import random
import signal
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pipelines.core.sample_data import generate_events, land
from pipelines.errors import SourceUnavailable, StorageUnavailable
from pipelines.ingest import INGESTED_DIR, ingest
from pipelines.ingest.erased import ErasedUsers
from pipelines.ingest.lines import split_lines
from pipelines.ingest.table import RowSource, Span, line_rows, standing_erasure
from pipelines.job.ingest_tasks import SparkIngestTasks
from pipelines.job.stream import catch_up
from testkit.lifecycle_expectations import expected_closed_sessions
from tests.kit.homes import config_env, free_port, make_config, tool
from tests.kit.tables import read_sessions
from tests.test_ingest_columnar import RULES

pytestmark = pytest.mark.tier("spark")

COMPARED = ["source_file", "line_no", "event_id", "user_id", "event_time", "event_type", "page", "reject_reason", "raw",
            "ingest_seq", "row_kind"]


def _hostile_lines(seed: int) -> list[bytes]:
    """Well-formed events among every rule's line, blank lines, lines longer than a task's range, bad UTF-8, CRLF."""
    rng = random.Random(seed)
    events = [json.dumps(e).encode() for e in generate_events(30, 6, seed=seed)]
    hostile = [line for _, line, _ in RULES if b"\n" not in line]
    hostile += [b"", b"   ", b"{not json", b"\xff\xfe", json.dumps({"event_id": "long", "user_id": "u-long",
                "event_time": "2026-11-01T08:00:00Z", "page": "x" * 200_000}).encode(), events[0] + b"\r"]
    lines = events + hostile * 2
    rng.shuffle(lines)
    return lines


def _write(path, lines: list[bytes], *, final_newline: bool = True) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(lines) + (b"\n" if final_newline else b""))


def _rows(config) -> pa.Table:
    table = DeltaTable(config.raw_events_table).to_pyarrow_table()
    return table.select(COMPARED + ["line_key"]).sort_by([("ingest_seq", "ascending"), ("source_file", "ascending"),
                                                          ("line_no", "ascending")])


def _tasks(spark, range_bytes: int = 64 * 1024) -> SparkIngestTasks:
    # Ranges far smaller than the file: tens of tasks, ranges where no line begins (inside the 200,000-byte lines).
    return SparkIngestTasks(spark, min_bytes=1, range_bytes=range_bytes)


def _ingest_both(tmp_path, spark, build) -> tuple:
    """`build(landing)` in two homes: one to ingest here, one by Spark tasks."""
    here, tasks = make_config(tmp_path / "here"), make_config(tmp_path / "tasks")
    build(here.landing)
    build(tasks.landing)
    return here, tasks


def test_a_large_file_read_by_tasks_has_the_rows_of_one_read_line_by_line(spark, tmp_path):
    lines = _hostile_lines(3)
    here, tasks = _ingest_both(tmp_path, spark, lambda landing: _write(landing / "big.jsonl", lines))
    read_here = ingest(here)
    by_tasks = ingest(tasks, large=_tasks(spark))
    assert by_tasks.by_tasks == 1 and read_here.by_tasks == 0
    assert (by_tasks.rows, by_tasks.rejected, by_tasks.files) == (read_here.rows, read_here.rejected, 1)
    got, expected = _rows(tasks), _rows(here)
    assert got.select(COMPARED).equals(expected.select(COMPARED))
    assert got["line_key"].to_pylist() == got["line_no"].to_pylist()  # unique in the commit: one file per commit
    assert pc.count_distinct(got["ingest_seq"]).as_py() == 1
    assert read_here.rejected > 20 and read_here.rows > 200  # the mix really holds both kinds
    for config in (here, tasks):
        assert not (config.landing / "big.jsonl").exists()  # read to its end, unchanged: archived
        assert len(list((config.landing / INGESTED_DIR).glob("*/big.jsonl"))) == 1
    assert ingest(tasks, large=_tasks(spark)).rows == 0  # nothing read twice


def test_a_file_tail_read_by_tasks_numbers_on_after_an_unterminated_line(spark, tmp_path):
    """A complete JSON object without its newline is taken; the newline appended later closes that same line (no
    row, no number), and the moved file's new lines are numbered on -- by the tasks as by a read here."""
    first, more = _hostile_lines(5), _hostile_lines(6)

    def land_first(landing) -> None:
        _write(landing / "tail.jsonl", first + [json.dumps(generate_events(1, 1, seed=9)[0]).encode()],
               final_newline=False)

    here, tasks = _ingest_both(tmp_path, spark, land_first)
    ingest(here)
    ingest(tasks, large=_tasks(spark))
    for config in (here, tasks):  # a writer still holding the moved file appends to it
        (moved,) = (config.landing / INGESTED_DIR).glob("*/tail.jsonl")
        with moved.open("ab") as handle:
            handle.write(b"\n" + b"\n".join(more) + b"\n")
    second_here = ingest(here)
    second = ingest(tasks, large=_tasks(spark, range_bytes=96 * 1024))
    assert second.by_tasks == 1 and second.rows == second_here.rows > 0
    assert _rows(tasks).select(COMPARED).equals(_rows(here).select(COMPARED))
    numbers = _rows(tasks)["line_no"].to_pylist()
    assert len(numbers) == len(set(numbers))


def test_the_tasks_drop_an_erased_users_events_and_say_whose(spark, tmp_path):
    config = make_config(tmp_path)
    lines = _hostile_lines(7)
    path = config.landing / "erased.jsonl"
    _write(path, lines)
    key = b"k" * 32
    victim = json.loads(lines[[k for k, line in enumerate(lines) if b'"user_id": "user-' in line][0]])["user_id"]
    hashed = "hmac-sha256:" + hmac.new(key, victim.encode(), hashlib.sha256).hexdigest()
    erased = ErasedUsers({hashed: 2**62}, key)
    at = dt.datetime(2026, 11, 29, tzinfo=dt.timezone.utc)
    os.makedirs(config.raw_events_table)
    span = Span("erased.jsonl", str(path), 0, path.stat().st_size, 0, False)
    parsed = _tasks(spark, range_bytes=128 * 1024)(span, table_uri=config.raw_events_table, seq=1, ingested_at=at,
                                             max_future=dt.timedelta(hours=1), erased=erased)
    # Expected: the rows of one read here, with the same standing erasure applied to them.
    lines_here, consumed, _ = split_lines(path.read_bytes(), 0, False)
    rows, dropped = standing_erasure(erased, line_rows([RowSource("erased.jsonl", lines_here)], 1, at,
                                                       dt.timedelta(hours=1), keyed_by_line_no=True))
    assert dropped[victim] > 0 and parsed.dropped == dropped
    assert (parsed.rows, parsed.lines) == (rows.num_rows, consumed)
    assert parsed.rejected == rows.num_rows - rows["reject_reason"].null_count
    valid = rows.filter(pc.is_null(rows["reject_reason"]))
    assert parsed.newest_us == pc.max(valid["event_time"].cast(pa.int64())).as_py()
    parsed.discard()
    root = config.raw_events_table
    assert [name for name in os.listdir(root) if name.endswith(".parquet")] == []  # in no version, and gone


def test_a_catch_up_of_a_large_file_is_the_oracles_and_keeps_the_files_order(spark, tmp_path):
    """SESSIONS_INGEST_TASK_MIB=1 (and tasks in local mode too): a small file, a file over 1 MiB, a small file, in that order of landing. The
    ingest while the JVM starts takes the first only; the session's tasks read the large one, then the last is read
    here: ingest_seq follows the landing order, and the sessions are the oracle's."""
    config = make_config(tmp_path, SESSIONS_INGEST_TASK_MIB=1, SESSIONS_INGEST_BY_TASKS="always")
    events = sorted(generate_events(400, 30, seed=11), key=lambda e: e["event_time"])  # no late event by design
    chunks = [events[:1000], events[1000:-1000], events[-1000:]]
    for k, chunk in enumerate(chunks):
        land(config.landing, f"part-{k}.jsonl", [json.dumps(e) for e in chunk])
        os.utime(config.landing / f"part-{k}.jsonl", ns=(10**18 + k * 10**9, 10**18 + k * 10**9))
    assert (config.landing / "part-1.jsonl").stat().st_size > 1 << 20
    summary = catch_up(config, spark)
    assert summary.files_read_by_tasks == 1 and summary.ingested_files == 3
    raw = DeltaTable(config.raw_events_table).to_pyarrow_table(columns=["source_file", "ingest_seq"])
    first_seq = {name: min(s for f, s in zip(raw["source_file"].to_pylist(), raw["ingest_seq"].to_pylist()) if f == name)
                 for name in ("part-0.jsonl", "part-1.jsonl", "part-2.jsonl")}
    assert first_seq["part-0.jsonl"] < first_seq["part-1.jsonl"] < first_seq["part-2.jsonl"]
    assert raw.num_rows == len(events)
    expected = expected_closed_sessions(chunks, 30 * 60_000, 10 * 60_000)  # conftest's gap and lateness
    assert len(expected) > 300 and read_sessions(config) == expected


@pytest.mark.tier("subprocess")
def test_a_catch_up_killed_between_the_tasks_files_and_the_ingest_commit_loses_and_repeats_nothing(tmp_path, spark):
    """`sessionctl catch-up` SIGKILLed at ingest:files-written: the tasks' raw_events files are on disk in no table
    version and the landed file is where it was; the next catch-up reads it again, and every line is in raw_events
    once and every session the oracle's, once. The next catch-up is the library call `sessionctl catch-up` makes, in
    the tests' session: what it must redo is what the killed process left on disk (a second process would add only a
    JVM start; a `sessionctl catch-up` process after a kill: the crash campaign's recoveries)."""
    config = make_config(tmp_path, SESSIONS_INGEST_TASK_MIB=1, SESSIONS_INGEST_BY_TASKS="always")
    events = sorted(generate_events(400, 30, seed=13), key=lambda e: e["event_time"])
    land(config.landing, "big.jsonl", [json.dumps(e) for e in events])
    assert (config.landing / "big.jsonl").stat().st_size > 1 << 20
    env = config_env(config, SESSIONS_INGEST_TASK_MIB=1, SESSIONS_INGEST_BY_TASKS="always")
    killed = subprocess.run([tool("sessionctl"), "catch-up"], env={**env, "SESSIONS_KILL_AT": "ingest:files-written"},
                            capture_output=True, text=True, timeout=600, start_new_session=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    raw = config.raw_events_table
    on_disk = {p.name for p in Path(raw).glob("*.parquet")}
    assert on_disk and not set(DeltaTable(raw).file_uris()) & {str(Path(raw) / name) for name in on_disk}
    assert (config.landing / "big.jsonl").exists()  # not archived: its position was never committed

    assert catch_up(config, spark).to_dict()["files_read_by_tasks"] == 1
    rows = DeltaTable(raw).to_pyarrow_table(columns=["event_id", "line_no"])
    assert sorted(rows["line_no"].to_pylist()) == list(range(1, len(events) + 1))
    assert not (config.landing / "big.jsonl").exists()
    assert read_sessions(config) == expected_closed_sessions([events], 30 * 60_000, 10 * 60_000)


def test_large_landing_objects_on_s3_are_read_by_the_tasks(spark, tmp_path, s3_endpoint):
    """Landing on S3 (a real S3 HTTP API): an object over SESSIONS_INGEST_TASK_MIB, its last line without a newline,
    between two small ones. The tasks read it by ranges from S3; every line once, the objects archived, the sessions
    the oracle's. (raw_events' files on S3 written by tasks: the sink's, tests/test_task_files.py.)"""
    import boto3

    prefix = f"s3://warehouse/{tmp_path.name}"
    config = make_config(tmp_path, SESSIONS_INGEST_TASK_MIB=1, SESSIONS_INGEST_BY_TASKS="always", SESSIONS_LANDING_URI=f"{prefix}/landing")
    events = sorted(generate_events(400, 30, seed=17), key=lambda e: e["event_time"])
    chunks = [events[:500], events[500:-500], events[-500:]]
    client = boto3.client("s3")
    for k, chunk in enumerate(chunks):  # listed in landing order: mtime, then name
        client.put_object(Bucket="warehouse", Key=f"{tmp_path.name}/landing/part-{k}.jsonl",
                          Body="\n".join(json.dumps(e) for e in chunk).encode())
    summary = catch_up(config, spark)
    assert summary.files_read_by_tasks == 1 and summary.ingested_files == 3
    from pipelines.storage import open_table
    raw = open_table(config, config.raw_events_table).to_pyarrow_table(columns=["source_file", "line_no"])
    assert sorted(zip(raw["source_file"].to_pylist(), raw["line_no"].to_pylist())) == sorted(
        (f"part-{k}.jsonl", n) for k, chunk in enumerate(chunks) for n in range(1, len(chunk) + 1))
    listed = [item["Key"] for item in client.list_objects_v2(Bucket="warehouse", Prefix=f"{tmp_path.name}/landing/")[
        "Contents"] if item["Key"].endswith(".jsonl")]
    assert len(listed) == 3 and all("/_ingested/" in key for key in listed), listed
    assert read_sessions(config) == expected_closed_sessions(chunks, 30 * 60_000, 10 * 60_000)


def test_a_landing_the_executors_cannot_see_is_one_line_naming_the_fix(spark, tmp_path):
    """Executors on other hosts than a driver-local landing directory: the file is not where the tasks run (here: a
    path that exists nowhere). One typed line that names the way out, no task files left behind."""
    config = make_config(tmp_path)
    os.makedirs(config.raw_events_table)
    span = Span("gone.jsonl", str(tmp_path / "elsewhere" / "gone.jsonl"), 0, 5 << 20, 0, False)
    with pytest.raises(SourceUnavailable) as raised:
        _tasks(spark, range_bytes=1 << 20)(span, table_uri=config.raw_events_table, seq=1,
                                           ingested_at=dt.datetime.now(dt.timezone.utc),
                                           max_future=dt.timedelta(hours=1), erased=ErasedUsers({}, b""))
    line = str(raised.value)
    assert "\n" not in line and "gone.jsonl" in line and "SESSIONS_INGEST_BY_TASKS=never" in line
    assert os.listdir(config.raw_events_table) == []


def test_s3_refusing_the_tasks_is_storage_unavailable_as_for_an_ingest_here(spark, tmp_path, s3_endpoint,
                                                                           monkeypatch):
    """The landing's S3 endpoint refusing connections while the tasks read: StorageUnavailable, one line naming the
    endpoint -- what `run` rides out, as it does when an ingest here finds S3 down."""
    config = make_config(tmp_path)
    os.makedirs(config.raw_events_table)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    span = Span("part.jsonl", "s3://warehouse/nowhere/part.jsonl", 0, 3 << 20, 0, False)
    with pytest.raises(StorageUnavailable) as raised:
        _tasks(spark, range_bytes=1 << 20)(span, table_uri=config.raw_events_table, seq=1,
                                           ingested_at=dt.datetime.now(dt.timezone.utc),
                                           max_future=dt.timedelta(hours=1), erased=ErasedUsers({}, b""))
    assert "\n" not in str(raised.value) and os.environ["AWS_ENDPOINT_URL"] in str(raised.value)
