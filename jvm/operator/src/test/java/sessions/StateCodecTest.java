package sessions;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.Random;
import java.util.UUID;

import org.junit.jupiter.api.Test;

/** StateCodec, the JVM operator's state value: v1 values (written here by hand from the format in StateCodec's
 * javadoc) still read, v2 values round trip, a hand-written v3 value's partials (a long sum beyond 64 bits among
 * them) read and are written byte for byte, anything else is refused naming its version byte. */
class StateCodecTest {

    // ---- v1: read only --------------------------------------------------------------------------------------------

    @Test
    void aHandWrittenV1ValueReadsAsItsRow() {
        // version 1, 1 row: time 105 (zig-zag 210 = 0xD2 0x01), start delta 5, count 1, views 1,
        // id "a" (1 + length 1, 'a'), type page_view (1).
        byte[] value = {1, 1, (byte) 0xD2, 0x01, 5, 1, 1, 2, 'a', 1};
        assertRows(List.of(row(100, "a", 105, "page_view", 1, 1)), StateCodec.decode(value));
    }

    @Test
    void v1ValuesReadEveryKindOfIdAndType() {
        List<Row> rows = List.of(
            row(1_700_000_000_000L, "evt-1", 1_700_000_000_000L, "page_view", 1, 1),
            row(1_700_000_000_000L, null, 1_700_000_060_000L, "logout", 7, 3),       // a frozen prefix
            row(-10_000, "événement-😀", -4_000, null, 1, 0),                           // before 1970: zig-zag < 0
            row(0, "x", 0, "add_to_cart", Long.MAX_VALUE, 1L << 40),
            row(5, "", 9, "ünïcode type", 2, 0));
        assertRows(rows, StateCodec.decode(v1(rows)));
    }

    @Test
    void anEmptyV1ValueHasNoRows() {
        assertRows(List.of(), StateCodec.decode(new byte[] {1, 0}));
    }

    // ---- v2: written and read -------------------------------------------------------------------------------------

    @Test
    void canonicalUuidIdsRoundTripAsSixteenBytes() {
        String uuid = "123e4567-e89b-42d3-a456-426614174000";
        assertTrue(StateCodec.isUuid(uuid));
        List<Row> one = List.of(row(1000, uuid, 1000, "page_view", 1, 1));
        List<Row> shortId = List.of(row(1000, "u", 1000, "page_view", 1, 1));
        roundTrips(one);
        // A one-character id costs 1 (tag + length) + 1 (shared) + 1 byte; the UUID its tag + 16 bytes.
        assertEquals(encode(shortId).length - 3 + 1 + 16, encode(one).length);
        // Not canonical (upper case, no dashes, one digit short): kept as text, read back exactly.
        String upper = uuid.toUpperCase(Locale.ROOT);
        String[] notCanonical = {upper, uuid.replace("-", ""), uuid.substring(1), "g" + uuid.substring(1)};
        for (String id : notCanonical) {
            assertFalse(StateCodec.isUuid(id), id);
        }
        roundTrips(Arrays.stream(notCanonical).map(id -> row(1000, id, 1000, "page_view", 1, 1)).toList());
        Random random = new Random(7);
        List<Row> many = new ArrayList<>();
        for (int i = 0; i < 200; i++) {
            many.add(row(1000, new UUID(random.nextLong(), random.nextLong()).toString(), 1000 + i, "page_view", 1, 1));
        }
        roundTrips(many);
    }

    @Test
    void idsSharingPrefixesAreFrontCoded() {
        List<Row> rows = new ArrayList<>();
        for (int i = 0; i < 50; i++) {
            rows.add(row(0, String.format(Locale.ROOT, "user-42/event-%06d", i), i * 1000L, "page_view", 1, 1));
        }
        roundTrips(rows);
        // The ids' bytes (a null id costs its 1-byte tag): the first whole (tag, shared length 0, its 20 bytes), then
        // each its tag, the shared length and the last digit, two digits where the tens change (10, 20, 30, 40).
        List<Row> noIds = rows.stream().map(r -> row(r.start(), null, r.time(), r.type(), r.count(), r.views())).toList();
        assertEquals(1 + 1 + 20 + 49 * (1 + 1 + 1) + 4, encode(rows).length - encode(noIds).length + rows.size());
        // A shorter id after a longer one, an id equal to the previous one, an id that is a prefix of the previous.
        roundTrips(List.of(row(0, "abcdef", 1, null, 1, 0), row(0, "abc", 2, null, 1, 0), row(0, "abc", 3, null, 1, 0),
                           row(0, "abcdefgh", 4, null, 1, 0), row(0, "b", 5, null, 1, 0), row(0, "", 6, null, 1, 0),
                           row(0, "b", 7, null, 1, 0)));
    }

    @Test
    void nonAsciiIdsRoundTripThroughSharedUtf8Bytes() {
        // "é" (C3 A9) and "è" (C3 A8) share their first UTF-8 byte: the shared prefix ends inside a character.
        roundTrips(List.of(row(0, "é", 1, "page_view", 1, 1), row(0, "è", 2, "page_view", 1, 1),
                           row(0, "èè-😀", 3, "clic", 1, 0), row(0, "èè-😁", 4, "clic", 1, 0),
                           row(0, "日本語のイベント", 5, "ページ", 1, 0), row(0, "日本語のイベント2", 6, "ページ", 1, 0),
                           row(0, "\u0000nul", 7, "logout", 1, 0)));
    }

