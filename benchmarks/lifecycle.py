"""Savepoint / restore / rescale cost as state grows, side by side with a raw pyarrow Parquet write.

For each size N (open users in state): land N users x 2 recent events, catch up (state = N users, 2N
events), then measure in one run:
  savepoint      state_store.lifecycle.take_savepoint, full (the executors read the state, write the Delta table's
                 files and re-read them to verify; the driver commits their metadata) -> rows/s, MB/s, and the peak
                 resident memory of the driver's Python process and of the JVM during it (PeakRss)
  incremental    (not with --savepoint-only) 1% of the users get a new event (not raising the watermark: only they
                 change), then the savepoint after it -- incremental (SESSIONS_SAVEPOINT_FULL_EVERY=10 here), read
                 from Spark's state change feed -- and a full one (--full) of the same batch, side by side; the
                 restore below restores the incremental one (its chain resolved by the executors)
  parquet        pyarrow.parquet.write_table of the same canonical rows (the floor for writing them)
  delta write    SavepointStore.write_state alone (delta-rs) of the same rows, for the write share
  state read     Spark's state data source -> canonical Arrow rows alone, for the read share
  restore        state_store.lifecycle.restore of the incremental savepoint into a fresh checkpoint, verified
  rescale        state_store.rescale.rescale(partitions * 2)
  online         (--online) a savepoint of the RUNNING stream: `sessionctl run` in its own process with a file of
                 touched users landing every 2 s; the savepoint's duration, and the stream's per-batch latency
                 (offsets/N -> commits/N file times) during it vs without it, in the same run
Results: benchmarks/results/lifecycle.json and lifecycle.md. Usage:
  .venv/bin/python benchmarks/lifecycle.py [--sizes 10000,100000] [--provider rocksdb|hdfs|both] [--large]
                                           [--savepoint-only] [--scale [--master spark://127.0.0.1:7077]]
                                           [--running-rescale] [--running-restore] [--native]
                                           [--canonical-restore [--baseline REV]]
  native         (--native) only native vs canonical: a full savepoint with and without its native copy, then
                 `sessionctl restore` as whole commands (native, --canonical, native) and the first catch-up after each
  running rescale (--running-rescale) only a rescale 4 -> 8 of a running `sessionctl run`, files landing: the
                 downtime the stream reports and the one its checkpoint's commit times show
  running restore (--running-restore) only `restore --online` of a running `sessionctl run`, files landing, to a
                 savepoint taken beside it a little earlier: the restore's phases and the downtime the stream reports
  canonical restore (--canonical-restore) only `sessionctl restore --canonical` of one full savepoint as whole
                 commands, the restore of a baseline revision (--baseline, default the one before the state writer:
                 its bootstrap batch loads the rows as Spark's initial state) and of this tree,
                 alternating, twice each, each followed by the catch-up of one small file; every answer's checksum
                 must be the savepoint's
  scale          (--scale) only a full savepoint and its restore, with the peak memory of the driver's Python
                 process, its JVM and each executor JVM of a standalone cluster (--master): the driver's must not
                 grow with the state. The state is built by one process, measured by a fresh one (whose driver never
                 ingested it: ingest's own memory is not the savepoint's)
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipelines.config import SessionsConfig  # noqa: E402
from pipelines.core.sample_data import land  # noqa: E402
from pipelines.job.runtime import get_spark, stop_spark, stop_state_stores  # noqa: E402
from pipelines.job.stream import catch_up  # noqa: E402
from state_store.lifecycle import restore, take_savepoint  # noqa: E402
from state_store.rescale import rescale  # noqa: E402
from state_store.savepoint import catalog as sp  # noqa: E402
from testkit.lifecycle_expectations import live_state  # noqa: E402


def _status_kib(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class PeakRss:
    """Peak resident memory (MiB) of processes while the block runs. Each process's VmHWM is reset at the start
    (`5` into /proc/PID/clear_refs) and read at the end; VmRSS is also polled every 50 ms (the only measure where the
    reset is refused). Also each process's RSS when the block started."""

    def __init__(self, pids: dict[str, int], every_s: float = 0.05) -> None:
        self.pids, self.every_s = {k: v for k, v in pids.items() if v}, every_s
        self.peak_kib: dict[str, int] = {}
        self.start_kib: dict[str, int] = {}
        self.reset: dict[str, bool] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.pids.items():
                self.peak_kib[name] = max(self.peak_kib.get(name, 0), _status_kib(pid, "VmRSS") or 0)
            self._stop.wait(self.every_s)

    def __enter__(self) -> PeakRss:
        for name, pid in self.pids.items():
            self.start_kib[name] = _status_kib(pid, "VmRSS") or 0
            try:
                Path(f"/proc/{pid}/clear_refs").write_text("5")
                self.reset[name] = True
            except OSError:
                self.reset[name] = False
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        for name, pid in self.pids.items():
            if self.reset[name]:
                self.peak_kib[name] = max(self.peak_kib.get(name, 0), _status_kib(pid, "VmHWM") or 0)

    def figures(self, prefix: str) -> dict:
        out = {}
        for name in self.pids:
            out[f"{prefix}_{name}_peak_mib"] = round(self.peak_kib.get(name, 0) / 1024, 1)
            out[f"{prefix}_{name}_start_mib"] = round(self.start_kib.get(name, 0) / 1024, 1)
        return out


