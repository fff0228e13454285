package sessions;

import java.io.BufferedReader;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InputStreamReader;
import java.net.URI;
import java.net.URISyntaxException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;

/**
 * raw_events' live data files and newest ingest_seq, kept up to date from the tail of its Delta log: the last
 * checkpoint and the commits after it once, then each new commit once (a poll with nothing new is one missing-file
 * probe). Each file carries its ingest_seq bounds (its statistics) and whether a deletion vector hides rows of it.
 *
 * <p>A table this reading does not cover -- partitioned, column mapping, a reader feature other than deletion vectors
 * and timestamps without time zone, a v2 checkpoint -- is {@link #plain() not plain}: the caller reads it through
 * Delta Spark.
 */
final class RawEventsLog {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final Pattern COMMIT = Pattern.compile("(\\d{20})\\.json");
    private static final Pattern CLASSIC_CHECKPOINT = Pattern.compile("(\\d{20})\\.checkpoint(\\.\\d{10}\\.\\d{10})?\\.parquet");
    private static final Pattern OTHER_CHECKPOINT = Pattern.compile("\\d{20}\\.checkpoint\\.[^.]+\\.(parquet|json)");
    private static final Set<String> PLAIN_FEATURES = Set.of("deletionVectors", "timestampNtz");

    /** A live data file: its path, ingest_seq bounds (when its statistics have them) and deletion vector. */
    record DataFile(String path, Long minSeq, Long maxSeq, boolean deletionVector) {
        boolean mayHold(long low, long high) {
            return minSeq == null || maxSeq == null || (maxSeq > low && minSeq <= high);
        }
    }

    private final Path table;
    private final Path log;
    private final Configuration conf;
    private final Map<String, DataFile> live = new LinkedHashMap<>();
    private long version = -1;  // the newest commit applied
    private long seq;  // the newest ingest_seq up to it
    private boolean plain = true;

    RawEventsLog(Path table, Configuration conf) {
        this.table = table;
        this.log = new Path(table, "_delta_log");
        this.conf = conf;
    }

    /** Apply the commits since the last call. */
    synchronized void update(SparkSession spark) throws IOException {
        FileSystem fs = log.getFileSystem(conf);
        if (version < 0) {
            load(spark, fs);
            return;
        }
        while (apply(fs, version + 1)) {
            version++;
        }
    }

    synchronized long latestSeq() {
        return seq;
    }

    synchronized boolean plain() {
        return plain;
    }

    /** The live files that may hold ingest_seq in (low, high]. */
    synchronized List<DataFile> filesFor(long low, long high) {
        List<DataFile> files = new ArrayList<>();
        for (DataFile file : live.values()) {
            if (file.mayHold(low, high)) {
                files.add(file);
            }
        }
        return files;
    }

    private void load(SparkSession spark, FileSystem fs) throws IOException {
        FileStatus[] listed;
        try {
            listed = fs.listStatus(log);
        } catch (FileNotFoundException e) {
            return;  // no table yet: nothing live, seq 0
        }
        long newest = -1;
        TreeMap<Long, List<Path>> checkpoints = new TreeMap<>();
        Map<Long, Integer> declaredParts = new HashMap<>();
        for (FileStatus status : listed) {
            String name = status.getPath().getName();
            Matcher commit = COMMIT.matcher(name);
            Matcher checkpoint = CLASSIC_CHECKPOINT.matcher(name);
            if (commit.matches()) {
                newest = Math.max(newest, Long.parseLong(commit.group(1)));
            } else if (checkpoint.matches()) {
                long at = Long.parseLong(checkpoint.group(1));
                checkpoints.computeIfAbsent(at, v -> new ArrayList<>()).add(status.getPath());
                // "NNN.checkpoint.PPPPPPPPPP.TTTTTTTTTT.parquet": part P of T; a single file is its own whole
                declaredParts.put(at, checkpoint.group(2) == null ? 1 : Integer.parseInt(checkpoint.group(2).substring(12)));
            } else if (OTHER_CHECKPOINT.matcher(name).matches()) {
                plain = false;  // a v2 checkpoint: Delta Spark's to read
            }
        }
        // A multi-part checkpoint whose writer died between its parts is not one: read from an older one, or from
        // the first commit (Delta's readers skip it alike).
        checkpoints.entrySet().removeIf(e -> e.getValue().size() != declaredParts.get(e.getKey()));
        if (newest < 0 && checkpoints.isEmpty()) {
            return;
        }
        long from = 0;
        Map.Entry<Long, List<Path>> last = checkpoints.lastEntry();
        if (last != null) {
            readCheckpoint(spark, last.getValue());
            from = last.getKey() + 1;
            version = last.getKey();
        }
        for (long v = from; apply(fs, v); v++) {
            version = v;
        }
        if (version < newest) {  // a gap: never read what is left as the whole table
            throw new IOException("the Delta log of " + table + " lists commit " + newest + " but not commit "
                + (version + 1) + " after its newest complete checkpoint: not a log this source can read");
        }
    }

