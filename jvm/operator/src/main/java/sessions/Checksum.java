package sessions;

import java.io.IOException;
import java.math.BigDecimal;
import java.math.MathContext;
import java.math.RoundingMode;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;

import com.fasterxml.jackson.core.json.JsonReadFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.json.JsonMapper;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.IntegralType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.TimestampNTZType;
import org.apache.spark.sql.types.TimestampType;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The savepoint checksum in the JVM: a frame's rows hashed where they are, with no Python worker. The algorithm's
 * owner and specification is state_store/savepoint/checksum.py (its docstring spells out every byte); this computes the
 * same values -- tests hold the two together on rows built to differ -- so that a checksum Python wrote (a savepoint's
 * catalog row) can be checked by a job of the JVM.
 *
 * <p>A row's text is its fields in column order joined by U+001F: a string as it is, an integer, boolean or timestamp
 * (microseconds since the epoch) as decimal text, a null as "" (a null event_type as U+0000), and `attributes` as its
 * JSON re-written the way Python's json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False) writes it,
 * left out with its separator when null or an empty value. Its hash is SipHash-2-4 of the text's UTF-8 bytes, keyed
 * "0123456789123456", then the splitmix64 finalizer; a frame's checksum is its row count and the wrapping sum.
 */
public final class Checksum {
    // (before K0 and K1, which it reads)
    private static final java.lang.invoke.VarHandle WORD =
        java.lang.invoke.MethodHandles.byteArrayViewVarHandle(long[].class, java.nio.ByteOrder.LITTLE_ENDIAN);

    private static final long K0 = littleEndian("01234567".getBytes(StandardCharsets.US_ASCII), 0);
    private static final long K1 = littleEndian("89123456".getBytes(StandardCharsets.US_ASCII), 0);
    private static final byte SEPARATOR = 0x1f;
    private static final String OPTIONAL = "attributes";
    private static final ObjectMapper JSON = JsonMapper.builder()
        .enable(JsonReadFeature.ALLOW_NON_NUMERIC_NUMBERS).build();  // Python's json reads NaN and Infinity

    private Checksum() {}

    /** {rows, wrapping sum of the row hashes} of `rows` (their columns, in order, are what is hashed), computed by its
     * tasks: state_store.savepoint.checksum.frame_checksum's answer. */
    public static long[] frame(Dataset<Row> rows) {
        List<Column> columns = new ArrayList<>();
        List<Kind> kinds = new ArrayList<>();
        for (StructField field : rows.schema().fields()) {
            DataType type = field.dataType();
            Column column = rows.col(field.name());
            Kind kind;
            if (type instanceof StringType) {
                kind = OPTIONAL.equals(field.name()) ? Kind.ATTRIBUTES
                    : "event_type".equals(field.name()) ? Kind.EVENT_TYPE : Kind.STRING;
            } else if (type instanceof TimestampType || type instanceof TimestampNTZType) {
                column = functions.unix_micros(column.cast(DataTypes.TimestampType));
                kind = Kind.LONG;
            } else if (type instanceof IntegralType || type instanceof BooleanType) {
                column = column.cast(DataTypes.IntegerType.equals(type) || type instanceof BooleanType
                                     ? DataTypes.IntegerType : DataTypes.LongType).cast(DataTypes.LongType);
                kind = Kind.LONG;
            } else {
                throw new IllegalArgumentException("no checksum text for column " + field.name() + " of type "
                                                   + type.simpleString());
            }
            columns.add(column.alias(field.name()));
            kinds.add(kind);
        }
        Kind[] k = kinds.toArray(new Kind[0]);
        List<long[]> parts = rows.select(columns.toArray(new Column[0])).queryExecution().toRdd().toJavaRDD()
            .mapPartitions((FlatMapFunction<Iterator<InternalRow>, long[]>) it -> partial(it, k)).collect();
        long count = 0;
        long sum = 0;
        for (long[] p : parts) {
            count += p[0];
            sum += p[1];
        }
        return new long[] {count, sum};
    }

    private enum Kind { STRING, EVENT_TYPE, LONG, ATTRIBUTES }

