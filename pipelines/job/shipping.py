"""How the project's code reaches executors on a cluster: a zip of the packages they import, built from this
installation when the driver starts and shipped with `spark.submit.pyFiles` (Spark puts it first on the Python
workers' path). On Kubernetes an image with the package installed does the same (deploy/spark/README.md, "Spark on
Kubernetes")."""
from __future__ import annotations

import hashlib
import tempfile
import zipfile
from pathlib import Path

import pipelines
from pipelines.storage import aws_env

__all__ = ["cluster_conf"]

# Executors unpickle the operator, the source reader and the state readers (state_store.state) from these.
SHIPPED_PACKAGES = ("pipelines", "state_store")


def is_local(master: str) -> bool:
    return master.startswith("local")


def code_archive() -> Path:
    """The zip of SHIPPED_PACKAGES' .py files, named by its content (a changed checkout ships a new zip)."""
    root = Path(pipelines.__file__).resolve().parent.parent
    files = sorted(p for package in SHIPPED_PACKAGES for p in (root / package).rglob("*.py"))
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    target = Path(tempfile.gettempdir()) / f"sessions-code-{digest.hexdigest()[:16]}.zip"
    if not target.exists():
        partial = target.with_suffix(".zip.partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in files:
                archive.write(path, str(path.relative_to(root)))
        partial.replace(target)  # atomic: a concurrent driver never ships half a zip
    return target


def cluster_conf(master: str) -> dict[str, str]:
    """Spark settings a cluster master needs beyond local mode: the code, and executors reachable on loopback
    when the master is (a local standalone cluster)."""
    if is_local(master):
        return {}
    conf = {"spark.submit.pyFiles": str(code_archive())}
    # Executors read raw_events from S3 themselves: the standard AWS_* variables, passed as executor environment
    # (Spark redacts secret-looking values in its UI and logs: spark.redaction.regex).
    for name, value in aws_env().items():
        conf[f"spark.executorEnv.{name}"] = value
    if "127.0.0.1" in master or "localhost" in master:
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
    return conf
