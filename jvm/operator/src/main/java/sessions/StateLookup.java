package sessions;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.UUID;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.checkpointing.OffsetSeqLog;
import org.apache.spark.sql.execution.streaming.checkpointing.OffsetSeqMetadata$;
import org.apache.spark.sql.execution.streaming.checkpointing.OffsetSeqMetadataBase;
import org.apache.spark.sql.execution.streaming.operators.stateful.flatmapgroupswithstate.FlatMapGroupsWithStateExecHelper;
import org.apache.spark.sql.execution.streaming.runtime.StreamExecution$;
import org.apache.spark.sql.execution.streaming.state.NoPrefixKeyStateEncoderSpec;
import org.apache.spark.sql.execution.streaming.state.ReadStateStore;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf;
import org.apache.spark.sql.execution.streaming.state.StateStoreId;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider;
import org.apache.spark.sql.execution.streaming.state.StateStoreProviderId;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

import scala.Option;

/**
 * Point lookups in a checkpoint's state: the stored values of a few users at a committed batch, reading only the
 * state partitions that hold them -- what `sessionctl state --user` and an erasure's check of the live state cost is
 * one partition's store, not the whole state (Spark's state data source reads every partition).
 *
 * <p>A user's partition is where the stateful operator puts its key: Spark's hash partitioning of (xxhash64(user_id),
 * user_id) into the checkpoint's partitions (SessionsOperator's grouping; StateWriter places keys the same way). Each
 * such partition's store is opened read-only in this JVM at the batch's version through a provider of the checkpoint's
 * own class and settings (the batch's offset log entry, as the state data source reads them): nothing is written.
 */
public final class StateLookup {
    private static final StructType FOUND = new StructType()
        .add("user_id", DataTypes.StringType, false).add("value", DataTypes.BinaryType, false)
        .add("partition", DataTypes.IntegerType, false);
    private static final StructType USERS = new StructType().add("user_id", DataTypes.StringType, false);

    private StateLookup() {}

    /** The state partition of each of `users` in a checkpoint of `partitions` partitions (Spark's own expressions,
     * evaluated in the driver: no job). */
    public static int[] partitionsOf(org.apache.spark.sql.SparkSession spark, String[] users, int partitions) {
        List<Row> placed = placements(spark, users, partitions);
        int[] out = new int[users.length];
        for (int i = 0; i < out.length; i++) {
            out[i] = placed.get(i).getInt(2);
        }
        return out;
    }

    /** (user_id, user_hash, partition) of each of `users`, in order. */
    private static List<Row> placements(org.apache.spark.sql.SparkSession spark, String[] users, int partitions) {
        List<Row> rows = new ArrayList<>();
        for (String user : users) {
            rows.add(RowFactory.create(user));
        }
        Dataset<Row> frame = spark.createDataFrame(rows, USERS);
        Dataset<Row> hashed = frame.withColumn("user_hash", functions.xxhash64(frame.col("user_id")));
        return hashed.select(hashed.col("user_id"), hashed.col("user_hash"), functions.pmod(
            functions.hash(hashed.col("user_hash"), hashed.col("user_id")), functions.lit(partitions))).collectAsList();
    }

    /** The checkpoint's state partitions at `batchId` (its offset log entry's shuffle partitions). */
    public static int partitions(org.apache.spark.sql.SparkSession spark, String checkpoint, long batchId) {
        return confAt(spark, checkpoint, batchId).numShufflePartitions();
    }

