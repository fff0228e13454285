package sessions;

import java.io.Serializable;
import java.util.List;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

/**
 * The session rules the operator runs by: pipelines.core.rules.SessionRules, handed over whole as the JSON that
 * pipelines.job.operators.jvm.rules_json writes ({"gap_ms": ..., "attributes": [...]}). The gap ends a session; the
 * attributes, in output order, say what a closed session carries and what partials each stored row keeps. The
 * lateness is the watermark's (Spark applies it before the operator) and the idle close is ingest's: neither is the
 * operator's.
 */
public record Rules(long gapMs, List<Attributes.Attr> attributes) implements Serializable {
    private static final ObjectMapper JSON = new ObjectMapper();

    public Rules {
        if (gapMs <= 0) {
            throw new IllegalArgumentException("the gap must be positive, got " + gapMs + " ms");
        }
        attributes = List.copyOf(attributes);
    }

    public static Rules parse(String json) {
        try {
            JsonNode rules = JSON.readTree(json);
            JsonNode gap = rules.get("gap_ms");
            if (gap == null || !gap.canConvertToLong()) {
                throw new IllegalArgumentException("the rules have no integer gap_ms: " + json);
            }
            JsonNode attributes = rules.get("attributes");
            return new Rules(gap.asLong(), attributes == null ? List.of() : Attributes.parse(attributes));
        } catch (java.io.IOException e) {
            throw new IllegalArgumentException("the rules are not the JSON pipelines.job.operators.jvm writes", e);
        }
    }
}
