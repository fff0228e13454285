"""The session rules as one value: made from the settings and the spec, recorded in the job metadata and read back
whole (also by a release that does not know a later key), and compared in one place with what each difference
means for a running job and a restore."""
from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest

from pipelines.config import SessionsConfig
from pipelines.core.rules import SessionRules, compare
from pipelines.core.spec import DEFAULT_SPEC, parse_spec
from pipelines.job.checkpoint import JobMetadata
from testkit.specs import CONTRACT_EXAMPLE
from tests.kit.homes import make_config

pytestmark = pytest.mark.tier("pure")

MIN = 60_000
EXAMPLE = parse_spec(CONTRACT_EXAMPLE)


def test_the_settings_and_the_spec_make_one_rules_value(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(CONTRACT_EXAMPLE)
    config = make_config(tmp_path, SESSIONS_GAP_MINUTES="45", SESSIONS_LATENESS_MINUTES="5",
                         SESSIONS_IDLE_CLOSE_MINUTES="2.5", SESSIONS_SPEC=str(spec))
    assert config.rules == SessionRules(45 * MIN, 5 * MIN, 150_000, EXAMPLE)
    # unset idle close: the lateness; no lateness: the gap
    home = {"SESSIONS_HOME": str(tmp_path)}
    assert SessionsConfig.from_env(home).rules == SessionRules(30 * MIN, 10 * MIN, 10 * MIN, DEFAULT_SPEC)
    assert SessionsConfig.from_env({**home, "SESSIONS_LATENESS_MINUTES": "0"}).rules.idle_close_ms == 30 * MIN


def test_job_metadata_records_the_rules_and_reads_them_back_whole():
    rules = SessionRules(45 * MIN, 5 * MIN, 150_000, EXAMPLE)
    meta = JobMetadata.new(rules, 16, state_layout="layout")
    stored = json.dumps(asdict(meta))
    assert JobMetadata.from_json(stored).rules == rules
    # the default spec and the default idle close are recorded as null: such a checkpoint's metadata is the
    # previous release's, key for key
    plain = JobMetadata.new(SessionRules(30 * MIN, 10 * MIN, 10 * MIN), 16, state_layout="layout")
    assert (plain.spec, plain.idle_close_ms) == (None, None)
    assert JobMetadata.from_json(json.dumps(asdict(plain))).rules == SessionRules(30 * MIN, 10 * MIN, 10 * MIN)


def test_metadata_of_a_later_release_still_reads():
    """A rollback: keys this build does not know are left out, not a TypeError at the job's start."""
    later = {**asdict(JobMetadata.new(SessionRules(30 * MIN, 10 * MIN, 10 * MIN), 16, state_layout="x")),
             "some_later_key": {"a": 1}}
    assert JobMetadata.from_json(json.dumps(later)).rules.gap_ms == 30 * MIN


def test_one_comparison_says_what_each_difference_means():
    before = SessionRules(30 * MIN, 10 * MIN, 10 * MIN, EXAMPLE)
    assert compare(before, before).none and compare(before, before).refusals("x", how="y") == []

    idle = compare(before, replace(before, idle_close_ms=2 * MIN))
    assert not idle.none and idle.refusals("x", how="y") == []
    assert idle.lines() == ["idle close 10 -> 2 min (clock rows follow it from now on)"]
    assert idle.migrations() == []  # the state a restore puts back does not depend on it

    gap = compare(before, replace(before, gap_ms=45 * MIN))
    assert gap.refusals("savepoint S was taken", how="pass --migrate") == [
        "savepoint S was taken with gap 30 min and lateness 10 min; the settings say gap 45 min and lateness 10 min: "
        "pass --migrate"]
    assert gap.lines() == gap.migrations() == ["gap 30 -> 45 min, lateness 10 -> 10 min (open sessions re-walked)"]

    fewer = replace(EXAMPLE, attributes=tuple(a for a in EXAMPLE.attributes if a.name != "revenue"))
    removed = compare(before, replace(before, spec=fewer))
    assert removed.refusals("x", how="y") == [] and removed.lines() == [
        "session spec: attribute revenue removed: its column is no longer filled"]
    assert compare(replace(before, spec=fewer), before).lines() == [
        "session spec: attribute revenue added: sessions open now carry null for it"]

    other = parse_spec(CONTRACT_EXAMPLE.replace("revenue: {sum: revenue}", "revenue: {max: revenue}"))
    changed = compare(before, replace(before, spec=other))
    [refusal] = changed.refusals("the checkpoint was made", how="restore with --migrate")
    assert refusal.startswith("SESSIONS_SPEC attributes.revenue: its definition changed")
    assert refusal.endswith("restore with --migrate") and "\n" not in refusal
    # both kinds at once: each its own line (restore --dry-run lists every reason)
    both = compare(before, replace(before, gap_ms=45 * MIN, spec=other)).refusals("x", how="y")
    assert len(both) == 2 and both[0].startswith("x with gap 30 min") and both[1].startswith("SESSIONS_SPEC")
