package sessions;

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
        + "dictionary); reads jvm-v1";
    static final byte VERSION_1 = 1;  // read only: tests/test_jvm_operator.py writes v1 values by the spec above
    static final byte VERSION = 2;

    private StateCodec() {}

    public static byte[] encode(List<SessionsOperator.R> rows) {
        Out out = new Out(16 + rows.size() * 24);
        out.buf[out.len++] = VERSION;
        out.varint(rows.size());
        long previousTime = 0;
        byte[] previousId = new byte[0];
        List<String> types = new ArrayList<>(2);
        for (SessionsOperator.R r : rows) {
            long delta = r.time - previousTime;
            out.varint((delta << 1) ^ (delta >> 63));
            previousTime = r.time;
            out.varint(r.time - r.start);
            out.varint(r.count);
            out.varint(r.views);
            if (r.id == null) {
                out.varint(0);
            } else if (isUuid(r.id)) {
                out.varint(1);
                out.uuid(r.id);
            } else {
                byte[] id = r.id.getBytes(StandardCharsets.UTF_8);
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
            if (r.type == null) {
                out.varint(0);
            } else if (SessionsOperator.PAGE_VIEW.equals(r.type)) {
                out.varint(1);
            } else if (SessionsOperator.LOGOUT.equals(r.type)) {
                out.varint(2);
            } else {
                int k = types.indexOf(r.type);
                if (k >= 0) {
                    out.varint(4 + k);
                } else {
                    byte[] type = r.type.getBytes(StandardCharsets.UTF_8);
                    out.varint(3);
                    out.varint(type.length);
                    out.bytes(type, 0, type.length);
                    types.add(r.type);
                }
            }
        }
        byte[] value = new byte[out.len];
        System.arraycopy(out.buf, 0, value, 0, out.len);
        return value;
    }

    public static List<SessionsOperator.R> decode(byte[] value) {
        In in = new In(value);
        byte version = value.length == 0 ? 0 : value[in.pos++];
        if (version == VERSION) {
            return decodeV2(in);
        }
        if (version == VERSION_1) {
            return decodeV1(in);
        }
        throw new IllegalStateException("state value of an unknown layout (version byte "
            + (value.length == 0 ? "missing" : Byte.toString(version)) + "; this build reads " + VALUE_FORMAT + ")");
    }

    private static List<SessionsOperator.R> decodeV2(In in) {
        int n = (int) in.varint();
        List<SessionsOperator.R> rows = new ArrayList<>(n + 8);
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
            rows.add(new SessionsOperator.R(start, id, time, type, count, views, i));
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
