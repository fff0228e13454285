"""What a fresh Dagster shows without anyone running a job: a sensor looks at the tables, the checkpoint and the
savepoint catalog every minute (no Spark) and reports what it finds -- a new Delta version or committed batch as a
materialization, once (whoever wrote it: the CLI, a stream, a run), the state's watermark and the catalog as
observations, and the asset checks' evaluations as their inputs change -- and asks for an `observe_state` run -- a
pass over the state with Spark -- whenever the job has committed a new batch. The state asset's metadata carries a
small plot of its size and open sessions over the recent passes."""
import datetime as dt
import json
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    AssetSpec,
    DefaultSensorStatus,
    MetadataValue,
    OpExecutionContext,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    job,
    op,
    sensor,
)

from assets.checks import SAVEPOINT_CHECKS, SESSIONS_CHECKS, STATE_CHECKS, evaluations
from assets.resources import SessionsResource, SessionsSpark
from assets.tables import (
    DATA_VERSION_TAG,
    SESSIONS,
    STATE,
    bar_table,
    only_new,
    reporting_run_in_progress,
    series_table,
    state_metadata,
    written,
)
from pipelines.errors import SessionsError
from state_store.history import diff_savepoints
from state_store.results import SavepointInfo
from state_store.savepoint.catalog import SavepointStore
from state_store.status import status

SAVEPOINTS = AssetKey("savepoint_catalog")
savepoint_catalog = AssetSpec(SAVEPOINTS, deps=[STATE], description=(
    "Savepoints (Delta tables on S3 or a local path): the catalog, newest first, observed every minute; a new "
    "complete savepoint is a materialization (its id is the data version)."))
PLOT_POINTS = 20


def _savepoint_table(catalog: list[SavepointInfo], now: dt.datetime) -> str:
    lines = ["| savepoint | status | trigger | batch | rows | bytes | age |", "|---|---|---|---|---|---|---|"]
    for saved in catalog[:5]:
        age = now - dt.datetime.fromisoformat(saved.created_at) if saved.created_at else None
        lines.append(f"| {saved.savepoint_id} | {saved.status} | {saved.trigger} | {saved.batch_id} | "
                     f"{saved.rows} | {saved.bytes or 0} | {str(age).split('.')[0] if age else '-'} |")
    return "\n".join(lines)


def observe(sessions: SessionsResource, now: dt.datetime, counted: dict[str, Any] | None = None
            ) -> tuple[list[AssetMaterialization | AssetObservation], int | None, str | None]:
    """The cheap look (no Spark): every table's and the state's current version as a materialization, the state's
    metadata (watermark lag now) as an observation, the catalog; with the last committed batch (the cue for a pass
    over the state) and the newest complete savepoint."""
    config = sessions.config()
    report = status(config, with_state=False)
    events: list[AssetMaterialization | AssetObservation] = list(written(config, report, now=now, counted=counted))
    events.append(AssetObservation(asset_key=STATE, metadata=state_metadata(report, now=now, counted=counted)))
    catalog = SavepointStore.of(config).list()
    complete = [s for s in catalog if s.status == "complete"]
    newest = complete[0].savepoint_id if complete else None
    newest_age = (now - dt.datetime.fromisoformat(complete[0].created_at)).total_seconds() if complete else -1.0
    metadata: dict[str, Any] = {"complete": len(complete), "failed": len(catalog) - len(complete), "newest": newest or "-",
                "newest_age_s": round(newest_age, 1), "uri": config.savepoint_uri,
                "newest_savepoints": MetadataValue.md(_savepoint_table(catalog, now))}
    events.append(AssetObservation(asset_key=SAVEPOINTS, metadata=metadata))
    if newest is not None:
        events.append(AssetMaterialization(asset_key=SAVEPOINTS, tags={DATA_VERSION_TAG: newest}, metadata=metadata))
    return events, report.last_committed_batch, newest


def _is_state_pass(metadata: Any) -> bool:
    """An observe_state observation (not a sensor observation carrying its figures forward)."""
    return "recent_batches" in metadata


def _num(metadata: Any, key: str) -> int:
    value: Any = metadata[key].value
    return int(value)


@op(description="A pass over the state with Spark: open users, sessions and events, with a plot of recent ones.")
def observe_state_op(context: OpExecutionContext, sessions: SessionsResource, pyspark: SessionsSpark) -> None:
    try:
        report = status(sessions.config(), spark=pyspark.spark_session)
    except SessionsError as error:  # e.g. a restore is replacing the checkpoint right now
        context.log.warning(f"state not observed: {error}")
        return
    history = context.instance.fetch_observations(STATE, limit=4 * PLOT_POINTS).records
    points = [(_num(m, "last_committed_batch"), _num(m, "open_state_bytes"), _num(m, "open_sessions"))
              for m in (r.asset_observation.metadata for r in reversed(history) if r.asset_observation)
              if _is_state_pass(m)]
    points = [*points, (report.last_committed_batch or 0, report.state_value_bytes, report.open_sessions)]
    points = list(dict((batch, (batch, size, n)) for batch, size, n in points).values())[-PLOT_POINTS:]
    plot = series_table(f"State over the last {len(points)} observed batches", [str(p[0]) for p in points],
                        {"open state bytes": [p[1] for p in points], "open sessions": [p[2] for p in points]})
    context.log_event(AssetObservation(asset_key=STATE, metadata={
        **state_metadata(report, now=dt.datetime.now(dt.timezone.utc)), "recent_batches": MetadataValue.md(plot),
        "history": MetadataValue.json({"batch": [p[0] for p in points], "open_state_bytes": [p[1] for p in points],
                                       "open_sessions": [p[2] for p in points]})}))
    _observe_newest_diff(context, sessions, pyspark)