def _executor_pids() -> list[int]:
    """The standalone cluster's executor JVMs on this machine (CoarseGrainedExecutorBackend), oldest first."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"CoarseGrainedExecutorBackend" in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return sorted(found)


def process_ids(spark) -> dict[str, int]:
    """This (the driver's Python) process, the JVM pyspark started for it (local mode: the executors too) and, on a
    standalone cluster, each executor JVM."""
    proc = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
    ids = {"python": os.getpid(), "jvm": getattr(proc, "pid", 0)}
    if not spark.sparkContext.master.startswith("local"):
        ids.update({f"executor{i}": pid for i, pid in enumerate(_executor_pids(), 1)})
    return ids


def state_home(prefix: str, provider: str, users: int) -> tuple[Path, SessionsConfig]:
    """A new home holding `users` open users (build_state), its Spark stopped: for benchmarks of whole commands."""
    home = Path(tempfile.mkdtemp(prefix=prefix))
    config = _config(home, provider, None)
    spark = get_spark(config)
    build_state(config, users, spark)
    stop_spark(spark)  # the commands measured start their own
    return home, config


def build_state(config: SessionsConfig, users: int, spark, users_per_file: int = 100_000, *, start: int = 0) -> None:
    """Users `start` .. `users` - 1 x 2 events, landed in files of `users_per_file` users (this process never holds
    them all)."""
    base = dt.datetime(2026, 11, 1, 10, tzinfo=dt.timezone.utc)
    for first in range(start, users, users_per_file):
        lines = []
        for u in range(first, min(users, first + users_per_file)):
            for k in range(2):
                t = base + dt.timedelta(seconds=(u % 600) + 30 * k)
                lines.append(json.dumps({"event_id": f"e{u}-{k}", "user_id": f"u{u:07d}",
                                         "event_time": t.isoformat().replace("+00:00", "Z"),
                                         "event_type": "page_view", "page": "/"}))
        land(config.landing, f"state-{first // users_per_file:05d}.jsonl", lines)
    catch_up(config, spark)


def touch_users(config: SessionsConfig, users: int, spark, share: int = 100) -> int:
    """One new event for every `share`-th user (1%), inside the window build_state's events span: not late, and the
    maximum event time -- so the watermark -- stays where it was, so no other user is re-walked."""
    at = (dt.datetime(2026, 11, 1, 10, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=500)).isoformat()
    at = at.replace("+00:00", "Z")
    touched = range(0, users, share)
    land(config.landing, "touch.jsonl", [json.dumps({"event_id": f"t{u}", "user_id": f"u{u:07d}", "event_time": at,
                                                      "event_type": "page_view", "page": "/"}) for u in touched])
    catch_up(config, spark)
    return len(touched)


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _batch_spans(checkpoint: Path) -> dict[int, tuple[float, float]]:
    """(start, end) wall times of each committed batch still in the logs: its offset-log file, then its commit file."""
    spans: dict[int, tuple[float, float]] = {}
    try:
        commits = list((checkpoint / "commits").iterdir())
    except OSError:  # a restore between two checkpoints: set aside, the new one not made yet
        return spans
    for commit in commits:
        try:
            if commit.name.isdigit():
                spans[int(commit.name)] = ((checkpoint / "offsets" / commit.name).stat().st_mtime,
                                           commit.stat().st_mtime)
        except OSError:  # purged meanwhile
            continue
    return spans


class BatchSpans:
    """Every batch's span, sampled while the block runs: Spark purges its offset and commit logs down to the last
    SESSIONS_MIN_BATCHES_TO_RETAIN batches, so reading them once at the end would miss the earlier ones."""

    def __init__(self, checkpoint: Path, every_s: float = 0.5) -> None:
        self.checkpoint, self.every_s, self.spans = checkpoint, every_s, {}
        self.commit_times: set[float] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while True:
            found = _batch_spans(self.checkpoint)
            self.spans.update(found)
            # By time, not by batch id: a restore's new checkpoint numbers its batches from 0 again.
            self.commit_times.update(end for _, end in found.values())
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> BatchSpans:
        self.before = set(_batch_spans(self.checkpoint))
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.spans.update(_batch_spans(self.checkpoint))

    def new(self) -> list[tuple[float, float]]:
        return [span for batch, span in sorted(self.spans.items()) if batch not in self.before]


@contextlib.contextmanager
def running_stream(config: SessionsConfig, users: int) -> Iterator[BatchSpans]:
    """`sessionctl run` (its own JVM) with a file of touched users landing every 2 s, its batches sampled; yields once
    the stream committed 3 batches, stops it (Ctrl-C) afterwards."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SESSIONS_")},
           "SESSIONS_HOME": str(config.home), "SESSIONS_STATE_STORE": config.state_store,
           "SESSIONS_STATE_PARTITIONS": str(config.state_partitions), "SESSIONS_SPARK_MASTER": config.spark_master,
           "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO)}
    # The producer is its own process: in this one, the savepoint's Python work would starve a feeder thread of the
    # GIL, and a stream with no new file makes no batch to measure.
    feeder_code = (
        "import datetime as dt, json, sys, time\n"
        "from pathlib import Path\n"
        "from pipelines.core.sample_data import land\n"
        "landing, users = Path(sys.argv[1]), int(sys.argv[2])\n"
        "base = dt.datetime(2026, 11, 1, 10, 20, tzinfo=dt.timezone.utc)\n"
        "for k in range(100000):\n"
        "    t = (base + dt.timedelta(seconds=k)).isoformat().replace('+00:00', 'Z')\n"
        "    land(landing, f'live-{k:05d}.jsonl', [json.dumps({'event_id': f'live-{k}-{u}', 'user_id': f'u{u:07d}',"
        " 'event_time': t, 'event_type': 'page_view', 'page': '/'})"
        " for u in range(k * 997 % users, users, max(1, users // 5000))])\n"
        "    time.sleep(2.0)\n")
    run = subprocess.Popen([str(Path(sys.executable).parent / "sessionctl"), "run", "--poll-seconds", "1"], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    feeder = None
    try:
        with BatchSpans(config.checkpoint) as sampled:
            feeder = subprocess.Popen([sys.executable, "-c", feeder_code, str(config.landing), str(users)], env=env)
            deadline = time.monotonic() + 300
            while len(sampled.new()) < 3 and time.monotonic() < deadline:
                time.sleep(0.5)
            yield sampled
    finally:
        if feeder is not None:
            feeder.kill()
            feeder.wait()
        run.send_signal(signal.SIGINT)
        run.wait(timeout=600)


def measure_online(config: SessionsConfig, users: int, spark, quiet_s: float = 25.0) -> dict:
    """A savepoint beside `sessionctl run` (its own JVM), files landing; batch latency during vs without it."""
    with running_stream(config, users) as sampled:
        time.sleep(quiet_s)  # batches without a savepoint
        started_wall, started = time.time(), time.monotonic()
        saved = take_savepoint(config, spark=spark)
        online_s, ended_wall = time.monotonic() - started, time.time()
        time.sleep(quiet_s)  # and after it
    spans = sampled.new()
    during = [end - start for start, end in spans if start < ended_wall and end > started_wall]
    without = [end - start for start, end in spans if end <= started_wall or start >= ended_wall]
    return {"online_savepoint_s": round(online_s, 3), "online_savepoint_batch": saved.batch_id,
            "online_rows": saved.rows,
            "batch_s_during_savepoint_median": round(statistics.median(during), 3) if during else None,
            "batches_during": len(during),
            "batch_s_without_median": round(statistics.median(without), 3) if without else None,
            "batches_without": len(without),
            # every batch as (start, end) seconds from the savepoint's start: what "during" and "without" were made of
            "batch_spans_from_savepoint_s": [(round(start - started_wall, 2), round(end - started_wall, 2))
                                             for start, end in spans]}


def measure_running_rescale(provider: str, users: int, spark, work: Path, quiet_s: float = 10.0,
                            master: str | None = None) -> dict:
    """`rescale` (4 -> 8 partitions) of a running `sessionctl run`, files landing: the downtime the stream reports
    (Spark's progress times) beside the one its checkpoint shows (the commit-log file times: the last batch before
    the request's answer and the first after). On a cluster's `master` the stream and this process are two
    applications: each needs `spark.cores.max` below the cluster's cores (PYSPARK_SUBMIT_ARGS) to get executors."""
    config = _config(work / f"running-rescale-{provider}-{users}", provider, master)
    began = time.monotonic()
    build_state(config, users, spark)
    build_s = time.monotonic() - began
    with running_stream(config, users) as sampled:
        time.sleep(quiet_s)
        asked = time.time()
        result = rescale(config, config.state_partitions * 2)
        answered = time.time()
        time.sleep(quiet_s)
    ends = sorted(sampled.commit_times)
    before = [end for end in ends if end <= asked]
    # The rescale's own commits (Spark's repartition batch; a restore's bootstrap batch) come before the query runs
    # again, `resumed_s` after the last batch before: the first batch after is the first commit past that.
    resumed_at = before[-1] + (result.resumed_seconds or 0.0) if before else asked
    after = [end for end in ends if end > resumed_at]
    checkpoint_downtime = round(after[0] - before[-1], 3) if before and after else None
    if result.method == "prepared":  # the stream committed all through the preparation: only its own report says
        checkpoint_downtime = None
    return {"provider": provider, "users": users, "build_s": round(build_s, 1), "partitions": "4 -> 8",
            "rescale_method": result.method, "state_rows": result.rows, "rescale_s": result.seconds,
            "rescale_phases": result.phases,
            "downtime_s": result.downtime_seconds, "resumed_s": result.resumed_seconds,
            "checkpoint_downtime_s": checkpoint_downtime, "request_to_answer_s": round(answered - asked, 3),
            "master": config.spark_master, "load_avg_1m": round(os.getloadavg()[0], 2), "load_end": _load()}


def measure_running_restore(provider: str, users: int, spark, work: Path, quiet_s: float = 10.0) -> dict:
    """`restore --online` of a running `sessionctl run`, files landing, to a savepoint taken beside it `quiet_s`
    earlier: the restore's own seconds and phases, and the downtime the stream reports (Spark's progress times)."""
    config = _config(work / f"running-restore-{provider}-{users}", provider, None)
    began = time.monotonic()
    build_state(config, users, spark)
    build_s = time.monotonic() - began
    restores = []
    with running_stream(config, users):
        time.sleep(quiet_s)
        # beside the stream, as an operator would; with its native copy, which the first restore below skips
        saved = take_savepoint(config, spark=spark, native_copy=True)
        for canonical in (True, False):
            time.sleep(quiet_s)
            asked = time.time()
            result = restore(config, saved.savepoint_id, online=True, canonical=canonical)
            answered = time.time()
            restores.append({"method": result.method, "restore_s": result.seconds, "restore_phases": result.phases,
                             "rolled_back": result.rolled_back, "downtime_s": result.downtime_seconds,
                             "resumed_s": result.resumed_seconds, "request_to_answer_s": round(answered - asked, 3),
                             "load_avg_1m": round(os.getloadavg()[0], 2)})
        time.sleep(quiet_s)
    return {"provider": provider, "users": users, "build_s": round(build_s, 1), "state_rows": saved.rows,
            "restores": restores, "load_end": _load()}


def _env(home: Path, provider: str, master: str | None) -> dict[str, str]:
    env = {"SESSIONS_HOME": str(home), "SESSIONS_STATE_STORE": provider, "SESSIONS_STATE_PARTITIONS": "4",
           "SESSIONS_SAVEPOINT_FULL_EVERY": "10"}  # incremental savepoints, whatever the default
    return {**env, **({"SESSIONS_SPARK_MASTER": master} if master else {})}


def _config(home: Path, provider: str, master: str | None) -> SessionsConfig:
    return SessionsConfig.from_env(_env(home, provider, master))


def _sessionctl(home: Path, provider: str, *args: str, master: str | None = None,
                code: Path | None = None) -> tuple[float, dict]:
    """A whole `sessionctl` command, as an operator waits for it: (wall seconds, its JSON answer). `code`: the tree
    whose Python runs it (PYTHONPATH; the venv's own install otherwise)."""
    env = {**os.environ, **_env(home, provider, master), **({"PYTHONPATH": str(code)} if code else {})}
    began = time.monotonic()
    done = subprocess.run([str(REPO / ".venv" / "bin" / "sessionctl"), *args], capture_output=True, text=True,
                          env=env, timeout=1800)
    if done.returncode != 0:  # its one line says why
        raise SystemExit(f"sessionctl {' '.join(args)} (code {code or REPO}) failed: {done.stderr.strip()[-2000:]}")
    return round(time.monotonic() - began, 3), json.loads(done.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def savepoint_phases() -> Iterator[dict[str, float]]:
    """Seconds of a savepoint's parts taken in this process (state_store.savepoint.take's calls, timed): the state
    read and written by the executors, the Delta commit, the re-read that verifies it, the native copy."""
    from state_store.savepoint import take

    phases: dict[str, float] = {}
    names = {"write_state_files": "read_and_write", "commit_state_files": "commit",
             "verify_state_files": "verify"}
    saved = {name: getattr(take, name) for name in names}
    saved_copy = take.native.copy_out

    def timed(label: str, function):
        def call(*args, **kwargs):
            began = time.monotonic()
            try:
                return function(*args, **kwargs)
            finally:
                phases[label] = round(phases.get(label, 0.0) + time.monotonic() - began, 3)
        return call

    for name, label in names.items():
        setattr(take, name, timed(label, saved[name]))
    take.native.copy_out = timed("native_copy", saved_copy)
    try:
        yield phases
    finally:
        for name, function in saved.items():
            setattr(take, name, function)
        take.native.copy_out = saved_copy


def measure_native(provider: str, users: int, spark, work: Path, master: str | None = None) -> dict:
    """Native vs canonical, same state, same run: a full savepoint with and without the native copy (and the copy
    alone), then `sessionctl restore` of it as a whole command, native, canonical, native again (each restore's own
    seconds and the command's wall time), and the catch-up of one small file after each (the first batch loads the
    restored state). With a cluster's `master`, this process's application gives its executors back while a
    restore command runs (a standalone master gives a second application no cores while the first holds them)."""
    from state_store.savepoint import native

    home = work / f"native-{provider}-{users}"
    config = _config(home, provider, master)
    spark = get_spark(config) if master else spark  # the caller's, or a new one if an earlier run stopped it
    began = time.monotonic()
    build_state(config, users, spark)
    build_s = time.monotonic() - began
    load_start = _load()
    with savepoint_phases() as phases:
        canonical = take_savepoint(config, spark=spark, full=True)
    canonical_phases = dict(phases)
    with savepoint_phases() as phases:
        with_native = take_savepoint(config, spark=spark, full=True, native_copy=True)
    native_phases = dict(phases)
    stop_state_stores(spark)  # the commands below are other processes
    commands = [_sessionctl(home, provider, "savepoint", "--full", "--native", "--json", master=master)
                for _ in range(2)]
    began = time.monotonic()
    native.copy_out(config.checkpoint, with_native.batch_id, partitions=int(with_native.partitions or 0),
                    provider=provider, store_uri=str(work / f"scratch-{provider}-{users}"), savepoint_id="copy")
    copy_s = round(time.monotonic() - began, 3)
    touch_users(config, users, spark)
    restores = []
    for kind in ("native", "canonical", "native"):
        args = ["restore", "--savepoint", with_native.savepoint_id] + (["--canonical"] if kind == "canonical" else [])
        stop_state_stores(spark)  # this process's stores of the checkpoint: nothing uploaded into the restored one
        if master:
            spark.stop()
        wall, answer = _sessionctl(home, provider, *args, master=master)
        if master:
            spark = get_spark(config)
        assert answer["method"] == kind, answer
        land(config.landing, f"after-{len(restores)}.jsonl", [json.dumps(
            {"event_id": f"a{len(restores)}", "user_id": "u0000001", "event_type": "page_view", "page": "/",
             "event_time": "2026-11-01T10:09:00Z"})])
        began = time.monotonic()
        catch_up(config, spark)
        restores.append({"method": kind, "command_s": wall, "restore_s": answer["seconds"],
                         "phases": answer["phases"], "first_catch_up_s": round(time.monotonic() - began, 3)})
    return {"provider": provider, "users": users, "build_s": round(build_s, 1), "state_rows": canonical.rows,
            "canonical_savepoint_s": canonical.seconds, "savepoint_native_s": with_native.seconds,
            "canonical_savepoint_phases": canonical_phases, "savepoint_native_phases": native_phases,
            "savepoint_command_s": [wall for wall, _ in commands],
            "savepoint_command_own_s": [answer.get("seconds") for _, answer in commands],
            "native_copy_s": copy_s, "native_files": with_native.native_files,
            "native_mb": round((with_native.native_bytes or 0) / 1e6, 1), "restores": restores,
            "master": master or "local[2]", "load_start": load_start, "load_end": _load()}


BASELINE_REV = "a3adb47"  # the last revision whose canonical restore loads the rows as Spark's initial state


def baseline_tree(rev: str, work: Path) -> Path:
    """Revision `rev` (git archive) with its own operator jar and class archive, beside this tree's other build
    artifacts (Spark's runtime jars, S3A, Kafka, HDFS: build/ entries but jvm/ linked). The old restore calls
    SessionsOperator.sessionize with an initial state, which this tree's jar no longer has: the revision's jar is built
    as the Makefile's JVM_JAR rule builds it, offline (`make setup` has fetched what its pom needs, unchanged since
    a3adb47), and its class archive made as `make setup` makes it, so that neither restore starts Spark without one."""
    tree = work / f"baseline-{rev}"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    build = tree / "build"
    (build / "jvm").mkdir(parents=True)
    for entry in (REPO / "build").resolve().iterdir():
        if entry.name != "jvm":
            (build / entry.name).symlink_to(entry)
    subprocess.run(["mvn", "-o", "-q", "-B", "-f", str(tree / "jvm" / "operator" / "pom.xml"), "-DskipTests",
                    "package"], check=True)  # into the tree's build/jvm/operator/ (the pom's build directory)
    shutil.copy2(build / "jvm" / "operator" / "sessions-operator.jar", build / "jvm" / "sessions-operator.jar")
    subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "pipelines.job.class_archive",
                    str(build / "jvm" / "spark-classes.jsa")], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                   check=True)
    return tree