    private void readCheckpoint(SparkSession spark, List<Path> parts) throws IOException {
        String[] paths = parts.stream().map(Path::toString).toArray(String[]::new);
        Dataset<Row> actions = spark.read().parquet(paths);
        Set<String> columns = Set.of(actions.columns());
        if (columns.contains("metaData")) {
            for (Row row : actions.where("metaData is not null").selectExpr("to_json(metaData)").collectAsList()) {
                metaData(parse(row.getString(0)));
            }
        }
        if (columns.contains("protocol")) {
            for (Row row : actions.where("protocol is not null").selectExpr("to_json(protocol)").collectAsList()) {
                protocol(parse(row.getString(0)));
            }
        }
        if (columns.contains("add")) {
            for (Row row : actions.where("add is not null").selectExpr("to_json(add)").collectAsList()) {
                add(parse(row.getString(0)));
            }
        }
    }

    /** Apply commit `v`; false when it does not exist (yet). */
    private boolean apply(FileSystem fs, long v) throws IOException {
        Path file = new Path(log, String.format("%020d.json", v));
        List<JsonNode> adds = new ArrayList<>();
        try (FSDataInputStream in = fs.open(file);
             BufferedReader lines = new BufferedReader(new InputStreamReader(in, StandardCharsets.UTF_8))) {
            for (String line = lines.readLine(); line != null; line = lines.readLine()) {
                if (line.isBlank()) {
                    continue;
                }
                JsonNode action = JSON.readTree(line);
                if (action.has("add")) {
                    adds.add(action.get("add"));  // after the commit's removes: a new deletion vector is both
                } else if (action.has("remove")) {
                    live.remove(absolute(action.get("remove").get("path").asText()));
                } else if (action.has("commitInfo")) {
                    JsonNode ingest = action.get("commitInfo").get("ingest_seq");
                    if (ingest != null && !ingest.isNull()) {
                        seq = Math.max(seq, ingest.asLong());
                    }
                } else if (action.has("metaData")) {
                    metaData(action.get("metaData"));
                } else if (action.has("protocol")) {
                    protocol(action.get("protocol"));
                }
            }
        } catch (FileNotFoundException e) {
            return false;
        }
        for (JsonNode add : adds) {
            add(add);
        }
        return true;
    }

    private void add(JsonNode add) throws IOException {
        Long min = null;
        Long max = null;
        JsonNode stats = add.get("stats");
        if (stats != null && !stats.isNull()) {
            JsonNode parsed = JSON.readTree(stats.asText());
            JsonNode low = parsed.path("minValues").path("ingest_seq");
            JsonNode high = parsed.path("maxValues").path("ingest_seq");
            min = low.canConvertToLong() ? low.asLong() : null;
            max = high.canConvertToLong() ? high.asLong() : null;
        }
        if (max != null) {
            seq = Math.max(seq, max);
        }
        JsonNode dv = add.get("deletionVector");
        String path = absolute(add.get("path").asText());
        live.put(path, new DataFile(path, min, max, dv != null && !dv.isNull()));
    }

    private void metaData(JsonNode meta) {
        JsonNode partitions = meta.path("partitionColumns");
        String mapping = meta.path("configuration").path("delta.columnMapping.mode").asText("none");
        if ((partitions.isArray() && partitions.size() > 0) || !"none".equals(mapping)) {
            plain = false;
        }
    }

    private void protocol(JsonNode protocol) {
        for (JsonNode feature : protocol.path("readerFeatures")) {
            if (!PLAIN_FEATURES.contains(feature.asText())) {
                plain = false;
            }
        }
    }

    /**
     * A data file's path as the key of {@link #live}: made absolute and percent-decoded (Path keeps the URI's decoded
     * path), so an add and its remove match however each spells the path. A path that is not a URI (the protocol asks
     * for one) leaves the table to Delta Spark, whose reading is the reference.
     */
    private String absolute(String path) {
        try {
            URI uri = new URI(path);
            return (uri.isAbsolute() ? new Path(uri) : new Path(table, new Path(uri))).toString();
        } catch (URISyntaxException e) {
            plain = false;
            return path;
        }
    }

    private static JsonNode parse(String json) {
        try {
            return JSON.readTree(json);
        } catch (IOException e) {
            throw new IllegalStateException("a Delta checkpoint action that is not JSON: " + json, e);
        }
    }
}
