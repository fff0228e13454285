package sessions;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import org.junit.jupiter.api.Test;

/** Checksum against values Python computed (pandas' hash_array, repr, json.dumps): the specification's own figures,
 * not this class's. */
class ChecksumTest {
    @Test
    void rowHashesAreThoseOfPandasHashArray() throws Exception {
        assertEquals(1760245841805064774L, Checksum.rowHash(""));
        assertEquals(-4496393130729816112L, Checksum.rowHash("a"));
        assertEquals(-4312002522427063734L, Checksum.rowHash("abcdefgh"));  // one whole word, then the length alone
        assertEquals(-8053659608799063290L, Checksum.rowHash("abcdefghi"));
        assertEquals(-5450980178988134103L, Checksum.rowHash(
            "u0000001\u001f1793527229000000\u001fe1-0\u001f1793527229000000\u001fpage_view\u001f1\u001f1"));
        assertEquals(-4365247843453164009L, Checksum.rowHash("naïve ✓ 𝄞"));
    }

    @Test
    void floatsAreSpelledAsPythonsRepr() {
        double[] values = {1.0, -0.0, 0.1, 1e16, 1234567890123456.0, 0.0001, 0.00001, 1.5e-05, 123.456, 1e22, 1e23,
                           Double.MIN_VALUE, Double.MAX_VALUE, 3 * Double.MIN_VALUE, 100.0, 12345678.9,
                           -720469553746438.75};
        String[] python = {"1.0", "-0.0", "0.1", "1e+16", "1234567890123456.0", "0.0001", "1e-05", "1.5e-05",
                           "123.456", "1e+22", "1e+23", "5e-324", "1.7976931348623157e+308", "1.5e-323", "100.0",
                           "12345678.9", "-720469553746438.8"};
        for (int i = 0; i < values.length; i++) {
            assertEquals(python[i], Checksum.pythonFloat(values[i]), "repr of " + values[i]);
        }
    }

    @Test
    void attributesAreRewrittenAsPythonsJsonDumps() throws Exception {
        assertEquals("{\"a\":[0.5,1e-07],\"b\":1,\"c\":\"x\\\"\\n\\u0001é\"}",
                     Checksum.attributesText("{\"b\": 1, \"a\": [0.5, 1e-7], \"c\": \"x\\\"\\n\\u0001é\"}"));
        assertNull(Checksum.attributesText("{}"));
        assertEquals("{\"a\":NaN,\"m\":-Infinity,\"n\":null,\"t\":true,\"z\":123456789012345678901234567890}",
                     Checksum.attributesText("{\"z\": 123456789012345678901234567890, \"a\": NaN, \"m\": -Infinity, "
                                             + "\"n\": null, \"t\": true}"));
        assertEquals("{\"\uffff\":2,\"𝄞\":1}", Checksum.attributesText("{\"\\ud834\\udd1e\": 1, \"\\uffff\": 2}"));
    }

    @Test
    void aRowTextIsItsFieldsAsPythonSpellsThem() throws Exception {
        Checksum.Text text = new Checksum.Text();
        for (int round = 0; round < 2; round++) {  // the buffer reused: the second row's hash is its own
            text.reset();
            text.separate();
            text.utf8("u0000001");
            text.separate();
            text.decimal(1793527229000000L);
            text.separate();
            text.utf8(org.apache.spark.unsafe.types.UTF8String.fromString("e1-0"));
            text.separate();
            text.decimal(1793527229000000L);
            text.separate();
            text.utf8("page_view");
            text.separate();
            text.decimal(1);
            text.separate();
            text.decimal(1);
            assertEquals(-5450980178988134103L, Checksum.mix(text.sipHash24()));
        }
        long[] numbers = {0, 7, -7, 10, 99, -100, Long.MAX_VALUE, Long.MIN_VALUE, 1793527229000000L};
        for (long n : numbers) {
            text.reset();
            text.decimal(n);
            assertEquals(Checksum.rowHash(Long.toString(n)), Checksum.mix(text.sipHash24()), "digits of " + n);
        }
        String long_ = "naïve ✓ 𝄞 ".repeat(40);  // past the first buffer, not ASCII
        text.reset();
        text.utf8("x");
        text.separate();
        text.utf8(long_);
        assertEquals(Checksum.rowHash("x" + long_), Checksum.mix(text.sipHash24()));
    }
}
