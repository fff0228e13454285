"""The assets: the tables and the state the stream keeps -- written by the library (the CLI, the stream, the runs
here), so external assets, reported as materialized once per new Delta version or committed batch (the runs that
write them, and assets.observations' sensor for writes made outside Dagster) -- and the daily metrics derived from
the sessions table. One owner for what each asset's metadata holds (table_materialization, state_metadata)."""
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetSpec,
    DagsterInstance,
    DagsterRunStatus,
    DailyPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    RunsFilter,
    asset,
)

from assets.resources import SessionsResource
from pipelines.config import SessionsConfig
from pipelines.job.checkpoint import read_job_metadata
from pipelines.job.metrics import daily_metrics, metrics_table
from pipelines.storage import open_table, read_rows
from state_store.results import StatusReport, TableFacts
from state_store.status import table_facts

RAW_EVENTS, SESSIONS, QUARANTINE, STATE = (AssetKey("raw_events"), AssetKey("sessions"),
                                           AssetKey("quarantine"), AssetKey("session_state"))
TABLE_KEYS = {"raw_events": RAW_EVENTS, "sessions": SESSIONS, "quarantine": QUARANTINE}
# deploy/dagster.yaml lets one run with this tag go at a time; the library's job/lifecycle locks
# guard the same thing for the CLI and for anything outside Dagster.
LIFECYCLE_TAGS = {"sessions/lifecycle": "true"}
STREAM_TAGS = {"sessions/stream": "true"}
DATA_VERSION_TAG = "dagster/data_version"  # Dagster's own tag: the version a materialization made
# A run of a job with this tag reports the versions it wrote when it ends (only_new); while one is running the
# observation sensor leaves the versions to it, so that a version is reported once, not by both at the same moment.
REPORTS_VERSIONS_TAGS = {"sessions/reports_versions": "true"}

_TABLE_KEYS_TEXT = ("Metadata: delta_version (the table version, also the data version), rows, data_files, bytes "
                    "(live data files), stream_batch (the stream's newest committed batch when the version was "
                    "reported; -1 before the first), uri.")
# What each key of session_state's metadata means (its description shows them; state_metadata writes them).
STATE_KEYS = {
    "provider": "the state store provider (rocksdb or hdfs)",
    "partitions": "the state store's partitions",
    "last_committed_batch": "the newest micro-batch whose state is committed (the data version: the checkpoint's "
                            "incarnation/this batch)",
    "watermark": "the event-time watermark after that batch (UTC): sessions idle for the gap before it are closed",
    "watermark_lag": "how far the watermark is behind the wall clock when observed (grows while no event arrives)",
    "state_bytes_on_disk": "the state store's files in the checkpoint (every version kept for recovery, the store's "
                           "own overhead: RocksDB's SST and log files)",
    "state_files": "the number of those files",
    "open_users": "users with an open session (counted by a pass over the state)",
    "open_sessions": "open sessions (counted by a pass over the state)",
    "open_events": "events held in open sessions (counted by a pass over the state)",
    "frozen_prefixes": "open sessions' parts no longer changed by late events (counted by a pass over the state)",
    "state_keys": "keys in the state store (counted by a pass over the state)",
    "open_state_bytes": "the open sessions' values as the operator encodes them: what the state holds, without the "
                        "store's files, versions and overhead (state_bytes_on_disk)",
    "counted_at_batch": "the batch the counts above were made at (a pass over the state runs at most every "
                        "SESSIONS_OBSERVE_STATE_MINUTES)",
    "restore_in_progress": "the command that finishes a restore left half-done, or no",
    "rescale_in_progress": "the command that finishes a rescale left half-done, or no",
    "recent_batches": "a plot of open sessions and open state bytes over the recent passes over the state",
}
PLOTS = ("recent_batches", "history")  # a pass's plot of its recent batches, carried with its counts
_COUNTED = ("open_users", "open_sessions", "open_events", "frozen_prefixes", "state_keys", "open_state_bytes")

