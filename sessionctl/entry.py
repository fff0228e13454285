"""The `sessionctl` console script: Ctrl-C is caught from the first instant of the process, before the CLI's heavy
imports (pyspark, pandas) run, so an early Ctrl-C is the same one line as a late one, never a traceback."""
from __future__ import annotations

from sessionctl import interrupt


def main() -> int:
    interrupt.install()
    from sessionctl.cli import main as cli_main

    return cli_main()
