"""`savepoints diff A B` and `state --user U --history` against a recomputation: the savepoints' Delta tables read
back with delta-rs alone (users added, removed, changed by their rows) and the oracle's open sessions at each
savepoint's batch (session counts, each user's sessions)."""
from __future__ import annotations

import json
import subprocess
from collections import defaultdict

import pytest
from deltalake import DeltaTable

from pipelines.job.stream import catch_up
from state_store.history import diff_savepoints, user_history
from state_store.lifecycle import take_savepoint
from testkit.oracle import run_oracle
from tests.kit.datagen import land_batches, stream_scenario
from tests.kit.homes import config_env, make_config, tool

pytestmark = pytest.mark.tier("spark")

GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000
CUTS = (1, 5)  # seed 8: users open at the first and not the second, the other way, and in both


@pytest.fixture(scope="module")
def two_savepoints(spark, tmp_path_factory):
    # The second savepoint incremental (a full one every 10th): diff resolves its chain.
    config = make_config(tmp_path_factory.mktemp("history"), "rocksdb", SESSIONS_SAVEPOINT_FULL_EVERY=10)
    batches = stream_scenario(8, 6, True, GAP_MS, LATENESS_MS)
    taken, done = [], 0
    for cut in CUTS:
        land_batches(config, batches[done:cut], start=done)
        catch_up(config, spark)
        taken.append(take_savepoint(config, spark=spark))
        done = cut
    assert [s.kind for s in taken] == ["full", "incremental"]
    return config, batches, taken


def _rows_by_user(saved) -> dict[str, frozenset]:
    """The savepoint's state by user from its Delta tables, as the documented view resolves an incremental one's
    chain (state_store/savepoint/catalog.py): per user the rows of the newest table of the chain holding the user, unless
    they are a tombstone (`deleted`)."""
    users: dict[str, set] = {}
    for member in reversed(saved.chain or (saved.savepoint_id,)):
        found: dict[str, set] = defaultdict(set)
        for row in DeltaTable(saved.uri.rsplit("/", 1)[0] + "/" + member).to_pyarrow_table().to_pylist():
            deleted = row.pop("deleted", False)
            found[row["user_id"]].update(() if deleted else [tuple(sorted(row.items(), key=lambda kv: kv[0]))])
        for user, rows in found.items():
            users.setdefault(user, rows)
    return {user: frozenset(rows) for user, rows in users.items() if rows}


def test_diff_equals_a_recomputation_from_the_tables(spark, two_savepoints):
    config, batches, (a, b) = two_savepoints
    diff = diff_savepoints(config, spark, a.savepoint_id, b.savepoint_id)
    rows_a, rows_b = _rows_by_user(a), _rows_by_user(b)
    added = set(rows_b) - set(rows_a)
    removed = set(rows_a) - set(rows_b)
    changed = {u for u in set(rows_a) & set(rows_b) if rows_a[u] != rows_b[u]}
    assert added and removed and changed, "the scenario moves users in every way"
    assert (diff.users_added, diff.users_removed, diff.users_changed) == (len(added), len(removed), len(changed))
    assert diff.users_unchanged == len(set(rows_a) & set(rows_b)) - len(changed)
    assert (diff.users_a, diff.users_b) == (len(rows_a), len(rows_b))
    assert set(diff.sample["added"]) <= added and set(diff.sample["removed"]) <= removed
    assert set(diff.sample["changed"]) <= changed and diff.sample["added"]
    oracle_a = run_oracle(batches[:CUTS[0]], GAP_MS, LATENESS_MS)
    oracle_b = run_oracle(batches[:CUTS[1]], GAP_MS, LATENESS_MS)
    assert (diff.open_sessions_a, diff.open_sessions_b) == (len(oracle_a.open_sessions), len(oracle_b.open_sessions))
    same = diff_savepoints(config, spark, b.savepoint_id, "latest")
    assert same.users_added == same.users_removed == same.users_changed == 0


def test_history_equals_the_oracle_at_each_savepoint(spark, two_savepoints):
    config, batches, taken = two_savepoints
    expected = [run_oracle(batches[:cut], GAP_MS, LATENESS_MS).open_sessions for cut in CUTS]
    users = sorted({s[1] for s in expected[0]} | {s[1] for s in expected[1]})
    checked = 0
    for user in users[:4]:
        history = user_history(config, spark, user)
        assert [h["savepoint_id"] for h in history] == [s.savepoint_id for s in taken]  # oldest first
        for entry, open_then in zip(history, expected):
            want = sorted((s[0], s[4]) for s in open_then if s[1] == user)  # session_id, events
            assert sorted((s["session_id"], s["events"]) for s in entry["sessions"]) == want
            checked += len(want)
    assert checked > 0


@pytest.mark.tier("subprocess")
def test_the_cli_prints_the_contracts_keys(two_savepoints):
    config, _, (a, b) = two_savepoints
    env = config_env(config)
    diff = subprocess.run([tool("sessionctl"), "savepoints", "diff", a.savepoint_id, "latest", "--json"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert diff.returncode == 0, diff.stderr
    assert {"users_added", "users_removed", "users_changed", "open_sessions_a", "open_sessions_b", "sample"} <= set(
        json.loads(diff.stdout))
    wrong = subprocess.run([tool("sessionctl"), "savepoints", "diff", a.savepoint_id], env=env, capture_output=True,
                           text=True, timeout=120)
    assert wrong.returncode != 0 and "Traceback" not in wrong.stderr and len(wrong.stderr.strip().splitlines()) == 1