    @Test
    void eventTypesAreADictionary() {
        String[] types = {"page_view", "logout", null, "add_to_cart", "search", "add_to_cart", "page_view", "search",
                          null, "logout", "add_to_cart", "ünïcode"};
        List<Row> rows = new ArrayList<>();
        for (int i = 0; i < types.length; i++) {
            rows.add(row(0, "e" + i, i, types[i], 1, "page_view".equals(types[i]) ? 1 : 0));
        }
        roundTrips(rows);
        // A type seen before in the value costs one byte, as page_view does; a new one its length too.
        List<Row> known = new ArrayList<>(rows);
        known.add(row(0, "e99", 99, "add_to_cart", 1, 0));
        List<Row> pageView = new ArrayList<>(rows);
        pageView.add(row(0, "e99", 99, "page_view", 1, 0));
        List<Row> fresh = new ArrayList<>(rows);
        fresh.add(row(0, "e99", 99, "checkout", 1, 0));
        assertEquals(encode(pageView).length, encode(known).length);
        assertEquals(encode(pageView).length + 1 + "checkout".length(), encode(fresh).length);
        roundTrips(known);
        roundTrips(fresh);
    }

    @Test
    void rowsOutOfTimeOrderHaveNegativeDeltas() {
        roundTrips(List.of(row(4000, "c", 5000, "page_view", 1, 1), row(1000, "a", 1000, "page_view", 1, 1),
                           row(1000, "b", 3000, null, 1, 0), row(-86_400_000, "z", -1, "logout", 1, 0),
                           row(Long.MIN_VALUE / 4, "y", Long.MAX_VALUE / 4, null, 1, 0),
                           row(Long.MIN_VALUE / 4, "w", Long.MIN_VALUE / 4, null, 1, 0)));
    }

    @Test
    void nullIdsAreFrozenPrefixes() {
        String uuid = "00000000-0000-4000-8000-000000000000";
        // The prefix a non-UUID id shares is with the previous non-UUID id, across null and UUID ids between them.
        roundTrips(List.of(row(0, "user-7/evt-001", 10, "page_view", 1, 1), row(0, null, 20, "logout", 12, 5),
                           row(0, uuid, 30, "page_view", 1, 1), row(0, "user-7/evt-002", 40, null, 1, 0),
                           row(50, null, 60, null, 3, 0), row(50, null, 60, "page_view", 1, 1)));
        roundTrips(List.of(row(0, null, 0, null, 0, 0)));
    }

    @Test
    void largeCountsAndManyRowsRoundTrip() {
        roundTrips(List.of(row(0, "a", 0, null, Long.MAX_VALUE, Long.MAX_VALUE), row(0, "b", 1, null, 0, 0),
                           row(0, "c", 2, null, 1L << 35, (1L << 35) - 1), row(0, "d", 3, null, 127, 128)));
        Random random = new Random(42);
        String[] types = {"page_view", "logout", null, "scroll", "add_to_cart"};
        List<Row> rows = new ArrayList<>();
        for (int i = 0; i < 2000; i++) {
            long time = 1_700_000_000_000L + random.nextInt(10_000_000) - 5_000_000;
            String id = switch (random.nextInt(4)) {
                case 0 -> null;
                case 1 -> new UUID(random.nextLong(), random.nextLong()).toString();
                case 2 -> "evt-" + random.nextInt(1000) + "-" + "x".repeat(random.nextInt(300));  // lengths past 127
                default -> "ü" + random.nextInt(50);
            };
            rows.add(row(time - random.nextInt(3_600_000), id, time, types[random.nextInt(types.length)],
                         1 + random.nextInt(1_000_000), random.nextInt(1_000_000)));
        }
        roundTrips(rows);
    }

    @Test
    void noRowsRoundTrip() {
        roundTrips(List.of());
    }

    // ---- v3: partials, by hand from the javadoc --------------------------------------------------------------------

