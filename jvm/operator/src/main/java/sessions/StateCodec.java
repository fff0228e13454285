package sessions;

import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/**
 * The JVM operator's state value: one user's open rows (SessionsOperator.R) as bytes. The one owner of this format;
 * Python reads it only through DecodeState (a SQL function), never byte by byte.
 *
 * A version byte, the row count, then per row (unsigned varints; zig-zag where a value can be negative):
 * <ul>
 * <li>v2 (written): event_time_ms as a zig-zag delta from the previous row's (the first from 0), event_time_ms -
 *     session_start_ms, event_count, page_views; event_id: 0 = null (a frozen prefix), 1 = a canonical lowercase
 *     UUID as 16 bytes, else 2 + the suffix's UTF-8 length, the length of the prefix it shares with the previous
 *     non-UUID id's UTF-8 bytes, the suffix; event_type: 0 = null, 1 = page_view, 2 = logout, 3 = a new type (UTF-8
 *     length, bytes; it joins the value's dictionary), 4 + k = the k-th type of that dictionary.</li>
 * <li>v3 (written when the session spec has attributes; a job without them writes v2): the v2 layout, with after
 *     the row count a header -- the attribute count, then per attribute its 4-byte fingerprint (Attributes.Attr) and
 *     its partial's encoding byte -- and after each row's v2 fields one partial per header attribute: 0 = null (no
 *     non-null value yet), 2 = unknown (stored before the attribute existed), 1 + the value: count and long as
 *     zig-zag varints, a double as 8 bytes, a double sum as its component count and 8 bytes each, a string as UTF-8
 *     length and bytes, a boolean as one byte; 3 (count and long only) + an exact integer beyond 64 bits (a long sum
 *     past the range, kept exact until its session closes) as a varint byte length and BigInteger.toByteArray()'s
 *     bytes. A value is read under the current attributes by fingerprint: one it lacks is unknown, one the spec no
 *     longer has is skipped (the encoding byte says how).</li>
 * <li>v1 (read, never written since v2): event_time_ms zig-zag, the start delta, event_count, page_views, event_id
 *     (0 = null, else 1 + UTF-8 length, bytes), event_type (0 = null, 1 = page_view, 2 = logout, else 3 + UTF-8
 *     length, bytes).</li>
 * </ul>
 * A v1 value is rewritten as v2 when its user is next touched: no migration step, a checkpoint may hold both. v2
 * writes about a third fewer bytes on short ids and half on UUIDs (benchmarks/README.md). A binary value is what Spark
 * stores and copies as it is: the timeout pass, which reads every key of the partition each batch, copies bytes
 * instead of building rows of arrays of structs.
 */
public final class StateCodec {
    public static final String VALUE_FORMAT = "open_sessions_by_user/jvm-v2:varint rows of "
        + "(event_time_ms delta, start delta, event_count, page_views, event_id front-coded or UUID, event_type "
        + "dictionary); jvm-v3: v2 with attribute partials; reads jvm-v1";
    static final byte VERSION_1 = 1;  // read only: tests/test_jvm_operator.py writes v1 values by the spec above
    static final byte VERSION = 2;
    static final byte VERSION_3 = 3;

    private StateCodec() {}

    public static byte[] encode(List<SessionsOperator.R> rows) {
        return encode(rows, List.of());
    }