    private static Iterator<long[]> partial(Iterator<InternalRow> rows, Kind[] kinds) throws IOException {
        long count = 0;
        long sum = 0;
        Text text = new Text();
        while (rows.hasNext()) {
            InternalRow row = rows.next();
            text.reset();
            for (int i = 0; i < kinds.length; i++) {
                boolean isNull = row.isNullAt(i);
                if (kinds[i] == Kind.ATTRIBUTES) {
                    String json = isNull ? null : attributesText(row.getUTF8String(i).toString());
                    if (json != null) {  // null: neither the field nor its separator
                        text.separate();
                        text.utf8(json);
                    }
                    continue;
                }
                text.separate();
                if (isNull) {
                    if (kinds[i] == Kind.EVENT_TYPE) {
                        text.put((byte) 0);
                    }
                } else if (kinds[i] == Kind.LONG) {
                    text.decimal(row.getLong(i));
                } else {
                    text.utf8(row.getUTF8String(i));
                }
            }
            sum += mix(text.sipHash24());
            count++;
        }
        return List.of(new long[] {count, sum}).iterator();
    }

    /** A row's text under construction, one buffer reused row after row (no lock, no copy per field): the separator
     * goes before every field but the first; numbers are written as decimal digits in place. */
    static final class Text {
        private byte[] buf = new byte[256];
        private final byte[] digits = new byte[19];  // Long.MAX_VALUE's
        private int size;
        private boolean first = true;

        void reset() {
            size = 0;
            first = true;
        }

        void separate() {
            if (!first) {
                put(SEPARATOR);
            }
            first = false;
        }

        private void room(int more) {
            if (size + more > buf.length) {
                buf = java.util.Arrays.copyOf(buf, Math.max(buf.length * 2, size + more));
            }
        }

        void put(byte b) {
            room(1);
            buf[size++] = b;
        }

        void utf8(UTF8String s) {
            int n = s.numBytes();
            room(n);
            s.writeToMemory(buf, Platform.BYTE_ARRAY_OFFSET + size);
            size += n;
        }

        void utf8(String s) {
            int n = s.length();
            room(n);
            for (int i = 0; i < n; i++) {  // ASCII, the usual case, byte by byte; else the JDK's encoder
                char c = s.charAt(i);
                if (c >= 0x80) {
                    byte[] bytes = s.getBytes(StandardCharsets.UTF_8);
                    room(bytes.length);
                    System.arraycopy(bytes, 0, buf, size, bytes.length);
                    size += bytes.length;
                    return;
                }
                buf[size + i] = (byte) c;
            }
            size += n;
        }

        /** `v` as Long.toString spells it: its digits from the last, one division each. */
        void decimal(long v) {
            if (v == Long.MIN_VALUE) {
                utf8(Long.toString(v));
                return;
            }
            room(20);
            if (v < 0) {
                buf[size++] = '-';
                v = -v;
            }
            int at = digits.length;
            do {
                long q = v / 10;
                digits[--at] = (byte) ('0' + (v - q * 10));
                v = q;
            } while (v != 0);
            System.arraycopy(digits, at, buf, size, digits.length - at);
            size += digits.length - at;
        }

        long sipHash24() {
            return Checksum.sipHash24(buf, size);
        }
    }

    /** The hash of one canonical row (CANONICAL_DDL's columns, then `attributes` when the job has any) of `user`'s
     * stored row `r` under the attributes `attrs`: what a frame of the state's canonical rows hashes for it. Its text
     * is built in `text`, a buffer the caller reuses row after row. */
    static long canonicalRow(Text text, String user, SessionsOperator.R r, List<Attributes.Attr> attrs)
            throws IOException {
        text.reset();
        text.separate();
        text.utf8(user);
        text.separate();
        text.decimal(Math.multiplyExact(r.start(), 1000L));
        text.separate();
        if (r.id() != null) {
            text.utf8(r.id());
        }
        text.separate();
        text.decimal(Math.multiplyExact(r.time(), 1000L));
        text.separate();
        if (r.type() == null) {
            text.put((byte) 0);
        } else {
            text.utf8(r.type());
        }
        text.separate();
        text.decimal(r.count());
        text.separate();
        text.decimal(r.views());
        String json = Attributes.toJson(attrs, r.parts());
        String hashed = json == null ? null : attributesText(json);
        if (hashed != null) {
            text.separate();
            text.utf8(hashed);
        }
        return mix(text.sipHash24());
    }

