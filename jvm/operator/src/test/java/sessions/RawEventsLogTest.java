package sessions;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.List;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** RawEventsLog on hand-written Delta logs (JSON commits, no checkpoint: no Spark needed): removes match their adds
 * however each spells the path, ingest_seq bounds come from the statistics, and what it does not read is left to
 * Delta Spark. */
class RawEventsLogTest {

    @TempDir
    java.nio.file.Path dir;

    private void commit(long version, String... actions) throws IOException {
        java.nio.file.Path log = Files.createDirectories(dir.resolve("_delta_log"));
        Files.writeString(log.resolve(String.format("%020d.json", version)), String.join("\n", actions) + "\n",
            StandardCharsets.UTF_8);
    }

    private static String add(String path, long min, long max) {
        return "{\"add\":{\"path\":\"" + path + "\",\"size\":1,\"modificationTime\":1,\"dataChange\":true,"
            + "\"stats\":\"{\\\"numRecords\\\":1,\\\"minValues\\\":{\\\"ingest_seq\\\":" + min
            + "},\\\"maxValues\\\":{\\\"ingest_seq\\\":" + max + "}}\"}}";
    }

    private static String remove(String path) {
        return "{\"remove\":{\"path\":\"" + path + "\",\"deletionTimestamp\":2,\"dataChange\":true}}";
    }

    /** The names of the live files that may hold ingest_seq in (low, high]. */
    private static List<String> names(RawEventsLog log, long low, long high) {
        return log.filesFor(low, high).stream().map(f -> new Path(f.path()).getName()).toList();
    }

    private RawEventsLog read() throws IOException {
        RawEventsLog log = new RawEventsLog(new Path(dir.toUri()), new Configuration());
        log.update(null);  // no checkpoint in these logs: Spark is not asked
        return log;
    }

    @Test
    void aRemoveMatchesItsAddHoweverEachSpellsThePath() throws IOException {
        commit(0, "{\"protocol\":{\"minReaderVersion\":1,\"minWriterVersion\":2}}",
            add("part%2D0%20a.parquet", 1, 5), add("part-1.parquet", 6, 9));
        commit(1, remove("part-0%20a.parquet"),
            remove("part%2D1.parquet"), add("part-2.parquet", 1, 9));
        RawEventsLog log = read();
        assertEquals(List.of("part-2.parquet"), names(log, 0, 100));
        assertEquals(9, log.latestSeq());
        assertTrue(log.plain());
    }

    @Test
    void filesAreChosenByTheirIngestSeqBounds() throws IOException {
        commit(0, add("a.parquet", 1, 5), add("b.parquet", 6, 9), add("c.parquet", 10, 12));
        RawEventsLog log = read();
        assertEquals(List.of("b.parquet"), names(log, 5, 9));
        assertEquals(12, log.latestSeq());
    }

    @Test
    void aMultiPartCheckpointMissingAPartIsNotRead() throws IOException {
        commit(0, add("a.parquet", 1, 5));
        commit(1, add("b.parquet", 6, 9));
        commit(2, remove("a.parquet"));
        // part 1 of 2 only (its writer died): the log is read from its commits (Spark, null here, is not asked)
        Files.writeString(dir.resolve("_delta_log").resolve(String.format("%020d.checkpoint.%010d.%010d.parquet", 1, 1, 2)),
            "not read");
        RawEventsLog log = read();
        assertEquals(List.of("b.parquet"), names(log, 0, 100));
        assertEquals(9, log.latestSeq());
    }

    @Test
    void aGapInTheLogIsAnErrorNotAnEmptyTable() throws IOException {
        commit(1, add("b.parquet", 6, 9));  // commit 0 gone, and no checkpoint to start from
        IOException error = assertThrows(IOException.class, this::read);
        assertTrue(error.getMessage().contains("not commit 0"), error.getMessage());
    }

    @Test
    void aPathThatIsNotAUriLeavesTheTableToDeltaSpark() throws IOException {
        commit(0, add("not a uri.parquet", 1, 5));
        assertFalse(read().plain());
    }

    @Test
    void aPartitionedTableIsLeftToDeltaSpark() throws IOException {
        commit(0, "{\"metaData\":{\"id\":\"x\",\"format\":{\"provider\":\"parquet\",\"options\":{}},"
            + "\"schemaString\":\"{}\",\"partitionColumns\":[\"day\"],\"configuration\":{}}}", add("a.parquet", 1, 5));
        assertFalse(read().plain());
    }
}
