package sessions;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;

import java.math.BigInteger;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;

import org.junit.jupiter.api.Test;

/** Attributes (each kind's partial and merge, the exact double sum) and StateCodec v3 (partials stored per row, read
 * under another spec by fingerprint). The expected values are worked by hand or by BigDecimal, not by the code. */
class AttributesTest {

    private static Attributes.Attr attr(String key, Attributes.Kind kind, Attributes.Type type) {
        return new Attributes.Attr(key, Attributes.fingerprint(key), kind, type,
                                   kind == Attributes.Kind.COUNT_IF ? null : "field_x", List.of("purchase", "order"));
    }

    private static final Attributes.Attr FIRST = attr("first", Attributes.Kind.FIRST, Attributes.Type.STRING);
    private static final Attributes.Attr LAST = attr("last", Attributes.Kind.LAST, Attributes.Type.STRING);
    private static final Attributes.Attr COUNT = attr("count", Attributes.Kind.COUNT_IF, Attributes.Type.LONG);
    private static final Attributes.Attr SUM_LONG = attr("sum_long", Attributes.Kind.SUM, Attributes.Type.LONG);
    private static final Attributes.Attr SUM_DOUBLE = attr("sum_double", Attributes.Kind.SUM, Attributes.Type.DOUBLE);
    private static final Attributes.Attr MIN = attr("min", Attributes.Kind.MIN, Attributes.Type.DOUBLE);
    private static final Attributes.Attr MAX = attr("max", Attributes.Kind.MAX, Attributes.Type.LONG);
    private static final Attributes.Attr FLAG = attr("flag", Attributes.Kind.LAST, Attributes.Type.BOOLEAN);

    private static Object fold(Attributes.Attr a, Object... partials) {
        Object folded = a.identity();
        for (Object p : partials) {
            folded = Attributes.merge(a, folded, p);
        }
        return folded;
    }

    @Test
    void firstAndLastSkipNullsAndKeepWalkOrder() {
        assertEquals("/a", fold(FIRST, null, "/a", null, "/b"));
        assertEquals("/b", fold(LAST, null, "/a", "/b", null));
        assertNull(fold(FIRST, null, null));
        assertNull(fold(FIRST));
    }

    @Test
    void countIfCountsItsEventTypesAndStartsAtZero() {
        assertEquals(0L, fold(COUNT));
        assertEquals(3L, fold(COUNT, 1L, 0L, 2L));
    }

    @Test
    void sumMinMaxOverNonNullValues() {
        assertEquals(7L, fold(SUM_LONG, 3L, null, 4L));
        assertEquals(-1.5, fold(MIN, 2.0, null, -1.5, 0.0));
        assertEquals(9L, fold(MAX, null, 9L, -3L));
        assertNull(fold(MAX, null, null));
        // As Python's min/max: the earlier of two equal values (0.0 then -0.0 keeps 0.0).
        assertEquals(Double.doubleToRawLongBits(0.0),
                     Double.doubleToRawLongBits((Double) fold(MIN, 0.0, -0.0)));
    }

    private static final long LMAX = Long.MAX_VALUE;  // MIN and MAX name attributes here
    private static final long LMIN = Long.MIN_VALUE;
    private static final BigInteger TWO_TO_63 = BigInteger.ONE.shiftLeft(63);

    /** Every order of `values` (null is an event without the field), each cut into runs every possible way (a run
     * folded alone, as a frozen prefix is, then the runs merged in order): the partial of each. */
    private static List<Object> everyOrderAndCut(Long... values) {
        List<Object> out = new ArrayList<>();
        for (List<Long> order : permutations(Arrays.asList(values))) {
            for (int cuts = 0; cuts < 1 << Math.max(0, order.size() - 1); cuts++) {
                List<Object> runs = new ArrayList<>();
                Object run = SUM_LONG.identity();
                for (int i = 0; i < order.size(); i++) {
                    run = Attributes.merge(SUM_LONG, run, order.get(i));
                    if ((cuts >> i & 1) == 1) {
                        runs.add(run);
                        run = SUM_LONG.identity();
                    }
                }
                runs.add(run);
                out.add(fold(SUM_LONG, runs.toArray()));
            }
        }
        return out;
    }