    /** (user_id, value, partition) of each of `users` with a stored value at committed batch `batchId` of the
     * checkpoint's stateful operator (operator 0). `value` is the operator's stored bytes (StateCodec's format). */
    public static Dataset<Row> values(org.apache.spark.sql.SparkSession session, String checkpoint, long batchId,
                                      String[] users) {
        org.apache.spark.sql.classic.SparkSession spark = (org.apache.spark.sql.classic.SparkSession) session;
        SQLConf conf = confAt(spark, checkpoint, batchId);
        Map<Integer, List<Row>> byPartition = new TreeMap<>();
        for (Row placed : placements(spark, users, conf.numShufflePartitions())) {
            byPartition.computeIfAbsent(placed.getInt(2), p -> new ArrayList<>()).add(placed);
        }
        Configuration hadoop = spark.sessionState().newHadoopConf();
        String runId = UUID.randomUUID().toString();
        hadoop.set(StreamExecution$.MODULE$.RUN_ID_KEY(), runId);  // the HDFS provider's init reads it
        Path root = new Path(checkpoint);
        String stateRoot;
        try {
            stateRoot = new Path(root.getFileSystem(hadoop).makeQualified(root), "state").toString();
        } catch (java.io.IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
        int format = Integer.parseInt(conf.getConfString(StateWriter.FORMAT_VERSION, "2"));
        FlatMapGroupsWithStateExecHelper.StateManager manager = StateWriter.stateManager(format);
        // The stored row: format 2 nests the value as groupState.value (the state data source's
        // value.groupState.value), format 1 keeps it as the row's first column.
        StructType stateSchema = manager.stateSchema();
        int nested = stateSchema.fields()[0].dataType() instanceof StructType inner ? inner.size() : -1;
        StateStoreConf storeConf = StateWriter.storeConf(conf);  // a read store: RocksDB's row count is of no use
        UnsafeProjection keys = UnsafeProjection.create(StateWriter.KEY_SCHEMA);
        List<Row> found = new ArrayList<>();
        for (Map.Entry<Integer, List<Row>> entry : byPartition.entrySet()) {
            int partition = entry.getKey();
            StateStoreId id = StateStoreId.apply(stateRoot, 0L, partition, StateStoreId.DEFAULT_STORE_NAME());
            StateStoreProvider provider = StateStoreProvider.createAndInit(
                StateStoreProviderId.apply(id, UUID.fromString(runId)), StateWriter.KEY_SCHEMA, manager.stateSchema(),
                NoPrefixKeyStateEncoderSpec.apply(StateWriter.KEY_SCHEMA), false, storeConf, hadoop, false,
                Option.empty());
            try {
                // A read store: nothing is created in the checkpoint (a store opened for an update would start the
                // next version's changelog file there), so a lookup beside a running stream, on a read-only home or
                // killed midway leaves nothing behind.
                ReadStateStore store = provider.getReadStore(batchId + 1, Option.empty());
                try {
                    for (Row user : entry.getValue()) {
                        UnsafeRow key = keys.apply(new GenericInternalRow(new Object[] {
                            user.getLong(1), UTF8String.fromString(user.getString(0))}));
                        UnsafeRow stored = store.get(key, StateStore.DEFAULT_COL_FAMILY_NAME());
                        byte[] value = stored == null || stored.isNullAt(0) ? null
                            : nested >= 0 ? stored.getStruct(0, nested).getBinary(0) : stored.getBinary(0);
                        if (value != null) {
                            found.add(RowFactory.create(user.getString(0), value, partition));
                        }
                    }
                } finally {
                    store.release();
                }
            } finally {
                provider.close();
            }
        }
        return spark.createDataFrame(found, FOUND);
    }

    /** The session's SQL conf with the checkpoint's own settings at `batchId` (provider, formats, partitions). */
    static SQLConf confAt(org.apache.spark.sql.SparkSession session, String checkpoint, long batchId) {
        org.apache.spark.sql.classic.SparkSession spark = (org.apache.spark.sql.classic.SparkSession) session;
        OffsetSeqLog log = new OffsetSeqLog(spark, new Path(checkpoint, "offsets").toString(), true);
        Option<OffsetSeqMetadataBase> metadata = log.offsetSeqMetadataForBatchId(batchId);
        if (metadata.isEmpty()) {
            throw new IllegalStateException("no offset log entry for batch " + batchId + " in " + checkpoint);
        }
        SQLConf conf = spark.sessionState().conf().clone();
        OffsetSeqMetadata$.MODULE$.setSessionConf(metadata.get(), conf);
        return conf;
    }
}
