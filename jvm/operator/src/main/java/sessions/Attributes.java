package sessions;

import java.io.Serializable;
import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.List;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.spark.sql.Row;

/**
 * The session spec's attributes as the operator computes them: partial aggregates that merge in walk order, the same
 * rules as pipelines/core/attributes.py (the specification; tests hold the two together through the oracle).
 *
 * A partial is one of: null (no non-null value yet), {@link #UNKNOWN} (the row was stored before the attribute
 * existed: its session closes with null for it), a Long (count_if; sum, first, last, min, max of a long field), a
 * Double, a String or a Boolean (first, last, min, max of such a field), or a double[] for the sum of a double field:
 * the non-overlapping components of Shewchuk's exact summation, rounded once when the session closes, so the value
 * does not depend on where the walk was cut into frozen prefixes.
 *
 * The sum of a long field is kept exact: a Long while it fits in 64 bits, a BigInteger beyond (never a BigInteger that
 * fits, so a value has one representation and a row's text and hash stay canonical). Merging stays associative:
 * +MAX, +1, -1 gives MAX in any order and whatever the cuts. A closed session's value is that sum when it fits in a
 * signed 64-bit long, and null when it does not (an overflow).
 */
public final class Attributes {
    /** The partial of a row stored before its attribute existed. */
    public static final Object UNKNOWN = new Object() {
        @Override
        public String toString() {
            return "UNKNOWN";
        }
    };

    public enum Kind { FIRST, LAST, COUNT_IF, SUM, MIN, MAX }

    public enum Type { STRING, LONG, DOUBLE, BOOLEAN }

    /** How a partial is stored (StateCodec v3): one byte per attribute in a value's header, so that a value can be
     * read past an attribute the current spec no longer has. */
    static final byte COUNT = 0;
    static final byte LONG = 1;
    static final byte DOUBLE = 2;
    static final byte DOUBLE_SUM = 3;
    static final byte STRING = 4;
    static final byte BOOLEAN = 5;

    /** One attribute: its stored identity (pipelines.core.spec.Attribute.key) and a 4-byte fingerprint of it (what a
     * state value stores), its aggregate, its result type, the input column it reads (null for count_if) and the
     * event types count_if counts. */
    public record Attr(String key, int fingerprint, Kind kind, Type type, String column, List<String> eventTypes)
            implements Serializable {
        public Attr {
            eventTypes = List.copyOf(eventTypes);
        }

        byte encoding() {
            if (kind == Kind.COUNT_IF) {
                return COUNT;
            }
            return switch (type) {
                case LONG -> LONG;
                case DOUBLE -> kind == Kind.SUM ? DOUBLE_SUM : DOUBLE;
                case STRING -> STRING;
                case BOOLEAN -> BOOLEAN;
            };
        }

        /** The identity of a run with no rows. */
        Object identity() {
            return kind == Kind.COUNT_IF ? (Object) 0L : null;
        }
    }

    private static final ObjectMapper JSON = new ObjectMapper();

    private Attributes() {}

    /** The "attributes" of the rules' JSON (Rules.parse) -> the attributes, in output order. */
    static List<Attr> parse(JsonNode attributes) {
        List<Attr> out = new ArrayList<>();
        for (JsonNode a : attributes) {
            List<String> types = new ArrayList<>();
            a.get("event_types").forEach(t -> types.add(t.asText()));
            String key = a.get("key").asText();
            JsonNode column = a.get("column");
            out.add(new Attr(key, fingerprint(key), Kind.valueOf(a.get("aggregate").asText().toUpperCase()),
                             Type.valueOf(a.get("type").asText().toUpperCase()),
                             column == null || column.isNull() ? null : column.asText(), types));
        }
        return List.copyOf(out);
    }

