"""Asset checks: what must hold of the outputs and the state, evaluated by the library -- and by the product itself:
the observation sensor evaluates them (`evaluations`) as the tables and the state change, so none shows as passed
before it ran and none waits for a click."""
from collections.abc import Sequence

from dagster import AssetCheckEvaluation, AssetCheckResult, AssetChecksDefinition, AssetCheckSeverity, asset_check

from assets.resources import SessionsResource
from assets.tables import SESSIONS, STATE
from pipelines.errors import SavepointNotFound, SessionsError
from pipelines.job.checkpoint import inspect_checkpoint, last_commit_age_seconds, read_restore_marker, rescale_command
from pipelines.storage import open_table, read_rows
from state_store import lifecycle
from state_store.preflight import plan_restore


@asset_check(asset=SESSIONS, description="Every session_id appears once.")
def sessions_have_unique_ids(sessions: SessionsResource) -> AssetCheckResult:
    config = sessions.config()
    ids = read_rows(open_table(config, config.sessions_table), columns=["session_id"])["session_id"]
    duplicates = len(ids) - len(ids.unique())
    return AssetCheckResult(passed=duplicates == 0, metadata={"rows": len(ids), "duplicates": duplicates})


@asset_check(asset=STATE, description="The newest complete savepoint re-reads with its count and checksum.")
def newest_savepoint_verifies(sessions: SessionsResource) -> AssetCheckResult:
    try:
        saved = lifecycle.validate_savepoint(sessions.config(), "latest", migrate=True)
    except SavepointNotFound as error:  # none taken yet: a warning, not a broken savepoint
        return AssetCheckResult(passed=False, severity=AssetCheckSeverity.WARN, metadata={"error": str(error)})
    except SessionsError as error:
        return AssetCheckResult(passed=False, metadata={"error": str(error)})
    return AssetCheckResult(passed=True, metadata={"savepoint_id": saved.savepoint_id, "rows": saved.rows})


@asset_check(asset=STATE, description="The current settings can restore the newest complete savepoint (the restore "
                                      "pre-flight, `sessionctl restore --savepoint latest --dry-run`; a running "
                                      "stream aside). The restore runbook runs the same pre-flight first.")
def newest_savepoint_restorable(sessions: SessionsResource) -> AssetCheckResult:
    try:
        plan = plan_restore(sessions.config(), "latest")
    except SavepointNotFound as error:
        return AssetCheckResult(passed=False, severity=AssetCheckSeverity.WARN, metadata={"error": str(error)})
    except SessionsError as error:
        return AssetCheckResult(passed=False, metadata={"error": str(error)})
    return AssetCheckResult(passed=not plan.savepoint_reasons,
                            metadata={"savepoint_id": plan.savepoint_id, "reasons": "; ".join(plan.savepoint_reasons),
                                      "migrations": "; ".join(plan.migrations) or "none",
                                      "expected_seconds": plan.expected_seconds})


@asset_check(asset=STATE, description="The state's newest committed batch is recent (SESSIONS_STATE_MAX_AGE_MINUTES).")
def state_is_fresh(sessions: SessionsResource) -> AssetCheckResult:
    config = sessions.config()
    age = last_commit_age_seconds(config.checkpoint)
    limit = config.state_max_age_minutes * 60
    return AssetCheckResult(passed=age is not None and age <= limit, severity=AssetCheckSeverity.WARN,
                            metadata={"age_seconds": -1.0 if age is None else round(age, 1), "limit_seconds": limit})


@asset_check(asset=STATE, description="No restore was left half-done (a killed restore leaves its marker), nor a "
                                      "rescale inside Spark's repartition.")
def no_restore_left_half_done(sessions: SessionsResource) -> AssetCheckResult:
    checkpoint = sessions.config().checkpoint
    marker = read_restore_marker(checkpoint)
    if marker is None:
        finish = rescale_command(inspect_checkpoint(checkpoint))
        if finish is None:
            return AssetCheckResult(passed=True)
        return AssetCheckResult(passed=False, description=f"a rescale was interrupted: finish it: {finish}",
                                metadata={"next_step": finish})
    return AssetCheckResult(passed=False, description=f"finish it: {marker['command']}",
                            metadata={"savepoint_id": marker["savepoint_id"], "started_at": marker["started_at"],
                                      "next_step": marker["command"]})


ALL_CHECKS = [sessions_have_unique_ids, newest_savepoint_verifies, newest_savepoint_restorable, state_is_fresh,
              no_restore_left_half_done]
# What the sensor evaluates whenever a table or the state changed (reads of logs and of one column): all but the
# savepoint's re-read, which it evaluates once per new savepoint.
STATE_CHECKS = [newest_savepoint_restorable, state_is_fresh, no_restore_left_half_done]
SAVEPOINT_CHECKS = [newest_savepoint_verifies]
SESSIONS_CHECKS = [sessions_have_unique_ids]


def evaluations(sessions: SessionsResource, checks: Sequence[AssetChecksDefinition]) -> list[AssetCheckEvaluation]:
    """Each check run now, as the evaluation event a sensor reports; a check that cannot read what it checks fails
    with the library's one line."""
    out = []
    for check in checks:
        (key,) = check.check_keys
        try:
            result: AssetCheckResult = check(sessions)  # type: ignore[assignment]  # the decorated function's own
        except SessionsError as error:
            result = AssetCheckResult(passed=False, description=str(error), metadata={"error": str(error)})
        out.append(AssetCheckEvaluation(asset_key=key.asset_key, check_name=key.name, passed=result.passed,
                                        metadata=result.metadata, severity=result.severity,
                                        description=result.description))
    return out