    /** One row's hash of its text (state_store.savepoint.checksum.row_hashes). */
    public static long rowHash(String text) {
        byte[] bytes = text.getBytes(StandardCharsets.UTF_8);
        return mix(sipHash24(bytes, bytes.length));
    }

    /** The splitmix64 finalizer pandas' hash_array applies to each SipHash value. */
    static long mix(long h) {
        h ^= h >>> 30;
        h *= 0xBF58476D1CE4E5B9L;
        h ^= h >>> 27;
        h *= 0x94D049BB133111EBL;
        h ^= h >>> 31;
        return h;
    }

    /** SipHash-2-4 (the reference algorithm) of data[0..length) under the checksum's key. */
    static long sipHash24(byte[] data, int length) {
        long v0 = K0 ^ 0x736f6d6570736575L;
        long v1 = K1 ^ 0x646f72616e646f6dL;
        long v2 = K0 ^ 0x6c7967656e657261L;
        long v3 = K1 ^ 0x7465646279746573L;
        int whole = length - (length % 8);
        for (int at = 0; at <= whole; at += 8) {
            long m;
            if (at < whole) {
                m = (long) WORD.get(data, at);
            } else {  // the last, partial word with the length in its top byte
                m = ((long) length) << 56;
                for (int i = 0; i < length % 8; i++) {
                    m |= (data[whole + i] & 0xFFL) << (8 * i);
                }
            }
            v3 ^= m;
            for (int round = 0; round < 2; round++) {
                v0 += v1; v1 = Long.rotateLeft(v1, 13); v1 ^= v0; v0 = Long.rotateLeft(v0, 32);
                v2 += v3; v3 = Long.rotateLeft(v3, 16); v3 ^= v2;
                v0 += v3; v3 = Long.rotateLeft(v3, 21); v3 ^= v0;
                v2 += v1; v1 = Long.rotateLeft(v1, 17); v1 ^= v2; v2 = Long.rotateLeft(v2, 32);
            }
            v0 ^= m;
        }
        v2 ^= 0xff;
        for (int round = 0; round < 4; round++) {
            v0 += v1; v1 = Long.rotateLeft(v1, 13); v1 ^= v0; v0 = Long.rotateLeft(v0, 32);
            v2 += v3; v3 = Long.rotateLeft(v3, 16); v3 ^= v2;
            v0 += v3; v3 = Long.rotateLeft(v3, 21); v3 ^= v0;
            v2 += v1; v1 = Long.rotateLeft(v1, 17); v1 ^= v2; v2 = Long.rotateLeft(v2, 32);
        }
        return v0 ^ v1 ^ v2 ^ v3;
    }

    private static long littleEndian(byte[] data, int at) {
        return (long) WORD.get(data, at);
    }

    /** A row's `attributes` as hashed: its JSON as Python's json.loads then json.dumps(sort_keys=True,
     * separators=(",", ":"), ensure_ascii=False) write it; null when Python's value is falsy (an empty object above
     * all: a row whose attributes are all unknown hashes as a row without attributes). */
    public static String attributesText(String json) throws IOException {
        JsonNode node = JSON.readTree(json);
        if (node == null || falsy(node)) {
            return null;
        }
        StringBuilder out = new StringBuilder(json.length());
        python(node, out);
        return out.toString();
    }

    private static boolean falsy(JsonNode node) {
        if (node.isNull() || node.isMissingNode()) {
            return true;
        }
        if (node.isContainerNode()) {
            return node.size() == 0;
        }
        if (node.isTextual()) {
            return node.textValue().isEmpty();
        }
        if (node.isBoolean()) {
            return !node.booleanValue();
        }
        if (node.isIntegralNumber()) {
            return node.bigIntegerValue().signum() == 0;
        }
        return node.isNumber() && node.doubleValue() == 0.0;
    }