    /** Rows whose partials are of `attrs` (in that order): v2 when there are none, else v3. */
    public static byte[] encode(List<SessionsOperator.R> rows, List<Attributes.Attr> attrs) {
        Out out = new Out(16 + rows.size() * (24 + 8 * attrs.size()));
        out.buf[out.len++] = attrs.isEmpty() ? VERSION : VERSION_3;
        out.varint(rows.size());
        byte[] encodings = new byte[attrs.size()];
        if (!attrs.isEmpty()) {
            out.varint(attrs.size());
            for (int k = 0; k < encodings.length; k++) {
                encodings[k] = attrs.get(k).encoding();
                out.fixedInt(attrs.get(k).fingerprint());
                out.room(1);
                out.buf[out.len++] = encodings[k];
            }
        }
        long previousTime = 0;
        byte[] previousId = new byte[0];
        List<String> types = new ArrayList<>(2);
        for (SessionsOperator.R r : rows) {
            long delta = r.time() - previousTime;
            out.varint((delta << 1) ^ (delta >> 63));
            previousTime = r.time();
            out.varint(r.time() - r.start());
            out.varint(r.count());
            out.varint(r.views());
            if (r.id() == null) {
                out.varint(0);
            } else if (isUuid(r.id())) {
                out.varint(1);
                out.uuid(r.id());
            } else {
                byte[] id = r.id().getBytes(StandardCharsets.UTF_8);
                int shared = 0;
                int most = Math.min(id.length, previousId.length);
                while (shared < most && id[shared] == previousId[shared]) {
                    shared++;
                }
                out.varint(2 + id.length - shared);
                out.varint(shared);
                out.bytes(id, shared, id.length - shared);
                previousId = id;
            }
            if (r.type() == null) {
                out.varint(0);
            } else if (SessionsOperator.PAGE_VIEW.equals(r.type())) {
                out.varint(1);
            } else if (SessionsOperator.LOGOUT.equals(r.type())) {
                out.varint(2);
            } else {
                int k = types.indexOf(r.type());
                if (k >= 0) {
                    out.varint(4 + k);
                } else {
                    byte[] type = r.type().getBytes(StandardCharsets.UTF_8);
                    out.varint(3);
                    out.varint(type.length);
                    out.bytes(type, 0, type.length);
                    types.add(r.type());
                }
            }
            for (int k = 0; k < encodings.length; k++) {
                out.partial(encodings[k], r.parts()[k]);
            }
        }
        byte[] value = new byte[out.len];
        System.arraycopy(out.buf, 0, value, 0, out.len);
        return value;
    }

    public static List<SessionsOperator.R> decode(byte[] value) {
        return decode(value, List.of());
    }

    /** A stored value's rows with their partials of `attrs` (in that order): unknown for an attribute the value does
     * not hold (every attribute, for a v1 or v2 value). */
    public static List<SessionsOperator.R> decode(byte[] value, List<Attributes.Attr> attrs) {
        In in = new In(value);
        byte version = value.length == 0 ? 0 : value[in.pos++];
        if (version == VERSION || version == VERSION_3) {
            return decodeV2(in, version == VERSION_3, attrs);
        }
        if (version == VERSION_1) {
            return withUnknown(decodeV1(in), attrs);
        }
        throw new IllegalStateException("state value of an unknown layout (version byte "
            + (value.length == 0 ? "missing" : Byte.toString(version)) + "; this build reads " + VALUE_FORMAT + ")");
    }

    private static List<SessionsOperator.R> withUnknown(List<SessionsOperator.R> rows, List<Attributes.Attr> attrs) {
        if (attrs.isEmpty()) {
            return rows;
        }
        List<SessionsOperator.R> out = new ArrayList<>(rows.size() + 8);
        for (SessionsOperator.R r : rows) {
            out.add(new SessionsOperator.R(r.start(), r.id(), r.time(), r.type(), r.count(), r.views(), r.seq(),
                                           Attributes.unknown(attrs.size())));
        }
        return out;
    }

