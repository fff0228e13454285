package sessions;

import java.io.IOException;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.UUID;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.catalyst.encoders.ExpressionEncoder;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.operators.stateful.flatmapgroupswithstate.FlatMapGroupsWithStateExecHelper;
import org.apache.spark.sql.execution.streaming.runtime.StreamExecution$;
import org.apache.spark.sql.execution.streaming.state.NoPrefixKeyStateEncoderSpec;
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
import org.apache.spark.util.SerializableConfiguration;

import scala.Option;

/**
 * The canonical restore's state writer: a restored checkpoint's state written straight into its state store, in the
 * executors, one task per state partition -- no batch, no per-key operator call.
 *
 * <p>What it writes for a user is SessionsOperator.restored's value (the user's rows walked once at watermark 0, as the
 * operator walks a stored user) and timeout, keyed as the operator keys it -- (xxhash64(user_id),
 * user_id) -- and placed in the partition Spark's hash partitioning of those two columns gives (the stateful
 * operator's distribution), so any partition count works. Values in flatMapGroupsWithState's own state format (the
 * state manager Spark's operator uses: the encoded bytes and the event-time timeout).
 *
 * <p>Each partition's store is opened empty at version 0 through Spark's StateStore API (a provider of the
 * checkpoint's class, as Spark's StatePartitionAllColumnFamiliesWriter opens it), given every key, and committed: that
 * is store version 1, the state of batch 0, whose logs, operator metadata and state schema RestoredBatch writes. A
 * partition's store files already there are removed first (its `_metadata` kept).
 */
public final class StateWriter {
    /** The stateful operator's key (SessionsOperator's grouping columns). */
    static final StructType KEY_SCHEMA = new StructType()
        .add("user_hash", DataTypes.LongType, false).add("user_id", DataTypes.StringType, true);
    static final String FORMAT_VERSION = "spark.sql.streaming.flatMapGroupsWithState.stateFormatVersion";
    /** writePlaced's column: the state partition Spark's hash partitioning gives the row's key. */
    static final String PLACED_AT = "placed_at";
    /** A checkpoint's state directory (Spark's). */
    static final String STATE = "state";
    private static final StructType DONE = new StructType().add("partition", DataTypes.IntegerType, false)
        .add("keys", DataTypes.LongType, false).add("rows", DataTypes.LongType, false)
        .add("due", DataTypes.LongType, false).add("read_rows", DataTypes.LongType, false)
        .add("read_sum", DataTypes.LongType, false);

    private StateWriter() {}

    /** Writes store version 1 of the checkpoint's stateful operator (operator 0) in each of its `partitions` from
     * `rows` (user_id and SessionsOperator.STATE_ROW's columns, any order; attributes optional), under the session
     * rules `rulesJson` (Rules). Returns {keys, rows} written, the keys whose timer fires at `watermarkMs` (the
     * sessions the first batch at that watermark closes), and the canonical rows read back from the committed stores
     * by fresh providers with their checksum's wrapping sum (Checksum: the savepoint checksum's algorithm). Called
     * from Python through py4j. */
    public static long[] write(Dataset<Row> rows, String checkpoint, int partitions, String rulesJson,
                               long watermarkMs) throws IOException {
        return write(rows, checkpoint, STATE, partitions, rulesJson, watermarkMs);
    }

    /** write, into the stores under `stateDir` of the checkpoint instead of its `state` (a staging directory that
     * `install` then moves into place: the writer runs beside the query that writes batch 0's logs). */
    public static long[] write(Dataset<Row> rows, String checkpoint, String stateDir, int partitions,
                               String rulesJson, long watermarkMs) throws IOException {
        Dataset<Row> sorted = placed(rows, partitions).sortWithinPartitions("user_hash", "user_id");
        Task task = task(sorted.sparkSession(), sorted.schema(), checkpoint, stateDir, rulesJson, watermarkMs, false);
        List<Row> done = new ArrayList<>(sorted.mapPartitions(task, Encoders.row(DONE)).collectAsList());
        // A partition no task wrote (Spark runs none over an empty shuffle: an empty state) gets its empty store
        // here, in the driver: batch 0's state is version 1 of every partition.
        java.util.Set<Integer> wrote = new java.util.HashSet<>();
        for (Row r : done) {
            wrote.add(r.getInt(0));
        }
        for (int partition = 0; partition < partitions; partition++) {
            if (!wrote.contains(partition)) {
                done.add(task.write(java.util.Collections.emptyIterator(), partition));
            }
        }
        return totals(done);
    }

