"""`make demo`: land realistic sample clickstream, run the job on the embedded default (local
filesystem, RocksDB), print what it produced."""
from __future__ import annotations

import json

from pipelines.config import SessionsConfig
from pipelines.runtime import get_spark
from pipelines.sample_data import land_sample
from pipelines.stream import catch_up
from state_store.status import status


def main() -> None:
    config = SessionsConfig.from_env()
    landed = land_sample(config.landing, users=2000, sessions_per_user=3, files=8)
    print(f"landed {landed['events']} events (+{landed['broken_lines']} broken lines) in {landed['files']} files "
          f"under {config.landing}")
    spark = get_spark(config)
    summary = catch_up(config, spark)
    report = status(config, spark)
    print(json.dumps({
        "sessions_written": summary.sessions_written,
        "sessions_table_rows": report.sessions_rows,
        "open_users_in_state": report.open_users,
        "open_sessions_in_state": report.open_sessions,
        "open_events_in_state": report.open_events,
        "quarantined_lines": report.quarantine_rows,
        "provider": report.provider,
        "partitions": report.partitions,
        "last_committed_batch": report.last_committed_batch,
        "state_bytes": report.state_bytes,
        "seconds": summary.seconds,
    }, indent=2))
    print(f"tables under {config.warehouse_uri}; try `.venv/bin/sessionctl status --json` "
          f"or `.venv/bin/dagster dev -w workspace.yaml`")


if __name__ == "__main__":
    main()
