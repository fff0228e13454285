package sessions;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Set;

import org.apache.spark.api.java.function.FlatMapGroupsWithStateFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoder;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.KeyValueGroupedDataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.streaming.GroupState;
import org.apache.spark.sql.streaming.GroupStateTimeout;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

import scala.Tuple2;

/**
 * The JVM operator (the default for a new checkpoint; SESSIONS_OPERATOR): the same sessionization as the Python core
 * (pipelines/core/sessionize.py, the specification; tests compare both with the oracle), run by Spark's
 * flatMapGroupsWithState keyed by user_id. A user's state is their open rows -- events above the watermark and
 * at most one frozen prefix per open session (event_id null) -- so a batch reads and writes only the users it
 * touches or whose timer is due. Input: the columns of pipelines.job.operators.seam's `keyed` frame; output: the schema
 * pipelines.job.operators.seam.OUTPUT_SCHEMA hands in (checked against OUTPUT_NAMES, the order this class builds rows in).
 * A restored checkpoint's state is written into its store by StateWriter (the values `restored` gives), never
 * through the events.
 */
public final class SessionsOperator {
    public static final String LOGOUT = "logout";
    public static final String PAGE_VIEW = "page_view";
    /** The checkpoint's state layout (pipelines/job/operators/jvm.py STATE_LAYOUT, held equal by a test): one key per
     * user; each value carries its own format version byte (StateCodec.VALUE_FORMAT). */
    public static final String STATE_LAYOUT = "open_sessions_by_user/jvm-v1";

    /** A stored row as the state readers see it (DecodeState): pipelines.core.state_format.ROW_FIELDS, times in ms. */
    public static final StructType STATE_ROW = new StructType()
        .add("session_start_ms", DataTypes.LongType, false)
        .add("event_id", DataTypes.StringType, true)
        .add("event_time_ms", DataTypes.LongType, false)
        .add("event_type", DataTypes.StringType, true)
        .add("event_count", DataTypes.LongType, false)
        .add("page_views", DataTypes.LongType, false)
        .add("attributes", DataTypes.StringType, true);  // the row's partials as text (Attributes.toJson)
    /** The output columns in the order rows are built below; the types come from Python's OUTPUT_SCHEMA. */
    public static final String[] OUTPUT_NAMES = {"kind", "session_id", "user_id", "session_start_ms",
        "session_end_ms", "event_count", "page_views", "end_reason", "event_id", "event_time_ms", "event_type",
        "ingest_seq", "line_key"};
    private static final Encoder<Tuple2<Long, String>> KEY = Encoders.tuple(Encoders.LONG(), Encoders.STRING());

    private SessionsOperator() {}

    /** `keyed` grouped by user through the operator; called from Python through py4j. The key is (xxhash64(user_id),
     * user_id): Spark sorts a batch by the key before the call, and the hash first makes that sort decide on the
     * long prefix instead of comparing ids that often share their first bytes. `rulesJson`
     * (pipelines.job.operators.jvm.rules_json) are the session rules (Rules): the gap, and the attributes, whose
     * partials live in each stored row and whose values follow OUTPUT_NAMES in a closed session's output. */
    public static Dataset<Row> sessionize(Dataset<Row> keyed, String rulesJson, String outputDdl) {
        Rules rules = Rules.parse(rulesJson);
        List<Attributes.Attr> attrs = rules.attributes();
        StructType output = StructType.fromDDL(outputDdl);
        String[] names = output.fieldNames();
        if (names.length != OUTPUT_NAMES.length + attrs.size()
                || !java.util.Arrays.equals(java.util.Arrays.copyOf(names, OUTPUT_NAMES.length), OUTPUT_NAMES)) {
            throw new IllegalArgumentException("output schema " + output.simpleString() + " does not list the columns "
                + String.join(",", OUTPUT_NAMES) + " in this order, then one per attribute");
        }
        Dataset<Row> hashed = keyed.withColumn("user_hash", functions.xxhash64(keyed.col("user_id")));
        StructType schema = hashed.schema();
        int[] columns = new int[attrs.size()];
        for (int k = 0; k < columns.length; k++) {
            String column = attrs.get(k).column();
            columns[k] = column == null ? -1 : schema.fieldIndex(column);
        }
        Fn fn = new Fn(rules, new int[] {
            schema.fieldIndex("event_id"), schema.fieldIndex("event_time_ms"), schema.fieldIndex("event_type"),
            schema.fieldIndex("ingest_seq"), schema.fieldIndex("line_key")}, columns);
        // groupBy(columns).as(...): Spark groups on the columns themselves (no per-row key function, AppendColumns)
        KeyValueGroupedDataset<Tuple2<Long, String>, Row> grouped = hashed
            .groupBy(hashed.col("user_hash"), hashed.col("user_id"))
            .as(KEY, Encoders.row(schema));
        return grouped.flatMapGroupsWithState(fn, OutputMode.Append(), Encoders.BINARY(), Encoders.row(output),
                                              GroupStateTimeout.EventTimeTimeout());
    }

