"""The test kit: what tests import (fixtures stay in tests/conftest.py). One owner per helper:

- `tests.kit.homes`     a test's home and its commands: make_config, config_env, tool, free_port,
                        assert_half_done_is_reported
- `tests.kit.tables`    the one reader of each output: read_sessions, read_quarantine, read_open_sessions,
                        open_sessions_of, assert_late_keys, iso_ms
- `tests.kit.waits`     the one waiter: wait_until, still_running, stream_caught_up
- `tests.kit.storages`  where a checkpoint lives: STORAGES, checkpoint_env, s3a_session
- `tests.kit.datagen`   landed input: events, lines, scenarios and hypothesis strategies
- `tests.kit.savepoint_expectations`  what a savepoint's state rows must be, computed in plain Python
- `tests.kit.servers`   a real PostgreSQL (PostgresServer)
- `testkit` (top level) what tests and benchmarks share: the oracle, the crash campaign, Kafka producers
"""