    /** write, from rows already in the operator's placement: `parts.get(i)` holds exactly the users of state
     * partition i, each user's rows together -- a full savepoint of a checkpoint with as many partitions, each
     * partition's files read by one task (a savepoint writes one file set per state partition, each key's rows
     * together). No shuffle and no sort. Each task checks that every row belongs to its partition and that no user's
     * rows resume after another's; a task that finds otherwise commits nothing. Returns null when the rows were not
     * so placed: the caller then writes with `write`. (An RDD union: a Dataset union of single-partition children is
     * one partition under spark.sql.unionOutputPartitioning.) */
    public static long[] writePlaced(List<Dataset<Row>> parts, String checkpoint, String stateDir, String rulesJson,
                                     long watermarkMs) throws IOException {
        int partitions = parts.size();
        List<JavaRDD<Row>> placed = new ArrayList<>();
        StructType schema = null;
        for (Dataset<Row> part : parts) {
            Dataset<Row> hashed = part.withColumn("user_hash", functions.xxhash64(part.col("user_id")));
            // Spark's hash partitioning of the key: pmod(murmur3 of (user_hash, user_id), partitions) -- what
            // placed()'s repartition computes for each row.
            Dataset<Row> checked = hashed.withColumn(PLACED_AT, functions.pmod(
                functions.hash(hashed.col("user_hash"), hashed.col("user_id")), functions.lit(partitions)))
                .coalesce(1);
            JavaRDD<Row> rdd = checked.javaRDD();
            if (rdd.getNumPartitions() != 1) {
                return null;
            }
            schema = checked.schema();
            placed.add(rdd);
        }
        if (schema == null) {
            return null;
        }
        org.apache.spark.sql.SparkSession session = parts.get(0).sparkSession();
        Task task = task(session, schema, checkpoint, stateDir, rulesJson, watermarkMs, true);
        @SuppressWarnings({"unchecked", "rawtypes"})  // a generic array
        JavaRDD<Row>[] all = placed.toArray(new JavaRDD[0]);
        List<Row> done = JavaSparkContext.fromSparkContext(session.sparkContext()).union(all)
            .mapPartitions(task::call).collect();
        for (Row r : done) {
            if (r.getLong(1) < 0) {
                return null;
            }
        }
        return done.size() == partitions ? totals(done) : null;
    }

    /** The tasks' function for rows of `schema` (with PLACED_AT when `checkPlacement`). A staged write starts from an
     * empty staging directory: no earlier attempt's store stays there. */
    private static Task task(org.apache.spark.sql.SparkSession session, StructType schema, String checkpoint,
                             String stateDir, String rulesJson, long watermarkMs, boolean checkPlacement)
            throws IOException {
        SQLConf sql = ((org.apache.spark.sql.classic.SparkSession) session).sessionState().conf();
        Stores stores = Stores.of(session, sql, checkpoint, stateDir);
        if (!STATE.equals(stateDir)) {
            Path staged = new Path(stores.stateRoot());
            staged.getFileSystem(stores.hadoop()).delete(staged, true);
        }
        return new Task(storeConf(sql), new SerializableConfiguration(stores.hadoop()), stores.runId(),
                        stores.stateRoot(), rulesJson, stores.format(), SessionsOperator.stateRowColumns(schema),
                        schema.fieldIndex("user_hash"), schema.fieldIndex("user_id"), watermarkMs,
                        checkPlacement ? schema.fieldIndex(PLACED_AT) : -1);
    }

    private static long[] totals(List<Row> done) {
        long keys = 0;
        long written = 0;
        long due = 0;
        long readRows = 0;
        long readSum = 0;
        for (Row r : done) {
            keys += r.getLong(1);
            written += r.getLong(2);
            due += r.getLong(3);
            readRows += r.getLong(4);
            readSum += r.getLong(5);
        }
        return new long[] {keys, written, due, readRows, readSum};
    }

