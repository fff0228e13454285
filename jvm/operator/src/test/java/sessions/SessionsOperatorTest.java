package sessions;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

import org.junit.jupiter.api.Test;

/** The pieces of SessionsOperator that must agree with the Python core (pipelines/core/sessionize.py). */
class SessionsOperatorTest {

    @Test
    void sessionIdsEqualPythonsSessionId() {
        // Expected: pipelines.core.sessionize.session_id(user, start) (sha256 of "user\x1fstart", first 32 hex digits).
        assertEquals("ef66e4a7bf0d0573403e147679522c7d", SessionsOperator.sessionId("user-1", 1_700_000_000_000L));
        assertEquals("2e98015bc43d0d13e426195e14e0af9f", SessionsOperator.sessionId("ü-😀", 0));
        assertEquals("4fad685c175cbf65baadae5dc4f73c4a", SessionsOperator.sessionId("", -5));
        assertEquals("ee79de8965892192f79c09496525c223", SessionsOperator.sessionId("u", Long.MAX_VALUE));
    }

    @Test
    void compareCodePointsOrdersAsPythonOrdersStr() {
        assertEquals(0, SessionsOperator.compareCodePoints("", ""));
        assertEquals(0, SessionsOperator.compareCodePoints("événement-😀", "événement-😀"));
        assertTrue(SessionsOperator.compareCodePoints("a", "b") < 0);
        assertTrue(SessionsOperator.compareCodePoints("b", "a") > 0);
        assertTrue(SessionsOperator.compareCodePoints("", "a") < 0);
        assertTrue(SessionsOperator.compareCodePoints("ab", "a") > 0);  // a prefix first
        assertTrue(SessionsOperator.compareCodePoints("Z", "a") < 0);
        // Past U+FFFF: U+FFFF < U+1F600 by code point, while String.compareTo compares the surrogate U+D83D first.
        assertTrue(SessionsOperator.compareCodePoints("\uFFFF", "😀") < 0);
        assertTrue("\uFFFF".compareTo("😀") > 0);
        assertTrue(SessionsOperator.compareCodePoints("x😀", "x\uFFFF") > 0);
        assertTrue(SessionsOperator.compareCodePoints("😀", "😀a") < 0);
        // Sorting by it gives Python's sorted() order (code points): U+E000 < U+FFFD < U+10000 < U+1F600.
        List<String> ids = new ArrayList<>(Arrays.asList("😀", "\uFFFD", "\uE000", "𐀀", "z", "é"));
        ids.sort(SessionsOperator::compareCodePoints);
        assertEquals(List.of("z", "é", "\uE000", "\uFFFD", "𐀀", "😀"), ids);
    }
}