def _observe_newest_diff(context: OpExecutionContext, sessions: SessionsResource, pyspark: SessionsSpark) -> None:
    """The diff of the two newest complete savepoints (`sessionctl savepoints diff`) as an observation of the
    catalog with a plot, once per new pair."""
    config = sessions.config()
    complete = [s for s in SavepointStore.of(config).list() if s.status == "complete"][:2]
    if len(complete) < 2:
        return
    newer, older = complete
    pair = f"{older.savepoint_id}..{newer.savepoint_id}"
    seen = context.instance.fetch_observations(SAVEPOINTS, limit=20).records
    if any(r.asset_observation and "diff" in r.asset_observation.metadata
           and r.asset_observation.metadata["diff"].value == pair for r in seen):
        return
    try:
        diff = diff_savepoints(config, pyspark.spark_session, older.savepoint_id, newer.savepoint_id)
    except SessionsError as error:
        context.log.warning(f"savepoint diff not observed: {error}")
        return
    plot = bar_table(f"Users from {older.savepoint_id} (batch {diff.batch_a}) to {newer.savepoint_id} "
                     f"(batch {diff.batch_b})", {"added": diff.users_added, "removed": diff.users_removed,
                                                 "changed": diff.users_changed, "unchanged": diff.users_unchanged})
    context.log_event(AssetObservation(asset_key=SAVEPOINTS, metadata={
        "diff": pair, "users_added": diff.users_added, "users_removed": diff.users_removed,
        "users_changed": diff.users_changed, "open_sessions_before": diff.open_sessions_a,
        "open_sessions_after": diff.open_sessions_b, "diff_plot": MetadataValue.md(plot),
        "sample": MetadataValue.json(diff.sample)}))


@job(description="Observe the state (requested by observation_sensor after each new committed batch).")
def observe_state() -> None:
    observe_state_op()


@sensor(job=observe_state, minimum_interval_seconds=60, default_status=DefaultSensorStatus.RUNNING)
def observation_sensor(context: SensorEvaluationContext, sessions: SessionsResource) -> SensorResult:
    """Every minute (cheap, no Spark): the tables' and the state's new versions as materializations, once each; the
    state and the catalog as observations; the asset checks' evaluations when what they check changed (the state's
    freshness also when SESSIONS_OBSERVE_STATE_MINUTES passed); and a pass over the state when a batch was committed
    since the last one it requested, at most every SESSIONS_OBSERVE_STATE_MINUTES (each pass starts Spark)."""
    now = dt.datetime.now(dt.timezone.utc)
    # The UI shows the newest event's metadata: carry the newest state pass's counts forward, labelled with the batch
    # they were counted at (state_metadata's counted_at_batch).
    passes = context.instance.fetch_observations(STATE, limit=50).records
    counted = next((dict(r.asset_observation.metadata) for r in passes
                    if r.asset_observation and _is_state_pass(r.asset_observation.metadata)), None)
    observed, batch, newest = observe(sessions, now, counted)
    # A run that reports what it writes reports it when it ends; the next tick reports what it did not.
    fresh = [] if reporting_run_in_progress(context.instance) else only_new(
        context.instance, [e for e in observed if isinstance(e, AssetMaterialization)])
    events: list[AssetMaterialization | AssetObservation | AssetCheckEvaluation] = [
        *fresh, *(e for e in observed if isinstance(e, AssetObservation))]
    cursor = json.loads(context.cursor) if context.cursor else {}
    quiet_s = sessions.config().observe_state_minutes * 60
    # What the checks last looked at: a new version (whoever reported it) is checked once; the state's freshness
    # also when SESSIONS_OBSERVE_STATE_MINUTES passed.
    versions = {e.asset_key.to_user_string(): (e.tags or {}).get(DATA_VERSION_TAG) for e in observed
                if isinstance(e, AssetMaterialization)}
    if SESSIONS.to_user_string() in versions and versions[SESSIONS.to_user_string()] != cursor.get("sessions_checked"):
        events += evaluations(sessions, SESSIONS_CHECKS)
        cursor["sessions_checked"] = versions[SESSIONS.to_user_string()]
    state = versions.get(STATE.to_user_string())
    if batch is not None and (state != cursor.get("state_checked")
                              or now.timestamp() - cursor.get("checked_at", 0) >= quiet_s):
        events += evaluations(sessions, STATE_CHECKS)
        cursor.update(state_checked=state, checked_at=now.timestamp())
    if newest is not None and cursor.get("verified") != newest:
        events += evaluations(sessions, SAVEPOINT_CHECKS)
        cursor["verified"] = newest
    requests = []
    if batch is not None and cursor.get("batch") != batch and now.timestamp() - cursor.get("at", 0) >= quiet_s:
        requests.append(RunRequest(run_key=f"observe-state-{sessions.config().checkpoint}-b{batch}-{now:%Y%m%d%H%M}"))
        cursor.update(batch=batch, at=now.timestamp())
    return SensorResult(run_requests=requests, asset_events=events, cursor=json.dumps(cursor))