    /** Where STATE_ROW's columns are in `schema` (open rows with user_id, as StateWriter takes them; any order): -1
     * for `attributes` when the rows carry none. */
    static int[] stateRowColumns(StructType schema) {
        int[] ix = new int[STATE_ROW.size()];
        List<String> names = java.util.Arrays.asList(schema.fieldNames());
        for (int i = 0; i < ix.length; i++) {  // attributes: optional (-1: the rows carry none)
            String name = STATE_ROW.fieldNames()[i];
            ix[i] = names.contains(name) ? schema.fieldIndex(name) : -1;
        }
        return ix;
    }

    /** One open row (columns at `ix`, stateRowColumns) as the walk takes it, with its partials of `attrs`. */
    static R openRow(Row r, int[] ix, List<Attributes.Attr> attrs) {
        String text = ix[6] < 0 || r.isNullAt(ix[6]) ? null : r.getString(ix[6]);
        return new R(r.getLong(ix[0]), r.isNullAt(ix[1]) ? null : r.getString(ix[1]), r.getLong(ix[2]),
                     r.isNullAt(ix[3]) ? null : r.getString(ix[3]), r.getLong(ix[4]), r.getLong(ix[5]),
                     0, attrs.isEmpty() ? NO_PARTS : Attributes.fromJson(attrs, text));
    }

    /** What the store keeps for a user after a walk: the encoded open rows and the event-time timeout Spark fires
     * at (timeout < watermark); null when nothing stays open (the key is removed). */
    record Stored(byte[] value, long timeout) {}

    static Stored stored(Walk walk, List<Attributes.Attr> attrs) {
        if (walk.open().isEmpty()) {
            return null;
        }
        return new Stored(StateCodec.encode(walk.open(), attrs), walk.due() - 1);  // Spark fires when timeout < watermark
    }

    /** A restored user's stored value: the user's `open` rows (a savepoint's, any order) put in WALK_ORDER (one value
     * whatever order they were read in), then walked as Fn walks a stored user, with no event at watermark 0 (nothing
     * closes or freezes; v1 rows and a new gap settle). The state writer (StateWriter) writes this without a batch. */
    static Stored restored(String user, List<R> open, Rules rules) {
        open.sort(WALK_ORDER);
        return stored(advance(user, open, List.of(), 0, rules), rules.attributes());
    }

    /** One open row of a user (a state row or a fresh event). `parts` is never written after the row is made: one
     * partial per attribute (Attributes), in the operator's attribute order. `seq` is the arrival order: the first
     * of two rows with one event_id wins, ties keep it. `id` null: a frozen prefix. */
    record R(long start, String id, long time, String type, long count, long views, int seq, Object[] parts) {
        R(long start, String id, long time, String type, long count, long views, int seq) {
            this(start, id, time, type, count, views, seq, NO_PARTS);
        }

        R withSeq(int order) {
            return new R(start, id, time, type, count, views, order, parts);
        }
    }

    static final Object[] NO_PARTS = new Object[0];

    /** What one user's walk leaves: the rows that stay open, the closed sessions' output rows, and the earliest due
     * (when a session closes or a row can be frozen; Long.MAX_VALUE if nothing is open). */
    record Walk(List<R> open, List<Row> closed, long due) {}