    static final String TRACK_ROWS = "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows";

    /** The session's state store configuration for a store written whole by a job of ours (StateWriter, StateEraser):
     * without RocksDB's row count, which reads every key before it puts it (half of a fresh store's put time at 1M
     * keys). The version it commits then records no count, and the stream's provider counts the keys once when it
     * loads that version (Spark's way when the option was off before a restart); the HDFS-backed provider has none. */
    static StateStoreConf storeConf(SQLConf sql) {
        SQLConf conf = sql.clone();
        conf.setConfString(TRACK_ROWS, "false");
        return StateStoreConf.apply(conf);
    }

    /** The stores of a checkpoint's stateful operator as a job over them sees them from the driver: the Hadoop
     * configuration (with the run id the HDFS provider's init reads), the run id, the qualified state root and
     * flatMapGroupsWithState's state format version. */
    record Stores(Configuration hadoop, String runId, String stateRoot, int format) {
        static Stores of(org.apache.spark.sql.SparkSession session, SQLConf sql, String checkpoint) throws IOException {
            return of(session, sql, checkpoint, STATE);
        }

        static Stores of(org.apache.spark.sql.SparkSession session, SQLConf sql, String checkpoint, String stateDir)
                throws IOException {
            Configuration hadoop = ((org.apache.spark.sql.classic.SparkSession) session).sessionState().newHadoopConf();
            String runId = UUID.randomUUID().toString();
            hadoop.set(StreamExecution$.MODULE$.RUN_ID_KEY(), runId);
            Path root = new Path(checkpoint);
            String stateRoot = new Path(root.getFileSystem(hadoop).makeQualified(root), stateDir).toString();
            return new Stores(hadoop, runId, stateRoot, Integer.parseInt(sql.getConfString(FORMAT_VERSION, "2")));
        }
    }

    /** `rows` (with a user_id column) and their user_hash, in the operator's own placement: hash partitioning of
     * (user_hash, user_id) into the `partitions` state partitions, so each user's rows land in the task of the
     * partition whose store holds the user. */
    static Dataset<Row> placed(Dataset<Row> rows, int partitions) {
        Dataset<Row> hashed = rows.withColumn("user_hash", functions.xxhash64(rows.col("user_id")));
        return hashed.repartition(partitions, hashed.col("user_hash"), hashed.col("user_id"));
    }

    /** A provider of store `partition` of operator 0 under `stateRoot`, keyed as the operator keys its state. */
    static StateStoreProvider provider(String stateRoot, int partition, String runId, StructType valueSchema,
                                       StateStoreConf storeConf, Configuration hadoop) {
        StateStoreId id = StateStoreId.apply(stateRoot, 0L, partition, StateStoreId.DEFAULT_STORE_NAME());
        return StateStoreProvider.createAndInit(
            StateStoreProviderId.apply(id, UUID.fromString(runId)), KEY_SCHEMA, valueSchema,
            NoPrefixKeyStateEncoderSpec.apply(KEY_SCHEMA), false, storeConf, hadoop, false, Option.empty());
    }

    /** flatMapGroupsWithState's state manager for a byte[] state with an event-time timeout: Spark's own value rows. */
    @SuppressWarnings("unchecked")
    static FlatMapGroupsWithStateExecHelper.StateManager stateManager(int formatVersion) {
        ExpressionEncoder<?> encoder = org.apache.spark.sql.catalyst.encoders.package$.MODULE$.encoderFor(
            Encoders.BINARY());
        return FlatMapGroupsWithStateExecHelper.createStateManager((ExpressionEncoder<Object>) encoder, true,
                                                                   formatVersion);
    }

    /** Writes one partition's store: removes what batch 0 left there, opens it empty at version 0, puts each user's
     * value and commits version 1. `users` are sorted so that each user's rows are together. Returns {keys, rows,
     * keys whose timer fires at watermarkMs, rows read back, their checksum's sum} (readBack). */
    static long[] writePartition(Iterator<Row> users, int partition, StateStoreConf storeConf, Configuration hadoop,
                                 String runId, String stateRoot, Rules rules, int format, int[] ix, int hashCol,
                                 int userCol, long watermarkMs) throws IOException {
        return writePartition(users, partition, storeConf, hadoop, runId, stateRoot, rules, format, ix, hashCol,
                              userCol, watermarkMs, -1);
    }

