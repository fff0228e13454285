"""Hadoop's local file system without child processes (jvm/operator/src/main/java/sessions/LocalFileSystemNoFork.java,
set for local masters by pipelines.job.runtime): file:// paths go through it, and it does what Hadoop's own does -- the
same permission bits as `chmod`, the same statuses for files, directories, missing paths and symlinks. That it forks
nothing during a real job is checked in tests/test_class_archive.py, whose subprocess JVM can be given a PATH that logs
every command.
(The stream, state and lifecycle tests all run on it: it is the session's file system.)"""
from __future__ import annotations

import os
import stat

import pytest
from py4j.protocol import Py4JJavaError

pytestmark = pytest.mark.tier("spark")


@pytest.fixture(scope="module")
def hadoop(spark):
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    fs = jvm.org.apache.hadoop.fs.FileSystem.getLocal(conf)
    return jvm, fs, jvm.org.apache.hadoop.fs.FileContext.getLocalFSFileContext(conf), spark.sparkContext._gateway


def test_file_paths_use_it_for_filesystem_and_filecontext(hadoop):
    _, fs, fc, _ = hadoop
    assert fs.getClass().getName() == "sessions.LocalFileSystemNoFork$Checked"
    assert fs.getRaw().getClass().getName() == "sessions.LocalFileSystemNoFork$Raw"
    assert fc.getDefaultFileSystem().getClass().getName() == "sessions.LocalFileSystemNoFork$CheckedFs"


@pytest.mark.parametrize("symbolic,mode", [("-rw-r-----", 0o640), ("-rwxr-x--x", 0o751), ("----------", 0o000),
                                           ("-rw-rw-rw-", 0o666)])
def test_set_permission_sets_the_bits_chmod_would(hadoop, tmp_path, symbolic, mode):
    jvm, fs, _, _ = hadoop
    target = tmp_path / "f"
    target.write_text("x")
    fs.setPermission(jvm.org.apache.hadoop.fs.Path(str(target)), jvm.org.apache.hadoop.fs.permission.FsPermission.valueOf(symbolic))
    assert stat.S_IMODE(os.stat(target).st_mode) == mode


def test_directories_made_with_a_permission_and_a_sticky_bit_left_to_hadoop(hadoop, tmp_path):
    jvm, fs, _, _ = hadoop
    permission = jvm.org.apache.hadoop.fs.permission.FsPermission
    made = tmp_path / "a" / "b"
    assert fs.mkdirs(jvm.org.apache.hadoop.fs.Path(str(made)), permission(0o750))
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o750  # exactly: set after the mkdir, as Hadoop's chmod does
    fs.setPermission(jvm.org.apache.hadoop.fs.Path(str(made)), permission(0o1777))  # Hadoop's own chmod path
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o1777


def test_link_status_of_files_directories_missing_paths_and_symlinks(hadoop, tmp_path):
    jvm, fs, fc, gateway = hadoop
    path = jvm.org.apache.hadoop.fs.Path
    regular = tmp_path / "data.bin"
    regular.write_bytes(b"12345")
    status = fs.getFileLinkStatus(path(str(regular)))
    assert status.isFile() and not status.isSymlink() and status.getLen() == 5
    assert fs.getFileLinkStatus(path(str(tmp_path))).isDirectory()
    link = tmp_path / "link"
    link.symlink_to(regular)
    linked = fs.getFileLinkStatus(path(str(link)))
    assert linked.isSymlink() and linked.getSymlink().toUri().getPath() == str(regular)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "gone")
    assert fs.getFileLinkStatus(path(str(dangling))).isSymlink()
    with pytest.raises(Py4JJavaError, match="FileNotFoundException"):
        fs.getFileLinkStatus(path(str(tmp_path / "missing")))
    # FileContext's rename (how Spark commits a checkpoint file) still refuses to overwrite without OVERWRITE.
    other = tmp_path / "other.bin"
    other.write_bytes(b"x")
    options = gateway.new_array(jvm.org.apache.hadoop.fs.Options.Rename, 0)  # the varargs: no OVERWRITE
    with pytest.raises(Py4JJavaError, match="FileAlreadyExistsException"):
        fc.rename(path(str(other)), path(str(regular)), options)
    fc.rename(path(str(other)), path(str(tmp_path / "renamed.bin")), options)
    assert (tmp_path / "renamed.bin").read_bytes() == b"x" and not other.exists()