    private static List<List<Long>> permutations(List<Long> values) {
        if (values.isEmpty()) {
            return List.of(List.of());
        }
        List<List<Long>> out = new ArrayList<>();
        for (int i = 0; i < values.size(); i++) {
            List<Long> rest = new ArrayList<>(values);
            Long first = rest.remove(i);
            for (List<Long> tail : permutations(rest)) {
                List<Long> order = new ArrayList<>();
                order.add(first);
                order.addAll(tail);
                out.add(order);
            }
        }
        return out;
    }

    @Test
    void aLongSumThatOverflowsOnTheWayAndComesBackIsExactInEveryOrderAndCut() {
        // Worked by hand: MAX + 1 - 1 = MAX; MIN - 1 + 1 = MIN; 2 MAX + 2 MIN + 5 = 2 (MAX + MIN) + 5 = -2 + 5 = 3.
        Object[][] cases = {{LMAX, new Long[] {LMAX, 1L, -1L, null}}, {LMIN, new Long[] {LMIN, -1L, 1L}},
                            {3L, new Long[] {LMAX, LMAX, LMIN, LMIN, 5L}}, {0L, new Long[] {LMAX, LMAX, -LMAX, -LMAX}}};
        for (Object[] c : cases) {
            Long[] values = (Long[]) c[1];
            for (Object partial : everyOrderAndCut(values)) {
                assertEquals(c[0], partial, Arrays.toString(values));  // a Long: one representation per value
                assertEquals(c[0], Attributes.result(partial));
            }
        }
    }

    @Test
    void aLongSumThatEndsBeyond64BitsIsNullInEveryOrderAndCut() {
        // Worked by hand: MAX + 1 = 2^63; MIN - 1 = -(2^63) - 1; 2 MAX + 2 = 2^64; MAX + MAX + MIN = MAX - 1 (fits).
        Object[][] cases = {{TWO_TO_63, new Long[] {LMAX, 1L}},
                            {TWO_TO_63.negate().subtract(BigInteger.ONE), new Long[] {LMIN, -1L, null}},
                            {BigInteger.ONE.shiftLeft(64), new Long[] {LMAX, LMAX, 1L, 1L}}};
        for (Object[] c : cases) {
            Long[] values = (Long[]) c[1];
            for (Object partial : everyOrderAndCut(values)) {
                assertEquals(c[0], partial, Arrays.toString(values));  // the exact sum, kept for later merges
                assertNull(Attributes.result(partial), Arrays.toString(values));
            }
        }
        assertEquals(LMAX - 1, Attributes.result(fold(SUM_LONG, LMAX, LMAX, LMIN)));
        // a big partial merged with a Long or with another big one, either side
        assertEquals(LMAX, Attributes.merge(SUM_LONG, TWO_TO_63, -1L));
        assertEquals(LMAX, Attributes.merge(SUM_LONG, -1L, TWO_TO_63));
        assertEquals(0L, Attributes.merge(SUM_LONG, TWO_TO_63, TWO_TO_63.negate()));
        assertEquals(BigInteger.ONE.shiftLeft(64), Attributes.merge(SUM_LONG, TWO_TO_63, TWO_TO_63));
    }

    @Test
    void anUnknownPartialMakesTheSessionNull() {
        assertSame(Attributes.UNKNOWN, fold(SUM_LONG, 1L, Attributes.UNKNOWN, 2L));
        assertSame(Attributes.UNKNOWN, fold(COUNT, Attributes.UNKNOWN));
        assertNull(Attributes.result(Attributes.UNKNOWN));
    }

