"""Every bad input is one line: a table of sessionctl arguments and settings, each refused with a non-zero exit and
exactly one line on stderr, `sessionctl <command>: ...` (argparse's refusals too), never a traceback.

Each was a traceback once (found by a new user): an OverflowError, a DeltaError/OSError of an S3 endpoint that is
down, NotADirectoryError, IndexError of a zero-byte checkpoint log file, a full disk while writing errors.log. Each is
refused at its cause: arguments and settings up front (pipelines.config, sessionctl.checks), a damaged checkpoint log
where it is read (pipelines.job.checkpoint), and only an S3 client's failure no layer below translated at the CLI's
boundary (sessionctl.checks.object_store_failure). Nothing here starts a JVM.
"""
from __future__ import annotations

import http.server
import logging
import os
import re
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.kit.homes import free_port, tool

pytestmark = pytest.mark.tier("subprocess")

OFFSETS = ('v1\n{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{"spark.sql.shuffle.partitions":"2",'
           '"spark.sql.streaming.stateStore.providerClass":"org.apache.spark.sql.execution.streaming.state.'
           'RocksDBStateStoreProvider"}}\n{"seq":1}\n')


def _checkpoint(home: Path, offsets: str = OFFSETS, commit: str = "") -> None:
    """A checkpoint whose batch 0 has these offsets/0 and commits/0 (default: a zero-byte commit file)."""
    root = home / "checkpoints" / "sessions"
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir(parents=True)
    (root / "offsets" / "0").write_text(offsets)
    (root / "commits" / "0").write_text(commit)


