package sessions;

import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Set;

import org.apache.commons.io.FileUtils;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.apache.spark.sql.execution.streaming.state.ReadStateStore;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf;
import org.apache.spark.sql.execution.streaming.state.StateStoreIterator;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import org.apache.spark.util.SerializableConfiguration;

import scala.Option;

/**
 * The erasure's state rewrite in place: only the state partitions that hold the erased users are rewritten, each at
 * the version the stream resumes from, and every older or newer file of those partitions is then removed.
 *
 * <p>Why a rewrite and not a delete: a delete leaves the user's bytes where the store keeps history -- RocksDB's SST
 * files, its MANIFEST's key ranges and changelogs, the HDFS-backed provider's delta files (whose removal record holds
 * the key). So each such partition is read at version V (the last committed batch's state), every key but the users'
 * is put into a fresh store of the same provider in a local directory (version 1: a new RocksDB, or a delta file of
 * puts only, which is byte for byte a snapshot file), and that is installed as version V of the live partition:
 * RocksDB's SSTs copied and its 1.zip written as V.zip, the HDFS-backed provider's 1.delta written as V.snapshot.
 * Loading V then reads only what was installed. {@link #purge} then removes every other file of those partitions
 * (the older versions, changelogs and SSTs that held the users, and any uncommitted newer version).
 *
 * <p>Each step leaves a loadable checkpoint: until V's new file is written, V is what it was (the new SSTs are files no
 * version names); after it, V is the erased state and the old files are history no load reads. A rerun redoes both.
 */
public final class StateEraser {
    private static final String CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled";
    private static final String PROVIDER = "spark.sql.streaming.stateStore.providerClass";
    private static final String ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider";
    private static final StructType DONE = new StructType().add("partition", DataTypes.IntegerType, false)
        .add("kept", DataTypes.LongType, false).add("removed", DataTypes.LongType, false)
        .add("files", DataTypes.StringType, false);

    private StateEraser() {}

    /** Rewrites, at store `version`, each state partition of `checkpoint` (operator 0, `partitions` of them, the
     * provider class `providerClass`) that holds one of `users` (a frame with a user_id column), without them. Returns
     * one row per partition rewritten: partition, keys kept, keys removed, and the files that make up its version now
     * (relative to the partition's directory, newline-separated: what {@link #purge} keeps). Called through py4j. */
    public static List<Row> rewrite(Dataset<Row> users, String checkpoint, int partitions, long version,
                                    String providerClass) throws IOException {
        SQLConf sql = ((org.apache.spark.sql.classic.SparkSession) users.sparkSession()).sessionState().conf().clone();
        sql.setConfString(PROVIDER, providerClass);
        sql.setConfString(CHANGELOG, "false");  // the fresh store's commit writes its snapshot (1.zip) at once
        StateWriter.Stores stores = StateWriter.Stores.of(users.sparkSession(), sql, checkpoint);
        Task task = new Task(StateWriter.storeConf(sql), new SerializableConfiguration(stores.hadoop()), stores.runId(),
                             stores.stateRoot(), stores.format(), version, ROCKSDB.equals(providerClass));
        // The users land in the tasks of the partitions whose stores hold them; a partition no user lands in is not
        // touched.
        return StateWriter.placed(users.select("user_id"), partitions).mapPartitions(task, Encoders.row(DONE))
            .collectAsList();
    }

    /** Removes every file of state partition `partition` of `checkpoint` but `keep` (relative paths, and their
     * checksum files) and its `_metadata`. Returns the files removed. */
    public static long purge(org.apache.spark.sql.SparkSession spark, String checkpoint, int partition,
                             List<String> keep) throws IOException {
        Path dir = new Path(new Path(new Path(checkpoint, "state"), "0"), Integer.toString(partition));
        return purgeDir(dir, spark.sessionState().newHadoopConf(), keep);
    }

    /** {@link #purge} of one partition's directory `dir`. */
    static long purgeDir(Path dir, Configuration hadoop, List<String> keep) throws IOException {
        FileSystem fs = dir.getFileSystem(hadoop);
        Set<String> kept = new HashSet<>(keep);
        for (String name : keep) {
            Path p = new Path(name);
            String parent = p.getParent() == null ? "" : p.getParent() + "/";
            kept.add(parent + "." + p.getName() + ".crc");
        }
        return purgeUnder(fs, dir, "", kept);
    }

    private static long purgeUnder(FileSystem fs, Path dir, String prefix, Set<String> kept) throws IOException {
        long removed = 0;
        if (!fs.exists(dir)) {
            return 0;
        }
        for (FileStatus file : fs.listStatus(dir)) {
            String name = prefix + file.getPath().getName();
            if (name.equals("_metadata") || kept.contains(name)) {
                continue;
            }
            if (file.isDirectory()) {
                removed += purgeUnder(fs, file.getPath(), name + "/", kept);
            } else if (fs.delete(file.getPath(), false)) {
                removed++;
            } else if (fs.exists(file.getPath())) {
                throw new IOException("could not remove " + file.getPath() + " after the erasure's rewrite");
            }
        }
        return removed;
    }