    @Test
    void aDoubleSumIsExactWhateverTheCutsAndRoundedOnce() {
        // 1e16 + 1 + 1 - 1e16 = 2 exactly; a float sum in this order gives 0 (1e16 + 1 rounds back to 1e16).
        double[] values = {1e16, 1.0, 1.0, -1e16, 0.1, 0.2, 0.3};
        double exact = new java.math.BigDecimal(1e16).add(java.math.BigDecimal.ONE).add(java.math.BigDecimal.ONE)
            .subtract(new java.math.BigDecimal(1e16)).add(new java.math.BigDecimal(0.1))
            .add(new java.math.BigDecimal(0.2)).add(new java.math.BigDecimal(0.3)).doubleValue();
        Random random = new Random(7);
        for (int trial = 0; trial < 50; trial++) {
            // cut the walk into runs anywhere, fold each run, merge the runs in order
            List<Object> runs = new ArrayList<>();
            Object run = SUM_DOUBLE.identity();
            for (double v : values) {
                run = Attributes.merge(SUM_DOUBLE, run, new double[] {v});
                if (random.nextBoolean()) {
                    runs.add(run);
                    run = SUM_DOUBLE.identity();
                }
            }
            runs.add(run);
            assertEquals(exact, (Double) Attributes.result(fold(SUM_DOUBLE, runs.toArray())), 0.0);
        }
    }

    @Test
    void fsumRoundsHalfEvenAcrossComponents() {
        // 1 + 2^-53 + 2^-105: a float sum ties to 1.0; the exact sum is just above the halfway point -> 1 + 2^-52.
        double[] parts = {1.0, Math.scalb(1.0, -53), Math.scalb(1.0, -105)};
        assertEquals(1.0 + Math.ulp(1.0), Attributes.fsum(parts), 0.0);
        assertEquals(0.0, Attributes.fsum(new double[0]), 0.0);
    }

    // ---- StateCodec v3 ------------------------------------------------------------------------------------------

    private static final List<Attributes.Attr> SPEC = List.of(FIRST, COUNT, SUM_DOUBLE, MAX, FLAG);

    private static SessionsOperator.R row(long time, String id, Object... parts) {
        return new SessionsOperator.R(time - 10, id, time, "page_view", 1, 1, 0, parts);
    }

    @Test
    void v3RoundTripsEveryPartialKind() {
        List<SessionsOperator.R> rows = List.of(
            row(100, "a", "/home", 1L, new double[] {1e16, 1.0}, 5L, true),
            row(200, null, null, 0L, null, null, null),                                     // a frozen prefix
            row(300, "c", Attributes.UNKNOWN, 2L, Attributes.UNKNOWN, -7L, Attributes.UNKNOWN));
        byte[] value = StateCodec.encode(rows, SPEC);
        assertEquals(3, value[0]);
        List<SessionsOperator.R> back = StateCodec.decode(value, SPEC);
        assertEquals(rows.size(), back.size());
        for (int i = 0; i < rows.size(); i++) {
            assertPartsEqual(rows.get(i).parts(), back.get(i).parts());
            assertEquals(rows.get(i).id(), back.get(i).id());
            assertEquals(rows.get(i).time(), back.get(i).time());
        }
    }

    @Test
    void aValueIsReadUnderAnotherSpecByFingerprint() {
        byte[] value = StateCodec.encode(List.of(row(100, "a", "/home", 1L, new double[] {2.5}, 5L, false)), SPEC);
        Attributes.Attr added = attr("added", Attributes.Kind.MIN, Attributes.Type.DOUBLE);
        // reordered, one removed (FLAG), one added: the added one is unknown, the rest keep their values
        List<Attributes.Attr> other = List.of(MAX, added, FIRST, SUM_DOUBLE, COUNT);
        Object[] parts = StateCodec.decode(value, other).get(0).parts();
        assertPartsEqual(new Object[] {5L, Attributes.UNKNOWN, "/home", new double[] {2.5}, 1L}, parts);
        // a changed definition is another key: unknown
        Attributes.Attr retyped = attr("max", Attributes.Kind.MAX, Attributes.Type.DOUBLE);
        assertSame(Attributes.UNKNOWN, StateCodec.decode(value, List.of(retyped)).get(0).parts()[0]);
        // no attributes any more: the v2 fields as they were
        SessionsOperator.R plain = StateCodec.decode(value, List.of()).get(0);
        assertEquals(0, plain.parts().length);
        assertEquals("a", plain.id());
    }

