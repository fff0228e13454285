package sessions;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermissions;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFs;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FsConstants;
import org.apache.hadoop.fs.FsServerDefaults;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.local.LocalConfigKeys;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.io.nativeio.NativeIO;

/**
 * Hadoop's local file system without a child process per call (pipelines/job/runtime.py sets it for file:// paths).
 *
 * Without Hadoop's native library (the pyspark wheel has none), RawLocalFileSystem forks `chmod` for every
 * permission it sets (each file and directory it creates with one) and `readlink` for every link status it reads
 * (every FileContext rename: each checkpoint file Spark commits). A 2M-event catch-up forked 161 of them (120
 * readlink, 41 chmod), ~2-3 ms each in a quiet JVM, many on the stream's own thread. Here both are java.nio calls with the same effect; everything else --
 * symlinks, sticky bits, Windows, a machine with the native library -- is Hadoop's own code, unchanged.
 */
public final class LocalFileSystemNoFork {
  private LocalFileSystemNoFork() {}

  /** RawLocalFileSystem with the two forking calls done in-process. */
  public static class Raw extends RawLocalFileSystem {
    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      if (NativeIO.isAvailable() || permission.getStickyBit()) {
        super.setPermission(p, permission);
        return;
      }
      // What `chmod 0xyz` does: the nine bits set, the link followed.
      Files.setPosixFilePermissions(pathToFile(p).toPath(), PosixFilePermissions.fromString(
          permission.getUserAction().SYMBOL + permission.getGroupAction().SYMBOL
              + permission.getOtherAction().SYMBOL));
    }

    @Override
    public FileStatus getFileLinkStatus(Path f) throws IOException {
      // Hadoop's version reads `readlink` for every path; only a symlink needs its answer.
      if (NativeIO.isAvailable() || Files.isSymbolicLink(pathToFile(f).toPath())) {
        return super.getFileLinkStatus(f);
      }
      return getFileStatus(f);  // what Hadoop returns for a file or directory (FileNotFoundException if none)
    }
  }

  /** fs.file.impl: LocalFileSystem (the checksum layer) over Raw. */
  public static class Checked extends LocalFileSystem {
    public Checked() {
      super(new Raw());
    }
  }

  /** The FileContext side, as org.apache.hadoop.fs.local.RawLocalFs (its constructors are package-private). */
  public static class RawFs extends DelegateToFileSystem {
    public RawFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
      super(uri, new Raw(), conf, FsConstants.LOCAL_FS_URI.getScheme(), false);
    }

    @Override
    public int getUriDefaultPort() {
      return -1;  // no port for file:
    }

    @Override
    @Deprecated
    public FsServerDefaults getServerDefaults() throws IOException {
      return LocalConfigKeys.getServerDefaults();
    }

    @Override
    public FsServerDefaults getServerDefaults(Path f) throws IOException {
      return LocalConfigKeys.getServerDefaults();
    }

    @Override
    public boolean isValidName(String src) {
      return true;  // any local path
    }
  }

  /** fs.AbstractFileSystem.file.impl: ChecksumFs over RawFs, as org.apache.hadoop.fs.local.LocalFs. */
  public static class CheckedFs extends ChecksumFs {
    public CheckedFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
      super(new RawFs(FsConstants.LOCAL_FS_URI, conf));  // as LocalFs: the URI given is not used
    }
  }
}