TABLE_SPECS = [
    AssetSpec(RAW_EVENTS, description="Every landed line, with ingest_seq (the stream's source offsets). "
              + _TABLE_KEYS_TEXT),
    AssetSpec(SESSIONS, deps=[RAW_EVENTS], description="Closed sessions, each exactly once. " + _TABLE_KEYS_TEXT),
    AssetSpec(QUARANTINE, deps=[RAW_EVENTS], description="Rejected lines and late events, with reasons. "
              + _TABLE_KEYS_TEXT),
    AssetSpec(STATE, deps=[RAW_EVENTS], description="Open sessions in the Spark state store. Metadata: " + "; ".join(
        f"{key}: {text}" for key, text in STATE_KEYS.items()) + "."),
]


def duration_text(seconds: float) -> str:
    """A duration as an operator reads it: 26 d 4 h, 3 h 12 min, 4 min 10 s, 12 s."""
    sign, left = ("-" if seconds < 0 else ""), int(abs(seconds))
    days, hours, minutes, secs = left // 86400, left // 3600 % 24, left // 60 % 60, left % 60
    if days:
        return f"{sign}{days} d {hours} h"
    if hours:
        return f"{sign}{hours} h {minutes} min"
    return f"{sign}{minutes} min {secs} s" if minutes else f"{sign}{secs} s"


def table_materialization(key: AssetKey, facts: TableFacts, *, batch: int | None) -> AssetMaterialization:
    """A table's new version, as every reporter of it says it (the data version is the Delta version)."""
    return AssetMaterialization(asset_key=key, tags={DATA_VERSION_TAG: str(facts.version)}, metadata={
        "delta_version": facts.version, "rows": facts.rows, "data_files": facts.data_files,
        "bytes": MetadataValue.int(facts.bytes), "stream_batch": MetadataValue.int(-1 if batch is None else batch),
        "uri": MetadataValue.path(facts.uri)})


def state_metadata(report: StatusReport, *, now: dt.datetime, counted: Mapping[str, Any] | None = None
                   ) -> dict[str, Any]:
    """session_state's metadata, one key set (STATE_KEYS) for every reporter: a report with a pass over the state
    (`counted` None) carries its own counts; one without carries `counted` (a pass's metadata) forward."""
    watermark = report.watermark_ms
    metadata: dict[str, Any] = {
        "provider": report.provider, "partitions": MetadataValue.int(report.partitions or 0),
        "last_committed_batch": MetadataValue.int(-1 if report.last_committed_batch is None
                                                  else report.last_committed_batch),
        "watermark": "-" if watermark is None else dt.datetime.fromtimestamp(
            watermark / 1000, dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "watermark_lag": "-" if watermark is None else duration_text(now.timestamp() - watermark / 1000),
        "state_bytes_on_disk": MetadataValue.int(report.state_bytes), "state_files": report.state_files,
        "restore_in_progress": report.restore_in_progress or "no",
        "rescale_in_progress": report.rescale_in_progress or "no",
    }
    if counted is None:
        metadata.update({"open_users": report.open_users, "open_sessions": report.open_sessions,
                         "open_events": report.open_events, "frozen_prefixes": report.frozen_prefixes,
                         "state_keys": report.state_keys, "open_state_bytes": MetadataValue.int(report.state_value_bytes),
                         "counted_at_batch": metadata["last_committed_batch"]})
    else:
        metadata.update({key: counted[key] for key in (*_COUNTED, "counted_at_batch", *PLOTS) if key in counted})
    if report.kafka_lag is not None:
        metadata["kafka_lag"] = MetadataValue.json(report.kafka_lag)
    return metadata


def state_version(config: SessionsConfig, batch: int | None) -> str:
    """session_state's data version: the checkpoint's incarnation and its batch (a restored checkpoint counts its
    batches from 0 again)."""
    meta = read_job_metadata(config.checkpoint)
    return f"{meta.incarnation if meta else '-'}/{batch}"


def state_materialization(config: SessionsConfig, report: StatusReport, *, now: dt.datetime,
                          counted: Mapping[str, Any] | None = None) -> AssetMaterialization:
    """The state at a newly committed batch (the data version: state_version)."""
    return AssetMaterialization(asset_key=STATE, tags={DATA_VERSION_TAG: state_version(
        config, report.last_committed_batch)}, metadata=state_metadata(report, now=now, counted=counted))


def written(config: SessionsConfig, report: StatusReport, *, now: dt.datetime,
            counted: Mapping[str, Any] | None = None) -> list[AssetMaterialization]:
    """The tables' and the state's current versions as materializations (`report`: the state's status)."""
    events = [table_materialization(TABLE_KEYS[name], facts, batch=report.last_committed_batch)
              for name, facts in table_facts(config).items()]
    if report.last_committed_batch is not None:
        events.append(state_materialization(config, report, now=now, counted=counted))
    return events


def reporting_run_in_progress(instance: DagsterInstance) -> bool:
    """Whether a run that reports the versions it writes (REPORTS_VERSIONS_TAGS) is running. A queued one is not: it
    reports nothing before it has started Spark and done its work, long after a tick's events are stored."""
    running = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]
    return bool(instance.get_runs(filters=RunsFilter(statuses=running, tags=REPORTS_VERSIONS_TAGS), limit=1))


