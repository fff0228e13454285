"""The Spark JVM's class archive (pipelines/job/class_archive.py, built by `make setup`): the product's JVM maps it, and
one that does not fit (a JDK or pyspark upgrade without `make setup`) is skipped with a line in the JVM's log --
never on stdout, where sessionctl prints its JSON."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.job.runtime import CLASS_ARCHIVE, JVM_STDERR_LOG
from tests.kit.homes import config_env, make_config

pytestmark = pytest.mark.tier("subprocess")

# sessionctl catch-up with pipelines.job.runtime patched first (the archive's path, or a JVM log flag): the same
# command line, its options built by the product's own java_options.
_RUN = """
import sys
from pathlib import Path
from pipelines.job import runtime
archive, flag = sys.argv[1:3]
if archive:
    runtime.CLASS_ARCHIVE = Path(archive)
options = runtime.java_options
runtime.java_options = lambda config, dump=None: f"{options(config, dump)} {flag}"
from sessionctl import main
sys.argv = ["sessionctl", "catch-up"]
sys.exit(main())
"""


def _catch_up(config, archive: str = "", java_flag: str = "", **env: str) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, "-c", _RUN, archive, java_flag], env=config_env(config, **env),
                          capture_output=True, text=True, timeout=300, cwd=config.home.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = done.stdout.strip().splitlines()  # exactly one line: the summary
    return json.loads(line), (config.log_dir / JVM_STDERR_LOG).read_text()


def _logging_path(tmp_path: Path) -> tuple[str, Path]:
    """A PATH whose readlink, chmod and rm log each call, then run the real one."""
    bin_dir, log = tmp_path / "bin", tmp_path / "commands.log"
    bin_dir.mkdir()
    for name in ("readlink", "chmod", "rm"):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\nexec {shutil.which(name)} "$@"\n')
        script.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}", log


def test_the_setup_archive_is_mapped_at_jvm_start_and_local_files_fork_nothing(tmp_path):
    assert CLASS_ARCHIVE.exists(), "make setup builds it"
    path, commands = _logging_path(tmp_path)
    summary, log = _catch_up(make_config(tmp_path), java_flag="-Xlog:cds=info:stderr", PATH=path)
    assert summary["last_committed_batch"] == 0
    assert f"Opened archive {CLASS_ARCHIVE}." in log
    assert "Mapped dynamic region #0" in log, log[-3000:]  # the archive's classes, not only the JDK's base archive
    assert "Unable to use shared archive" not in log
    # The local file system (tests/test_local_fs.py): Hadoop's own forks `chmod` for every file it creates with a
    # permission and `readlink` for every checkpoint file it renames; here none. The PATH did reach the JVM: Spark's
    # own `rm -rf` of its temporary directories is logged.
    called = commands.read_text().splitlines() if commands.exists() else []
    assert [c for c in called if c.split()[0] in ("chmod", "readlink")] == [], called[:10]
    assert any(c.startswith("rm ") for c in called), called


def test_an_archive_that_does_not_fit_is_skipped_and_said_in_the_log(tmp_path):
    # A real archive made for another class path: the JVM refuses it, as it would one from another JDK.
    other, program = tmp_path / "other.jsa", tmp_path / "Hello.java"
    program.write_text('public class Hello { public static void main(String[] a) { System.out.println("hi"); } }')
    for command in (["javac", "-d", str(tmp_path), str(program)],
                    ["jar", "cf", str(tmp_path / "hello.jar"), "-C", str(tmp_path), "Hello.class"],
                    ["java", f"-XX:ArchiveClassesAtExit={other}", "-cp", str(tmp_path / "hello.jar"), "Hello"]):
        subprocess.run(command, check=True, capture_output=True, timeout=120)
    assert other.exists()
    summary, log = _catch_up(make_config(tmp_path), archive=str(other))
    assert summary["last_committed_batch"] == 0  # the job ran, without the archive
    assert f"Unable to use shared archive. The top archive failed to load: {other}" in log
