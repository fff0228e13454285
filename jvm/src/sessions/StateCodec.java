package sessions;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/**
 * The JVM operator's state value: one user's open rows (SessionsOperator.R) as bytes. The one owner of this format;
 * Python reads it only through DecodeState (a SQL function), never byte by byte.
 *
 * Layout: a version byte, the row count, then per row: event_time_ms, event_time_ms - session_start_ms, event_count,
 * page_views (unsigned varints, the time zig-zag), event_id (0 = null / frozen prefix, else 1 + UTF-8 length, then
 * the bytes) and event_type (0 = null, 1 = page_view, 2 = logout, else 3 + UTF-8 length, then the bytes). A binary
 * value is what Spark stores and copies as it is: the timeout pass, which reads every key of the partition each batch,
 * copies bytes instead of building rows of arrays of structs.
 */
public final class StateCodec {
    public static final String SCHEMA_ID = "open_sessions_by_user/jvm-v1:varint rows of "
        + "(event_time_ms, start delta, event_count, page_views, event_id, event_type)";
    static final byte VERSION = 1;

    private StateCodec() {}

    public static byte[] encode(List<SessionsOperator.R> rows) {
        Out out = new Out(16 + rows.size() * 40);
        out.buf[out.len++] = VERSION;
        out.varint(rows.size());
        for (SessionsOperator.R r : rows) {
            out.varint((r.time << 1) ^ (r.time >> 63));
            out.varint(r.time - r.start);
            out.varint(r.count);
            out.varint(r.views);
            if (r.id == null) {
                out.varint(0);
            } else {
                byte[] id = r.id.getBytes(StandardCharsets.UTF_8);
                out.varint(1 + id.length);
                out.bytes(id);
            }
            if (r.type == null) {
                out.varint(0);
            } else if (SessionsOperator.PAGE_VIEW.equals(r.type)) {
                out.varint(1);
            } else if (SessionsOperator.LOGOUT.equals(r.type)) {
                out.varint(2);
            } else {
                byte[] type = r.type.getBytes(StandardCharsets.UTF_8);
                out.varint(3 + type.length);
                out.bytes(type);
            }
        }
        byte[] value = new byte[out.len];
        System.arraycopy(out.buf, 0, value, 0, out.len);
        return value;
    }

    public static List<SessionsOperator.R> decode(byte[] value) {
        In in = new In(value);
        if (value.length == 0 || value[in.pos++] != VERSION) {
            throw new IllegalStateException("state value of an unknown layout (version byte "
                + (value.length == 0 ? "missing" : Byte.toString(value[0])) + "; this build reads " + SCHEMA_ID + ")");
        }
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

        void bytes(byte[] b) {
            room(b.length);
            System.arraycopy(b, 0, buf, len, b.length);
            len += b.length;
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
    }
}
