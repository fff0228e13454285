"""What an operator can see without running the job or starting Spark: the output tables as their Delta logs
describe them, the checkpoint (status with_state=False) and the savepoint catalog. Dagster's observation
sensor calls these every minute, so they must stay cheap."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.config import SessionsConfig
from pipelines.storage import open_table, table_exists
from state_store.results import TableFacts


def _facts(config: SessionsConfig, uri: str) -> TableFacts | None:
    if not table_exists(config, uri):
        return None
    table = open_table(config, uri)
    adds = pa.table(table.get_add_actions(flatten=True))
    return TableFacts(uri=uri, version=table.version(), rows=int(pc.sum(adds["num_records"]).as_py() or 0),
                      data_files=adds.num_rows, bytes=int(pc.sum(adds["size_bytes"]).as_py() or 0))


def table_facts(config: SessionsConfig) -> dict[str, TableFacts]:
    """raw_events, sessions and quarantine (those that exist), from their Delta logs' file statistics."""
    found = {name: _facts(config, uri) for name, uri in (("raw_events", config.raw_events_table),
                                                  ("sessions", config.sessions_table),
                                                  ("quarantine", config.quarantine_table))}
    return {name: facts for name, facts in found.items() if facts is not None}
