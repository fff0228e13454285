package sessions;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Random;
import java.util.UUID;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.execution.streaming.operators.stateful.flatmapgroupswithstate.FlatMapGroupsWithStateExecHelper;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreConf;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import scala.Option;

/** StateWriter: the value it writes for a user is the one the operator leaves for the user's rows stored and walked
 * with no event at watermark 0 (encoded in WALK_ORDER, decoded and walked as Fn does), and a partition it writes is a
 * store version 1 that Spark's HDFS-backed provider reads back, key by key, with flatMapGroupsWithState's state
 * manager. */
class StateWriterTest {
    private static final long GAP = 30 * 60_000L;
    private static final long T = 1_700_000_000_000L;
    /** Open rows as the writer takes them: user_id, STATE_ROW's columns (attributes left out), user_hash. */
    private static final StructType INPUT = new StructType().add("user_id", DataTypes.StringType)
        .add("session_start_ms", DataTypes.LongType).add("event_id", DataTypes.StringType)
        .add("event_time_ms", DataTypes.LongType).add("event_type", DataTypes.StringType)
        .add("event_count", DataTypes.LongType).add("page_views", DataTypes.LongType)
        .add("user_hash", DataTypes.LongType);

    private static Rules rules(long gapMs) {
        return Rules.parse("{\"gap_ms\": " + gapMs + ", \"attributes\": []}");
    }

    private static List<SessionsOperator.R> sample(Random random) {
        List<SessionsOperator.R> rows = new ArrayList<>();
        rows.add(new SessionsOperator.R(T, null, T + 60_000, "page_view", 4, 2, 0));  // a frozen prefix
        long at = T + 120_000;
        for (int i = 0; i < 1 + random.nextInt(5); i++) {
            at += random.nextInt(3) == 0 ? GAP + 1 : random.nextInt(600_000);  // now and then a new session
            rows.add(new SessionsOperator.R(T, "e" + i, at, i % 3 == 0 ? "logout" : "page_view", 1,
                                            i % 3 == 0 ? 0 : 1, 0));
        }
        return rows;
    }

    /** The operator's own path, step by step: the rows encoded as a stored value in WALK_ORDER (StateCodec), decoded
     * as Fn decodes a user's state, and walked with no event at a first batch's watermark (0). */
    private static SessionsOperator.Stored byStoreAndWalk(String user, List<SessionsOperator.R> rows, Rules rules) {
        List<SessionsOperator.R> sorted = new ArrayList<>(rows);
        sorted.sort(SessionsOperator.WALK_ORDER);
        List<SessionsOperator.R> loaded = StateCodec.decode(StateCodec.encode(sorted, rules.attributes()),
                                                            rules.attributes());
        return SessionsOperator.stored(SessionsOperator.advance(user, loaded, List.of(), 0, rules),
                                       rules.attributes());
    }

    @Test
    void aRestoredValueIsTheStoredRowsWalkedAtWatermarkZero() {
        Random random = new Random(63);
        for (long gap : new long[] {GAP, 5 * 60_000L, 2 * GAP}) {  // the savepoint's gap, and a migrated one
            for (int k = 0; k < 200; k++) {
                List<SessionsOperator.R> rows = sample(random);
                Collections.shuffle(rows, random);  // whatever order the savepoint's files give
                SessionsOperator.Stored expected = byStoreAndWalk("u" + k, rows, rules(gap));
                SessionsOperator.Stored got = SessionsOperator.restored("u" + k, new ArrayList<>(rows), rules(gap));
                assertNotNull(got);
                assertArrayEquals(expected.value(), got.value());
                assertEquals(expected.timeout(), got.timeout());
                assertTrue(got.timeout() > 0 && got.timeout() < Long.MAX_VALUE - 1, "a timer is set");
            }
        }
        assertNull(SessionsOperator.restored("nobody", new ArrayList<>(), rules(GAP)));
    }