    @Test
    void todaysValuesAndThoseWithoutAttributesReadAsUnknown() {
        List<SessionsOperator.R> rows = List.of(new SessionsOperator.R(90, "a", 100, "logout", 1, 0, 0));
        byte[] v2 = StateCodec.encode(rows);
        assertEquals(2, v2[0]);
        assertArrayEquals(v2, StateCodec.encode(rows, List.of()));  // no attributes: v2, byte for byte
        Object[] parts = StateCodec.decode(v2, SPEC).get(0).parts();
        assertEquals(SPEC.size(), parts.length);
        for (Object p : parts) {
            assertSame(Attributes.UNKNOWN, p);
        }
    }

    @Test
    void v3RoundTripsALongSumBeyond64Bits() {
        List<Attributes.Attr> spec = List.of(SUM_LONG, COUNT, MAX);
        BigInteger huge = BigInteger.ONE.shiftLeft(100).negate().add(BigInteger.valueOf(12345));
        List<SessionsOperator.R> rows = List.of(
            row(100, "a", TWO_TO_63, 1L, LMAX),
            row(200, "b", TWO_TO_63.negate().subtract(BigInteger.ONE), 0L, LMIN),
            row(300, null, huge, 2L, null),
            row(400, "d", LMIN, 3L, -7L));                                   // the extremes that fit stay Longs
        byte[] value = StateCodec.encode(rows, spec);
        List<SessionsOperator.R> back = StateCodec.decode(value, spec);
        for (int i = 0; i < rows.size(); i++) {
            assertPartsEqual(rows.get(i).parts(), back.get(i).parts());
            assertEquals(rows.get(i).id(), back.get(i).id());
        }
        // Read under a spec without the sum (its bytes skipped) and with it last: the others are in place.
        List<SessionsOperator.R> other = StateCodec.decode(value, List.of(MAX, COUNT));
        assertPartsEqual(new Object[] {null, 2L}, other.get(2).parts());
        assertPartsEqual(new Object[] {-7L, 3L}, other.get(3).parts());
        assertEquals(List.of("a", "b", "d"), other.stream().map(r -> r.id()).filter(id -> id != null).toList());
    }

    @Test
    void aLongSumBeyond64BitsAsText() {
        List<Attributes.Attr> spec = List.of(SUM_LONG, COUNT);
        Object[] parts = {TWO_TO_63.negate().subtract(BigInteger.ONE), 3L};
        String text = Attributes.toJson(spec, parts);
        assertEquals("{\"count\":3,\"sum_long\":-9223372036854775809}", text);
        assertPartsEqual(parts, Attributes.fromJson(spec, text));
        // Python's json writes the same number; the largest that fits reads as a Long
        assertPartsEqual(new Object[] {TWO_TO_63, 3L},
                         Attributes.fromJson(spec, "{\"count\": 3, \"sum_long\": 9223372036854775808}"));
        assertPartsEqual(new Object[] {LMAX, 3L},
                         Attributes.fromJson(spec, "{\"count\": 3, \"sum_long\": 9223372036854775807}"));
    }

    @Test
    void partialsAsTextRoundTripAndLeaveUnknownOut() {
        Object[] parts = {"/é", 3L, new double[] {1e16, 1.0}, null, Attributes.UNKNOWN};
        String text = Attributes.toJson(SPEC, parts);
        assertEquals("{\"count\":3,\"first\":\"/é\",\"max\":null,\"sum_double\":[1.0E16,1.0]}", text);
        assertPartsEqual(parts, Attributes.fromJson(SPEC, text));
        // Python's spelling of the same partials (pipelines.core.attributes.partials_to_json) reads the same
        assertPartsEqual(parts, Attributes.fromJson(SPEC,
            "{\"count\":3,\"first\":\"/\\u00e9\",\"max\":null,\"sum_double\":[1e+16,1.0]}"));
    }

    private static void assertPartsEqual(Object[] expected, Object[] actual) {
        assertEquals(expected.length, actual.length, Arrays.deepToString(actual));
        for (int k = 0; k < expected.length; k++) {
            if (expected[k] instanceof double[] e) {
                assertArrayEquals(e, (double[]) actual[k], 0.0);
            } else if (expected[k] == Attributes.UNKNOWN) {
                assertSame(Attributes.UNKNOWN, actual[k]);
            } else {
                assertEquals(expected[k], actual[k]);  // equals is per class: 3L is not BigInteger 3
            }
        }
    }
}
