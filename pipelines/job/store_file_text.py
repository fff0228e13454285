"""Spark's state store files as plain bytes, decoded in a JVM of their own with no Spark session (jvm/operator/src/
main/java/sessions/StoreFileText.java, its `main`): for an audit that must read the state's files but need not ask the
live state. Such a JVM loads Spark's compression codecs and RocksDB's SST reader only, and starts in a fraction of a
Spark session's time; one serves every file of an audit, one request at a time over its standard input."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import pyspark

from pipelines.config import SessionsConfig
from pipelines.errors import SessionsError
from pipelines.job.operators.jvm import JVM_JAR
from pipelines.job.runtime import JVM_STDERR_LOG, LOG4J2

__all__ = ["StoreFileDecoder", "StoreFileError"]


class StoreFileError(SessionsError):
    """A state store file the decoder could not read (its one line says why), or the decoder itself not running."""


def _java() -> str:
    home = os.environ.get("JAVA_HOME")  # as Spark's launcher finds it
    return str(Path(home) / "bin" / "java") if home else (shutil.which("java") or "java")


def _class_path() -> str:
    return os.pathsep.join([str(Path(pyspark.__file__).parent / "jars" / "*"), str(JVM_JAR)])


class StoreFileDecoder:
    """One JVM decoding state store files for this process (`with StoreFileDecoder(config) as decoder`), started on
    the first file."""

    def __init__(self, config: SessionsConfig) -> None:
        self._config = config
        self._process: subprocess.Popen[str] | None = None
        self._work: tempfile.TemporaryDirectory[str] | None = None

    def __enter__(self) -> StoreFileDecoder:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def decode(self, name: str, data: bytes) -> bytes:
        """The plain bytes of one state store file (`name`: its file name, which says its kind; `data`: its bytes,
        read from any filesystem by the caller)."""
        process, work = self._started()
        source, target = os.path.join(work, "in"), os.path.join(work, "out")
        with open(source, "wb") as handle:
            handle.write(data)
        kind = "sst" if name.endswith(".sst") else "stream"
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(f"{kind}\t{source}\t{target}\n")
            process.stdin.flush()
            answer = process.stdout.readline().strip()
        except OSError as error:
            answer = f"error {error}"
        if not answer.startswith("ok "):
            why = answer.removeprefix("error ") or f"the decoder exited (code {process.poll()}; see "\
                f"{self._config.log_dir / JVM_STDERR_LOG})"
            raise StoreFileError(why)
        with open(target, "rb") as handle:
            return handle.read()

    def _started(self) -> tuple[subprocess.Popen[str], str]:
        if self._process is None or self._work is None:
            self._work = tempfile.TemporaryDirectory(prefix="store-files-")
            with self._log() as log:
                self._process = subprocess.Popen(
                    [_java(), f"-Dlog4j2.configurationFile=file:{LOG4J2}",
                     f"-Dsessions.log.dir={self._config.log_dir}", "-cp", _class_path(), "sessions.StoreFileText"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, encoding="utf-8")
        return self._process, self._work.name

    def _log(self) -> BinaryIO:
        """The JVM's log (its stderr), as the Spark JVM's: a read-only home's audit still runs, its output dropped."""
        try:
            self._config.log_dir.mkdir(parents=True, exist_ok=True)
            return open(self._config.log_dir / JVM_STDERR_LOG, "ab")  # closed by the caller's with
        except OSError:
            return open(os.devnull, "wb")

    def close(self) -> None:
        if self._process is not None:
            assert self._process.stdin is not None
            self._process.stdin.close()  # its input ended: it exits
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        if self._work is not None:
            self._work.cleanup()
            self._work = None