def measure_canonical_restore(provider: str, users: int, spark, work: Path, baseline: Path, rev: str) -> dict:
    """`sessionctl restore --canonical` of one full savepoint as whole commands: the baseline revision's restore
    (`rev`, built in `baseline`) and this tree's, alternating, twice each, in the same run; the catch-up of one small
    file after each (its first batch loads the restored state and closes what the savepoint held as due). Before
    them, `sessionctl savepoint --full --native` of the same state the same way (each answer the state's rows and
    checksum)."""
    home = work / f"canonical-{provider}-{users}"
    config = _config(home, provider, None)
    began = time.monotonic()
    build_state(config, users, spark)
    build_s = time.monotonic() - began
    saved = take_savepoint(config, spark=spark, full=True)
    savepoints = []
    for path in (f"revision {rev}", "this tree") * 2:
        stop_state_stores(spark)
        load = _load()
        wall, answer = _sessionctl(home, provider, "savepoint", "--full", "--native", "--json",
                                   code=baseline if path != "this tree" else REPO)
        assert (answer["rows"], answer["checksum"]) == (saved.rows, saved.checksum), answer
        savepoints.append({"path": path, "command_s": wall, "savepoint_s": answer["seconds"], "load_before": load,
                           "load_after": _load()})
    restores = []
    for path in (f"revision {rev}", "this tree") * 2:
        stop_state_stores(spark)  # this process's stores of the checkpoint: nothing uploaded into the restored one
        load = _load()
        wall, answer = _sessionctl(home, provider, "restore", "--savepoint", saved.savepoint_id, "--canonical",
                                   code=baseline if path != "this tree" else REPO)
        assert (answer["method"], answer["rows"], answer["checksum"]) == ("canonical", saved.rows, saved.checksum), \
            answer
        land(config.landing, f"after-{len(restores)}.jsonl", [json.dumps(
            {"event_id": f"a{len(restores)}", "user_id": "u0000001", "event_type": "page_view", "page": "/",
             "event_time": "2026-11-01T10:09:00Z"})])
        began = time.monotonic()
        catch_up(config, spark)
        restores.append({"path": path, "command_s": wall, "restore_s": answer["seconds"], "phases": answer["phases"],
                         "first_catch_up_s": round(time.monotonic() - began, 3), "load_before": load,
                         "load_after": _load()})
    return {"provider": provider, "users": users, "build_s": round(build_s, 1), "state_rows": saved.rows,
            "partitions": saved.partitions, "savepoints": savepoints, "restores": restores}


