"""The assets: the tables and the state the stream keeps (materialized by catch-up, a multi_asset, so
lineage is computed by Dagster), and the daily metrics derived from the sessions table."""
from collections.abc import Iterator, Sequence
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetSpec,
    DailyPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    asset,
    multi_asset,
)
from dagster_pyspark import PySparkResource

from assets.resources import SessionsResource, expected_errors
from pipelines.job import stream
from pipelines.job.metrics import daily_metrics, metrics_table
from pipelines.storage import open_table
from state_store.results import StatusReport
from state_store.status import status

RAW_EVENTS, SESSIONS, QUARANTINE, STATE = (AssetKey("raw_events"), AssetKey("sessions"),
                                           AssetKey("quarantine"), AssetKey("session_state"))
# deploy/dagster.yaml lets one run with this tag go at a time; the library's job/lifecycle locks
# guard the same thing for the CLI and for anything outside Dagster.
LIFECYCLE_TAGS = {"sessions/lifecycle": "true"}
STREAM_TAGS = {"sessions/stream": "true"}

TABLE_SPECS = [
    AssetSpec(RAW_EVENTS, description="Every landed line, with ingest_seq (the stream's source offsets)."),
    AssetSpec(SESSIONS, deps=[RAW_EVENTS], description="Closed sessions, each exactly once."),
    AssetSpec(QUARANTINE, deps=[RAW_EVENTS], description="Rejected lines and late events, with reasons."),
    AssetSpec(STATE, deps=[RAW_EVENTS], description="Open sessions in the Spark state store."),
]

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



def state_metadata(report: StatusReport) -> dict[str, MetadataValue]:
    """What an operator reads about the state (observations and materializations alike)."""
    return {
        "provider": MetadataValue.text(report.provider),
        "partitions": MetadataValue.int(report.partitions or 0),
        "last_committed_batch": MetadataValue.int(-1 if report.last_committed_batch is None
                                                  else report.last_committed_batch),
        "state_keys": MetadataValue.int(report.state_keys), "open_users": MetadataValue.int(report.open_users),
        "open_sessions": MetadataValue.int(report.open_sessions),
        "open_events": MetadataValue.int(report.open_events),
        "frozen_prefixes": MetadataValue.int(report.frozen_prefixes),
        "state_bytes": MetadataValue.int(report.state_bytes),
        "watermark_ms": MetadataValue.int(report.watermark_ms or 0),
        **({"kafka_lag": MetadataValue.json(report.kafka_lag)} if report.kafka_lag is not None else {}),
    }


@multi_asset(specs=TABLE_SPECS, name="catch_up", op_tags=LIFECYCLE_TAGS,
             description="Ingest everything landed and process it (trigger availableNow), then stop.")
def catch_up(context: AssetExecutionContext, sessions: SessionsResource,
             pyspark: PySparkResource) -> Iterator[MaterializeResult[Any]]:
    config, spark = sessions.config(), pyspark.spark_session
    summary = expected_errors(stream.catch_up, config, spark=spark)
    yield MaterializeResult(asset_key=RAW_EVENTS, metadata={
        "ingested_files": summary.ingested_files, "ingested_rows": summary.ingested_rows,
        "rejected_lines": summary.rejected_lines})
    yield MaterializeResult(asset_key=SESSIONS, metadata={
        k: v for k, v in summary.to_dict().items() if v is not None})
    yield MaterializeResult(asset_key=QUARANTINE, metadata={"quarantined": summary.quarantined})
    yield MaterializeResult(asset_key=STATE, metadata=state_metadata(status(config, spark=spark)))


@asset(partitions_def=DailyPartitionsDefinition(start_date="2026-01-01"), deps=[SESSIONS],
       description="Per day (UTC, by session start): sessions, users, median duration, page views.")
def daily_session_metrics(context: AssetExecutionContext, sessions: SessionsResource) -> MaterializeResult[Any]:
    config = sessions.config()
    row = daily_metrics(config, context.partition_key)
    days = open_table(config, metrics_table(config)).to_pyarrow_table(columns=["day", "sessions"]).sort_by("day")
    days = days.slice(max(0, days.num_rows - 31))  # the last month of computed days
    plot = series_table("Sessions written per day", days["day"].to_pylist(),
                        {"sessions": days["sessions"].to_pylist()})
    return MaterializeResult(metadata={**{k: v for k, v in row.items() if k != "day"},
                                       "sessions_per_day": MetadataValue.md(plot)})