    @Test
    void aWrittenPartitionReadsBackThroughSparksProvider(@TempDir Path dir) throws IOException {
        StoreDir dirs = StoreDir.under(dir);
        Path partition = dirs.partition();
        // What batch 0 left: its (empty) version and partition 0's schema file, which must stay.
        Files.writeString(partition.resolve("1.delta"), "batch 0's empty version");
        Rules rules = rules(GAP);
        Random random = new Random(7);
        List<Row> input = new ArrayList<>();
        List<String> users = List.of("a", "b", "ü-😀", "d");
        List<List<SessionsOperator.R>> rowsOf = new ArrayList<>();
        for (String user : users) {
            List<SessionsOperator.R> rows = sample(random);
            rowsOf.add(rows);
            for (SessionsOperator.R r : rows) {  // each user's rows together, as the sort leaves them
                input.add(RowFactory.create(user, r.start(), r.id(), r.time(), r.type(), r.count(), r.views(),
                                            (long) user.hashCode()));
            }
        }
        int[] ix = SessionsOperator.stateRowColumns(INPUT);
        // A watermark at the latest timer: every other user's timer fires in the first batch at it (timeout < it).
        long watermark = Long.MIN_VALUE;
        for (int i = 0; i < users.size(); i++) {
            watermark = Math.max(watermark, byStoreAndWalk(users.get(i), rowsOf.get(i), rules).timeout());
        }
        long due = 0;
        long stored = 0;
        long sum = 0;  // the read-back's checksum, from each stored row's text framed here (Checksum.rowHash's input)
        for (int i = 0; i < users.size(); i++) {
            SessionsOperator.Stored expected = byStoreAndWalk(users.get(i), rowsOf.get(i), rules);
            due += expected.timeout() < watermark ? 1 : 0;
            for (SessionsOperator.R r : StateCodec.decode(expected.value(), List.of())) {
                sum += Checksum.rowHash(String.join("\u001f", users.get(i), Long.toString(r.start() * 1000),
                    r.id() == null ? "" : r.id(), Long.toString(r.time() * 1000), r.type() == null ? "\0" : r.type(),
                    Long.toString(r.count()), Long.toString(r.views())));
                stored++;
            }
        }
        long[] done = StateWriter.writePartition(input.iterator(), 0, dirs.conf(), dirs.hadoop(), dirs.runId(),
                                                 dirs.stateRoot(), rules, 2, ix, INPUT.fieldIndex("user_hash"),
                                                 INPUT.fieldIndex("user_id"), watermark);
        assertArrayEquals(new long[] {users.size(), input.size(), due, stored, sum}, done);
        assertEquals("kept", Files.readString(partition.resolve("_metadata/schema")));

        FlatMapGroupsWithStateExecHelper.StateManager manager = StateWriter.stateManager(2);
        StateStoreProvider provider = dirs.provider();
        try {
            StateStore store = provider.getStore(1L, Option.empty(), false, false);
            UnsafeProjection keys = UnsafeProjection.create(StateWriter.KEY_SCHEMA);
            for (int i = 0; i < users.size(); i++) {
                String user = users.get(i);
                UnsafeRow key = keys.apply(new GenericInternalRow(
                    new Object[] {(long) user.hashCode(), UTF8String.fromString(user)}));
                FlatMapGroupsWithStateExecHelper.StateData state = manager.getState(store, key);
                SessionsOperator.Stored expected = byStoreAndWalk(user, rowsOf.get(i), rules);
                assertArrayEquals(expected.value(), (byte[]) state.stateObj(), user);
                assertEquals(expected.timeout(), state.timeoutTimestamp(), user);
            }
            store.abort();
        } finally {
            provider.close();
        }
    }
    /** On RocksDB the writer's stores skip the provider's row count (StateWriter.storeConf): the stream's provider,
     * which counts rows, counts them when it loads the version and then keeps counting from there. */
    @Test
    void aRocksDbStoreWrittenWithoutItsRowCountIsCountedByTheStreamsProvider(@TempDir Path dir) throws IOException {
        StoreDir dirs = StoreDir.under(dir);
        SQLConf sql = new SQLConf();
        sql.setConfString("spark.sql.streaming.stateStore.providerClass",
                          "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider");
        sql.setConfString("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "false");
        Rules rules = rules(GAP);
        Random random = new Random(11);
        List<Row> input = new ArrayList<>();
        int users = 50;
        for (int u = 0; u < users; u++) {
            for (SessionsOperator.R r : sample(random)) {
                input.add(RowFactory.create("u" + u, r.start(), r.id(), r.time(), r.type(), r.count(), r.views(),
                                            (long) u));
            }
        }
        int[] ix = SessionsOperator.stateRowColumns(INPUT);
        long[] done = StateWriter.writePartition(input.iterator(), 0, StateWriter.storeConf(sql), dirs.hadoop(),
                                                 dirs.runId(), dirs.stateRoot(), rules, 2, ix,
                                                 INPUT.fieldIndex("user_hash"), INPUT.fieldIndex("user_id"), 0L);
        assertEquals(users, done[0]);
        assertEquals("false", StateWriter.storeConf(sql).sqlConfs().get(StateWriter.TRACK_ROWS).get());
        StateStoreConf counting = StateStoreConf.apply(sql);  // the stream's: rows counted (Spark's default)
        StateStoreProvider provider = StateWriter.provider(dirs.stateRoot(), 0, UUID.randomUUID().toString(),
                                                           StateWriter.stateManager(2).stateSchema(), counting,
                                                           dirs.hadoop());
        try {
            StateStore store = provider.getStore(1L, Option.empty(), false, false);
            try {  // the stream's next batch: one user's key removed, version 2 committed with its count
                UnsafeRow key = UnsafeProjection.create(StateWriter.KEY_SCHEMA).apply(new GenericInternalRow(
                    new Object[] {0L, UTF8String.fromString("u0")}));
                store.remove(key, StateStore.DEFAULT_COL_FAMILY_NAME());
                assertEquals(2L, store.commit());
                assertEquals(users - 1, store.metrics().numKeys());
            } finally {
                if (!store.hasCommitted()) {
                    store.abort();
                }
            }
        } finally {
            provider.close();
        }
    }
    /** writePlaced's check in each task: rows all of the task's partition, each user's together, are written as
     * without it; a row of another partition, or a user whose rows resume after another's, and nothing is committed. */
    @Test
    void aPlacedPartitionIsCheckedRowByRow(@TempDir Path dir) throws IOException {
        StructType placed = INPUT.add(StateWriter.PLACED_AT, DataTypes.IntegerType);
        int[] ix = SessionsOperator.stateRowColumns(placed);
        Rules rules = rules(GAP);
        Random random = new Random(5);
        List<List<Row>> byUser = new ArrayList<>();
        for (String user : List.of("a", "b", "c")) {
            List<Row> rows = new ArrayList<>();
            for (SessionsOperator.R r : sample(random)) {
                rows.add(RowFactory.create(user, r.start(), r.id(), r.time(), r.type(), r.count(), r.views(),
                                           (long) user.hashCode(), 0));
            }
            byUser.add(rows);
        }
        List<Row> together = new ArrayList<>();
        byUser.forEach(together::addAll);
        List<Row> resumed = new ArrayList<>(together);  // a's last row after c's
        resumed.add(resumed.remove(byUser.get(0).size() - 1));
        List<Row> elsewhere = new ArrayList<>(together);  // b's first row placed in partition 1
        Row b = elsewhere.get(byUser.get(0).size());
        elsewhere.set(byUser.get(0).size(), RowFactory.create(b.get(0), b.get(1), b.get(2), b.get(3), b.get(4), b.get(5),
                                                              b.get(6), b.get(7), 1));
        long[] expected = null;
        for (List<Row> input : List.of(together, resumed, elsewhere)) {
            StoreDir dirs = StoreDir.under(dir.resolve("case-" + (expected == null ? 0 : input == resumed ? 1 : 2)));
            long[] done = StateWriter.writePartition(input.iterator(), 0, dirs.conf(), dirs.hadoop(), dirs.runId(),
                                                     dirs.stateRoot(), rules, 2, ix, placed.fieldIndex("user_hash"),
                                                     placed.fieldIndex("user_id"), 0L,
                                                     placed.fieldIndex(StateWriter.PLACED_AT));
            if (expected == null) {  // the unchecked write of the same rows
                StoreDir plain = StoreDir.under(dir.resolve("unchecked"));
                expected = StateWriter.writePartition(together.iterator(), 0, plain.conf(), plain.hadoop(),
                                                      plain.runId(), plain.stateRoot(), rules, 2, ix,
                                                      placed.fieldIndex("user_hash"), placed.fieldIndex("user_id"), 0L);
                assertEquals(3L, expected[0]);
                assertArrayEquals(expected, done);
                assertTrue(Files.exists(dirs.partition().resolve("1.delta")));
            } else {
                assertArrayEquals(new long[] {-1, 0, 0, 0, 0}, done);
                try (var files = Files.list(dirs.partition())) {  // nothing committed: only _metadata
                    assertEquals(List.of("_metadata"), files.map(f -> f.getFileName().toString()).toList());
                }
            }
        }
    }
}