def measure_online_priority(provider: str, users: int, spark, work: Path, quiet_s: float = 20.0) -> dict:
    """`sessionctl savepoint --full` beside a running `sessionctl run` (both processes on this host, files landing),
    four times, alternating SESSIONS_BESIDE_STREAM_NICE=0 and the default 10: each savepoint's wall time and the
    stream's batch latency during it, against its batches during none."""
    home = work / f"priority-{provider}-{users}"
    config = _config(home, provider, None)
    began = time.monotonic()
    build_state(config, users, spark)
    build_s = time.monotonic() - began
    stop_state_stores(spark)
    load_start = _load()
    rounds = []
    with running_stream(config, users) as sampled:
        time.sleep(quiet_s)
        for nice in (0, 10, 0, 10):
            started_wall = time.time()
            done = subprocess.run([str(REPO / ".venv" / "bin" / "sessionctl"), "savepoint", "--full", "--json"],
                                  capture_output=True, text=True, timeout=1800, check=True,
                                  env={**os.environ, **_env(home, provider, None),
                                       "SESSIONS_BESIDE_STREAM_NICE": str(nice)})
            rounds.append({"nice": nice, "started": started_wall, "ended": time.time(),
                           "savepoint_s": json.loads(done.stdout)["seconds"], "load_avg_1m": round(os.getloadavg()[0], 2)})
            time.sleep(quiet_s)
        spans = sampled.new()

    def overlaps(span: tuple[float, float], r: dict) -> bool:
        return span[0] < r["ended"] and span[1] > r["started"]

    without = [end - start for start, end in spans if not any(overlaps((start, end), r) for r in rounds)]
    for r in rounds:
        during = [end - start for start, end in spans if overlaps((start, end), r)]
        r.update(command_s=round(r.pop("ended") - r.pop("started"), 2), batches_during=len(during),
                 batch_s_during_median=round(statistics.median(during), 3) if during else None)
    return {"provider": provider, "users": users, "build_s": round(build_s, 1), "rounds": rounds,
            "batches_without": len(without),
            "batch_s_without_median": round(statistics.median(without), 3) if without else None,
            "load_start": load_start, "load_end": _load()}


