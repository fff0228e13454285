"""What the job holds now, for `sessionctl status`, Dagster's observations and the demo; and what an operator can see
without running the job or starting Spark (`table_facts`: the output tables as their Delta logs describe them), which
Dagster's observation sensor reads every minute, so it stays cheap."""
from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from pipelines.config import SessionsConfig
from pipelines.data_files import row_count
from pipelines.errors import NoCommittedBatch, SessionsError
from pipelines.ingest.kafka import kafka_lag
from pipelines.job.checkpoint import (
    CheckpointInfo,
    JobMetadata,
    directory_size,
    inspect_checkpoint,
    read_restore_marker,
    rescale_command,
)
from pipelines.job.runtime import get_spark, spark_failures
from pipelines.job.sink import table_rows
from pipelines.storage import open_table, storage_options, table_exists
from state_store.results import StatusReport, TableFacts
from state_store.state import at_newest_batch, state_summary

__all__ = ["status", "table_facts"]


def _kafka_lag(config: SessionsConfig) -> dict[str, Any] | None:
    """Per partition: next offset ingest starts at, high watermark, lag; None without Kafka. A broker that does not
    answer is reported in the field, not as a failed status."""
    if not config.uses_kafka:
        return None
    try:
        return {str(partition): lag for partition, lag in kafka_lag(config).items()}
    except SessionsError as error:
        return {"error": str(error)}


def status(config: SessionsConfig, *, spark: SparkSession | None = None, with_state: bool = True) -> StatusReport:
    """What the job holds now: provider, partitions, last batch, state keys and bytes, watermark."""
    info = inspect_checkpoint(config.checkpoint)
    files, size = directory_size(config.checkpoint / "state")
    state: dict[str, int] = {}  # StatusReport's state fields default to 0: nothing read
    if with_state and info.last_committed_batch is not None:
        def summary(read: CheckpointInfo, meta: JobMetadata, _watermark: int | None
                    ) -> tuple[CheckpointInfo, dict[str, int]]:
            return read, state_summary(spark or get_spark(config), config.checkpoint, meta.rules,
                                       batch_id=read.last_committed_batch)

        with spark_failures(config):
            try:  # the batch the figures are of (a running stream may have committed past `info`'s)
                info, state = at_newest_batch(config, summary)
            except NoCommittedBatch:  # a checkpoint older than the job's metadata
                state = state_summary(spark or get_spark(config), config.checkpoint, config.rules)
    return StatusReport(
        checkpoint=info.path,
        provider=info.provider or config.state_store,
        partitions=info.partitions or config.state_partitions,
        last_committed_batch=info.last_committed_batch,
        watermark_ms=info.next_watermark_ms if info.next_watermark_ms is not None else info.batch_watermark_ms,
        source_offset=info.source_offset,
        state_files=files,
        state_bytes=size,
        sessions_rows=table_rows(config.sessions_table, storage_options(config, config.sessions_table)),
        restore_in_progress=(read_restore_marker(config.checkpoint) or {}).get("command"),
        rescale_in_progress=rescale_command(info),
        quarantine_rows=table_rows(config.quarantine_table, storage_options(config, config.quarantine_table)),
        kafka_lag=_kafka_lag(config),
        **state,
    )


def _facts(config: SessionsConfig, uri: str) -> TableFacts | None:
    if not table_exists(config, uri):
        return None
    table = open_table(config, uri)
    adds = pa.table(table.get_add_actions(flatten=True))
    return TableFacts(uri=uri, version=table.version(), rows=row_count(table),
                      data_files=adds.num_rows, bytes=int(pc.sum(adds["size_bytes"]).as_py() or 0))


def table_facts(config: SessionsConfig) -> dict[str, TableFacts]:
    """raw_events, sessions and quarantine (those that exist), from their Delta logs' file statistics."""
    found = {name: _facts(config, uri) for name, uri in (("raw_events", config.raw_events_table),
                                                  ("sessions", config.sessions_table),
                                                  ("quarantine", config.quarantine_table))}
    return {name: facts for name, facts in found.items() if facts is not None}
