package sessions;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import org.apache.hadoop.conf.Configuration;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The fence through Spark's checkpoint file manager: a query log's file is written while the fence holds, refused
 * once it has expired, and a checkpoint without a fence (or another file than a query log's) is never refused. */
class FenceTest {
    private static void write(Path checkpoint, String file) throws Exception {
        org.apache.hadoop.fs.Path path = new org.apache.hadoop.fs.Path(checkpoint.resolve(file).toUri());
        CheckpointFileManager files = new CheckpointFiles(path.getParent(), new Configuration());
        files.mkdirs(path.getParent());
        CheckpointFileManager.CancellableFSDataOutputStream out = files.createAtomic(path, false);
        out.write(1);
        out.close();
    }

    @Test
    void aQueryLogIsWrittenOnlyWhileTheFenceHolds(@TempDir Path dir) throws Exception {
        Path checkpoint = dir.resolve("checkpoint");
        Fence.hold(checkpoint.toString(), 60_000);
        try {
            write(checkpoint, "offsets/0");
            write(checkpoint, "commits/0");
            Fence.hold("file:" + checkpoint + "/", -1_000);  // lapsed a second ago; spelled as Spark qualifies it
            Fence.Fenced refused = assertThrows(Fence.Fenced.class, () -> write(checkpoint, "offsets/1"));
            assertTrue(refused.getMessage().contains("offsets/1"), refused.getMessage());
            assertThrows(Fence.Fenced.class, () -> write(checkpoint, "commits/1"));
            assertFalse(Files.exists(checkpoint.resolve("offsets/1")));
            write(checkpoint, "state/0/0/1.delta");  // the state's files are not the fence's
            write(dir.resolve("other"), "offsets/0");  // nor another checkpoint's logs
        } finally {
            Fence.release(checkpoint.toString());
        }
        write(checkpoint, "offsets/1");  // released: no fence on it any more
        assertTrue(Files.exists(checkpoint.resolve("offsets/1")));
    }
}
