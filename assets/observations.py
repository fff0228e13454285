"""What a fresh Dagster shows without anyone running a job: a sensor observes the tables, the checkpoint and
the savepoint catalog every minute (no Spark), and asks for an `observe_state` run -- a pass over the state with
Spark -- whenever the job has committed a new batch. The state asset's metadata carries a small plot of its size
and open sessions over the recent observations."""
import datetime as dt
import json
from typing import Any

from dagster import (
    AssetKey,
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
from dagster_pyspark import PySparkResource

from assets.resources import SessionsResource
from assets.tables import QUARANTINE, RAW_EVENTS, SESSIONS, STATE, bar_table, series_table, state_metadata
from pipelines.errors import SessionsError
from state_store.history import diff_savepoints
from state_store.results import SavepointInfo
from state_store.savepoint.catalog import SavepointStore
from state_store.status import status, table_facts

SAVEPOINTS = AssetKey("savepoint_catalog")
savepoint_catalog = AssetSpec(SAVEPOINTS, deps=[STATE], description=(
    "Savepoints (Delta tables on S3 or a local path): the catalog, newest first, observed every minute."))
_TABLE_KEYS = {"raw_events": RAW_EVENTS, "sessions": SESSIONS, "quarantine": QUARANTINE}
PLOT_POINTS = 20
# What a state pass counted, carried on the sensor's cheap observations (see observation_sensor).
_CARRIED = ("open_users", "open_sessions", "open_events", "frozen_prefixes", "state_keys", "state_value_bytes",
            "recent_batches", "history")


def _iso(ms: int | None) -> str:
    return "-" if ms is None else dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat()


def _savepoint_table(catalog: list[SavepointInfo], now: dt.datetime) -> str:
    lines = ["| savepoint | status | trigger | batch | rows | bytes | age |", "|---|---|---|---|---|---|---|"]
    for saved in catalog[:5]:
        age = now - dt.datetime.fromisoformat(saved.created_at) if saved.created_at else None
        lines.append(f"| {saved.savepoint_id} | {saved.status} | {saved.trigger} | {saved.batch_id} | "
                     f"{saved.rows} | {saved.bytes or 0} | {str(age).split('.')[0] if age else '-'} |")
    return "\n".join(lines)


def observe(sessions: SessionsResource, now: dt.datetime) -> tuple[list[AssetObservation], int | None]:
    """The cheap observations, and the last committed batch (the cue for a pass over the state)."""
    config = sessions.config()
    events = [AssetObservation(asset_key=_TABLE_KEYS[name], metadata={
        "delta_version": facts.version, "rows": facts.rows, "data_files": facts.data_files,
        "bytes": MetadataValue.int(facts.bytes), "uri": MetadataValue.path(facts.uri)})
        for name, facts in table_facts(config).items()]
    report = status(config, with_state=False)
    watermark = report.watermark_ms
    events.append(AssetObservation(asset_key=STATE, metadata={
        "provider": report.provider, "partitions": report.partitions,
        "last_committed_batch": -1 if report.last_committed_batch is None else report.last_committed_batch,
        "watermark": _iso(watermark),
        "watermark_lag_s": -1.0 if watermark is None else round(now.timestamp() - watermark / 1000, 1),
        "state_bytes_on_disk": MetadataValue.int(report.state_bytes), "state_files": report.state_files,
        "restore_in_progress": report.restore_in_progress or "no",
        "rescale_in_progress": report.rescale_in_progress or "no"}))
    catalog = SavepointStore.of(config).list()
    complete = [s for s in catalog if s.status == "complete"]
    newest_age = (now - dt.datetime.fromisoformat(complete[0].created_at)).total_seconds() if complete else -1.0
    events.append(AssetObservation(asset_key=SAVEPOINTS, metadata={
        "complete": len(complete), "failed": len(catalog) - len(complete),
        "newest": complete[0].savepoint_id if complete else "-",
        "newest_age_s": round(newest_age, 1), "uri": config.savepoint_uri,
        "newest_savepoints": MetadataValue.md(_savepoint_table(catalog, now))}))
    return events, report.last_committed_batch


def _is_state_pass(metadata: Any) -> bool:
    """An observe_state observation (not a sensor observation carrying its figures forward)."""
    return "open_sessions" in metadata and "counted_at_batch" not in metadata


def _num(metadata: Any, key: str) -> int:
    value: Any = metadata[key].value
    return int(value)


@op(description="A pass over the state with Spark: open users, sessions and events, with a plot of recent ones.")
def observe_state_op(context: OpExecutionContext, sessions: SessionsResource, pyspark: PySparkResource) -> None:
    try:
        report = status(sessions.config(), spark=pyspark.spark_session)
    except SessionsError as error:  # e.g. a restore is replacing the checkpoint right now
        context.log.warning(f"state not observed: {error}")
        return
    history = context.instance.fetch_observations(STATE, limit=4 * PLOT_POINTS).records
    points = [(_num(m, "last_committed_batch"), _num(m, "state_value_bytes"), _num(m, "open_sessions"))
              for m in (r.asset_observation.metadata for r in reversed(history) if r.asset_observation)
              if _is_state_pass(m)]
    points = [*points, (report.last_committed_batch or 0, report.state_value_bytes, report.open_sessions)]
    points = list(dict((batch, (batch, size, n)) for batch, size, n in points).values())[-PLOT_POINTS:]
    plot = series_table(f"State over the last {len(points)} observed batches", [str(p[0]) for p in points],
                        {"state bytes": [p[1] for p in points], "open sessions": [p[2] for p in points]})
    context.log_event(AssetObservation(asset_key=STATE, metadata={
        **state_metadata(report), "state_value_bytes": MetadataValue.int(report.state_value_bytes),
        "recent_batches": MetadataValue.md(plot),
        "history": MetadataValue.json({"batch": [p[0] for p in points], "state_value_bytes": [p[1] for p in points],
                                       "open_sessions": [p[2] for p in points]})}))
    _observe_newest_diff(context, sessions, pyspark)


def _observe_newest_diff(context: OpExecutionContext, sessions: SessionsResource, pyspark: PySparkResource) -> None:
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
    """Observes tables, checkpoint and savepoint catalog (cheap, no Spark) every minute; requests a pass over
    the state when a batch was committed since the last one it requested, at most every
    SESSIONS_OBSERVE_STATE_MINUTES (each pass starts a Spark application)."""
    now = dt.datetime.now(dt.timezone.utc)
    events, batch = observe(sessions, now)
    # The UI shows the newest observation's metadata: carry the newest state pass's figures forward,
    # labelled with the batch they were counted at.
    passes = context.instance.fetch_observations(STATE, limit=50).records
    counted = next((r.asset_observation.metadata for r in passes
                    if r.asset_observation and _is_state_pass(r.asset_observation.metadata)), None)
    if counted is not None:
        carried = {key: counted[key] for key in _CARRIED if key in counted}
        carried["counted_at_batch"] = counted["last_committed_batch"]
        events = [AssetObservation(asset_key=e.asset_key, metadata={**e.metadata, **carried})
                  if e.asset_key == STATE else e for e in events]
    cursor = json.loads(context.cursor) if context.cursor else {}
    requests = []
    quiet_s = sessions.config().observe_state_minutes * 60
    if batch is not None and cursor.get("batch") != batch and now.timestamp() - cursor.get("at", 0) >= quiet_s:
        requests.append(RunRequest(run_key=f"observe-state-{sessions.config().checkpoint}-b{batch}-{now:%Y%m%d%H%M}"))
        cursor = {"batch": batch, "at": now.timestamp()}
    return SensorResult(run_requests=requests, asset_events=events, cursor=json.dumps(cursor))
