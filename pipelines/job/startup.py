"""What the job checks and creates before it starts: the checkpoint's fitness to run (its metadata, half-done
restores and rescales, settings that fit it) and the output tables."""
from __future__ import annotations

import logging
from pathlib import Path

from pipelines.config import SessionsConfig
from pipelines.core.rules import compare
from pipelines.errors import (
    CheckpointMismatch,
    CheckpointMissing,
    ConfigError,
    RestoreIncomplete,
)
from pipelines.job.checkpoint import (
    JobMetadata,
    inspect_checkpoint,
    read_job_metadata,
    read_restore_marker,
    rescale_command,
    write_job_metadata,
)
from pipelines.job.operators import for_layout, for_new_checkpoint
from pipelines.job.operators.seam import StateOperator
from pipelines.job.runtime import rescale_incomplete
from pipelines.job.sink import QUARANTINE_SCHEMA, SESSIONS_SCHEMA, add_attribute_columns, ensure_table, table_rows
from pipelines.storage import is_s3, storage_options

__all__ = ["checkpoint_metadata", "ensure_tables"]

log = logging.getLogger(__name__)


def ensure_tables(config: SessionsConfig) -> None:
    if not is_s3(config.warehouse_uri):
        Path(config.warehouse_uri).mkdir(parents=True, exist_ok=True)
    options = storage_options(config, config.warehouse_uri)
    ensure_table(config.sessions_table, SESSIONS_SCHEMA, options)
    add_attribute_columns(config.sessions_table, config.session_spec.attributes, options)
    ensure_table(config.quarantine_table, QUARANTINE_SCHEMA, options)


def checkpoint_metadata(config: SessionsConfig) -> tuple[JobMetadata, StateOperator]:
    """The checkpoint's job metadata (created for a new checkpoint) and the operator that runs it, decided here once;
    refuses settings that do not fit."""
    marker = read_restore_marker(config.checkpoint)
    if marker is not None:
        raise RestoreIncomplete(
            f"a restore from {marker['savepoint_id']} started at {marker['started_at']} did not finish (the process "
            f"was stopped): finish it with `{marker['command']}` before running the job", next_step=marker["command"])
    finish = rescale_command(inspect_checkpoint(config.checkpoint))
    if finish is not None:
        raise rescale_incomplete(finish)
    meta = read_job_metadata(config.checkpoint)
    if meta is None:
        if table_rows(config.sessions_table, storage_options(config, config.sessions_table)) > 0:
            raise CheckpointMissing(
                f"no checkpoint at {config.checkpoint} but the sessions table already has rows: "
                "restore one with `sessionctl restore --savepoint latest` (a fresh start would write them again)")
        operator = for_new_checkpoint()
        meta = JobMetadata.new(config.rules, config.state_buckets, state_layout=operator.layout)
        write_job_metadata(config.checkpoint, meta)
        return meta, operator
    operator = for_layout(meta.state_layout)  # one line for a layout this build cannot read
    if operator.retired is not None:  # readable, not runnable: refused before Spark starts
        raise CheckpointMismatch(f"{operator.retired} ({config.checkpoint})")
    return _rules_recorded(config, meta), operator


def _rules_recorded(config: SessionsConfig, meta: JobMetadata) -> JobMetadata:
    """The checkpoint's metadata with the rules this run uses: a new idle close, added and removed attributes and a
    changed input part are taken as they are (the contract); another gap or lateness, or a changed attribute, is
    refused in one line."""
    changes = compare(meta.rules, config.rules)
    refused = changes.refusals("the checkpoint was made", how="restore a savepoint with `sessionctl restore --migrate`")
    if refused:
        # another gap or lateness cannot reach the state the checkpoint holds; a changed attribute is another spec
        raise CheckpointMismatch(refused[0]) if changes.timing else ConfigError(refused[0])
    if changes.none:
        return meta
    for line in changes.lines():
        log.info("session rules: %s", line)
    meta = meta.with_rules(config.rules)
    write_job_metadata(config.checkpoint, meta)
    return meta
