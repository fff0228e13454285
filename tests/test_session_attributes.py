"""The session spec's attributes end to end (the contract's "Session spec"): Segment-shaped lines in, the stream's
sessions out with their attribute columns, each equal to the oracle's (testkit/oracle.py, written from the contract's
words) -- with duplicates, out-of-order and late events, logouts and one micro-batch per landed file.

Also: an attribute added to a job between two runs on one checkpoint (sessions open at the change carry null for it,
later ones its value; nothing lost or doubled), and a state value stored before attributes existed read as unknown."""
from __future__ import annotations

import datetime as dt
import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from pipelines.core.spec import parse_spec
from testkit.oracle import SessionRow, oracle_session_id, run_oracle
from testkit.specs import CONTRACT_EXAMPLE
from tests.kit.datagen import land_files, stream_scenario
from tests.kit.homes import make_config
from tests.kit.tables import read_sessions

pytestmark = pytest.mark.tier("spark")

GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000

EXAMPLE = CONTRACT_EXAMPLE  # the contract's example spec, word for word
# Epoch milliseconds, integer user ids, and the other field types and kinds.
EPOCH_MS = """\
input:
  event_id: messageId
  user_id: userId
  event_time: {path: sentAt, format: epoch_ms}
  event_type: event
  fields:
    quantity: {path: properties.quantity, type: long}
    member: {path: context.traits.member, type: boolean}
    revenue: {path: properties.revenue, type: double}
attributes:
  items: {sum: quantity}
  smallest: {min: quantity}
  was_member: {first: member}
  last_member: {last: member}
  cheapest: {min: revenue}
"""
REVENUES = [0.1, 0.2, 0.3, 1e16, -1e16, 2.5, None]  # a float sum in arrival order would differ from the exact one


def _hash(*parts: Any) -> int:
    return zlib.crc32("\x1f".join(map(str, parts)).encode())


