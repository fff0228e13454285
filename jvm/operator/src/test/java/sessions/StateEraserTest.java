package sessions;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.Set;
import java.util.TreeSet;
import java.util.stream.Collectors;
import java.util.stream.Stream;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.streaming.state.StateStore;
import org.apache.spark.sql.execution.streaming.state.StateStoreIterator;
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider;
import org.apache.spark.sql.execution.streaming.state.UnsafeRowPair;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import scala.Option;

/** StateEraser on Spark's HDFS-backed provider: the partition rewritten at its latest version holds every key but the
 * erased users', that version loads from the installed snapshot alone, and the purge leaves only it (and the
 * partition's `_metadata`): the older versions that held the user, and an uncommitted newer one, are gone. */
class StateEraserTest {
    private static final StructType INPUT = new StructType().add("user_id", DataTypes.StringType)
        .add("session_start_ms", DataTypes.LongType).add("event_id", DataTypes.StringType)
        .add("event_time_ms", DataTypes.LongType).add("event_type", DataTypes.StringType)
        .add("event_count", DataTypes.LongType).add("page_views", DataTypes.LongType)
        .add("user_hash", DataTypes.LongType);
    private static final long T = 1_700_000_000_000L;

    private static UnsafeRow key(String user) {
        return UnsafeProjection.create(StateWriter.KEY_SCHEMA).apply(new GenericInternalRow(
            new Object[] {(long) user.hashCode(), UTF8String.fromString(user)})).copy();
    }

    private static Set<String> usersAt(StoreDir dir, long version) {
        StateStoreProvider provider = dir.provider();
        try {
            StateStore store = provider.getStore(version, Option.empty(), false, false);
            Set<String> users = new TreeSet<>();
            StateStoreIterator<UnsafeRowPair> pairs = store.iterator(StateStore.DEFAULT_COL_FAMILY_NAME());
            while (pairs.hasNext()) {
                users.add(pairs.next().key().getUTF8String(1).toString());
            }
            store.abort();
            return users;
        } finally {
            provider.close();
        }
    }

    @Test
    void theErasedUserIsInNoVersionLeftAndTheOthersAreAsTheyWere(@TempDir Path dir) throws IOException {
        StoreDir store = StoreDir.under(dir);
        Path partition = store.partition();
        List<Row> input = new ArrayList<>();
        List<String> users = List.of("a", "b", "ü-😀", "c", "d");
        Random random = new Random(3);
        for (String user : users) {
            input.add(RowFactory.create(user, T, "e-" + user, T + random.nextInt(60_000), "page_view", 1L, 1L,
                                        (long) user.hashCode()));
        }
        int[] ix = SessionsOperator.stateRowColumns(INPUT);
        StateWriter.writePartition(input.iterator(), 0, store.conf(), store.hadoop(), store.runId(), store.stateRoot(),
                                   Rules.parse("{\"gap_ms\": 1800000, \"attributes\": []}"), 2, ix,
                                   INPUT.fieldIndex("user_hash"), INPUT.fieldIndex("user_id"), 0L);
        // Versions 2 and 3: c removed (its removal record names it), b's value written again (history holds b twice).
        StateStoreProvider history = store.provider();
        try {
            StateStore two = history.getStore(1L, Option.empty(), false, false);
            two.remove(key("c"), StateStore.DEFAULT_COL_FAMILY_NAME());
            two.commit();
            StateStore three = history.getStore(2L, Option.empty(), false, false);
            UnsafeRow b = three.get(key("b"), StateStore.DEFAULT_COL_FAMILY_NAME()).copy();
            three.put(key("b"), b, StateStore.DEFAULT_COL_FAMILY_NAME());
            three.commit();
        } finally {
            history.close();
        }
        Files.writeString(partition.resolve("4.delta"), "an uncommitted batch's version: it may hold b");

        StateEraser.Rewritten done = StateEraser.rewritePartition(Set.of("b", "c"), 0, 3L, store.conf(),
                                                                  store.hadoop(), store.runId(), store.stateRoot(), 2,
                                                                  false);
        assertEquals(3, done.kept());
        assertEquals(1, done.removed());  // c was gone at version 3 already
        assertEquals(List.of("3.snapshot"), done.files());
        assertEquals(Set.of("a", "d", "ü-😀"), usersAt(store, 3L));

        long removed = StateEraser.purgeDir(new org.apache.hadoop.fs.Path(partition.toUri()), store.hadoop(),
                                            done.files());
        try (Stream<Path> left = Files.walk(partition)) {
            Set<String> names = left.filter(Files::isRegularFile).map(p -> partition.relativize(p).toString())
                .collect(Collectors.toCollection(TreeSet::new));
            assertEquals(new TreeSet<>(List.of("3.snapshot", ".3.snapshot.crc", "_metadata/schema")), names);
        }
        assertEquals(4, removed);  // 1-3.delta and 4.delta (the local store drops their checksum files with them)
        assertEquals(Set.of("a", "d", "ü-😀"), usersAt(store, 3L));
        assertThrows(Exception.class, () -> usersAt(store, 2L));
    }
}
