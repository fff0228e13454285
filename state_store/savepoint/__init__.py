"""Savepoints: the catalog (one typed row per savepoint), the checksum, the state files executors write and read,
taking one (full or incremental, by policy), resolving and folding chains, and damage checks."""
