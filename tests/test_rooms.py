"""The rooms of the code, held: each wing imports only the wings below it, and the pure core loads no Spark.

Read from the source (the `import` statements), so a new module is checked the day it is added."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.tier("pure")

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ("pipelines", "state_store", "sessionctl", "assets")

# A wing may import itself and what is listed: the typed errors (stdlib only) under everything, the pure core (the
# session rules: the sessionizer, the state format, the session spec) beside the floor (settings, results, storage
# URIs), which holds the parsed spec in its settings, then coordination, ingest, the Spark job, the lifecycle library,
# and the two surfaces on top.
_BELOW_ALL = {"pipelines.errors", "pipelines.floor", "pipelines.core"}
ALLOWED: dict[str, set[str]] = {
    "pipelines.errors": set(),
    "pipelines.core": {"pipelines.errors"},
    "pipelines.floor": {"pipelines.errors", "pipelines.core"},
    "pipelines.coordination": _BELOW_ALL,
    "pipelines.ingest": _BELOW_ALL | {"pipelines.coordination"},
    "pipelines.job": _BELOW_ALL | {"pipelines.coordination", "pipelines.ingest"},
    "state_store": _BELOW_ALL | {"pipelines.coordination", "pipelines.ingest", "pipelines.job"},
    "sessionctl": _BELOW_ALL | {"pipelines.coordination", "pipelines.ingest", "pipelines.job", "state_store"},
    "assets": _BELOW_ALL | {"pipelines.coordination", "pipelines.ingest", "pipelines.job", "state_store"},
}


def _wing(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "pipelines":
        return parts[0]
    if len(parts) > 1 and parts[1] in ("core", "coordination", "ingest", "job", "errors"):
        return f"pipelines.{parts[1]}"
    return "pipelines.floor"


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module in PROJECT:  # `from pipelines import x`: the module is x
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif node.module.split(".")[0] in PROJECT:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] in PROJECT)
    return found


def test_every_wing_imports_only_the_wings_below_it():
    crossings = []
    for package in PROJECT:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            wing = _wing(module)
            for imported in _imports(path):
                target = _wing(imported)
                if target != wing and target not in ALLOWED[wing]:
                    crossings.append(f"{module} imports {imported} ({wing} -> {target})")
    assert crossings == []


def test_the_pure_core_loads_no_spark():
    # A fresh interpreter: this test process may already hold pyspark from other tests.
    code = ("import sys, pipelines.core.sessionize, pipelines.core.state_format, pipelines.core.sample_data; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j', 'deltalake')))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"