    /** One partition's rewrite (see the class comment). `erased`: the users whose keys go. Returns the keys kept and
     * removed, and the files of its new version relative to the partition's directory. */
    static Rewritten rewritePartition(Set<String> erased, int partition, long version, StateStoreConf storeConf,
                                      Configuration hadoop, String runId, String stateRoot, int format,
                                      boolean rocksdb) throws IOException {
        StructType valueSchema = StateWriter.stateManager(format).stateSchema();
        File local = Files.createTempDirectory("sessions-erasure-").toFile();
        try {
            String freshRoot = new Path(local.toURI().toString(), "state").toString();
            StateStoreProvider live = StateWriter.provider(stateRoot, partition, runId, valueSchema, storeConf, hadoop);
            StateStoreProvider fresh = StateWriter.provider(freshRoot, partition, runId, valueSchema, storeConf, hadoop);
            long kept = 0;
            long removed = 0;
            try {
                ReadStateStore current = live.getReadStore(version, Option.empty());
                StateStore into = fresh.getStore(0L, Option.empty(), false, false);
                try {
                    StateStoreIterator<UnsafeRowPair> pairs = current.iterator(StateStore.DEFAULT_COL_FAMILY_NAME());
                    while (pairs.hasNext()) {
                        UnsafeRowPair pair = pairs.next();
                        UTF8String user = pair.key().getUTF8String(1);
                        if (user != null && erased.contains(user.toString())) {
                            removed++;
                        } else {
                            into.put(pair.key().copy(), pair.value().copy(), StateStore.DEFAULT_COL_FAMILY_NAME());
                            kept++;
                        }
                    }
                    into.commit();
                } finally {
                    if (!into.hasCommitted()) {
                        into.abort();
                    }
                    current.abort();  // a read store: releases what it loaded, writes nothing
                }
            } finally {
                fresh.close();
                live.close();
            }
            Path from = new Path(new Path(new Path(freshRoot, "0"), Integer.toString(partition)).toString());
            Path to = new Path(new Path(new Path(stateRoot, "0"), Integer.toString(partition)).toString());
            List<String> files = install(from, to, version, rocksdb, hadoop);
            return new Rewritten(kept, removed, files);
        } finally {
            FileUtils.deleteQuietly(local);
        }
    }

    /** The fresh store's version 1 (in `from`) installed as version `version` in `to`: RocksDB's immutable files first
     * (new names: no version names them yet), then its 1.zip as version.zip; the HDFS-backed provider's 1.delta as
     * version.snapshot. The version's file is written last and whole, so a load sees the old version or the new. */
    static List<String> install(Path from, Path to, long version, boolean rocksdb, Configuration hadoop)
            throws IOException {
        FileSystem local = from.getFileSystem(hadoop);
        List<String> files = new ArrayList<>();
        if (rocksdb) {
            for (FileStatus sub : local.listStatus(from)) {
                if (!sub.isDirectory()) {
                    continue;
                }
                for (FileStatus file : local.listStatus(sub.getPath())) {
                    String name = file.getPath().getName();
                    if (!name.endsWith(".crc")) {
                        String relative = sub.getPath().getName() + "/" + name;
                        copy(local, file.getPath(), new Path(to, relative), hadoop);
                        files.add(relative);
                    }
                }
            }
        }
        String source = rocksdb ? "1.zip" : "1.delta";
        String target = version + (rocksdb ? ".zip" : ".snapshot");
        if (!local.exists(new Path(from, source))) {
            throw new IOException("the erasure's fresh store wrote no " + source + " in " + from);
        }
        copy(local, new Path(from, source), new Path(to, target), hadoop);
        files.add(target);
        return files;
    }

    /** A whole-file copy onto the checkpoint's store: S3 shows an object only once it is whole (one PUT, replacing
     * any older one at once); elsewhere Spark's atomic create (a temporary file renamed over the old one). */
    private static void copy(FileSystem local, Path source, Path target, Configuration hadoop) throws IOException {
        FileSystem fs = target.getFileSystem(hadoop);
        fs.mkdirs(target.getParent());  // a partition whose versions were all changelogs has no SSTs/ yet
        OutputStream out = "s3a".equalsIgnoreCase(target.toUri().getScheme()) ? fs.create(target, true)
            : CheckpointFileManager.create(target.getParent(), hadoop).createAtomic(target, true);
        try (InputStream in = local.open(source); OutputStream o = out) {
            in.transferTo(o);
        }
    }

    /** What a partition's rewrite did. */
    record Rewritten(long kept, long removed, List<String> files) {
        Rewritten {
            files = List.copyOf(files);
        }
    }

    /** One state partition's task (serialised to the executors): the users placed in it, erased from it. */
    static final class Task implements MapPartitionsFunction<Row, Row> {
        private static final long serialVersionUID = 1L;
        private final StateStoreConf storeConf;
        private final SerializableConfiguration hadoop;
        private final String runId;
        private final String stateRoot;
        private final int format;
        private final long version;
        private final boolean rocksdb;

        Task(StateStoreConf storeConf, SerializableConfiguration hadoop, String runId, String stateRoot, int format,
             long version, boolean rocksdb) {
            this.storeConf = storeConf;
            this.hadoop = hadoop;
            this.runId = runId;
            this.stateRoot = stateRoot;
            this.format = format;
            this.version = version;
            this.rocksdb = rocksdb;
        }

        @Override
        public Iterator<Row> call(Iterator<Row> users) throws IOException {
            Set<String> erased = new HashSet<>();
            while (users.hasNext()) {
                erased.add(users.next().getString(0));
            }
            if (erased.isEmpty()) {
                return List.<Row>of().iterator();
            }
            int partition = TaskContext.getPartitionId();
            Rewritten done = rewritePartition(erased, partition, version, storeConf, hadoop.value(), runId, stateRoot,
                                              format, rocksdb);
            return List.of(RowFactory.create(partition, done.kept(), done.removed(), String.join("\n", done.files())))
                .iterator();
        }
    }
}