def _shaped(batches: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """The scenario's events with purchases and fields, each derived from (user, event_id): a duplicate's copies
    carry the same ones, as a resent message does."""
    out = []
    for batch in batches:
        shaped = []
        for event in batch:
            h = _hash(event["user_id"], event["event_id"])
            kind = event.get("event_type")
            if kind == "search":
                kind = "purchase"
            elif kind == "click" and h % 3 == 0:
                kind = "order_completed"
            fields: dict[str, Any] = {}
            if h % 11:
                fields["page"] = None if h % 7 == 0 else f"/p{h % 5}"
            if h % 4 == 1:
                fields["referrer"] = f"https://ref{h % 3}.example/"
            fields["revenue"] = REVENUES[h % len(REVENUES)]
            fields["quantity"] = None if h % 5 == 0 else (h % 9) - 4
            fields["member"] = None if h % 6 == 0 else bool(h % 2)
            shaped.append({**event, "event_type": kind, "fields": fields})
        out.append(shaped)
    return out


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def segment_line(event: dict[str, Any], k: int) -> str:
    """The contract example's shape: the user in userId or (userId null) anonymousId, fields under properties and
    context; a null field sometimes spelled out, sometimes absent."""
    fields = event["fields"]
    record: dict[str, Any] = {"type": "track", "messageId": event["event_id"], "event": event["event_type"],
                              "timestamp": _iso(event["event_time_ms"]), "properties": {}, "context": {}}
    if k % 2:
        record.update(userId=None, anonymousId=event["user_id"])
    else:
        record["userId"] = event["user_id"]
    if "page" in fields:
        record["properties"]["url"] = fields["page"]
    if fields.get("revenue") is not None or k % 3 == 0:
        record["properties"]["revenue"] = fields.get("revenue")
    if "referrer" in fields:
        record["context"]["page"] = {"referrer": fields["referrer"]}
    return json.dumps(record)


def epoch_line(event: dict[str, Any], k: int) -> str:
    fields = event["fields"]
    return json.dumps({"messageId": event["event_id"], "userId": int(event["user_id"]), "event": event["event_type"],
                       "sentAt": event["event_time_ms"], "properties": {"quantity": fields["quantity"],
                                                                        "revenue": fields["revenue"]},
                       "context": {"traits": {"member": fields["member"]}}})


def _attribute_map(spec_text: str) -> dict[str, dict[str, Any]]:
    spec = parse_spec(spec_text)
    return {a.name: a.to_dict() for a in spec.attributes}


def read_attributes(config: Any, names: list[str]) -> dict[str, dict[str, Any]]:
    """session_id -> attribute name -> value, from the sessions table."""
    from pipelines.storage import open_table, read_rows

    table = read_rows(open_table(config, config.sessions_table))
    columns = {name: table[name].to_pylist() for name in names}
    return {sid: {name: columns[name][k] for name in names} for k, sid in enumerate(table["session_id"].to_pylist())}


def _expected(expected: Any, closed: set[SessionRow], names: list[str]) -> dict[str, dict[str, Any]]:
    return {row[0]: {name: expected.attributes[row[0]][name] for name in names} for row in closed}


def _run(spark: Any, tmp_path: Path, provider: str, spec_text: str, batches: list[list[dict[str, Any]]],
         to_line: Any) -> tuple[Any, Any]:
    from pipelines.job.stream import catch_up

    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(spec_text)
    config = make_config(tmp_path, provider, SESSIONS_SPEC=str(spec_path), SESSIONS_MAX_VERSIONS_PER_BATCH=1)
    numbering = iter(range(1, 1 + sum(len(batch) for batch in batches)))
    land_files(config, [[to_line(e, next(numbering)) for e in batch] for batch in batches])
    catch_up(config, spark)
    return config, run_oracle(batches, GAP_MS, LATENESS_MS, attributes=_attribute_map(spec_text))


@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_epoch_millisecond_times_integer_users_and_every_field_type(spark: Any, tmp_path: Path, provider: str) -> None:
    scenario = stream_scenario(6, 4)
    users = sorted({e["user_id"] for batch in scenario for e in batch})
    numbered = {user: str(7000 + k) for k, user in enumerate(users)}
    batches = _shaped([[{**e, "user_id": numbered[e["user_id"]]} for e in batch] for batch in scenario])
    config, expected = _run(spark, tmp_path, provider, EPOCH_MS, batches, epoch_line)
    assert expected.late and expected.duplicates and expected.closed
    names = list(_attribute_map(EPOCH_MS))
    assert read_sessions(config) == sorted(expected.closed)
    assert read_attributes(config, names) == _expected(expected, expected.closed, names)


ADDED = EXAMPLE.replace("  top_order: {max: revenue}\n", "  top_order: {max: revenue}\n  low_order: {min: revenue}\n")


def test_an_attribute_added_between_two_runs(spark: Any, tmp_path: Path) -> None:
    """The contract: sessions closed after the change carry it; one already open when it was added carries null.
    The sessions table gains the column by schema evolution; rows written before read null there."""
    from pipelines.job.stream import catch_up

    batches = _shaped(stream_scenario(5, 5))
    cut = len(batches) // 2
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(EXAMPLE)
    config = make_config(tmp_path, "rocksdb", SESSIONS_SPEC=str(spec_path), SESSIONS_MAX_VERSIONS_PER_BATCH=1)
    numbering = iter(range(1, 1 + sum(len(batch) for batch in batches)))
    land_files(config, [[segment_line(e, next(numbering)) for e in batch] for batch in batches[:cut]])
    catch_up(config, spark)
    before = run_oracle(batches[:cut], GAP_MS, LATENESS_MS)
    assert before.closed and before.open_sessions
    closed_before = {row[0] for row in read_sessions(config)}
    assert closed_before == {row[0] for row in before.closed}

    spec_path.write_text(ADDED)
    config = make_config(tmp_path, "rocksdb", SESSIONS_SPEC=str(spec_path), SESSIONS_MAX_VERSIONS_PER_BATCH=1)
    land_files(config, [[segment_line(e, next(numbering)) for e in batch] for batch in batches[cut:]], start=cut)
    catch_up(config, spark)

    expected = run_oracle(batches, GAP_MS, LATENESS_MS, attributes=_attribute_map(ADDED))
    assert read_sessions(config) == sorted(expected.closed)  # nothing lost or doubled
    open_at_change = {oracle_session_id(row[1], row[2]) for row in before.open_sessions}
    got = read_attributes(config, [*_attribute_map(EXAMPLE), "low_order"])
    want = _expected(expected, expected.closed, [*_attribute_map(EXAMPLE), "low_order"])
    for sid, row in want.items():
        if sid in closed_before or sid in open_at_change:
            row["low_order"] = None
    assert got == want
    later = [sid for sid in want if sid not in closed_before and sid not in open_at_change]
    assert any(want[sid]["low_order"] is not None for sid in later)
    assert any(sid in open_at_change for sid in want)  # a session open at the change closed after it

    # A changed definition is a different attribute: the run refuses it in one line; a savepoint taken under the
    # spec restores under another by the same rules, and the dry run says what differs.
    from pipelines.errors import ConfigError
    from state_store.lifecycle import take_savepoint
    from state_store.preflight import plan_restore

    saved = take_savepoint(config, spark=spark)
    assert json.loads(saved.spec or "{}") == json.loads(parse_spec(ADDED).to_json())
    changed = ADDED.replace("low_order: {min: revenue}", "low_order: {max: revenue}").replace(
        "  referrer: {first: referrer}\n", "")
    spec_path.write_text(changed)
    config = make_config(tmp_path, "rocksdb", SESSIONS_SPEC=str(spec_path), SESSIONS_MAX_VERSIONS_PER_BATCH=1)
    with pytest.raises(ConfigError) as refused:
        catch_up(config, spark)
    assert str(refused.value).startswith("SESSIONS_SPEC attributes.low_order: its definition changed from "
                                         '{"min": "revenue"} (double) to {"max": "revenue"} (double)')
    assert "\n" not in str(refused.value)
    plan = plan_restore(config, saved.savepoint_id)
    assert not plan.restorable and any("attributes.low_order" in reason and "--migrate" in reason
                                       for reason in plan.reasons)
    plan = plan_restore(config, saved.savepoint_id, migrate=True)
    assert plan.restorable, plan.reasons
    assert {"session spec: attribute low_order changed its definition",
            "session spec: attribute referrer removed: its column is no longer filled"} <= set(plan.migrations)


@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_attributes_survive_a_canonical_savepoint_and_its_restore(spark: Any, tmp_path: Path, provider: str) -> None:
    """Open sessions' partials travel in the canonical rows (`attributes`): a session open at the savepoint closes
    after a canonical restore with the oracle's values, and `state --user` shows an open session's values now."""
    from pipelines.job.stream import catch_up
    from state_store.lifecycle import restore, take_savepoint
    from state_store.state import lookup_user

    batches = _shaped(stream_scenario(5, 5))
    cut = 3
    attributes = _attribute_map(EXAMPLE)
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(EXAMPLE)
    config = make_config(tmp_path, provider, SESSIONS_SPEC=str(spec_path), SESSIONS_MAX_VERSIONS_PER_BATCH=1)
    numbering = iter(range(1, 1 + sum(len(batch) for batch in batches)))
    land_files(config, [[segment_line(e, next(numbering)) for e in batch] for batch in batches[:cut]])
    catch_up(config, spark)
    before = run_oracle(batches[:cut], GAP_MS, LATENESS_MS, attributes=attributes)
    assert before.open_sessions
    shown = 0
    for row in before.open_sessions:
        found = lookup_user(spark, config, row[1])["open_sessions"]
        mine = [s["attributes"] for s in found if s["session_id"] == row[0]]
        assert mine == [before.attributes[row[0]]], row
        shown += any(v is not None for v in mine[0].values())
    assert shown

    saved = take_savepoint(config, spark=spark, full=True)
    land_files(config, [[segment_line(e, next(numbering)) for e in batch] for batch in batches[cut:]], start=cut)
    catch_up(config, spark)
    restored = restore(config, saved.savepoint_id, spark=spark, canonical=True)
    assert restored.method == "canonical"
    catch_up(config, spark)
    expected = run_oracle(batches, GAP_MS, LATENESS_MS, attributes=attributes)
    assert read_sessions(config) == sorted(expected.closed)
    names = list(attributes)
    assert read_attributes(config, names) == _expected(expected, expected.closed, names)
    open_at_savepoint = {row[0] for row in before.open_sessions}
    assert open_at_savepoint & {row[0] for row in expected.closed}


def feed_with_spec_change(config: Any, spec_path: Path, batches: list[list[dict[str, Any]]], cut: int, *,
                          alive: Any) -> set[str]:
    """Land `batches` one file at a time to a running stream -- each ingested and processed before the next, so each
    is its own micro-batch (the oracle's split) --, switch the spec file to ADDED after the first `cut` once the
    stream has taken it, and return the sessions closed before the change. `alive`: the stream still runs."""
    from deltalake import DeltaTable

    from pipelines.core.sample_data import land
    from pipelines.ingest import latest_ingest_seq
    from pipelines.job.checkpoint import read_job_metadata
    from tests.kit.waits import stream_caught_up, wait_until

    numbering = iter(range(1, 1 + sum(len(batch) for batch in batches)))

    def ingested() -> int:
        return latest_ingest_seq(config.raw_events_table) if DeltaTable.is_deltatable(config.raw_events_table) else 0

    def land_one(k: int) -> None:
        seen = ingested()
        land(config.landing, f"part-{k:05d}.jsonl", [segment_line(e, next(numbering)) for e in batches[k]])
        wait_until(lambda: alive() and ingested() > seen and stream_caught_up(config), timeout_s=180,
                   what=f"file {k} ingested and processed")

    for k in range(cut):
        land_one(k)
    closed_before = {row[0] for row in read_sessions(config)}
    spec_path.write_text(ADDED)
    wait_until(lambda: alive() and "low_order" in (read_job_metadata(config.checkpoint).spec or ""), timeout_s=60,
               what="the running stream to take the new spec")
    for k in range(cut, len(batches)):
        land_one(k)
    return closed_before


def test_an_attribute_added_to_a_running_stream(spark: Any, tmp_path: Path) -> None:
    """`sessionctl run` (run_continuously) takes a spec that gained an attribute between two batches: the query
    restarts under it, and sessions open at the change carry null for it; nothing lost or doubled."""
    import threading

    from pipelines.job.stream import run_continuously

    batches = _shaped(stream_scenario(5, 5))
    cut = len(batches) // 2
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(EXAMPLE)
    config = make_config(tmp_path, "rocksdb", SESSIONS_SPEC=str(spec_path), SESSIONS_MAX_VERSIONS_PER_BATCH=1)
    stop, outcome = threading.Event(), {}

    def run() -> None:
        try:
            outcome["summary"] = run_continuously(config, spark=spark, stop=stop, poll_seconds=0.5)
        except BaseException as error:  # noqa: BLE001 -- handed to the test's thread
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        closed_before = feed_with_spec_change(config, spec_path, batches, cut, alive=lambda: "error" not in outcome)
    finally:
        stop.set()
        thread.join(timeout=120)
    assert "error" not in outcome, outcome
    before = run_oracle(batches[:cut], GAP_MS, LATENESS_MS)
    assert closed_before == {row[0] for row in before.closed}
    expected = run_oracle(batches, GAP_MS, LATENESS_MS, attributes=_attribute_map(ADDED))
    assert read_sessions(config) == sorted(expected.closed)
    names = [*_attribute_map(EXAMPLE), "low_order"]
    want = _expected(expected, expected.closed, names)
    open_at_change = {oracle_session_id(row[1], row[2]) for row in before.open_sessions}
    for sid, row in want.items():
        if sid in closed_before or sid in open_at_change:
            row["low_order"] = None
    assert read_attributes(config, names) == want
    assert any(sid in open_at_change for sid in want)


def test_the_dagster_resource_takes_the_spec(spark: Any, tmp_path: Path) -> None:
    """The Dagster resource's `spec` field (the launchpad shows it): a bad spec fails the run at launch in one line
    naming the key; a `session_stream` run takes an attribute added while it runs, between two batches."""
    import threading

    from assets.definitions import defs
    from assets.resources import SessionsResource, pyspark_resource
    from state_store.stream_control import stop_stream

    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.replace("revenue: {sum: revenue}", "revenue: {sum: page}"))
    resources = {"sessions": SessionsResource(home=str(tmp_path / "home"), spec=str(bad)),
                 "pyspark": pyspark_resource()}
    failed = defs.resolve_job_def("session_catch_up").execute_in_process(resources=resources, raise_on_error=False)
    assert not failed.success
    (failure,) = [e.event_specific_data.error_display_string for e in failed.all_events
                  if e.event_type_value == "STEP_FAILURE"]
    assert "SESSIONS_SPEC attributes.revenue: sum needs a field of type long or double, got string" in failure

    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(EXAMPLE)
    resources = {"sessions": SessionsResource(home=str(tmp_path / "home"), spec=str(spec_path),
                                              max_versions_per_batch=1), "pyspark": pyspark_resource()}
    config = resources["sessions"].config()
    batches = _shaped(stream_scenario(5, 5))
    cut = len(batches) // 2
    outcome: dict = {}
    job = threading.Thread(target=lambda: outcome.update(result=defs.resolve_job_def("session_stream").execute_in_process(
        resources=resources, run_config={"ops": {"stream_op": {"config": {"poll_seconds": 0.5}}}})), daemon=True)
    job.start()
    try:
        closed_before = feed_with_spec_change(config, spec_path, batches, cut, alive=job.is_alive)
    finally:
        stop_stream(config)
        job.join(timeout=300)
    assert outcome["result"].success
    before = run_oracle(batches[:cut], GAP_MS, LATENESS_MS)
    expected = run_oracle(batches, GAP_MS, LATENESS_MS, attributes=_attribute_map(ADDED))
    assert read_sessions(config) == sorted(expected.closed)
    open_at_change = {oracle_session_id(row[1], row[2]) for row in before.open_sessions}
    got = read_attributes(config, ["low_order", "revenue"])
    want = _expected(expected, expected.closed, ["low_order", "revenue"])
    for sid, row in want.items():
        if sid in closed_before or sid in open_at_change:
            row["low_order"] = None
    assert got == want
