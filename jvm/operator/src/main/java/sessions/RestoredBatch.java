package sessions;

import java.io.IOException;
import java.util.UUID;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.CommitLog;
import org.apache.spark.sql.execution.streaming.checkpointing.CommitMetadata;
import org.apache.spark.sql.execution.streaming.checkpointing.OffsetSeq$;
import org.apache.spark.sql.execution.streaming.checkpointing.OffsetSeqLog;
import org.apache.spark.sql.execution.streaming.checkpointing.OffsetSeqMetadata;
import org.apache.spark.sql.execution.streaming.checkpointing.OffsetSeqMetadata$;
import org.apache.spark.sql.execution.streaming.runtime.StreamMetadata;
import org.apache.spark.sql.execution.streaming.runtime.StreamMetadata$;
import org.apache.spark.sql.execution.streaming.state.OperatorInfoV1;
import org.apache.spark.sql.execution.streaming.state.OperatorStateMetadataV1;
import org.apache.spark.sql.execution.streaming.state.OperatorStateMetadataV1Writer;
import org.apache.spark.sql.execution.streaming.state.SchemaHelper;
import org.apache.spark.sql.execution.streaming.state.StateStoreColFamilySchema;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreMetadataV1;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.StructType;

import scala.Option;
import scala.collection.immutable.List$;
import scala.jdk.javaapi.CollectionConverters;

/**
 * A restored checkpoint's batch 0 as the stream's query would leave it, written with Spark's own log and metadata
 * classes instead of by running that query: the query id (`metadata`), the offset log entry of batch 0 (the source at
 * the savepoint's position, as after a batch with data: `{"seq": N, "boot": true, "settled": false}`, and the session's
 * relevant SQL settings, as MicroBatchExecution records them), its commit (the savepoint's watermark as the next
 * batch's), the stateful operator's metadata and its state schema. The state itself is the state writer's (store
 * version 1 of each partition: StateWriter). The stream that resumes from it runs batch 1 at the savepoint's watermark.
 *
 * <p>The writes go through the session's checkpoint file manager, so a lease fence on the checkpoint (Fence) holds
 * for them as for the query's own.
 */
public final class RestoredBatch {
    /** flatMapGroupsWithState's name in the operator metadata (Spark's FlatMapGroupsWithStateExec.shortName). */
    static final String OPERATOR = "flatMapGroupsWithState";

    private RestoredBatch() {}

    /** Writes batch 0's logs and the operator's metadata into `checkpoint`, a new checkpoint with none of them yet. */
    public static void write(org.apache.spark.sql.SparkSession session, String checkpoint, long sourceSeq,
                             long watermarkMs, int partitions) throws IOException {
        org.apache.spark.sql.classic.SparkSession classic = (org.apache.spark.sql.classic.SparkSession) session;
        Configuration hadoop = classic.sessionState().newHadoopConf();
        SQLConf sql = classic.sessionState().conf();
        Path root = new Path(checkpoint);
        StreamMetadata$.MODULE$.write(new StreamMetadata(UUID.randomUUID().toString()), new Path(root, "metadata"),
                                      hadoop);
        writeStateMetadata(root, hadoop, sql, partitions);
        // As StreamExecution records them: its clone of the session, the state's partition count in Spark's internal
        // setting (the offset log keeps it as spark.sql.shuffle.partitions).
        org.apache.spark.sql.classic.SparkSession forStream = classic.cloneSession();
        forStream.conf().set(SQLConf.STATEFUL_SHUFFLE_PARTITIONS_INTERNAL().key(), Integer.toString(partitions));
        OffsetSeqMetadata metadata = OffsetSeqMetadata$.MODULE$.apply(0L, System.currentTimeMillis(),
                                                                      forStream.conf());
        org.apache.spark.sql.connector.read.streaming.Offset source = new RawEventsOffset(sourceSeq, false);
        boolean added = new OffsetSeqLog(session, new Path(root, "offsets").toString(), false).add(0L,
            OffsetSeq$.MODULE$.fill(Option.apply(metadata.json()),
                                    CollectionConverters.asScala(java.util.List.of(source)).toList()));
        if (!added || !new CommitLog(session, new Path(root, "commits").toString(), false).add(0L,
                new CommitMetadata(watermarkMs))) {
            throw new IOException("batch 0 of " + checkpoint + " was written already: not a new checkpoint");
        }
    }

    /** The operator's metadata (`state/0/_metadata/metadata`) and its state schema (partition 0's
     * `_metadata/schema`), as Spark writes them at the query's first batch. */
    static void writeStateMetadata(Path root, Configuration hadoop, SQLConf sql, int partitions) throws IOException {
        Path operator = new Path(new Path(root, StateWriter.STATE), "0");
        new OperatorStateMetadataV1Writer(operator, hadoop).write(new OperatorStateMetadataV1(
            new OperatorInfoV1(0L, OPERATOR),
            new StateStoreMetadataV1[] {new StateStoreMetadataV1(StateStoreId.DEFAULT_STORE_NAME(), 0, partitions)}));
        StructType value = StateWriter.stateManager(Integer.parseInt(sql.getConfString(StateWriter.FORMAT_VERSION, "2")))
            .stateSchema();
        StateStoreColFamilySchema schema = new StateStoreColFamilySchema(StateStoreId.DEFAULT_STORE_NAME(), (short) 0,
            StateWriter.KEY_SCHEMA, (short) 0, value, Option.empty(), Option.empty());
        Path file = new Path(new Path(new Path(operator, "0"), "_metadata"), "schema");
        CheckpointFileManager files = CheckpointFileManager.create(file.getParent(), hadoop);
        files.mkdirs(file.getParent());
        CheckpointFileManager.CancellableFSDataOutputStream out = files.createAtomic(file, false);
        try {
            SchemaHelper.SchemaWriter$.MODULE$.createSchemaWriter(2).write(
                List$.MODULE$.from(CollectionConverters.asScala(java.util.List.of(schema))), out);
        } catch (RuntimeException e) {  // no half-written schema in place
            out.cancel();
            throw e;
        }
        out.close();
    }
}
