"""Dagster's run storage after `forget`: the runs that name an erased user -- in their run config or tags, or (a
state_lookup, whose point is a table of users) in their event log -- deleted with their storage directories (IO
manager outputs, compute logs). The forget_user run deletes the others (forget_user_op); its own run config names the
user too, so the erasure_runs_cleanup sensor deletes finished forget_user runs. Dagster-specific, so here and not in
state_store (which never imports dagster); what "names U" means is pipelines.ingest.erased.UserSpelling's. And the
erasure_requests sensor: a compliance workflow's request files (state_store.erasure_requests) turned into forget_user
runs, one for all that are pending."""
from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import os
import shutil
from collections.abc import Sequence

from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SkipReason,
    sensor,
    serialize_value,
)

from assets.resources import SessionsResource
from pipelines.ingest.erased import UserSpelling
from state_store.erasure_requests import pending_files

FORGET_JOB = "forget_user"
# Jobs whose event log lists user ids beyond their run config: state_lookup's table (the top-N lookup names users no
# run config does).
USER_LISTING_JOBS = frozenset({"state_lookup"})
FINISHED = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)


def runs_naming(instance: DagsterInstance, users: str | Sequence[str], *, besides: str | None = None
                ) -> list[DagsterRun]:
    """Every run of the instance but `besides` whose run config or tags name one of `users` (one id or several), or,
    for a USER_LISTING_JOBS run, whose event log does. Each run is read once, whatever the number of users."""
    spelled = [UserSpelling(u) for u in ([users] if isinstance(users, str) else users)]

    def names(run: DagsterRun) -> bool:
        config, tags = dict(run.run_config or {}), dict(run.tags or {})
        if any(user.in_value(config) or user.in_value(tags) for user in spelled):
            return True
        if run.job_name not in USER_LISTING_JOBS:
            return False
        entries = [serialize_value(entry).encode() for entry in instance.all_logs(run.run_id)]
        return any(user.in_bytes(entry) for entry in entries for user in spelled)

    return [run for run in instance.get_runs() if run.run_id != besides and names(run)]


def delete_run(instance: DagsterInstance, run_id: str) -> None:
    """The run and its event log (instance.delete_run), its compute logs, and its directory under the instance's
    storage ($DAGSTER_HOME/storage/<run_id>: the filesystem IO manager's outputs)."""
    instance.delete_run(run_id)
    if not run_id or os.path.basename(run_id) != run_id or run_id in (".", ".."):
        return  # never a path outside the storage directory
    with contextlib.suppress(NotImplementedError):  # a compute log manager that cannot delete
        instance.compute_log_manager.delete_logs(prefix=[run_id])
    directory = os.path.join(instance.storage_directory(), run_id)
    if os.path.isdir(directory):
        shutil.rmtree(directory)


def delete_runs_naming(instance: DagsterInstance, users: str | Sequence[str], *, besides: str) -> tuple[int, int]:
    """Deletes the finished runs naming one of `users` (runs_naming) but `besides`; (deleted, unfinished: left, still
    running)."""
    deleted = unfinished = 0
    for run in runs_naming(instance, users, besides=besides):
        if run.status in FINISHED:
            delete_run(instance, run.run_id)
            deleted += 1
        else:
            unfinished += 1
    return deleted, unfinished


@sensor(minimum_interval_seconds=30, default_status=DefaultSensorStatus.RUNNING,
        description="Deletes finished forget_user runs (their run config names the user) and their storage.")
def erasure_runs_cleanup(context: SensorEvaluationContext) -> SkipReason:
    runs = context.instance.get_runs(filters=RunsFilter(job_name=FORGET_JOB, statuses=list(FINISHED)))
    for run in runs:
        delete_run(context.instance, run.run_id)
        context.log.info(f"deleted {FORGET_JOB} run {run.run_id} ({run.status.value})")
    return SkipReason(f"deleted {len(runs)} finished {FORGET_JOB} run(s)")


IN_PROGRESS = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
               DagsterRunStatus.STARTED]
REQUESTS_RETRY_S = 3600.0  # a set of request files whose run did not erase them is asked again after this


@sensor(job_name=FORGET_JOB, minimum_interval_seconds=60, default_status=DefaultSensorStatus.RUNNING,
        description="Erasure requests (files named *.users at SESSIONS_ERASURE_REQUESTS_URI): every pending file's "
        "users erased in one forget_user run, which deletes the files.")
def erasure_requests(context: SensorEvaluationContext, sessions: SessionsResource) -> RunRequest | SkipReason:
    """One forget_user run for all pending request files (the run config names the files, not the users); none while
    another forget_user run is in progress, so the requests that arrive meanwhile go into the next one. A run that
    did not erase them (its files are still pending) is retried after an hour, or at once from the launchpad."""
    files = pending_files(sessions.config())
    if not files:
        return SkipReason("no erasure request is pending")
    running = context.instance.get_runs(filters=RunsFilter(job_name=FORGET_JOB, statuses=IN_PROGRESS), limit=1)
    if running:
        return SkipReason(f"{len(files)} request file(s) wait for forget_user run {running[0].run_id} to finish")
    key = hashlib.sha256("\n".join(files).encode()).hexdigest()[:16]  # the cursor keeps no name
    now = dt.datetime.now(dt.timezone.utc).timestamp()
    last_key, _, last_at = (context.cursor or "").rpartition("@")
    if last_key == key and now - float(last_at or 0) < REQUESTS_RETRY_S:
        return SkipReason(f"the run for these {len(files)} request file(s) did not erase them: asked again after "
                          f"{REQUESTS_RETRY_S / 60:g} minutes, or launch forget_user with their request_files now")
    context.update_cursor(f"{key}@{now}")
    return RunRequest(run_config={"ops": {"forget_user_op": {"config": {"request_files": files}}}},
                      tags={"sessions/reason": f"{len(files)} erasure request file(s)"})
