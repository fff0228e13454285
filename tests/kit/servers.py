"""A real PostgreSQL for the Dagster instance (the `postgres_server` fixture in tests/conftest.py starts it)."""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

# --- PostgreSQL (a real server for tests that need one: the Dagster instance storage) ------------------------
PG_BIN = Path(os.environ.get("SESSIONS_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))


@dataclass(frozen=True)
class PostgresServer:
    """A running PostgreSQL on 127.0.0.1 (password auth over TCP, like a managed database)."""

    host: str
    port: int
    user: str
    password: str
    data_dir: Path

    def create_database(self, name: str) -> str:
        """A new, empty database (one per test module keeps modules independent); returns its name."""
        subprocess.run([str(PG_BIN / "createdb"), "-h", self.host, "-p", str(self.port), "-U", self.user, name],
                       env={**os.environ, "PGPASSWORD": self.password}, check=True, capture_output=True, timeout=60)
        return name

    def dagster_env(self, database: str) -> dict[str, str]:
        """The DAGSTER_PG_* variables deploy/dagster.yaml reads its connection from."""
        return {"DAGSTER_PG_HOST": self.host, "DAGSTER_PG_PORT": str(self.port), "DAGSTER_PG_USER": self.user,
                "DAGSTER_PG_PASSWORD": self.password, "DAGSTER_PG_DB": database}


def _as_postgres_user(args: list[str]) -> list[str]:
    # initdb/pg_ctl refuse to run as root: as root (CI, the dev machines) run them as Debian's postgres user.
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args
