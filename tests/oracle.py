"""The oracle moved to testkit/oracle.py (shared with the benchmarks' crash campaign); this re-export keeps the many
test modules that import `tests.oracle` working. New code imports testkit.oracle."""
from testkit.oracle import (
    LOGOUT,
    PAGE_VIEW,
    OracleResult,
    close_time,
    oracle,
    oracle_session_id,
    run_oracle,
    session_row,
    sessionize_user,
    split_events,
)

__all__ = ["LOGOUT", "PAGE_VIEW", "OracleResult", "close_time", "oracle", "oracle_session_id", "run_oracle",
           "session_row", "sessionize_user", "split_events"]
