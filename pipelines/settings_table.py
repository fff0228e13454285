"""README.md's table of the settings ("Configuration"), made from their one declaration in pipelines/config.py, so
the README cannot drift from what the code reads: `python -m pipelines.settings_table` prints it,
`python -m pipelines.settings_table README.md` rewrites it there; tests/test_settings_table.py fails while they differ.
Apart from pipelines/config.py, which is the settings themselves."""
from __future__ import annotations

import sys
from dataclasses import MISSING
from pathlib import Path

from pipelines.config import PATH_SETTINGS, SETTINGS
from pipelines.errors import ConfigError
from pipelines.settings import Setting

__all__ = ["TABLE_END", "TABLE_START", "readme_with_table", "settings_table"]

# The README's table sits between these two lines.
TABLE_START = "<!-- settings: made by `python -m pipelines.settings_table README.md` from pipelines/config.py -->"
TABLE_END = "<!-- end of settings -->"


def _default(setting: Setting) -> str:
    """A value as code (`30`), a description of a derived default ("$SESSIONS_HOME/savepoints") as text."""
    return setting.shown if setting.default in ("", None, MISSING) else f"`{setting.shown}`"


def _run_config(setting: Setting) -> str:
    """The Dagster resource's field, or why there is none."""
    if not setting.in_run_config:
        return "no: a secret, environment only" if setting.secret else "no: environment only"
    # A data location in run config must be the environment's own (SessionsResource.config).
    return f"`{setting.name}`" + (" (may only repeat the environment's)" if setting.name in PATH_SETTINGS else "")


def settings_table() -> str:
    """Every setting as a Markdown table: variable, default, the Dagster run config field, what it does."""
    rows = [f"| `{setting.env}` | {_default(setting)} | {_run_config(setting)} | {setting.about} |"
            for setting in SETTINGS]
    return "\n".join(["| variable | default | Dagster run config | what |", "|---|---|---|---|", *rows])


def readme_with_table(*, readme: str) -> str:
    """`readme` with the lines between TABLE_START and TABLE_END replaced by settings_table()."""
    head, start, rest = readme.partition(TABLE_START + "\n")
    _, end, tail = rest.partition(TABLE_END)
    if not (start and end):
        raise ConfigError(f"no settings table: expected the lines {TABLE_START} and {TABLE_END}")
    return f"{head}{start}{settings_table()}\n{end}{tail}"


if __name__ == "__main__":
    if len(sys.argv) > 2:
        sys.exit("usage: python -m pipelines.settings_table [README.md]  (print the table, or rewrite it there)")
    if len(sys.argv) == 1:
        print(settings_table())
    else:
        readme_path = Path(sys.argv[1])
        readme_path.write_text(readme_with_table(readme=readme_path.read_text()))