    /** writePartition, checking with `placedCol` >= 0 (writePlaced's) that each row's key belongs to `partition` and
     * that no user's rows resume after another's; when one does not, nothing is committed and the keys are -1. */
    static long[] writePartition(Iterator<Row> users, int partition, StateStoreConf storeConf, Configuration hadoop,
                                 String runId, String stateRoot, Rules rules, int format, int[] ix, int hashCol,
                                 int userCol, long watermarkMs, int placedCol) throws IOException {
        removeVersions(new Path(new Path(stateRoot, "0"), Integer.toString(partition)), hadoop);
        FlatMapGroupsWithStateExecHelper.StateManager manager = stateManager(format);
        StateStoreProvider provider = provider(stateRoot, partition, runId, manager.stateSchema(), storeConf, hadoop);
        List<Attributes.Attr> attrs = rules.attributes();
        UnsafeProjection keys = UnsafeProjection.create(KEY_SCHEMA);
        long written = 0;
        long rowCount = 0;
        long due = 0;
        try {
            StateStore store = provider.getStore(0L, Option.empty(), false, false);
            try {
                String user = null;
                long hash = 0;
                List<SessionsOperator.R> open = new ArrayList<>();
                LongSet done = placedCol >= 0 ? new LongSet() : null;  // users passed (by hash: a clash, a refusal)
                while (true) {
                    Row r = users.hasNext() ? users.next() : null;
                    String next = r == null ? null : r.getString(userCol);
                    if (done != null && r != null && (r.getInt(placedCol) != partition
                            || (!java.util.Objects.equals(next, user) && done.contains(r.getLong(hashCol))))) {
                        return new long[] {-1, 0, 0, 0, 0};  // not placed: the finally aborts the store
                    }
                    if (user != null && (r == null || !user.equals(next))) {
                        if (done != null) {
                            done.add(hash);
                        }
                        SessionsOperator.Stored kept = SessionsOperator.restored(user, open, rules);
                        if (kept != null) {
                            UnsafeRow key = keys.apply(new GenericInternalRow(
                                new Object[] {hash, UTF8String.fromString(user)}));
                            manager.putState(store, key, kept.value(), kept.timeout());
                            written++;
                            if (kept.timeout() < watermarkMs) {  // Spark fires an event-time timer below the watermark
                                due++;
                            }
                        }
                        open = new ArrayList<>();
                    }
                    if (r == null) {
                        break;
                    }
                    user = next;
                    hash = r.getLong(hashCol);
                    open.add(SessionsOperator.openRow(r, ix, attrs));
                    rowCount++;
                }
                store.commit();
            } finally {
                if (!store.hasCommitted()) {
                    store.abort();
                }
            }
        } finally {
            provider.close();
        }
        long[] read = readBack(partition, storeConf, hadoop, runId, stateRoot, attrs, format);
        return new long[] {written, rowCount, due, read[0], read[1]};
    }

    /** Version 1 of a partition's store as a fresh provider loads it from the checkpoint's files (not the writer's
     * open store): its canonical rows' count and checksum sum, the restore's read-back. */
    static long[] readBack(int partition, StateStoreConf storeConf, Configuration hadoop, String runId,
                           String stateRoot, List<Attributes.Attr> attrs, int format) throws IOException {
        FlatMapGroupsWithStateExecHelper.StateManager manager = stateManager(format);
        StateStoreProvider provider = provider(stateRoot, partition, runId, manager.stateSchema(), storeConf, hadoop);
        long rows = 0;
        long sum = 0;
        Checksum.Text text = new Checksum.Text();
        try {
            StateStore store = provider.getStore(1L, Option.empty(), false, false);
            try {
                scala.collection.Iterator<FlatMapGroupsWithStateExecHelper.StateData> all = manager.getAllState(store);
                while (all.hasNext()) {
                    FlatMapGroupsWithStateExecHelper.StateData data = all.next();
                    String user = data.keyRow().getUTF8String(1).toString();
                    for (SessionsOperator.R r : StateCodec.decode((byte[]) data.stateObj(), attrs)) {
                        sum += Checksum.canonicalRow(text, user, r, attrs);
                        rows++;
                    }
                }
            } finally {
                store.abort();
            }
        } finally {
            provider.close();
        }
        return new long[] {rows, sum};
    }

