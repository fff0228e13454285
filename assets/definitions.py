"""Everything Dagster loads (`dagster dev -w workspace.yaml`): assets, jobs, the restore runbook, checks,
schedules and sensors, each in its own module; every op calls the library (pipelines/, state_store/)."""
from dagster import Definitions, in_process_executor

from assets.automation import (
    compaction_schedule,
    maintenance_sensor,
    resume_stream_after_restore,
    stream_failure_sensor,
)
from assets.checks import ALL_CHECKS
from assets.erasure_runs import erasure_requests, erasure_runs_cleanup
from assets.jobs import (
    compaction,
    forget_user,
    rescale,
    savepoint,
    session_catch_up,
    session_stream,
    state_lookup,
    stop_stream,
)
from assets.observations import observation_sensor, observe_state, savepoint_catalog
from assets.resources import SessionsResource, pyspark_resource
from assets.runbook import restore_from_snapshot
from assets.tables import TABLE_SPECS, daily_session_metrics

defs = Definitions(
    # The tables and the state are external assets: written by the library, reported as materialized by the runs
    # that write them and by observation_sensor (no button here re-runs what wrote them).
    assets=[*TABLE_SPECS, daily_session_metrics, savepoint_catalog],
    asset_checks=ALL_CHECKS,
    jobs=[session_catch_up, session_stream, stop_stream, savepoint, restore_from_snapshot, rescale, compaction, state_lookup,
          observe_state, forget_user],
    schedules=[compaction_schedule],
    sensors=[observation_sensor, maintenance_sensor, stream_failure_sensor, resume_stream_after_restore,
             erasure_runs_cleanup, erasure_requests],
    # Nothing machine-specific in the resources: both read the environment when a run uses them (no launchpad
    # shows this machine's paths).
    resources={"sessions": SessionsResource(), "pyspark": pyspark_resource()},
    # One process per run, so one Spark driver per run: the steps of a job (the runbook's restore and verify, the
    # catch-up and its checks) share its SparkSession instead of each starting a JVM of its own, as the default
    # multiprocess executor would. The steps of every job here depend on each other (or are checks of
    # seconds), so nothing that could run in parallel is lost. A run is still its own process (run launcher).
    executor=in_process_executor,
)