def measure_scale(provider: str, users: int, spark, work: Path, master: str | None) -> dict:
    """The scale proof, in this process: a full savepoint of the state `--scale-step build` made in another process
    (so this driver never ingested it), then its restore, each with the peak memory of the driver's Python process,
    its JVM and (on a cluster) every executor JVM."""
    config = _config(work / f"{provider}-{users}", provider, master)
    started = time.monotonic()
    with PeakRss(process_ids(spark)) as memory:
        saved = take_savepoint(config, spark=spark, full=True)
    savepoint_s = time.monotonic() - started
    extra = memory.figures("savepoint")
    started = time.monotonic()
    with PeakRss(process_ids(spark)) as memory:
        restored = restore(config, saved.savepoint_id, spark=spark)
    restore_s = time.monotonic() - started
    extra.update(memory.figures("restore"))
    return {"provider": provider, "users": users, "master": spark.sparkContext.master, "state_rows": saved.rows,
            "savepoint_bytes": saved.bytes, "savepoint_s": round(savepoint_s, 3), "restore_s": round(restore_s, 3),
            "restore_rows": restored.rows, "restore_phases": restored.phases, "load_avg_1m": round(os.getloadavg()[0], 2),
            "load_end": _load(), **extra}


def scale_run(provider: str, users: int, work: Path, master: str | None) -> dict:
    """One size of the scale proof: the state built by one process (`--scale-step build`), measured by a fresh one
    (`--scale-step measure`), one after the other (a standalone cluster gives its cores to one application)."""
    home = work / f"{provider}-{users}"
    shutil.rmtree(home, ignore_errors=True)
    common = [sys.executable, __file__, "--provider", provider, "--sizes", str(users), "--work-dir", str(work),
              *(["--master", master] if master else [])]
    subprocess.run([*common, "--scale-step", "build"], check=True)
    done = subprocess.run([*common, "--scale-step", "measure"], check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(provider: str, users: int, spark, work: Path, online: bool = False, savepoint_only: bool = False) -> dict:
    home = work / f"{provider}-{users}"
    shutil.rmtree(home, ignore_errors=True)
    config = _config(home, provider, None)
    build_state(config, users, spark)
    extra = measure_online(config, users, spark) if online else {}
    started = time.monotonic()
    with PeakRss(process_ids(spark)) as memory:
        saved = take_savepoint(config, spark=spark, full=True)
    savepoint_s = time.monotonic() - started
    extra.update(memory.figures("savepoint"), load_at_savepoint=_load())
    if savepoint_only:
        return {"provider": provider, "users": users, "state_rows": saved.rows, "savepoint_bytes": saved.bytes,
                "savepoint_s": round(savepoint_s, 3), "savepoint_rows_per_s": round(saved.rows / savepoint_s),
                "savepoint_mb_per_s": round(saved.bytes / savepoint_s / 1e6, 2),
                "load_avg_1m": round(os.getloadavg()[0], 2), **extra}
    changed = touch_users(config, users, spark)
    load_before = _load()
    started = time.monotonic()
    with PeakRss(process_ids(spark)) as memory:
        incremental = take_savepoint(config, spark=spark)
    incremental_s = time.monotonic() - started
    extra.update(memory.figures("incremental"))
    started = time.monotonic()
    with PeakRss(process_ids(spark)) as memory:
        full = take_savepoint(config, spark=spark, full=True)
    full_s = time.monotonic() - started
    extra.update(memory.figures("full"))
    extra.update(changed_users=changed, incremental_kind=incremental.kind, incremental_table_rows=incremental.table_rows,
                 incremental_bytes=incremental.bytes, incremental_savepoint_s=round(incremental_s, 3),
                 full_savepoint_s=round(full_s, 3), full_rows=full.rows, full_bytes=full.bytes,
                 incremental_over_full_s=round(incremental_s / full_s, 4),
                 same_state=(incremental.rows, incremental.checksum) == (full.rows, full.checksum),
                 load_incremental_before=load_before, load_incremental_after=_load())
    started = time.monotonic()
    rows = live_state(spark, config.checkpoint, batch_id=None)
    state_read_s = time.monotonic() - started
    started = time.monotonic()
    pq.write_table(rows, home / "raw.parquet")
    parquet_s = time.monotonic() - started
    parquet_bytes = (home / "raw.parquet").stat().st_size
    started = time.monotonic()
    sp.SavepointStore(str(home / "delta-only")).write_state("bench", rows)
    delta_write_s = time.monotonic() - started
    n_rows = rows.num_rows
    del rows  # not held by this process during the restore measured next
    started = time.monotonic()
    with PeakRss(process_ids(spark)) as memory:
        restored = restore(config, incremental.savepoint_id, spark=spark)
    restore_s = time.monotonic() - started
    extra.update(memory.figures("restore"))
    started = time.monotonic()
    scaled = rescale(config, 8, spark=spark)
    rescale_s = time.monotonic() - started
    return {
        "provider": provider, "users": users, "state_rows": saved.rows, "savepoint_bytes": saved.bytes,
        "savepoint_s": round(savepoint_s, 3), "savepoint_rows_per_s": round(saved.rows / savepoint_s),
        "savepoint_mb_per_s": round(saved.bytes / savepoint_s / 1e6, 2),
        "parquet_s": round(parquet_s, 3), "parquet_rows_per_s": round(n_rows / parquet_s),
        "parquet_mb_per_s": round(parquet_bytes / parquet_s / 1e6, 2),
        "savepoint_over_parquet_rows_per_s": round((saved.rows / savepoint_s) / (n_rows / parquet_s), 4),
        "state_read_s": round(state_read_s, 3), "delta_write_s": round(delta_write_s, 3),
        "delta_write_rows_per_s": round(n_rows / delta_write_s),
        "delta_over_parquet_rows_per_s": round(parquet_s / delta_write_s, 4),
        "full_over_parquet_rows_per_s": round((full.rows / full_s) / (n_rows / parquet_s), 4),
        "restore_s": round(restore_s, 3), "restore_verified": restored.verified, "restore_phases": restored.phases,
        "restore_savepoint_kind": incremental.kind, "restore_rows": restored.rows,
        "rescale_s": round(rescale_s, 3), "rescale_method": scaled.method,
        "rescale_partitions": f"{scaled.partitions_before}->{scaled.partitions_after}",
        "load_avg_1m": round(os.getloadavg()[0], 2), "load_end": _load(), **extra,
    }


def _incremental_lines(results: list[dict]) -> list[str]:
    if not results:
        return []
    lines = ["", "Incremental savepoint after 1% of the users changed (one new event each, the watermark unmoved), "
             "and a full savepoint (--full) of the same batch, side by side; goals: incremental <= 1 s and <= 0.1x "
             "the full one; full savepoint >= 0.5x a bare Parquet write of the same rows (pyarrow, driver, one file); "
             "restore of the incremental savepoint (chain resolved by the executors) <= 10 s. Python/JVM: peak RSS "
             "MiB of the driver's Python process / the JVM. Load: /proc/loadavg 1/5/15 min before the incremental "
             "savepoint.", "",
             "| provider | users | changed users | increment rows | incremental s | full s | incremental/full | "
             "full rows/s / parquet rows/s | restore s | Python MiB incr / full / restore | JVM MiB incr / full / "
             "restore | load |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for r in results:
        lines.append(
            f"| {r['provider']} | {r['users']:,} | {r['changed_users']:,} | {r['incremental_table_rows']:,} | "
            f"{r['incremental_savepoint_s']} | {r['full_savepoint_s']} | {r['incremental_over_full_s']} | "
            f"{r['full_over_parquet_rows_per_s']} | {r['restore_s']} | "
            f"{r.get('incremental_python_peak_mib')} / {r.get('full_python_peak_mib')} / "
            f"{r.get('restore_python_peak_mib')} | {r.get('incremental_jvm_peak_mib')} / {r.get('full_jvm_peak_mib')}"
            f" / {r.get('restore_jvm_peak_mib')} | {' '.join(map(str, r['load_incremental_before']))} |")
    return lines


def _memory_lines(results: list[dict]) -> list[str]:
    if not results:
        return []
    lines = ["", "Peak resident memory (MiB, VmHWM reset at the start, VmRSS polled every 50 ms) of the driver's Python "
             "process and of the JVM (the driver's; under local[N] the executors run in it too, on a cluster they have "
             "their own columns) during the savepoint and the restore; in "
             "brackets each one's RSS when the operation started.", "",
             "| provider | users | state rows | savepoint s | savepoint Python | savepoint JVM | restore s | "
             "restore Python | restore JVM | savepoint executors | restore executors | load (1 min) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|"]

    def mib(r: dict, what: str) -> str:
        return f"{r[what + '_peak_mib']:,} ({r[what + '_start_mib']:,})" if what + "_peak_mib" in r else "-"

    def executors(r: dict, op: str) -> str:
        found = sorted(k[len(op) + 1:-len("_peak_mib")] for k in r if k.startswith(f"{op}_executor")
                       and k.endswith("_peak_mib"))
        return " / ".join(mib(r, f"{op}_{name}") for name in found) or "-"

    lines += [f"| {r['provider']} | {r['users']:,} | {r['state_rows']:,} | {r['savepoint_s']} | "
              f"{mib(r, 'savepoint_python')} | {mib(r, 'savepoint_jvm')} | {r.get('restore_s', '-')} | "
              f"{mib(r, 'restore_python')} | {mib(r, 'restore_jvm')} | {executors(r, 'savepoint')} | "
              f"{executors(r, 'restore')} | {r['load_avg_1m']} |" for r in results]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--large", action="store_true", help="add 1,000,000 users")
    parser.add_argument("--provider", default="rocksdb", choices=["rocksdb", "hdfs", "both"])
    parser.add_argument("--online", action="store_true", help="also a savepoint of the running stream (latency)")
    parser.add_argument("--savepoint-only", action="store_true",
                        help="only the savepoint (time, peak memory); results in lifecycle-savepoint.json/.md")
    parser.add_argument("--scale", action="store_true",
                        help="the scale proof: a full savepoint and its restore with every process's peak memory; "
                             "results in lifecycle-scale.json/.md")
    parser.add_argument("--running-rescale", action="store_true",
                        help="only the rescale (4 -> 8) of a running `sessionctl run` and its downtime; results in "
                             "lifecycle-running-rescale.json/.md")
    parser.add_argument("--running-restore", action="store_true",
                        help="only `restore --online` of a running `sessionctl run` and its downtime; results in "
                             "lifecycle-running-restore.json/.md")
    parser.add_argument("--native", action="store_true",
                        help="only native vs canonical savepoints and restores (whole commands); results in "
                             "lifecycle-native.json/.md")
    parser.add_argument("--canonical-restore", action="store_true",
                        help="only `sessionctl restore --canonical` as whole commands, the baseline revision's and "
                             "this tree's alternating; results in lifecycle-canonical-restore.json/.md")
    parser.add_argument("--baseline", default=BASELINE_REV,
                        help="the revision whose restore --canonical-restore compares with (default %(default)s)")
    parser.add_argument("--online-priority", action="store_true",
                        help="only `sessionctl savepoint` beside a running `sessionctl run`, at nice 0 and at the "
                             "default nice, alternating; results in lifecycle-online-priority.json/.md")
    parser.add_argument("--master", default=None,
                        help="a Spark master, e.g. spark://127.0.0.1:7077 (deploy/local-cluster start); local[2] if unset")
    parser.add_argument("--scale-step", choices=("build", "measure"), help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", help=argparse.SUPPRESS)
    parser.add_argument("--results-dir", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] + ([1_000_000] if args.large else [])
    providers = ["rocksdb", "hdfs"] if args.provider == "both" else [args.provider]
    if args.scale_step:  # one process of scale_run: one provider, one size
        work = Path(args.work_dir)
        spark = get_spark(_config(work, providers[0], args.master))
        if args.scale_step == "build":
            build_state(_config(work / f"{providers[0]}-{sizes[0]}", providers[0], args.master), sizes[0], spark)
        else:
            print(json.dumps(measure_scale(providers[0], sizes[0], spark, work, args.master)), flush=True)
        return
    work = Path(tempfile.mkdtemp(prefix="lifecycle-bench-"))
    baseline = baseline_tree(args.baseline, work) if args.canonical_restore else None
    spark = None if args.scale else get_spark(_config(work, "rocksdb", args.master))
    results = []
    for provider in providers:
        for users in sizes:
            result = (scale_run(provider, users, work, args.master) if args.scale else
                      measure_running_rescale(provider, users, spark, work, master=args.master)
                      if args.running_rescale else
                      measure_running_restore(provider, users, spark, work) if args.running_restore else
                      measure_native(provider, users, spark, work, args.master) if args.native else
                      measure_canonical_restore(provider, users, spark, work, baseline, args.baseline)
                      if baseline is not None else
                      measure_online_priority(provider, users, spark, work) if args.online_priority else
                      measure(provider, users, spark, work, online=args.online, savepoint_only=args.savepoint_only))
            print(json.dumps(result), flush=True)
            results.append(result)
    shutil.rmtree(work, ignore_errors=True)
    out = Path(args.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = ("lifecycle-scale" if args.scale else "lifecycle-savepoint" if args.savepoint_only else
            "lifecycle-running-rescale" if args.running_rescale else
            "lifecycle-running-restore" if args.running_restore else "lifecycle-native" if args.native else
            "lifecycle-canonical-restore" if args.canonical_restore else
            "lifecycle-online-priority" if args.online_priority else "lifecycle")
    meta = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "nproc": os.cpu_count(),
            "note": args.note}
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    lines = [f"# State lifecycle cost as state grows ({meta['date']}, {meta['nproc']} cores) {args.note}", ""]
    if args.online_priority:
        lines += ["`sessionctl savepoint --full` beside a running `sessionctl run` (its own JVM, a file of touched "
                  "users every 2 s), both on this host, alternating SESSIONS_BESIDE_STREAM_NICE=0 and 10 (the "
                  "default): the savepoint command's wall time and the stream's batch latency during it (median) "
                  "against its batches during no savepoint.", "",
                  "| provider | users | nice | savepoint command s | its own s | batches during | batch s during "
                  "(median) | batch s without (median, all rounds) | during / without | load (1 min) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in results:
            base = r["batch_s_without_median"]
            lines += [f"| {r['provider']} | {r['users']:,} | {x['nice']} | {x['command_s']} | {x['savepoint_s']} | "
                      f"{x['batches_during']} | {x['batch_s_during_median']} | {base} ({r['batches_without']}) | "
                      f"{round(x['batch_s_during_median'] / base, 2) if base and x['batch_s_during_median'] else '-'}x"
                      f" | {x['load_avg_1m']} |" for x in r["rounds"]]
    elif args.running_rescale:
        lines += [f"On {args.master or 'local[2]'}: "
                  "`rescale` of a running `sessionctl run` (its own JVM, a file of touched users every 2 s), 4 -> 8 "
                  "state partitions, from the benchmark's process: prepared beside the stream (the pre-rescale "
                  "savepoint, restored at 8 partitions into a side checkpoint kept as its native copy), then the "
                  "stream stops its query between two batches, copies the native files in, rolls its outputs back to "
                  "the savepoint and starts the query again, which replays the events since. Downtime as the stream "
                  "reports it (Spark's progress: the end of its last batch before to the end of its first after) and "
                  "as its checkpoint shows it (the commit-log files' times), same run.", "",
                  "| provider | users | state rows | method | rescale s | its phases (s) | downtime s (stream) | "
                  "downtime s (checkpoint) | query running again after s | request to answer s | load (1 min) |",
                  "|---|---:|---:|---|---:|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['provider']} | {r['users']:,} | {r['state_rows']:,} | {r['rescale_method']} | "
                  f"{r['rescale_s']} | " + ", ".join(f"{k} {v}" for k, v in r.get("rescale_phases", {}).items())
                  + f" | {r['downtime_s']} | {r['checkpoint_downtime_s']} | {r['resumed_s']} | "
                  f"{r['request_to_answer_s']} | {r['load_avg_1m']} |" for r in results]
    elif args.running_restore:
        lines += ["`restore --online` of a running `sessionctl run` (its own JVM, a file of touched users every 2 s) to "
                  "a savepoint (with its native copy) taken beside it 10 s earlier, twice in the same run: first "
                  "`--canonical` (verified, outputs rolled back, bootstrap batch, state checked), then from the native "
                  "copy (files copied back, outputs rolled back). Each time the stream stops its query between two "
                  "batches, restores, and starts the query again, which replays the events since. Downtime as the "
                  "stream reports it (Spark's progress: the end of its last batch before to the end of its first "
                  "after).", "",
                  "| provider | users | state rows | method | restore s | its phases (s) | downtime s (stream) | query "
                  "running again after s | request to answer s | load (1 min) |",
                  "|---|---:|---:|---|---:|---|---:|---:|---:|---:|"]
        lines += [f"| {r['provider']} | {r['users']:,} | {r['state_rows']:,} | {x['method']} | {x['restore_s']} | "
                  + ", ".join(f"{k} {v}" for k, v in x["restore_phases"].items())
                  + f" | {x['downtime_s']} | {x['resumed_s']} | {x['request_to_answer_s']} | {x['load_avg_1m']} |"
                  for r in results for x in r["restores"]]
    elif args.canonical_restore:
        lines += [f"`sessionctl restore --canonical` of one full savepoint as whole commands (process start to exit), "
                  f"local[2], same state, same run: revision {args.baseline}'s restore and this tree's, alternating, "
                  "twice each; each followed by the catch-up of one small file (its first batch loads the restored state). Every "
                  "restore's answer carries the savepoint's rows and checksum.", "",
                  "| provider | users | state rows | partitions | path | command s | its own s | its phases (s) | "
                  "first catch-up after s | load (1 min) before -> after |",
                  "|---|---:|---:|---:|---|---:|---:|---|---:|---|"]
        lines += [f"| {r['provider']} | {r['users']:,} | {r['state_rows']:,} | {r['partitions']} | {x['path']} | "
                  f"{x['command_s']} | {x['restore_s']} | " + ", ".join(f"{k} {v}" for k, v in x["phases"].items())
                  + f" | {x['first_catch_up_s']} | {x['load_before'][0]} -> {x['load_after'][0]} |"
                  for r in results for x in r["restores"]]
        lines += ["", "`sessionctl savepoint --full --native` of the same state before the restores, the same way "
                  "(process start to exit; its own seconds as it answers):", "",
                  "| provider | path | command s | its own s | load (1 min) before -> after |", "|---|---|---:|---:|---|"]
        lines += [f"| {r['provider']} | {x['path']} | {x['command_s']} | {x['savepoint_s']} | "
                  f"{x['load_before'][0]} -> {x['load_after'][0]} |" for r in results for x in r.get("savepoints", [])]
    elif args.native:
        lines += [f"Native vs canonical, same state, same run (RocksDB or HDFS-backed, 4 partitions, "
                  f"{args.master or 'local[2]'}): a full "
                  "savepoint without and with the native copy (the checkpoint's own files of the batch), the copy "
                  "alone, then `sessionctl restore` of that savepoint as whole commands -- native, `--canonical`, "
                  "native again -- each followed by the catch-up of one small file (its first batch loads the "
                  "restored state).", "",
                  "| provider | users | state rows | savepoint s | with native s | native copy s | native files / MB "
                  "| restore: command s (own s) | first catch-up after s | load start -> end |",
                  "|---|---:|---:|---:|---:|---:|---:|---|---|---|"]
        lines += [f"| {r['provider']} | {r['users']:,} | {r['state_rows']:,} | {r['canonical_savepoint_s']} | "
                  f"{r['savepoint_native_s']} | {r['native_copy_s']} | {r['native_files']} / {r['native_mb']} | "
                  + ", ".join(f"{x['method']} {x['command_s']} ({x['restore_s']})" for x in r["restores"]) + " | "
                  + ", ".join(f"{x['method']} {x['first_catch_up_s']}" for x in r["restores"])
                  + f" | {r['load_start'][0]} -> {r['load_end'][0]} |" for r in results]
        lines += ["", "The savepoints' parts in this process (seconds; read_and_write = the executors read the state "
                  "and write the table's files), and `sessionctl savepoint --full --native` as whole commands "
                  "(process start to exit; its own seconds in brackets):", "",
                  "| provider | savepoint parts | with native: parts | command s (own s) |", "|---|---|---|---|"]
        lines += [f"| {r['provider']} | " + ", ".join(f"{k} {v}" for k, v in r["canonical_savepoint_phases"].items())
                  + " | " + ", ".join(f"{k} {v}" for k, v in r["savepoint_native_phases"].items()) + " | "
                  + ", ".join(f"{w} ({o})" for w, o in zip(r["savepoint_command_s"], r["savepoint_command_own_s"]))
                  + " |" for r in results]
    elif not (args.savepoint_only or args.scale):
        lines += ["Savepoint = the executors read the state through Spark's state data source and write the Delta "
                  "table's files, the driver commits their metadata, the executors re-read the files and verify the "
                  "checksum. State read (into the driver) and Delta write (delta-rs from the driver) are also timed "
                  "alone on the same rows; parquet = pyarrow.parquet.write_table of the same rows (the floor). "
                  "Restore = verified restore into a fresh checkpoint from the incremental savepoint (its chain "
                  "resolved by the executors); rescale = 4 -> 8 state partitions (pre-rescale savepoint included).", "",
                  "| provider | users | state rows | savepoint s | rows/s | MB/s | state read s | delta write rows/s | "
                  "parquet rows/s | savepoint/parquet | delta/parquet | restore s | rescale s | rescale |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in results:
            lines.append(f"| {r['provider']} | {r['users']:,} | {r['state_rows']:,} | {r['savepoint_s']} | "
                         f"{r['savepoint_rows_per_s']:,} | {r['savepoint_mb_per_s']} | {r['state_read_s']} | "
                         f"{r['delta_write_rows_per_s']:,} | {r['parquet_rows_per_s']:,} | "
                         f"{r['savepoint_over_parquet_rows_per_s']} | {r['delta_over_parquet_rows_per_s']} | "
                         f"{r['restore_s']} | {r['rescale_s']} | "
                         f"{r['rescale_method']} {r['rescale_partitions']} |")
    lines += _incremental_lines([r for r in results if "incremental_savepoint_s" in r])
    lines += _memory_lines([r for r in results if "savepoint_s" in r])
    online = [r for r in results if "online_savepoint_s" in r]
    if online:
        lines += ["", "Savepoint of the running stream (`sessionctl run` in its own JVM, a file of touched users every "
                  "2 s): its duration, and the stream's batch latency (offset-log -> commit-log file times) during "
                  "the savepoint vs the batches before and after it, same run.", "",
                  "| provider | users | online savepoint s | batches during | batch s during (median) | batches "
                  "without | batch s without (median) | load (1 min) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['provider']} | {r['users']:,} | {r['online_savepoint_s']} | {r['batches_during']} | "
                  f"{r['batch_s_during_savepoint_median']} | {r['batches_without']} | {r['batch_s_without_median']} | "
                  f"{r['load_avg_1m']} |" for r in online]
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