    static int fingerprint(String key) {
        try {
            byte[] d = MessageDigest.getInstance("SHA-256").digest(key.getBytes(StandardCharsets.UTF_8));
            return ((d[0] & 0xFF) << 24) | ((d[1] & 0xFF) << 16) | ((d[2] & 0xFF) << 8) | (d[3] & 0xFF);
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    /** One event's partial: its field's value (null when absent or null), or 1/0 for count_if. */
    static Object eventPartial(Attr a, String eventType, Row event, int column) {
        if (a.kind() == Kind.COUNT_IF) {
            return eventType != null && a.eventTypes().contains(eventType) ? 1L : 0L;
        }
        if (column < 0 || event.isNullAt(column)) {
            return null;
        }
        return switch (a.type()) {
            case LONG -> event.getLong(column);
            case DOUBLE -> a.kind() == Kind.SUM ? new double[] {event.getDouble(column)} : (Object) event.getDouble(column);
            case STRING -> event.getString(column);
            case BOOLEAN -> event.getBoolean(column);
        };
    }

    /** One row's partials as text (pipelines.core.attributes.partials_to_json: keyed by Attr.key, an unknown one
     * left out, a double sum as its components); null when there are no attributes. */
    static String toJson(List<Attr> attrs, Object[] parts) {
        if (attrs.isEmpty()) {
            return null;
        }
        java.util.TreeMap<String, Object> sorted = new java.util.TreeMap<>();
        for (int k = 0; k < parts.length; k++) {
            if (parts[k] != UNKNOWN) {
                sorted.put(attrs.get(k).key(), parts[k]);
            }
        }
        try {
            return JSON.writeValueAsString(sorted);
        } catch (com.fasterxml.jackson.core.JsonProcessingException e) {
            throw new IllegalStateException(e);
        }
    }

    /** A row's text (toJson's, or Python's) -> its partials in `attrs` order (unknown where the text has no key). */
    static Object[] fromJson(List<Attr> attrs, String text) {
        Object[] parts = unknown(attrs.size());
        if (text == null || text.isEmpty() || attrs.isEmpty()) {
            return parts;
        }
        try {
            JsonNode stored = JSON.readTree(text);
            for (int k = 0; k < parts.length; k++) {
                JsonNode v = stored.get(attrs.get(k).key());
                if (v == null) {
                    continue;
                }
                parts[k] = v.isNull() ? null : switch (attrs.get(k).encoding()) {
                    // A long sum beyond 64 bits is a plain JSON number too (Jackson's and Python's json)
                    case COUNT, LONG -> v.canConvertToLong() ? (Object) v.asLong() : normalise(v.bigIntegerValue());
                    case DOUBLE -> v.asDouble();
                    case DOUBLE_SUM -> {
                        double[] sum = new double[v.size()];
                        for (int i = 0; i < sum.length; i++) {
                            sum[i] = v.get(i).asDouble();
                        }
                        yield sum;
                    }
                    case STRING -> v.asText();
                    case BOOLEAN -> v.asBoolean();
                    default -> throw new IllegalStateException("no partial encoding");
                };
            }
            return parts;
        } catch (java.io.IOException e) {
            throw new IllegalArgumentException("a state row's attributes are not JSON: " + text, e);
        }
    }

    /** The partials of one event, in `attrs` order. */
    static Object[] eventPartials(List<Attr> attrs, String eventType, Row event, int[] columns) {
        Object[] parts = new Object[attrs.size()];
        for (int i = 0; i < parts.length; i++) {
            parts[i] = eventPartial(attrs.get(i), eventType, event, columns[i]);
        }
        return parts;
    }

    /** Every attribute UNKNOWN: a row stored before these attributes existed. */
    static Object[] unknown(int n) {
        Object[] parts = new Object[n];
        java.util.Arrays.fill(parts, UNKNOWN);
        return parts;
    }

    /** The partial of two runs of a session's rows, `earlier` before `later` in walk order. */
    static Object merge(Attr a, Object earlier, Object later) {
        if (earlier == UNKNOWN || later == UNKNOWN) {
            return UNKNOWN;
        }
        if (a.kind() == Kind.COUNT_IF) {
            return (Long) earlier + (Long) later;
        }
        if (earlier == null) {
            return later;
        }
        if (later == null) {
            return earlier;
        }
        return switch (a.kind()) {
            case FIRST -> earlier;
            case LAST -> later;
            case SUM -> earlier instanceof double[] e ? exactSum(e, (double[]) later) : exactLongSum(earlier, later);
            // As Python's min/max: the earlier unless the later is strictly smaller/larger (-0.0 vs 0.0, NaN).
            case MIN -> less(later, earlier) ? later : earlier;
            case MAX -> less(earlier, later) ? later : earlier;
            case COUNT_IF -> throw new IllegalStateException("unreachable");
        };
    }

    /** The exact sum of two long partials (Long or BigInteger): a Long when it fits, else a BigInteger. */
    static Object exactLongSum(Object x, Object y) {
        if (x instanceof Long a && y instanceof Long b) {
            try {
                return Math.addExact(a, b);
            } catch (ArithmeticException overflow) {
                // the exact sum needs more than 64 bits: kept as a BigInteger below
            }
        }
        return normalise(big(x).add(big(y)));
    }

    private static BigInteger big(Object partial) {
        return partial instanceof BigInteger b ? b : BigInteger.valueOf((Long) partial);
    }

    /** One representation per value: a Long when it fits in 64 bits. */
    static Object normalise(BigInteger value) {
        return value.bitLength() < 64 ? (Object) value.longValueExact() : value;
    }

    private static boolean less(Object x, Object y) {
        if (x instanceof Long a) {
            return a < (Long) y;
        }
        return (Double) x < (Double) y;
    }

    /** The partials of rows [first, last] of `rows` (walk order) merged into one, per attribute. */
    static Object[] fold(List<Attr> attrs, List<SessionsOperator.R> rows, int first, int last) {
        Object[] out = new Object[attrs.size()];
        for (int k = 0; k < out.length; k++) {
            Attr a = attrs.get(k);
            Object folded = a.identity();
            for (int i = first; i <= last; i++) {
                folded = merge(a, folded, rows.get(i).parts()[k]);
            }
            out[k] = folded;
        }
        return out;
    }

    /** A closed session's column value: null when the attribute is unknown to part of the session; a double sum
     * rounded once; null for a long sum beyond 64 bits (an overflow: normalised, a BigInteger partial never fits). */
    static Object result(Object partial) {
        if (partial == UNKNOWN || partial instanceof BigInteger) {
            return null;
        }
        return partial instanceof double[] parts ? fsum(parts) : partial;
    }

    /** Non-overlapping components whose exact sum is that of both (Shewchuk; pipelines.core.attributes._exact_sum). */
    static double[] exactSum(double[] components, double[] more) {
        double[] out = components.clone();
        int n = out.length;
        for (double m : more) {
            double x = m;
            double[] kept = new double[n + 1];
            int k = 0;
            for (int i = 0; i < n; i++) {
                double y = out[i];
                if (Math.abs(x) < Math.abs(y)) {
                    double t = x;
                    x = y;
                    y = t;
                }
                double high = x + y;
                double low = y - (high - x);
                if (low != 0.0) {
                    kept[k++] = low;
                }
                x = high;
            }
            kept[k++] = x;
            out = kept;
            n = k;
        }
        return java.util.Arrays.copyOf(out, n);
    }

    /** The correctly rounded sum of `components` (CPython's math.fsum). */
    static double fsum(double[] components) {
        double[] p = exactSum(new double[0], components);
        int n = p.length;
        if (n == 0) {
            return 0.0;
        }
        double hi = p[--n];
        double lo = 0.0;
        while (n > 0) {
            double x = hi;
            double y = p[--n];
            hi = x + y;
            double yr = hi - x;
            lo = y - yr;
            if (lo != 0.0) {
                break;
            }
        }
        // Round half-even correctly when the rest would tip the last rounding (CPython's fsum).
        if (n > 0 && ((lo < 0.0 && p[n - 1] < 0.0) || (lo > 0.0 && p[n - 1] > 0.0))) {
            double y = lo * 2.0;
            double x = hi + y;
            double yr = x - hi;
            if (y == yr) {
                hi = x;
            }
        }
        return hi;
    }
}