def _a_file(name: str) -> Callable[[Path], None]:
    def setup(home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        (home / name).write_text("not a directory\n")
    return setup


def _users_file(home: Path, text: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "users.txt").write_text(text)


def _full_disk(home: Path) -> None:
    """errors.log on a full disk: every write to it fails with ENOSPC."""
    (home / "logs").mkdir(parents=True)
    (home / "logs" / "errors.log").symlink_to("/dev/full")


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    says: str                                   # a regex the one line matches after `sessionctl <command>: `
    env: dict[str, str] = field(default_factory=dict)  # "{home}" and "{s3}" (the fake endpoint) are filled in
    setup: Callable[[Path], None] | None = None
    code: int = 1                               # 2: argparse's refusal


S3_DOWN = {"SESSIONS_WAREHOUSE_URI": "s3://nobucket/x", "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
           "AWS_EC2_METADATA_DISABLED": "true", "SESSIONS_S3_TIMEOUT": "1s", "SESSIONS_S3_MAX_RETRIES": "0",
           "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
CASES = {
    # arguments
    "keep-daily-days overflow": Case(("compact", "--keep-daily-days", "1000000"),
                                     r"argument --keep-daily-days: 1000000 must be <= 36500", code=2),
    "keep-daily-days negative": Case(("compact", "--keep-daily-days", "-3"),
                                     r"argument --keep-daily-days: -3 must be >= 0", code=2),
    "keep-last negative": Case(("compact", "--keep-last", "-1"), r"argument --keep-last: -1 must be >= 1", code=2),
    "keep-last zero": Case(("compact", "--keep-last", "0"), r"argument --keep-last: 0 must be >= 1", code=2),
    "keep-last not a number": Case(("compact", "--keep-last", "all"), r"argument --keep-last: 'all' is not an "
                                   r"integer", code=2),
    "poll-seconds zero": Case(("run", "--poll-seconds", "0"), r"argument --poll-seconds: 0 must be > 0", code=2),
    "poll-seconds negative": Case(("run", "--poll-seconds", "-1"), r"argument --poll-seconds: -1 must be > 0",
                                  code=2),
    "poll-seconds nan": Case(("run", "--poll-seconds", "nan"), r"'nan' is not a finite number", code=2),
    "poll-seconds inf": Case(("run", "--poll-seconds", "inf"), r"'inf' is not a finite number", code=2),
    "poll-seconds huge": Case(("run", "--poll-seconds", "1e300"), r"1e300 must be <= 1e\+09", code=2),
    "stop timeout zero": Case(("stop", "--timeout", "0"), r"argument --timeout: 0 must be > 0", code=2),
    "top zero": Case(("state", "--top", "0"), r"argument --top: 0 must be between 1 and 2147483647", code=2),
    "top negative": Case(("state", "--top", "-5"), r"argument --top: -5 must be between 1", code=2),
    "empty user": Case(("state", "--user", ""), r"argument --user: a user id, not an empty string", code=2),
    "forget empty user": Case(("forget", "--user", " "), r"argument --user: a user id, not an empty string", code=2),
    "forget nobody": Case(("forget",), r"the following arguments are required: --user, --users-file or --requests",
                          code=2),
    "forget requests and a user": Case(("forget", "--requests", "--user", "u1"), r"--requests takes the users from "
                                       r"the request files: not with --user, --users-file or --verify", code=2),
    "forget full without verify": Case(("forget", "--full", "--user", "u1"), r"--full goes with --verify \(an "
                                       r"erasure always goes through every file\)", code=2),
    "forget users file missing": Case(("forget", "--users-file", "home/users.txt"),
                                      r"argument --users-file: no such file: home/users.txt", code=2),
    "forget users file empty": Case(("forget", "--verify", "--users-file", "home/users.txt"),
                                    r"argument --users-file: home/users.txt lists no user id \(one per line; blank "
                                    r"lines are ignored\)", code=2, setup=lambda home: _users_file(home, "\n  \n\n")),
    "unknown command": Case(("compress",), r"argument command: invalid choice: 'compress'", code=2),
    "missing savepoint": Case(("restore",), r"the following arguments are required: --savepoint", code=2),
    # --partitions: 1..MAX_PARTITIONS while parsing (a count Spark cannot take was once "restorable" in a dry run)
    "restore partitions zero": Case(("restore", "--savepoint", "latest", "--partitions", "0"),
                                    r"argument --partitions: 0 must be between 1 and 10000", code=2),
    "rescale partitions zero": Case(("rescale", "--partitions", "0"),
                                    r"argument --partitions: 0 must be between 1 and 10000", code=2),
    "restore partitions huge, dry run": Case(("restore", "--savepoint", "latest", "--partitions",
                                              "99999999999999999999", "--dry-run"),
                                             r"argument --partitions: 99999999999999999999 must be between 1 and "
                                             r"10000", code=2),
    "restore partitions above the bound": Case(("restore", "--savepoint", "latest", "--partitions", "10001"),
                                               r"argument --partitions: 10001 must be between 1 and 10000", code=2),
    "rescale partitions not a number": Case(("rescale", "--partitions", "many"),
                                            r"argument --partitions: 'many' is not an integer", code=2),
    "unknown savepoint": Case(("restore", "--savepoint", "sp-nope"), r"no such savepoint: sp-nope"),
    "unknown savepoint, dry run": Case(("restore", "--savepoint", "sp-nope", "--dry-run"),
                                       r"no such savepoint: sp-nope"),
    "diff of one": Case(("savepoints", "diff", "a"), r"savepoints diff takes two savepoints"),
    # settings
    "lease ttl 1e11": Case(("status", "--no-state"), r"SESSIONS_LEASE_TTL_S=1e\+11 is too long: at most 86400",
                           {"SESSIONS_LEASE_TTL_S": "1e11"}),
    "keep daily days setting": Case(("compact",), r"SESSIONS_KEEP_DAILY_DAYS=1000000 must be <= 36500",
                                    {"SESSIONS_KEEP_DAILY_DAYS": "1000000"}),
    "a huge number": Case(("status", "--no-state"), r"SESSIONS_MAX_FUTURE_MINUTES=99999999999 must be <= 2147483647",
                          {"SESSIONS_MAX_FUTURE_MINUTES": "99999999999"}),
    "vacuum below its floor": Case(("compact", "--dry-run"), r"SESSIONS_VACUUM_RETENTION_HOURS=0 is below 24",
                                   {"SESSIONS_VACUUM_RETENTION_HOURS": "0"}),
    "s3 timeout": Case(("status", "--no-state"), r"SESSIONS_S3_TIMEOUT='soon' is not a duration",
                       {"SESSIONS_S3_TIMEOUT": "soon"}),
    "driver memory": Case(("status", "--no-state"), r"SESSIONS_SPARK_DRIVER_MEMORY='lots' is not a size",
                          {"SESSIONS_SPARK_DRIVER_MEMORY": "lots"}),
    # Spark's own settings, checked before a JVM would fail as "Java gateway process exited"
    "driver memory zero": Case(("state", "--top", "1"), r"SESSIONS_SPARK_DRIVER_MEMORY='0' is not a size",
                               {"SESSIONS_SPARK_DRIVER_MEMORY": "0"}),
    "driver memory without a unit": Case(("catch-up",), r"SESSIONS_SPARK_DRIVER_MEMORY='4096' is not a size",
                                         {"SESSIONS_SPARK_DRIVER_MEMORY": "4096"}),
    "driver memory below Spark's floor": Case(("status",), r"SESSIONS_SPARK_DRIVER_MEMORY='64m' is too small: "
                                              r"between 512m", {"SESSIONS_SPARK_DRIVER_MEMORY": "64m"}),
    "spark master nonsense": Case(("catch-up",), r"SESSIONS_SPARK_MASTER='nonsense' is not a Spark master",
                                  {"SESSIONS_SPARK_MASTER": "nonsense"}),
    "spark master local[0]": Case(("status",), r"SESSIONS_SPARK_MASTER='local\[0\]' is not a Spark master",
                                  {"SESSIONS_SPARK_MASTER": "local[0]"}),
    # Locations: s3 without a bucket once became ./s3: in the working directory
    "lease uri s3 without a bucket": Case(("catch-up",), r"SESSIONS_LEASE_URI='s3://' names no bucket: expected "
                                          r"s3://bucket/prefix", {"SESSIONS_LEASE_URI": "s3://"}),
    "savepoint uri s3 without a bucket": Case(("savepoints",), r"SESSIONS_SAVEPOINT_URI='s3:///x' names no bucket",
                                              {"SESSIONS_SAVEPOINT_URI": "s3:///x"}),
    "lease uri unsupported scheme": Case(("status", "--no-state"), r"SESSIONS_LEASE_URI='gs://b/leases': the "
                                         r"scheme gs:// is not supported", {"SESSIONS_LEASE_URI": "gs://b/leases"}),
    "warehouse uri upper-case S3": Case(("status", "--no-state"), r"SESSIONS_WAREHOUSE_URI='S3://b/w': the scheme "
                                        r"S3:// is not supported", {"SESSIONS_WAREHOUSE_URI": "S3://b/w"}),
    # Leases: renewals every TTL/3 need a TTL of at least a second
    "lease ttl too short": Case(("catch-up",), r"SESSIONS_LEASE_TTL_S=0.001 is too short: at least 1 s",
                                {"SESSIONS_LEASE_TTL_S": "0.001"}),
    "lease ttl zero": Case(("status", "--no-state"), r"SESSIONS_LEASE_TTL_S=0 must be > 0",
                           {"SESSIONS_LEASE_TTL_S": "0"}),
    "kafka plugin": Case(("status", "--no-state"), r"SESSIONS_KAFKA_CONF: 'plugin.library.paths' is not an allowed",
                         {"SESSIONS_KAFKA_CONF": "plugin.library.paths=/tmp/evil.so"}),
    "checkpoint uri names a file": Case(("status", "--no-state"),
                                        r"SESSIONS_CHECKPOINT_URI='[^']+/home/ck' is a file, not a directory",
                                        {"SESSIONS_CHECKPOINT_URI": "{home}/ck"}, setup=_a_file("ck")),
    "checkpoint uri under a file": Case(("catch-up",), r"SESSIONS_CHECKPOINT_URI='[^']+/home/ck/x' lies under "
                                        r"[^ ]+/home/ck, a file", {"SESSIONS_CHECKPOINT_URI": "{home}/ck/x"},
                                        setup=_a_file("ck")),
    "home's checkpoints a file": Case(("status", "--no-state"), r"SESSIONS_CHECKPOINT_URI \(unset: [^)]+/home/"
                                      r"checkpoints\) is a file", setup=_a_file("checkpoints")),
    # storage
    "s3 endpoint down": Case(("status", "--no-state"), r"S3 endpoint http://127.0.0.1:9 is unreachable for "
                             r"s3://nobucket/x \(Connection refused\)", S3_DOWN),
    "s3 endpoint down, errors.log on a full disk": Case(("status", "--no-state"), r"S3 endpoint http://127.0.0.1:9 "
                                                        r"is unreachable", S3_DOWN, setup=_full_disk),
    "s3 endpoint that is no s3": Case(("status", "--no-state"), r"S3 at http://127.0.0.1:\d+ failed for "
                                      r"s3://nobucket/x \(.*\): check the endpoint",
                                      {**S3_DOWN, "AWS_ENDPOINT_URL": "{s3}"}),
    # a damaged checkpoint log
    "zero-byte commit, status": Case(("status", "--no-state"), r"the checkpoint log file commits/0 of [^ ]+ is "
                                     r"empty: `sessionctl restore --savepoint latest`", setup=_checkpoint),
    "zero-byte commit, catch-up": Case(("catch-up",), r"the checkpoint log file commits/0 of [^ ]+ is empty",
                                       setup=_checkpoint),
    "zero-byte offsets, status": Case(("status", "--no-state"), r"the checkpoint log file offsets/0 of [^ ]+ is "
                                      r"empty", setup=lambda home: _checkpoint(home, offsets="", commit="v1\n{}\n")),
    "cut-short offsets, catch-up": Case(("catch-up",), r"offsets/0 of [^ ]+ is cut short",
                                        setup=lambda home: _checkpoint(home, offsets="v1\n", commit="v1\n{}\n")),
    "garbled commit, status": Case(("status", "--no-state"), r"commits/0 of [^ ]+ is not valid JSON",
                                   setup=lambda home: _checkpoint(home, commit="v1\n{\"nextBatch\n")),
}


@pytest.fixture(scope="module")
def not_s3() -> Iterator[str]:
    """An HTTP server that answers, but is no S3: every request a 404 page."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_input_is_one_line(tmp_path, not_s3, name):
    case = CASES[name]
    home = tmp_path / "home"
    if case.setup is not None:
        case.setup(home)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SESSIONS_", "AWS_"))}
    env.update({"SESSIONS_HOME": str(home), "SESSIONS_IDLE_CLOSE_MINUTES": "0"})
    env.update({k: v.format(home=home, s3=not_s3) for k, v in case.env.items()})
    done = subprocess.run([tool("sessionctl"), *case.argv], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    prefix = "sessionctl: " if name == "unknown command" else f"sessionctl {case.argv[0]}: "
    assert done.returncode == case.code, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stderr and "Logging error" not in done.stderr, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(prefix) and re.search(case.says, lines[0]), lines[0]
    assert "/tmp/evil.so" not in lines[0]  # a Kafka setting's value is never echoed
    assert done.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["home"])  # nothing made in the working directory


@pytest.mark.tier("pure")
def test_a_log_that_cannot_be_written_never_replaces_the_one_line(tmp_path, capsys):
    """log_traceback (Spark failures' details, in-process) and the CLI's errors.log handler drop what they cannot
    write -- a full disk, a log directory that is a file -- and the one line of the error stands."""
    from pyspark.errors import PySparkException

    from pipelines.errors import StreamFailed
    from pipelines.job.runtime import log_traceback, spark_failures
    from sessionctl.checks import LogFile
    from tests.kit.homes import make_config

    full = make_config(tmp_path / "full")
    _full_disk(full.home)
    a_file = make_config(tmp_path / "file")
    _a_file("logs")(a_file.home)
    for config in (full, a_file):
        with pytest.raises(StreamFailed, match="Spark failed: the query broke"), spark_failures(config):
            raise PySparkException(message="the query broke")
        try:
            raise ValueError("handled")
        except ValueError:
            log_traceback(config)  # nothing raised
    assert (a_file.home / "logs").is_file()

    handler = LogFile(full.log_dir / "errors.log")
    logger = logging.getLogger("tests.one_line")
    logger.addHandler(handler)
    try:
        logger.error("details", exc_info=ValueError("x"))
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert capsys.readouterr().err == ""  # no "--- Logging error ---" block


# --- exit codes of the checks: 0 yes, 3 no (the answer still on stdout), 1 the check failed -----------------------

def a_savepoint(home: Path) -> str:
    """A complete, empty savepoint of the default settings (gap 30, lateness 10) in `home`'s catalog, written
    without Spark: what a restore's pre-flight reads (the catalog row and the table's Delta log). Its id."""
    import datetime as dt

    import pyarrow as pa

    from pipelines.config import SessionsConfig
    from pipelines.core import state_format
    from state_store.results import SavepointInfo
    from state_store.savepoint.catalog import SavepointStore
    from state_store.savepoint.checksum import state_checksum

    config = SessionsConfig.from_env({"SESSIONS_HOME": str(home)})
    store = SavepointStore.of(config)
    savepoint_id = "sp-20260101T000000-b0-0000"
    empty = pa.Table.from_pylist([], schema=state_format.CANONICAL_SCHEMA)
    store.write_state(savepoint_id, empty)
    store.record(SavepointInfo.from_row({
        "savepoint_id": savepoint_id, "status": "complete", "trigger": "manual",
        "created_at": dt.datetime.now(dt.timezone.utc), "batch_id": 0, "source_seq": 0, "watermark_ms": 0,
        "gap_ms": config.rules.gap_ms, "lateness_ms": config.rules.lateness_ms, "buckets": config.state_buckets,
        "provider": config.state_store, "partitions": 2, "state_schema": state_format.SCHEMA_ID, "rows": 0,
        "checksum": state_checksum(empty), "sessions_version": 0, "quarantine_version": 0,
        "incarnation": "test", "bytes": 0, "seconds": 0.0, "kind": "full", "chain": savepoint_id, "table_rows": 0}))
    return savepoint_id


def _env(home: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SESSIONS_", "AWS_"))}
    return {**env, "SESSIONS_HOME": str(home), "SESSIONS_IDLE_CLOSE_MINUTES": "0", **settings}


def _sessionctl(env: dict[str, str], *args: str, prefix: tuple[str, ...] = (),
                cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, tool("sessionctl"), *args], env=env, capture_output=True, text=True, timeout=300,
                          cwd=cwd)


def test_restore_dry_run_exits_3_when_not_restorable(tmp_path):
    import json

    from pipelines.config import SessionsConfig
    from state_store.preflight import plan_restore

    home = tmp_path / "home"
    savepoint_id = a_savepoint(home)
    yes = _sessionctl(_env(home), "restore", "--savepoint", savepoint_id, "--dry-run", "--json")
    assert yes.returncode == 0 and yes.stderr == "", yes.stderr[-3000:]
    assert json.loads(yes.stdout)["restorable"] is True
    edge = _sessionctl(_env(home), "restore", "--savepoint", "latest", "--partitions", "10000", "--dry-run", "--json")
    assert edge.returncode == 0 and json.loads(edge.stdout)["restorable"] is True, edge.stderr[-3000:]

    other_gap = _env(home, SESSIONS_GAP_MINUTES="45")  # the savepoint was taken with 30: needs --migrate
    no = _sessionctl(other_gap, "restore", "--savepoint", savepoint_id, "--dry-run", "--json")
    assert no.returncode == 3, no.stderr[-3000:]
    plan = json.loads(no.stdout)  # the answer, as when restorable
    assert plan["restorable"] is False and "pass --migrate" in plan["reasons"][0]
    [line] = no.stderr.splitlines()
    assert line.startswith(f"sessionctl restore: savepoint {savepoint_id} is not restorable: savepoint "
                           f"{savepoint_id} was taken with gap 30 min") and "Traceback" not in no.stderr
    text = _sessionctl(other_gap, "restore", "--savepoint", savepoint_id, "--dry-run")
    assert text.returncode == 3 and "NOT restorable" in text.stdout and len(text.stderr.splitlines()) == 1
    migrated = _sessionctl(other_gap, "restore", "--savepoint", savepoint_id, "--dry-run", "--migrate", "--json")
    assert migrated.returncode == 0 and json.loads(migrated.stdout)["restorable"] is True
    failed = _sessionctl(_env(home), "restore", "--savepoint", "sp-nope", "--dry-run", "--json")
    assert failed.returncode == 1 and failed.stdout == ""  # the check itself failed: 1, not 3

    # The library's pre-flight (Dagster's runbook) bounds partitions as the CLI does.
    config = SessionsConfig.from_env({"SESSIONS_HOME": str(home)})
    huge = plan_restore(config, savepoint_id, partitions=99999999999999999999)
    assert not huge.restorable and huge.reasons == ["--partitions must be between 1 and 10000, got "
                                                    "99999999999999999999"]


# --- a read-only home ------------------------------------------------------------------------------------------------

@contextmanager
def read_only(home: Path) -> Iterator[tuple[str, ...]]:
    """A command prefix that runs a command with `home` read-only. Root writes whatever the permissions say: there,
    a read-only bind mount of it in the command's own mount namespace (gone with the process; skipped where the
    container cannot mount); anyone else: the write permission taken away meanwhile."""
    if os.geteuid() != 0:
        paths = [home, *home.rglob("*")]
        modes = {path: path.stat().st_mode for path in paths if not path.is_symlink()}
        for path, mode in modes.items():
            path.chmod(mode & ~0o222)
        try:
            yield ()
        finally:
            for path, mode in modes.items():
                path.chmod(mode)
        return
    prefix = ("unshare", "--mount", "sh", "-c",
              'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"', str(home))
    probe = subprocess.run([*prefix, "touch", str(home / ".probe")], capture_output=True, text=True, timeout=60)
    if "Read-only file system" not in probe.stderr:
        pytest.skip(f"no read-only bind mount here (unshare/mount: {probe.stderr.strip()[:200]!r})")
    yield prefix


def test_a_read_only_home_refuses_writes_in_one_line_and_still_answers_reads(tmp_path):
    """Commands that write (catch-up, savepoint, compact, forget, stop) are refused before they start, in one line
    naming SESSIONS_HOME; the ones that only read and start no JVM (status --no-state, savepoints, restore --dry-run)
    answer as on a writable home. (The JVM's commands: tests/test_read_only_home.py.)"""
    import json

    home = tmp_path / "home"
    savepoint_id = a_savepoint(home)
    env = _env(home)
    with read_only(home) as prefix:
        for argv in (("catch-up",), ("savepoint", "--json"), ("compact", "--dry-run"), ("forget", "--user", "u-1"),
                     ("stop",), ("restore", "--savepoint", "latest")):
            done = _sessionctl(env, *argv, prefix=prefix, cwd=tmp_path)
            assert done.returncode == 1 and done.stdout == "", (argv, done.stderr[-3000:])
            [line] = done.stderr.splitlines()
            assert line.startswith(f"sessionctl {argv[0]}: SESSIONS_HOME {home.resolve()} is not writable ("), line
            assert f"`sessionctl {argv[0]}{' --dry-run' if '--dry-run' in argv else ''}` writes there" in line
        listed = _sessionctl(env, "savepoints", "--json", prefix=prefix)
        assert listed.returncode == 0 and [s["savepoint_id"] for s in json.loads(listed.stdout)] == [savepoint_id]
        status = _sessionctl(env, "status", "--json", "--no-state", prefix=prefix)
        assert status.returncode == 0 and json.loads(status.stdout)["last_committed_batch"] is None, status.stderr
        dry = _sessionctl(env, "restore", "--savepoint", "latest", "--dry-run", "--json", prefix=prefix)
        assert dry.returncode == 0 and json.loads(dry.stdout)["restorable"] is True, dry.stderr[-3000:]
    assert not (home / "logs").exists() and not (home / ".probe").exists()  # nothing was written
