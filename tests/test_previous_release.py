"""A checkpoint and a savepoint made by the release before session attributes (commit b80d298: state values in
StateCodec v2, canonical savepoint rows without an `attributes` column, no `spec` in the checkpoint's _job.json nor in
the savepoint catalog) go on under this build, on both state store providers, without a session spec and with one
that has attributes -- exactly as the oracle says.

The fixture homes (tests/fixtures/previous_release_home/{rocksdb,hdfs}) were written by that release with
tests/fixtures/make_previous_release_home.py: stream_scenario(2, 6)'s first SAVEPOINT_AT batches processed, a full
savepoint taken (canonical rows and a native copy), one more batch processed (the checkpoint is past the savepoint).
Here the remaining batches are landed and processed by this build; then the savepoint is restored (its native copy,
then its canonical rows) and the job caught up again, on the same home: each time, every session exactly once.

With the spec (the contract's "Session spec": an attribute added to a running job), a session holding an event the
old state held carries null for every attribute, and a session made only of events ingested under the spec carries
the oracle's values. Lines ingested by the old release have no `page` field: the input part applies to lines ingested
after the change, so a restore that replays them sees a null page for them (but their event types still count).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pipelines.core.spec import parse_spec
from pipelines.job.stream import catch_up
from state_store.lifecycle import restore
from state_store.preflight import plan_restore
from state_store.savepoint import catalog as sp
from testkit.oracle import run_oracle
from tests.kit.datagen import land_batches, stream_scenario
from tests.kit.homes import make_config
from tests.kit.tables import assert_late_keys, read_open_sessions, read_sessions
from tests.test_session_attributes import read_attributes

pytestmark = pytest.mark.tier("spark")

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "previous_release_home"
SAVEPOINT_AT, CHECKPOINT_AT = 3, 4  # make_previous_release_home.py's
GAP_MS, LATENESS_MS = 30 * 60_000, 10 * 60_000  # make_config's defaults

SPEC = """\
input:
  fields:
    page: {path: page, type: string}
attributes:
  landing_page: {first: page}
  views: {count_if: {event_type: [page_view]}}
"""
ATTRIBUTES = {a.name: a.to_dict() for a in parse_spec(SPEC).attributes}  # for the oracle
HELD = {"held": {"max": "held"}}  # the oracle's alone: 1 when a session holds an event the old state held


def scenario() -> list[list[dict[str, Any]]]:
    return stream_scenario(2, 6, gap_ms=GAP_MS, lateness_ms=LATENESS_MS)  # the data the fixture was made from


@pytest.mark.tier("pure")
@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_the_catalog_columns_begin_with_the_previous_releases(provider):
    """The catalog's columns (SavepointInfo's stored fields, in order) begin with the ones the previous release's
    catalog table holds, in its order and with its types: a column is only ever added at the end."""
    import pyarrow as pa
    from deltalake import DeltaTable

    stored = pa.schema(DeltaTable(str(FIXTURE / provider / "savepoints" / "catalog")).schema().to_arrow())
    assert len(sp.CATALOG_SCHEMA) > len(stored)  # this build adds `spec`
    assert [(f.name, f.type) for f in sp.CATALOG_SCHEMA][:len(stored)] == [(f.name, f.type) for f in stored]


def _home(tmp_path: Path, provider: str, **env: Any) -> Any:
    home = tmp_path / "home"
    shutil.copytree(FIXTURE / provider, home)
    config = make_config(tmp_path, provider, home=home, **env)
    # What the previous release left: no spec recorded anywhere, canonical rows without `attributes`.
    from deltalake import DeltaTable

    assert "spec" not in json.loads((config.checkpoint / "_job.json").read_text())
    store = sp.SavepointStore.of(config)
    saved = store.get("latest")
    assert (saved.batch_id, saved.spec, saved.provider, saved.kind) == (SAVEPOINT_AT, None, provider, "full")
    columns = DeltaTable(store.state_uri(saved.savepoint_id)).schema().to_arrow().names
    assert saved.native_checksum and "user_id" in columns and "attributes" not in columns
    return config, saved


def _assert_exactly_the_oracle(spark: Any, config: Any, batches: list[list[dict[str, Any]]]) -> Any:
    expected = run_oracle(batches, GAP_MS, LATENESS_MS)
    assert read_sessions(config) == sorted(expected.closed)  # a list: a session written twice would show
    assert read_open_sessions(spark, config) == sorted(expected.open_sessions)
    assert_late_keys(config, expected)
    return expected


@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_the_previous_releases_checkpoint_continues_and_its_savepoint_restores(spark, tmp_path, provider):
    config, saved = _home(tmp_path, provider)
    batches = scenario()
    land_batches(config, batches[CHECKPOINT_AT:], start=CHECKPOINT_AT)
    catch_up(config, spark)
    expected = _assert_exactly_the_oracle(spark, config, batches)
    assert expected.closed and expected.late and expected.duplicates

    plan = plan_restore(config, saved.savepoint_id)
    assert plan.restorable, plan.reasons
    assert (plan.method, plan.migrations) == ("native", [])
    at_savepoint = run_oracle(batches[:SAVEPOINT_AT], GAP_MS, LATENESS_MS)
    for canonical in (False, True):
        restored = restore(config, saved.savepoint_id, spark=spark, canonical=canonical)
        assert restored.method == ("canonical" if canonical else "native")
        assert read_sessions(config) == sorted(at_savepoint.closed)
        assert read_open_sessions(spark, config) == sorted(at_savepoint.open_sessions)
        catch_up(config, spark)
        _assert_exactly_the_oracle(spark, config, batches)


def _with_fields(batches: list[list[dict[str, Any]]], held: set[tuple[str, str]]) -> list[list[dict[str, Any]]]:
    """The events as the oracle's attributes see them: `page` only for lines ingested under the spec (the old release
    ingested the first CHECKPOINT_AT batches), and the oracle's own `held` mark on the events the old state held."""
    return [[{**event, "fields": {**({"page": event["page"]} if k >= CHECKPOINT_AT else {}),
                                  "held": 1 if (event["user_id"], event["event_id"]) in held else None}}
             for event in batch] for k, batch in enumerate(batches)]