    private static List<SessionsOperator.R> decodeV2(In in, boolean withPartials, List<Attributes.Attr> attrs) {
        int n = (int) in.varint();
        List<SessionsOperator.R> rows = new ArrayList<>(n + 8);
        // v3: the value's attributes (fingerprint, encoding) and where each lands among `attrs` (-1: not there)
        byte[] encodings = new byte[0];
        int[] target = new int[0];
        if (withPartials) {
            int stored = (int) in.varint();
            encodings = new byte[stored];
            target = new int[stored];
            for (int h = 0; h < stored; h++) {
                int fingerprint = in.fixedInt();
                encodings[h] = in.buf[in.pos++];
                target[h] = -1;
                for (int k = 0; k < attrs.size(); k++) {
                    if (attrs.get(k).fingerprint() == fingerprint && attrs.get(k).encoding() == encodings[h]) {
                        target[h] = k;
                    }
                }
            }
        }
        long time = 0;
        byte[] previousId = new byte[0];
        List<String> types = new ArrayList<>(2);
        for (int i = 0; i < n; i++) {
            long zig = in.varint();
            time += (zig >>> 1) ^ -(zig & 1);
            long start = time - in.varint();
            long count = in.varint();
            long views = in.varint();
            long idTag = in.varint();
            String id;
            if (idTag == 0) {
                id = null;
            } else if (idTag == 1) {
                id = in.uuid();
            } else {
                int suffix = (int) idTag - 2;
                int shared = (int) in.varint();
                byte[] bytes = new byte[shared + suffix];
                System.arraycopy(previousId, 0, bytes, 0, shared);
                System.arraycopy(in.buf, in.pos, bytes, shared, suffix);
                in.pos += suffix;
                id = new String(bytes, StandardCharsets.UTF_8);
                previousId = bytes;
            }
            long typeTag = in.varint();
            String type;
            if (typeTag == 0) {
                type = null;
            } else if (typeTag == 1) {
                type = SessionsOperator.PAGE_VIEW;
            } else if (typeTag == 2) {
                type = SessionsOperator.LOGOUT;
            } else if (typeTag == 3) {
                type = in.string((int) in.varint());
                types.add(type);
            } else {
                type = types.get((int) typeTag - 4);
            }
            Object[] parts = attrs.isEmpty() ? SessionsOperator.NO_PARTS : Attributes.unknown(attrs.size());
            for (int h = 0; h < encodings.length; h++) {
                Object partial = in.partial(encodings[h]);
                if (target[h] >= 0) {
                    parts[target[h]] = partial;
                }
            }
            rows.add(new SessionsOperator.R(start, id, time, type, count, views, i, parts));
        }
        return rows;
    }

    private static List<SessionsOperator.R> decodeV1(In in) {
        int n = (int) in.varint();
        List<SessionsOperator.R> rows = new ArrayList<>(n + 8);
        for (int i = 0; i < n; i++) {
            long zig = in.varint();
            long time = (zig >>> 1) ^ -(zig & 1);
            long start = time - in.varint();
            long count = in.varint();
            long views = in.varint();
            long idLen = in.varint();
            String id = idLen == 0 ? null : in.string((int) idLen - 1);
            long typeTag = in.varint();
            String type = typeTag == 0 ? null : typeTag == 1 ? SessionsOperator.PAGE_VIEW
                : typeTag == 2 ? SessionsOperator.LOGOUT : in.string((int) typeTag - 3);
            rows.add(new SessionsOperator.R(start, id, time, type, count, views, i));
        }
        return rows;
    }

