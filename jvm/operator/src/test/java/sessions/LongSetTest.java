package sessions;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.HashSet;
import java.util.Random;
import java.util.Set;

import org.junit.jupiter.api.Test;

/** LongSet against java.util.HashSet over the same values. */
class LongSetTest {
    @Test
    void aLongSetHoldsWhatWasAddedOnly() {
        LongSet set = new LongSet();
        Random random = new Random(7);
        Set<Long> expected = new HashSet<>();
        for (int i = 0; i < 50_000; i++) {  // past several growths, zero and negatives among them
            long v = i % 1000 == 0 ? 0L : random.nextLong() % 100_000;
            assertEquals(expected.add(v), set.add(v), "add " + v);
        }
        for (long v = -100_000; v < 100_000; v += 37) {
            assertEquals(expected.contains(v), set.contains(v), "contains " + v);
        }
    }
}
