package sessions;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.UUID;

import org.apache.hadoop.conf.Configuration;
import org.apache.spark.sql.execution.streaming.runtime.StreamExecution$;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider;

/** A checkpoint's state directory for the store tests: operator 0's partition 0 with the schema file batch 0 leaves
 * in its `_metadata` (which every rewrite must keep), on Spark's default provider (HDFS-backed). */
record StoreDir(Configuration hadoop, String runId, String stateRoot, Path partition, StateStoreConf conf) {
    static StoreDir under(Path dir) throws IOException {
        Configuration hadoop = new Configuration();
        String runId = UUID.randomUUID().toString();
        hadoop.set(StreamExecution$.MODULE$.RUN_ID_KEY(), runId);
        Path partition = dir.resolve("state/0/0");
        Files.createDirectories(partition.resolve("_metadata"));
        Files.writeString(partition.resolve("_metadata/schema"), "kept");
        return new StoreDir(hadoop, runId, dir.resolve("state").toUri().toString(), partition, StateStoreConf.empty());
    }

    /** A new provider of partition 0 (its own run id: a reader apart from the writer). */
    StateStoreProvider provider() {
        return StateWriter.provider(stateRoot, 0, UUID.randomUUID().toString(), StateWriter.stateManager(2).stateSchema(),
                                    conf, hadoop);
    }
}