    // By time, then event_id as Python orders str (by code point; String.compareTo's UTF-16 order differs past
    // U+FFFF), then arrival: the Python core's walk order.
    static final Comparator<R> WALK_ORDER = Comparator
        .comparingLong((R r) -> r.time())
        .thenComparing((R r) -> r.id() == null ? "" : r.id(), SessionsOperator::compareCodePoints)
        .thenComparingInt(r -> r.seq());

    static int compareCodePoints(String a, String b) {
        int i = 0;
        int j = 0;
        while (i < a.length() && j < b.length()) {
            int x = a.codePointAt(i);
            int y = b.codePointAt(j);
            if (x != y) {
                return Integer.compare(x, y);
            }
            i += Character.charCount(x);
            j += Character.charCount(y);
        }
        return Integer.compare(a.length() - i, b.length() - j);
    }

    /** The core's rule for one user (pipelines.core.sessionize.advance): `rows` (stored, then a restore's) and `fresh`
     * (new events above the watermark, in arrival order), each with its partials of the rules' attributes -> the walk's result. */
    static Walk advance(String user, List<R> rows, List<R> fresh, long watermark, Rules rules) {
        long gapMs = rules.gapMs();
        List<Attributes.Attr> attrs = rules.attributes();
        // State rows first, then fresh events in arrival order: the first row of an event_id wins.
        List<R> walk = new ArrayList<>(rows.size() + fresh.size());
        Set<String> seen = new HashSet<>();
        int seq = 0;
        for (R r : rows) {
            if (r.id() == null || seen.add(r.id())) {
                walk.add(r.withSeq(seq++));
            }
        }
        for (R r : fresh) {
            if (seen.add(r.id())) {
                walk.add(r.withSeq(seq++));
            }
        }
        List<R> kept = new ArrayList<>();
        List<Row> out = new ArrayList<>();
        walk.sort(WALK_ORDER);
        long due = Long.MAX_VALUE;
        int n = walk.size();
        int first = 0;
        while (first < n) {
            int last = first;
            while (last + 1 < n && !LOGOUT.equals(walk.get(last).type())
                   && walk.get(last + 1).time() - walk.get(last).time() < gapMs) {
                last++;
            }
            R head = walk.get(first);
            R tail = walk.get(last);
            long start = head.id() == null ? head.start() : head.time();
            boolean logout = LOGOUT.equals(tail.type());
            long closeAt = logout ? tail.time() : tail.time() + gapMs;
            if (closeAt <= watermark) {
                long count = 0;
                long views = 0;
                for (int i = first; i <= last; i++) {
                    count += walk.get(i).count();
                    views += walk.get(i).views();
                }
                Object[] row = new Object[OUTPUT_NAMES.length + attrs.size()];
                Object[] fixed = {"session", sessionId(user, start), user, start, tail.time(), count, views,
                    logout ? "logout" : "inactivity"};
                System.arraycopy(fixed, 0, row, 0, fixed.length);  // event_id .. line_key: null for a session
                if (!attrs.isEmpty()) {
                    Object[] folded = Attributes.fold(attrs, walk, first, last);
                    for (int k = 0; k < folded.length; k++) {
                        row[OUTPUT_NAMES.length + k] = Attributes.result(folded[k]);
                    }
                }
                out.add(RowFactory.create(row));
            } else {
                due = Math.min(due, freeze(walk, first, last, start, closeAt, watermark, attrs, kept));
            }
            first = last + 1;
        }
        return new Walk(kept, out, due);
    }

    /** An open session's rows added to `kept` (the walk's own list, being built), those at or below the watermark
     * collapsed into one frozen prefix whose partials are theirs merged; returns the session's due: when it closes
     * or its next row can be frozen. */
    private static long freeze(List<R> walk, int first, int last, long start, long closeAt, long watermark,
                               List<Attributes.Attr> attrs, List<R> kept) {
        long due = closeAt;
        long count = 0;
        long views = 0;
        int frozenFrom = -1;
        R frozen = null;
        for (int i = first; i <= last; i++) {
            R r = walk.get(i);
            if (r.time() <= watermark) {
                count += r.count();
                views += r.views();
                if (frozen == null) {
                    frozenFrom = i;
                }
                frozen = r;
                continue;
            }
            if (frozen != null) {
                kept.add(prefix(walk, frozenFrom, i - 1, start, frozen, count, views, attrs));
                frozen = null;
            }
            kept.add(new R(start, r.id(), r.time(), r.type(), r.count(), r.views(), 0, r.parts()));
            if (r.id() != null) {  // a prefix restored under a lower watermark is still frozen
                due = Math.min(due, r.time());
            }
        }
        if (frozen != null) {
            kept.add(prefix(walk, frozenFrom, last, start, frozen, count, views, attrs));
        }
        return due;
    }