    private static void python(JsonNode node, StringBuilder out) {
        if (node.isObject()) {
            List<Map.Entry<String, JsonNode>> fields = new ArrayList<>();
            fields.addAll(node.properties());
            fields.sort((a, b) -> compareCodePoints(a.getKey(), b.getKey()));
            out.append('{');
            for (int i = 0; i < fields.size(); i++) {
                if (i > 0) {
                    out.append(',');
                }
                string(fields.get(i).getKey(), out);
                out.append(':');
                python(fields.get(i).getValue(), out);
            }
            out.append('}');
        } else if (node.isArray()) {
            out.append('[');
            for (int i = 0; i < node.size(); i++) {
                if (i > 0) {
                    out.append(',');
                }
                python(node.get(i), out);
            }
            out.append(']');
        } else if (node.isTextual()) {
            string(node.textValue(), out);
        } else if (node.isIntegralNumber()) {
            out.append(node.bigIntegerValue().toString());
        } else if (node.isNumber()) {
            out.append(pythonFloat(node.doubleValue()));
        } else if (node.isBoolean()) {
            out.append(node.booleanValue() ? "true" : "false");
        } else {
            out.append("null");
        }
    }

    /** Python's ordering of str: by code point (Java's compareTo orders UTF-16 units). */
    private static int compareCodePoints(String a, String b) {
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
        return Boolean.compare(i < a.length(), j < b.length());
    }

    /** A JSON string as Python's json writes it with ensure_ascii=False. */
    private static void string(String s, StringBuilder out) {
        out.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                case '\b' -> out.append("\\b");
                case '\f' -> out.append("\\f");
                default -> {
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        out.append('"');
    }

    /** The fewest significant digits that read back as `d` (> 0), the nearer of the two candidates when both do: what
     * Python's repr prints (Java's Double.toString prints two digits where one would do, 4.9E-324 for 5e-324). */
    private static BigDecimal shortest(double d) {
        BigDecimal exact = new BigDecimal(d);
        for (int digits = 1; digits < 17; digits++) {
            BigDecimal down = exact.round(new MathContext(digits, RoundingMode.FLOOR));
            BigDecimal up = exact.round(new MathContext(digits, RoundingMode.CEILING));
            boolean downReads = down.doubleValue() == d;
            boolean upReads = up.doubleValue() == d;
            if (downReads && upReads) {  // the nearer; on a tie the even last digit, as Python's repr
                int nearer = exact.subtract(down).compareTo(up.subtract(exact));
                boolean downEven = !down.unscaledValue().testBit(0);
                return (nearer < 0 || (nearer == 0 && downEven) ? down : up).stripTrailingZeros();
            }
            if (downReads || upReads) {
                return (downReads ? down : up).stripTrailingZeros();
            }
        }
        return exact.round(new MathContext(17, RoundingMode.HALF_EVEN)).stripTrailingZeros();
    }

    /** Python's repr of a float: the shortest digits that read back as it, in fixed notation when the decimal point
     * falls within 16 digits of them and 4 zeros of it, else d.ddde±XX. */
    static String pythonFloat(double d) {
        if (Double.isNaN(d)) {
            return "NaN";
        }
        if (Double.isInfinite(d)) {
            return d > 0 ? "Infinity" : "-Infinity";
        }
        if (d == 0.0) {
            return (1 / d < 0) ? "-0.0" : "0.0";
        }
        BigDecimal shortest = shortest(Math.abs(d));
        String digits = shortest.unscaledValue().toString();
        int point = digits.length() - shortest.scale();  // where the decimal point falls, from the first digit
        StringBuilder out = new StringBuilder(d < 0 ? "-" : "");
        if (point > -4 && point <= 16) {
            if (point <= 0) {
                out.append("0.").append("0".repeat(-point)).append(digits);
            } else if (point >= digits.length()) {
                out.append(digits).append("0".repeat(point - digits.length())).append(".0");
            } else {
                out.append(digits, 0, point).append('.').append(digits.substring(point));
            }
        } else {
            out.append(digits.charAt(0));
            if (digits.length() > 1) {
                out.append('.').append(digits.substring(1));
            }
            int exponent = point - 1;
            out.append('e').append(exponent < 0 ? '-' : '+');
            out.append(String.format("%02d", Math.abs(exponent)));
        }
        return out.toString();
    }
}