def _expected_attributes(batches: list[list[dict[str, Any]]], start: int) -> tuple[Any, dict[str, dict[str, Any]]]:
    """The sessions table's attributes after this build took over at batch `start` (the old state then held the
    oracle's open sessions at `start`): null for a session closed before (written by the old release) or holding an
    event the old state held; the oracle's values for the others."""
    before = run_oracle(batches[:start], GAP_MS, LATENESS_MS)
    expected = run_oracle(_with_fields(batches, before.open_events), GAP_MS, LATENESS_MS,
                          attributes={**ATTRIBUTES, **HELD})
    closed_before = {row[0] for row in before.closed}
    want = {}
    for row in expected.closed:
        values = expected.attributes[row[0]]
        null = row[0] in closed_before or values["held"] == 1
        want[row[0]] = {name: None if null else values[name] for name in ATTRIBUTES}
    return expected, want


@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_the_previous_releases_checkpoint_and_savepoint_under_a_spec_with_attributes(spark, tmp_path, provider):
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(SPEC)
    config, saved = _home(tmp_path, provider, SESSIONS_SPEC=str(spec_path))
    batches = scenario()
    land_batches(config, batches[CHECKPOINT_AT:], start=CHECKPOINT_AT)
    catch_up(config, spark)
    expected, want = _expected_attributes(batches, CHECKPOINT_AT)
    _assert_exactly_the_oracle(spark, config, batches)
    assert read_attributes(config, list(ATTRIBUTES)) == want
    open_then = {row[0] for row in run_oracle(batches[:CHECKPOINT_AT], GAP_MS, LATENESS_MS).open_sessions}
    later = [sid for sid in want if expected.attributes[sid]["held"] is None and sid not in open_then]
    assert open_then & set(want) and any(want[sid]["landing_page"] is not None for sid in later)
    assert all(want[sid] == {"landing_page": None, "views": None} for sid in open_then & set(want))
    recorded = json.loads((config.checkpoint / "_job.json").read_text())["spec"]
    assert json.loads(recorded) == json.loads(parse_spec(SPEC).to_json())

    plan = plan_restore(config, saved.savepoint_id)
    assert plan.restorable, plan.reasons
    assert {"session spec: attribute landing_page added: sessions open now carry null for it",
            "session spec: attribute views added: sessions open now carry null for it"} <= set(plan.migrations)
    after = _expected_attributes(batches, SAVEPOINT_AT)[1]
    # sessions of lines the old release ingested after its savepoint (replayed from raw_events): no page, page views
    assert any(row["landing_page"] is None and row["views"] for row in after.values())
    for canonical in (False, True):
        restored = restore(config, saved.savepoint_id, spark=spark, canonical=canonical)
        assert restored.method == ("canonical" if canonical else "native")
        catch_up(config, spark)
        _assert_exactly_the_oracle(spark, config, batches)
        assert read_attributes(config, list(ATTRIBUTES)) == after