    /** A canonical lowercase UUID (8-4-4-4-12 hex digits): stored as its 16 bytes, read back as the same text. */
    static boolean isUuid(String id) {
        if (id.length() != 36) {
            return false;
        }
        for (int i = 0; i < 36; i++) {
            char c = id.charAt(i);
            if (i == 8 || i == 13 || i == 18 || i == 23) {
                if (c != '-') {
                    return false;
                }
            } else if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
                return false;
            }
        }
        return true;
    }

    private static final char[] HEX = "0123456789abcdef".toCharArray();

    private static final class Out {
        byte[] buf;
        int len;

        Out(int capacity) {
            buf = new byte[capacity];
        }

        void room(int n) {
            if (len + n > buf.length) {
                byte[] bigger = new byte[Math.max(buf.length * 2, len + n)];
                System.arraycopy(buf, 0, bigger, 0, len);
                buf = bigger;
            }
        }

        void varint(long v) {
            room(10);
            while ((v & ~0x7FL) != 0) {
                buf[len++] = (byte) ((v & 0x7F) | 0x80);
                v >>>= 7;
            }
            buf[len++] = (byte) v;
        }

        void zigzag(long v) {
            varint((v << 1) ^ (v >> 63));
        }

        void fixedInt(int v) {
            room(4);
            buf[len++] = (byte) (v >>> 24);
            buf[len++] = (byte) (v >>> 16);
            buf[len++] = (byte) (v >>> 8);
            buf[len++] = (byte) v;
        }

        void fixedDouble(double d) {
            long v = Double.doubleToRawLongBits(d);
            fixedInt((int) (v >>> 32));
            fixedInt((int) v);
        }

        void partial(byte encoding, Object p) {
            if (p == null) {
                varint(0);
                return;
            }
            if (p == Attributes.UNKNOWN) {
                varint(2);
                return;
            }
            if (p instanceof BigInteger big) {  // a long sum beyond 64 bits (Attributes.exactLongSum)
                byte[] twos = big.toByteArray();  // two's complement, big-endian
                varint(3);
                varint(twos.length);
                bytes(twos, 0, twos.length);
                return;
            }
            varint(1);
            switch (encoding) {
                case Attributes.COUNT, Attributes.LONG -> zigzag((Long) p);
                case Attributes.DOUBLE -> fixedDouble((Double) p);
                case Attributes.DOUBLE_SUM -> {
                    double[] parts = (double[]) p;
                    varint(parts.length);
                    for (double d : parts) {
                        fixedDouble(d);
                    }
                }
                case Attributes.STRING -> {
                    byte[] text = ((String) p).getBytes(StandardCharsets.UTF_8);
                    varint(text.length);
                    bytes(text, 0, text.length);
                }
                case Attributes.BOOLEAN -> {
                    room(1);
                    buf[len++] = (byte) ((Boolean) p ? 1 : 0);
                }
                default -> throw new IllegalStateException("no partial encoding " + encoding);
            }
        }

        void bytes(byte[] b, int offset, int n) {
            room(n);
            System.arraycopy(b, offset, buf, len, n);
            len += n;
        }

        void uuid(String id) {  // isUuid(id): two hex digits per byte, dashes skipped
            room(16);
            for (int i = 0; i < 36; i += 2) {
                if (id.charAt(i) == '-') {
                    i--;
                    continue;
                }
                buf[len++] = (byte) ((Character.digit(id.charAt(i), 16) << 4) | Character.digit(id.charAt(i + 1), 16));
            }
        }
    }

    private static final class In {
        final byte[] buf;
        int pos;

        In(byte[] buf) {
            this.buf = buf;
        }

        long varint() {
            long v = 0;
            int shift = 0;
            while (true) {
                byte b = buf[pos++];
                v |= (long) (b & 0x7F) << shift;
                if ((b & 0x80) == 0) {
                    return v;
                }
                shift += 7;
            }
        }

        int fixedInt() {
            int v = ((buf[pos] & 0xFF) << 24) | ((buf[pos + 1] & 0xFF) << 16) | ((buf[pos + 2] & 0xFF) << 8)
                | (buf[pos + 3] & 0xFF);
            pos += 4;
            return v;
        }

        double fixedDouble() {
            long high = fixedInt() & 0xFFFFFFFFL;
            long low = fixedInt() & 0xFFFFFFFFL;
            return Double.longBitsToDouble((high << 32) | low);
        }

        Object partial(byte encoding) {
            long tag = varint();
            if (tag == 0) {
                return null;
            }
            if (tag == 2) {
                return Attributes.UNKNOWN;
            }
            if (tag == 3) {
                if (encoding != Attributes.COUNT && encoding != Attributes.LONG) {
                    throw new IllegalStateException("state value with a big integer partial of encoding " + encoding
                        + " (this build reads " + VALUE_FORMAT + ")");
                }
                int n = (int) varint();
                BigInteger big = new BigInteger(buf, pos, n);
                pos += n;
                return Attributes.normalise(big);  // written normalised already; one representation whatever was read
            }
            return switch (encoding) {
                case Attributes.COUNT, Attributes.LONG -> {
                    long zig = varint();
                    yield (zig >>> 1) ^ -(zig & 1);
                }
                case Attributes.DOUBLE -> fixedDouble();
                case Attributes.DOUBLE_SUM -> {
                    double[] parts = new double[(int) varint()];
                    for (int i = 0; i < parts.length; i++) {
                        parts[i] = fixedDouble();
                    }
                    yield parts;
                }
                case Attributes.STRING -> string((int) varint());
                case Attributes.BOOLEAN -> buf[pos++] != 0;
                default -> throw new IllegalStateException("state value with an unknown partial encoding "
                    + encoding + " (this build reads " + VALUE_FORMAT + ")");
            };
        }

        String string(int n) {
            String s = new String(buf, pos, n, StandardCharsets.UTF_8);
            pos += n;
            return s;
        }

        String uuid() {
            char[] text = new char[36];
            int t = 0;
            for (int b = 0; b < 16; b++) {
                if (t == 8 || t == 13 || t == 18 || t == 23) {
                    text[t++] = '-';
                }
                int v = buf[pos++] & 0xFF;
                text[t++] = HEX[v >>> 4];
                text[t++] = HEX[v & 0xF];
            }
            return new String(text);
        }
    }
}