    @Test
    void aHandWrittenV3ValueWithALongSumBeyond64BitsReadsAndIsWrittenTheSame() {
        Attributes.Attr sum = new Attributes.Attr("items", Attributes.fingerprint("items"), Attributes.Kind.SUM,
                                                  Attributes.Type.LONG, "field_items", List.of());
        int f = sum.fingerprint();
        byte[] value = {
            3, 3,                                                      // v3, 3 rows
            1, (byte) (f >>> 24), (byte) (f >>> 16), (byte) (f >>> 8), (byte) f, 1,  // 1 attribute: fingerprint, long
            // time 105 (zig-zag 210), start delta 5, count 1, views 1, no id, page_view; then 1 + -3 (zig-zag 5)
            (byte) 0xD2, 0x01, 5, 1, 1, 0, 1, 1, 5,
            // time +1 (zig-zag 2), start delta 6, ...; then 3 + 9 bytes: 2^63 in two's complement (0x00 0x80 0...)
            2, 6, 1, 1, 0, 1, 3, 9, 0, (byte) 0x80, 0, 0, 0, 0, 0, 0, 0,
            // time +1, start delta 7, ...; then 3 + 9 bytes: -(2^63) - 1 = 2^72 - 2^63 - 1 (0xFF 0x7F 0xFF...)
            2, 7, 1, 1, 0, 1, 3, 9, (byte) 0xFF, 0x7F, -1, -1, -1, -1, -1, -1, -1};
        List<SessionsOperator.R> rows = StateCodec.decode(value, List.of(sum));
        BigInteger twoTo63 = BigInteger.ONE.shiftLeft(63);
        assertEquals(List.of(-3L, twoTo63, twoTo63.negate().subtract(BigInteger.ONE)),
                     rows.stream().map(r -> r.parts()[0]).toList());
        assertEquals(List.of(105L, 106L, 107L), rows.stream().map(r -> r.time()).toList());
        assertArrayEquals(value, StateCodec.encode(rows, List.of(sum)));
        // a spec without the attribute skips the partials' bytes, whatever their tag
        assertRows(List.of(row(100, null, 105, "page_view", 1, 1), row(100, null, 106, "page_view", 1, 1),
                           row(100, null, 107, "page_view", 1, 1)), StateCodec.decode(value));
    }

    // ---- refused --------------------------------------------------------------------------------------------------

    @Test
    void anUnknownVersionByteIsRefusedByName() {
        for (byte version : new byte[] {0, 4, 9, 127, -1}) {
            byte[] value = {version, 1, 2, 0, 1, 1, 2, 'a', 1};
            IllegalStateException e = assertThrows(IllegalStateException.class, () -> StateCodec.decode(value));
            assertTrue(e.getMessage().contains("version byte " + version + ";"), e.getMessage());
            assertTrue(e.getMessage().contains(StateCodec.VALUE_FORMAT), e.getMessage());
        }
    }

    @Test
    void anEmptyValueIsRefused() {
        IllegalStateException e = assertThrows(IllegalStateException.class, () -> StateCodec.decode(new byte[0]));
        assertTrue(e.getMessage().contains("version byte missing"), e.getMessage());
    }

    @Test
    void v2IsWhatIsWritten() {
        assertEquals(2, encode(List.of())[0]);
        assertArrayEquals(encode(List.of(row(1, "a", 2, null, 1, 0))), encode(List.of(row(1, "a", 2, null, 1, 0))));
    }

    // ---- helpers --------------------------------------------------------------------------------------------------

    /** The fields of SessionsOperator.R the tests write and read. */
    private record Row(long start, String id, long time, String type, long count, long views) {}

    private static Row row(long start, String id, long time, String type, long count, long views) {
        return new Row(start, id, time, type, count, views);
    }

    private static List<SessionsOperator.R> rs(List<Row> rows) {
        List<SessionsOperator.R> out = new ArrayList<>();
        for (Row r : rows) {
            out.add(new SessionsOperator.R(r.start(), r.id(), r.time(), r.type(), r.count(), r.views(), out.size()));
        }
        return out;
    }

    private static void assertRows(List<Row> expected, List<SessionsOperator.R> actual) {
        List<Row> read = new ArrayList<>();
        for (SessionsOperator.R r : actual) {
            read.add(new Row(r.start(), r.id(), r.time(), r.type(), r.count(), r.views()));
        }
        assertEquals(expected, read);
    }

    private static byte[] encode(List<Row> rows) {
        return StateCodec.encode(rs(rows));
    }

    private static void roundTrips(List<Row> rows) {
        byte[] value = encode(rows);
        assertEquals(StateCodec.VERSION, value[0]);
        assertRows(rows, StateCodec.decode(value));
    }

    /** A v1 value as StateCodec's javadoc describes it. */
    private static byte[] v1(List<Row> rows) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        out.write(1);
        varint(out, rows.size());
        for (Row r : rows) {
            varint(out, (r.time() << 1) ^ (r.time() >> 63));
            varint(out, r.time() - r.start());
            varint(out, r.count());
            varint(out, r.views());
            String id = r.id();
            if (id == null) {
                varint(out, 0);
            } else {
                byte[] bytes = id.getBytes(StandardCharsets.UTF_8);
                varint(out, 1 + bytes.length);
                out.writeBytes(bytes);
            }
            String type = r.type();
            if (type == null) {
                varint(out, 0);
            } else if (type.equals("page_view")) {
                varint(out, 1);
            } else if (type.equals("logout")) {
                varint(out, 2);
            } else {
                byte[] bytes = type.getBytes(StandardCharsets.UTF_8);
                varint(out, 3 + bytes.length);
                out.writeBytes(bytes);
            }
        }
        return out.toByteArray();
    }

    private static void varint(ByteArrayOutputStream out, long v) {
        while ((v & ~0x7FL) != 0) {
            out.write((int) ((v & 0x7F) | 0x80));
            v >>>= 7;
        }
        out.write((int) v);
    }
}
