"""The streaming job (catch_up on real Spark + Delta) equals the independent oracle exactly.

Adversarial data (tests/kit/datagen.py: disorder within the lateness, duplicates, ties, exact gaps, logouts with
earlier events arriving after them, held-back events that may be late, and an edge block that hits the
watermark exactly) is landed one file per micro-batch, for several splits, on both state store providers.
Checked against testkit/oracle.py: the sessions table (row for row, each session_id once), the open events
in the state store, the `late` quarantine rows, and the final watermark.
"""
from __future__ import annotations

import pytest

from pipelines.job.stream import catch_up
from state_store.status import status
from testkit.oracle import run_oracle
from tests.kit.datagen import land_batches, stream_scenario
from tests.kit.homes import make_config
from tests.kit.storages import STORAGES, checkpoint_env
from tests.kit.tables import iso_ms, read_open_sessions, read_quarantine, read_sessions

pytestmark = pytest.mark.tier("spark")
# Parametrized tests whose cases differ in tier (tests/conftest.py reads this)
TIER_OF_CASE = {
    "test_live_state_lookup_equals_the_oracle[rocksdb]": "subprocess",
}

GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000


def assert_matches_oracle(spark, config, batches: list[list[dict]]) -> None:
    expected = run_oracle(batches, GAP_MS, LATENESS_MS)
    expected_rows = sorted(expected.closed)
    assert expected.late and expected.open_events and expected.duplicates  # the data exercises all paths

    got = read_sessions(config)
    ids = [r[0] for r in got]
    assert len(ids) == len(set(ids)), "a session_id was written more than once"
    missing = sorted(set(expected_rows) - set(got))
    extra = sorted(set(got) - set(expected_rows))
    assert not missing and not extra, f"missing {missing[:5]}, unexpected {extra[:5]}"
    assert got == expected_rows

    assert read_open_sessions(spark, config) == sorted(expected.open_sessions)

    quarantine = read_quarantine(config)
    late = quarantine[quarantine["reason"] == "late"]
    got_late = sorted(zip(late["user_id"], late["event_id"], late["event_time_ms"].astype(int)))
    missing_late = sorted(set(expected.late_keys) - set(got_late))
    assert not [k for k in missing_late if k[1] in expected.very_late], (
        "late events at or below the PREVIOUS batch's watermark were silently dropped, not quarantined: "
        f"{[k for k in missing_late if k[1] in expected.very_late]}")
    assert got_late == sorted(expected.late_keys)
    assert set(quarantine["reason"]) <= {"late"}

    report = status(config, spark=spark, with_state=False)
    assert report.watermark_ms == expected.final_watermark_ms
    assert report.sessions_rows == len(expected_rows)


CASES = [
    # (seed, random-part micro-batches, extra env, very late events): one big batch, a few, many; and late events
    # below the previous batch's watermark
    pytest.param(1, 1, {}, False, id="1batch"),
    pytest.param(2, 6, {}, False, id="6batches"),
    pytest.param(4, 10, {"SESSIONS_STATE_PARTITIONS": 4}, False, id="10batches-4partitions"),
    pytest.param(5, 5, {}, True, id="5batches-very-late"),
]


PROVIDERS = ("rocksdb", "hdfs")


def _matrix() -> list:
    """On a local checkpoint every scenario on both providers. On HDFS and S3 a covering array, 8 of the 16: every
    scenario on each store and with each provider, every provider on each store (what a store changes is the
    checkpoint's I/O, which each scenario's pair of runs there meets with both providers between them)."""
    remote = {param.values[0]: param.marks for param in STORAGES if hasattr(param, "values")}
    cases = []
    for i, case in enumerate(CASES):
        runs = [(provider, "local") for provider in PROVIDERS]
        runs += [(PROVIDERS[(i + (storage == "s3")) % 2], storage) for storage in remote]
        cases += [pytest.param(*case.values, provider, storage, id=f"{case.id}-{provider}-{storage}",
                               marks=remote.get(storage, ())) for provider, storage in runs]
    return cases


@pytest.mark.parametrize("seed,parts,env,very_late,provider,storage", _matrix())
def test_stream_equals_oracle(spark, request, tmp_path, storage, provider, seed, parts, env, very_late):
    config = make_config(tmp_path, provider, **env, **checkpoint_env(request, spark, storage, tmp_path))
    batches = stream_scenario(seed, parts, very_late, GAP_MS, LATENESS_MS)
    land_batches(config, batches)
    summary = catch_up(config, spark)
    assert summary.ingested_files == 0  # all pre-ingested: one ingest commit per file = one micro-batch
    assert_matches_oracle(spark, config, batches)


@pytest.mark.parametrize("storage", STORAGES)
def test_stream_equals_oracle_across_runs(spark, request, tmp_path, storage):
    """The same data delivered over three catch_up runs (stop/start between micro-batches) on hdfs with
    3 partitions, with a re-run that finds nothing new: the result is still exactly the oracle's."""
    config = make_config(tmp_path, "hdfs", SESSIONS_STATE_PARTITIONS=3,
                         **checkpoint_env(request, spark, storage, tmp_path))
    batches = stream_scenario(3, 5, gap_ms=GAP_MS, lateness_ms=LATENESS_MS)
    cut1, cut2 = 2, 5
    land_batches(config, batches[:cut1], start=0)
    catch_up(config, spark)
    land_batches(config, batches[cut1:cut2], start=cut1)
    catch_up(config, spark)
    land_batches(config, batches[cut2:], start=cut2)
    catch_up(config, spark)
    catch_up(config, spark)  # nothing new: must not write anything again
    assert_matches_oracle(spark, config, batches)


