package sessions;

import java.util.concurrent.ConcurrentHashMap;
import org.apache.hadoop.fs.Path;

/**
 * The job lease's fence for the writes Spark makes itself: a streaming query's offset and commit logs
 * ({@code <checkpoint>/offsets/N}, {@code <checkpoint>/commits/N}, through CheckpointFiles).
 *
 * <p>The lease lives in Python (pipelines/coordination/leases.py); every renewal tells this JVM for how long its
 * holder may still write ({@link #hold}): the TTL less the time since the renewal began, so the deadline here is never
 * later than the record's own expiry. A process frozen past its TTL (SIGSTOP, a long pause) resumes with Spark's
 * micro-batch thread and the lease's renewal thread side by side; without this, Spark would plan its next batch and
 * write {@code offsets/N} into a checkpoint another holder has taken over before any Python check ran. A checkpoint
 * nobody holds a fence for (a lifecycle command, a test's own query) is not fenced here.
 */
public final class Fence {
  private static final ConcurrentHashMap<String, Long> DEADLINES = new ConcurrentHashMap<>();

  private Fence() {}

  /** Writes into {@code checkpoint}'s logs allowed for {@code validForMillis} more (monotonic clock). */
  public static void hold(String checkpoint, long validForMillis) {
    DEADLINES.put(key(new Path(checkpoint)), System.nanoTime() + validForMillis * 1_000_000L);
  }

  /** No fence on {@code checkpoint} any more (its holder ended its block). */
  public static void release(String checkpoint) {
    DEADLINES.remove(key(new Path(checkpoint)));
  }

  /** Refuses a write of a query log's file when its checkpoint's fence has expired. */
  static void check(Path file) {
    Path log = file.getParent();
    if (log == null || log.getParent() == null) {
      return;
    }
    String name = log.getName();
    if (!"offsets".equals(name) && !"commits".equals(name)) {
      return;
    }
    Long deadline = DEADLINES.get(key(log.getParent()));
    if (deadline == null) {
      return;
    }
    long lateMillis = (System.nanoTime() - deadline) / 1_000_000L;
    if (lateMillis > 0) {
      throw new Fenced(file, lateMillis);
    }
  }

  private static String key(Path path) {
    String p = path.toUri().getPath();
    return p.length() > 1 && p.endsWith("/") ? p.substring(0, p.length() - 1) : p;
  }

  /** A write refused: the holder's lease ran past its last renewal's TTL. */
  public static final class Fenced extends IllegalStateException {
    private static final long serialVersionUID = 1L;

    Fenced(Path file, long lateMillis) {
      super("fenced: " + file + " not written: the job lease of its checkpoint was last renewed more than its TTL "
          + "ago (" + lateMillis + " ms past), so another process may hold it now");
    }
  }
}