def only_new(instance: DagsterInstance, events: Sequence[AssetMaterialization]) -> list[AssetMaterialization]:
    """The materializations of versions not reported yet (by a run or by the sensor): each version once."""
    fresh = []
    for event in events:
        latest = instance.get_latest_materialization_event(event.asset_key)
        seen = (latest.asset_materialization.tags or {}).get(DATA_VERSION_TAG) \
            if latest and latest.asset_materialization else None
        if seen != (event.tags or {}).get(DATA_VERSION_TAG):
            fresh.append(event)
    return fresh


# Small pictures in asset metadata: text plots that Dagster's markdown shows as they are.
_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float]) -> str:
    """A text plot, oldest to newest, scaled between the series' own min and max."""
    if not values:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1
    return "".join(_BARS[int((v - low) / span * (len(_BARS) - 1))] for v in values)


def series_table(title: str, labels: Sequence[str], series: dict[str, Sequence[float]]) -> str:
    """A markdown block: one row per series with its sparkline, min and max, under a title naming the range."""
    lines = [f"{title} ({labels[0]} .. {labels[-1]}):" if labels else title, "",
             "| series | oldest → newest | min | max |", "|---|---|---|---|"]
    for name, values in series.items():
        if values:
            lines.append(f"| {name} | `{sparkline(values)}` | {min(values):g} | {max(values):g} |")
    return "\n".join(lines)


def bar_table(title: str, values: dict[str, float], width: int = 30) -> str:
    """A markdown block: one row per value with a bar scaled to the largest."""
    top = max(values.values(), default=0) or 1
    lines = [title, "", "| | | count |", "|---|---|---|"]
    for name, value in values.items():
        lines.append(f"| {name} | `{'█' * round(value / top * width) or '·'}` | {value:g} |")
    return "\n".join(lines)



@asset(partitions_def=DailyPartitionsDefinition(start_date="2026-01-01"), deps=[SESSIONS],
       description="Per day (UTC, by session start): sessions, users, median duration, page views.")
def daily_session_metrics(context: AssetExecutionContext, sessions: SessionsResource) -> MaterializeResult[Any]:
    config = sessions.config()
    row = daily_metrics(config, context.partition_key)
    days = read_rows(open_table(config, metrics_table(config)), columns=["day", "sessions"]).sort_by("day")
    days = days.slice(max(0, days.num_rows - 31))  # the last month of computed days
    plot = series_table("Sessions written per day", days["day"].to_pylist(),
                        {"sessions": days["sessions"].to_pylist()})
    return MaterializeResult(metadata={**{k: v for k, v in row.items() if k != "day"},
                                       "sessions_per_day": MetadataValue.md(plot)})
