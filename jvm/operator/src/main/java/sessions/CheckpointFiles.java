package sessions;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.PathFilter;
import org.apache.hadoop.fs.UnsupportedFileSystemException;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager;

/**
 * Spark's checkpoint file manager (spark.sql.streaming.checkpointFileManagerClass, set by pipelines/job/runtime.py)
 * with one difference: on S3 (s3a://) it works through Hadoop's cached FileSystem, not a FileContext.
 *
 * Why: a FileContext on S3A wraps a new, uncached S3AFileSystem, and Hadoop closes that file system when the
 * FileContext's binding is garbage-collected (org.apache.hadoop.fs.s3a.S3A#finalize). A caller that keeps only a
 * stream it opened -- or JIT-compiled code in which the manager is no longer live -- can have the file system closed
 * under a read by the next GC: "IllegalStateException: Connection pool shut down", at random. It also costs an
 * S3AFileSystem start (thread pools, credential chain, metrics) per manager: hundreds in a short run.
 *
 * On S3 an overwrite deletes the old file first, as a FileContext's rename does (OnS3).
 *
 * Every other scheme keeps Spark's own choice: FileContext (atomic rename on HDFS and local files), FileSystem where
 * a scheme has no FileContext binding. S3 has no atomic rename either way, so nothing is lost there.
 */
public final class CheckpointFiles implements CheckpointFileManager {
  private final CheckpointFileManager delegate;

  public CheckpointFiles(Path path, Configuration hadoopConf) {
    this.delegate = choose(path, hadoopConf);
  }

  static CheckpointFileManager choose(Path path, Configuration hadoopConf) {
    String scheme = path.toUri().getScheme();
    if ("s3a".equalsIgnoreCase(scheme)) {
      return new OnS3(path, hadoopConf);
    }
    try {
      return new FileContextBasedCheckpointFileManager(path, hadoopConf);
    } catch (Exception e) {  // Scala throws the checked exception undeclared
      if (e instanceof UnsupportedFileSystemException) {
        // What Spark's CheckpointFileManager.create does when a scheme has no FileContext binding.
        return new FileSystemBasedCheckpointFileManager(path, hadoopConf);
      }
      throw CheckpointFiles.<RuntimeException>rethrow(e);
    }
  }

  @SuppressWarnings("unchecked")
  private static <E extends Exception> E rethrow(Exception e) throws E {
    throw (E) e;
  }

  /** Spark's FileSystem-based manager, with an overwrite that overwrites: S3A's rename refuses an existing
   * destination (returns false), which Spark's manager takes as "kept the old file" -- a re-run batch would keep its
   * first run's state file. What a FileContext's rename with OVERWRITE does instead: the destination deleted, then the
   * rename. */
  static final class OnS3 extends FileSystemBasedCheckpointFileManager {
    OnS3(Path path, Configuration hadoopConf) {
      super(path, hadoopConf);
    }

    @Override
    public void renameTempFile(Path srcPath, Path dstPath, boolean overwriteIfPossible) {
      if (overwriteIfPossible && exists(dstPath)) {
        delete(dstPath);
      }
      super.renameTempFile(srcPath, dstPath, overwriteIfPossible);
    }
  }

  /** The manager this one delegates to (tests check which). */
  public CheckpointFileManager delegate() {
    return delegate;
  }

  @Override
  public CancellableFSDataOutputStream createAtomic(Path path, boolean overwriteIfPossible) {
    Fence.check(path);  // a query's offset and commit logs: not after the job lease lapsed (Fence)
    return delegate.createAtomic(path, overwriteIfPossible);
  }

  @Override
  public FSDataInputStream open(Path path) {
    return delegate.open(path);
  }

  @Override
  public FileStatus[] list(Path path, PathFilter filter) {
    return delegate.list(path, filter);
  }

  @Override
  public FileStatus[] list(Path path) {
    return delegate.list(path);
  }

  @Override
  public void mkdirs(Path path) {
    delegate.mkdirs(path);
  }

  @Override
  public boolean exists(Path path) {
    return delegate.exists(path);
  }

  @Override
  public void delete(Path path) {
    delegate.delete(path);
  }

  @Override
  public boolean isLocal() {
    return delegate.isLocal();
  }

  @Override
  public Path createCheckpointDirectory() {
    return delegate.createCheckpointDirectory();
  }

  @Override
  public void close() {
    delegate.close();
  }
}