    /** Moves the stores `write` put under `stagedDir` of the checkpoint into its state directory, partition by
     * partition (each partition's store files there removed first, its `_metadata` kept), then removes `stagedDir`.
     * The checkpoint's query must be stopped and this JVM's providers of it unloaded. Returns the files moved. */
    public static long install(org.apache.spark.sql.SparkSession session, String checkpoint, String stagedDir,
                               int partitions) throws IOException {
        Configuration hadoop = ((org.apache.spark.sql.classic.SparkSession) session).sessionState().newHadoopConf();
        Path root = new Path(checkpoint);
        FileSystem fs = root.getFileSystem(hadoop);
        Path staged = new Path(new Path(root, stagedDir), "0");
        long moved = 0;
        for (int partition = 0; partition < partitions; partition++) {
            Path from = new Path(staged, Integer.toString(partition));
            if (!fs.exists(from)) {
                continue;
            }
            Path to = new Path(new Path(new Path(root, STATE), "0"), Integer.toString(partition));
            removeVersions(to, hadoop);
            org.apache.hadoop.fs.RemoteIterator<org.apache.hadoop.fs.LocatedFileStatus> files = fs.listFiles(from, true);
            String prefix = fs.makeQualified(from).toUri().getPath();
            while (files.hasNext()) {
                Path file = files.next().getPath();
                Path target = new Path(to, file.toUri().getPath().substring(prefix.length() + 1));
                fs.mkdirs(target.getParent());
                if (!fs.rename(file, target)) {
                    throw new IOException("could not move " + file + " to " + target + " while installing the state");
                }
                moved++;
            }
        }
        fs.delete(new Path(root, stagedDir), true);
        return moved;
    }

    /** Removes a partition's store files (batch 0's empty version), keeping `_metadata` (partition 0 holds the
     * operator's state schema there). */
    static void removeVersions(Path dir, Configuration hadoop) throws IOException {
        FileSystem fs = dir.getFileSystem(hadoop);
        if (!fs.exists(dir)) {
            return;
        }
        for (FileStatus file : fs.listStatus(dir)) {
            String name = file.getPath().getName();
            if (!name.startsWith("_metadata") && !fs.delete(file.getPath(), true) && fs.exists(file.getPath())) {
                throw new IOException("could not remove " + file.getPath() + " before writing the state");
            }
        }
    }

    /** One state partition's task (serialised to the executors). */
    static final class Task implements MapPartitionsFunction<Row, Row> {
        private static final long serialVersionUID = 1L;
        private final StateStoreConf storeConf;
        private final SerializableConfiguration hadoop;
        private final String runId;
        private final String stateRoot;
        private final String rulesJson;
        private final int format;
        private final int[] ix;
        private final int hashCol;
        private final int userCol;
        private final long watermarkMs;
        private final int placedCol;

        Task(StateStoreConf storeConf, SerializableConfiguration hadoop, String runId, String stateRoot,
             String rulesJson, int format, int[] ix, int hashCol, int userCol, long watermarkMs, int placedCol) {
            this.storeConf = storeConf;
            this.hadoop = hadoop;
            this.runId = runId;
            this.stateRoot = stateRoot;
            this.rulesJson = rulesJson;
            this.format = format;
            this.ix = ix.clone();
            this.hashCol = hashCol;
            this.userCol = userCol;
            this.watermarkMs = watermarkMs;
            this.placedCol = placedCol;
        }

        @Override
        public Iterator<Row> call(Iterator<Row> users) throws IOException {
            return List.of(write(users, TaskContext.getPartitionId())).iterator();
        }

        /** Store `partition` written from `users`: its DONE row. */
        Row write(Iterator<Row> users, int partition) throws IOException {
            long[] done = writePartition(users, partition, storeConf, hadoop.value(), runId, stateRoot,
                                         Rules.parse(rulesJson), format, ix, hashCol, userCol, watermarkMs,
                                         placedCol);
            return RowFactory.create(partition, done[0], done[1], done[2], done[3], done[4]);
        }
    }
}