def _read_while_retention_removes_the_batch(spark, config, last_batch, start: int) -> None:
    """A live read (state_store.state.at_newest_batch) whose batch a running stream moves past and whose files its
    retention removes during the read: the read fails, and the newest batch is read instead."""
    from pipelines.job.checkpoint import inspect_checkpoint
    from state_store.state import at_newest_batch, read_state

    read_batches = []

    def read(info, meta, watermark):
        batch_id = info.last_committed_batch
        read_batches.append(batch_id)
        if len(read_batches) == 1:  # the stream commits the next batch, and its retention removes this one
            land_batches(config, [last_batch], start=start)
            catch_up(config, spark)
            # Retention purges a batch's offset and commit log entries with its state versions: the state's files
            # stay read by newer versions until a snapshot replaces them, the log entries go at once.
            for log in ("offsets", "commits"):
                (config.checkpoint / log / str(batch_id)).unlink()
        return read_state(spark, config.checkpoint, batch_id=batch_id).count()

    rows = at_newest_batch(config, read)
    newest = inspect_checkpoint(config.checkpoint).last_committed_batch
    assert len(read_batches) == 2 and read_batches[0] < read_batches[1] == newest and rows > 0, read_batches


@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_live_state_lookup_equals_the_oracle(spark, tmp_path, provider):
    """`sessionctl state --user U` (state_store.state.lookup_user) reads one bucket of the committed state and
    shows exactly the oracle's open sessions of U; `--top N` the N largest by events; the CLI prints them."""
    import json
    import subprocess

    from state_store.state import lookup_user, top_sessions
    from tests.kit.homes import SESSIONCTL, config_env

    config = make_config(tmp_path, provider)
    batches = stream_scenario(2, 6, gap_ms=GAP_MS, lateness_ms=LATENESS_MS)
    land_batches(config, batches[:-1])
    catch_up(config, spark)
    if provider == "rocksdb":
        _read_while_retention_removes_the_batch(spark, config, batches[-1], len(batches) - 1)
    else:
        land_batches(config, batches[-1:], start=len(batches) - 1)
        catch_up(config, spark)
    expected = run_oracle(batches, GAP_MS, LATENESS_MS)
    users = sorted({e["user_id"] for batch in batches for e in batch})
    assert expected.open_sessions
    for user in users:
        got = lookup_user(spark, config, user)
        want = sorted((s[2], s[3], s[4], s[5]) for s in expected.open_sessions if s[1] == user)
        assert sorted((iso_ms(s["session_start"]), iso_ms(s["last_event"]), s["events"], s["page_views"])
                      for s in got["open_sessions"]) == want, user
    biggest = min(expected.open_sessions, key=lambda s: (-s[4], s[1]))  # most events, then user id
    top = top_sessions(spark, config, 1)["top"]
    assert [(t["user_id"], t["events"]) for t in top] == [(biggest[1], biggest[4])]
    if provider == "rocksdb":  # the CLI, once: JSON on stdout, the same answer
        user = biggest[1]
        done = subprocess.run([str(SESSIONCTL), "state", "--user", user, "--json"], env=config_env(config),
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        printed = json.loads(done.stdout.strip().splitlines()[-1])
        assert printed["user_id"] == user
        assert [s["events"] for s in printed["open_sessions"]] == \
            [s["events"] for s in lookup_user(spark, config, user)["open_sessions"]]
    _lookups_open_only_their_partition(spark, config, biggest[1])


def _lookups_open_only_their_partition(spark, config, user: str) -> None:
    """A point lookup's partition of each user (sessions.StateLookup) is where Spark's state data source finds the
    user's key; the lookup writes nothing into the checkpoint; and it opens that partition's store only: with another
    partition's files gone, the user's answer is unchanged, while a user of the removed partition can no longer be
    read."""
    import shutil

    from pipelines.job.checkpoint import inspect_checkpoint
    from pipelines.job.operators.seam import state_reader
    from state_store.state import lookup_user

    info = inspect_checkpoint(config.checkpoint)
    placed = {row["user_id"]: row["partition_id"] for row in state_reader(
        spark, config.checkpoint, info.last_committed_batch).select("key.user_id", "partition_id").collect()}
    users = sorted(placed)
    jvm = spark.sparkContext._jvm
    names = spark.sparkContext._gateway.new_array(jvm.java.lang.String, len(users))
    for i, name in enumerate(users):
        names[i] = name
    assert list(jvm.sessions.StateLookup.partitionsOf(spark._jsparkSession, names, info.partitions)) == \
        [placed[name] for name in users]
    others = sorted({p for p in placed.values() if p != placed[user]})
    assert others, placed  # the scenario's users are in more than one partition
    files = sorted(p.relative_to(config.checkpoint) for p in (config.checkpoint / "state").rglob("*"))
    before = lookup_user(spark, config, user)
    assert sorted(p.relative_to(config.checkpoint) for p in (config.checkpoint / "state").rglob("*")) == files, \
        "a lookup left a file in the checkpoint"
    shutil.rmtree(str(config.checkpoint / "state" / "0" / str(others[0])))
    assert lookup_user(spark, config, user) == before
    gone = next(name for name in users if placed[name] == others[0])
    with pytest.raises(Exception):  # noqa: B017, PT011 -- Spark's own error for a store with no files
        lookup_user(spark, config, gone)