    /** The frozen prefix of walk rows [from, to]: its last event's time and type, their counts, their partials. */
    private static R prefix(List<R> walk, int from, int to, long start, R lastRow, long count, long views,
                            List<Attributes.Attr> attrs) {
        Object[] parts = attrs.isEmpty() ? NO_PARTS : Attributes.fold(attrs, walk, from, to);
        return new R(start, null, lastRow.time(), lastRow.type(), count, views, 0, parts);
    }

    static final class Fn implements FlatMapGroupsWithStateFunction<Tuple2<Long, String>, Row, byte[], Row> {
        private static final long serialVersionUID = 1L;
        private final Rules rules;
        private final List<Attributes.Attr> attrs;
        private final int[] ix;  // event_id, event_time_ms, event_type, ingest_seq, line_key
        private final int[] columns;  // per attribute: the keyed column it reads (-1: none, count_if)

        Fn(Rules rules, int[] ix, int[] columns) {
            this.rules = rules;
            this.attrs = rules.attributes();
            this.ix = ix.clone();
            this.columns = columns.clone();
        }

        @Override
        public Iterator<Row> call(Tuple2<Long, String> key, Iterator<Row> events, GroupState<byte[]> state) {
            String user = key._2();
            long watermark = state.getCurrentWatermarkMs();
            List<R> rows = state.exists() ? StateCodec.decode(state.get(), attrs) : new ArrayList<>();
            List<Row> out = new ArrayList<>();
            List<R> fresh = new ArrayList<>();
            if (!state.hasTimedOut()) {
                while (events.hasNext()) {
                    Row e = events.next();
                    String id = e.isNullAt(ix[0]) ? null : e.getString(ix[0]);
                    long time = e.getLong(ix[1]);
                    String type = e.isNullAt(ix[2]) ? null : e.getString(ix[2]);
                    if (time <= watermark) {
                        Object[] late = new Object[OUTPUT_NAMES.length + attrs.size()];
                        Object[] fixed = {"late", null, user, null, null, null, null, null, id, time, type,
                            e.isNullAt(ix[3]) ? null : e.getLong(ix[3]), e.isNullAt(ix[4]) ? null : e.getLong(ix[4])};
                        System.arraycopy(fixed, 0, late, 0, fixed.length);
                        out.add(RowFactory.create(late));
                    } else {
                        Object[] parts = attrs.isEmpty() ? NO_PARTS : Attributes.eventPartials(attrs, type, e, columns);
                        fresh.add(new R(time, id, time, type, 1, PAGE_VIEW.equals(type) ? 1 : 0, 0, parts));
                    }
                }
            }
            Walk walk = advance(user, rows, fresh, watermark, rules);
            out.addAll(walk.closed());
            Stored kept = stored(walk, attrs);
            if (kept == null) {
                if (state.exists()) {
                    state.remove();
                }
            } else {
                state.update(kept.value());
                state.setTimeoutTimestamp(kept.timeout());
            }
            return out.iterator();
        }

    }

    /** pipelines.core.sessionize.session_id: the same session gets the same id on every replay, restore and rescale. */
    public static String sessionId(String user, long startMs) {
        byte[] digest = SHA256.get().digest((user + "\u001f" + startMs).getBytes(StandardCharsets.UTF_8));
        StringBuilder hex = new StringBuilder(32);
        for (int i = 0; i < 16; i++) {
            hex.append(Character.forDigit((digest[i] >> 4) & 0xf, 16)).append(Character.forDigit(digest[i] & 0xf, 16));
        }
        return hex.toString();
    }

    private static final ThreadLocal<MessageDigest> SHA256 = ThreadLocal.withInitial(() -> {
        try {
            return MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    });
}
