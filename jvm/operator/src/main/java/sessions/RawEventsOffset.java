package sessions;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import org.apache.spark.sql.execution.streaming.Offset;

/**
 * A position of the stream's source in raw_events, as the offset log keeps it: {@code {"seq": N, "boot": true,
 * "settled": s}}.
 *
 * <ul>
 *   <li>{@code seq}: the rows with ingest_seq up to N have been handed over;</li>
 *   <li>{@code boot}: always true (false marked a position before a restored checkpoint's batch 0, which was a
 *   query's batch then and is written by the restore now: RestoredBatch; kept in the text, which Spark compares);</li>
 *   <li>{@code settled}: false after a batch with data, so that one empty batch follows it at the watermark the data
 *   advanced (the sessions it closes are written then, not when the next event happens to arrive).</li>
 * </ul>
 *
 * <p>The text is byte for byte what the offset logs of existing checkpoints hold (Spark compares offsets by their
 * text: another spelling of the same position would read as new data and run an empty batch).
 */
public final class RawEventsOffset extends Offset {
    private static final ObjectMapper JSON = new ObjectMapper();

    private final long seq;
    private final boolean settled;

    public RawEventsOffset(long seq, boolean settled) {
        this.seq = seq;
        this.settled = settled;
    }

    /** An offset log entry's text; a missing "settled" reads as true (entries written before it existed). */
    public static RawEventsOffset parse(String json) {
        try {
            JsonNode node = JSON.readTree(json);
            return new RawEventsOffset(node.get("seq").asLong(), node.path("settled").asBoolean(true));
        } catch (java.io.IOException | RuntimeException e) {
            throw new IllegalArgumentException("not an offset of the raw_events source: " + json, e);
        }
    }

    public long seq() {
        return seq;
    }

    public boolean settled() {
        return settled;
    }

    @Override
    public String json() {
        return "{\"seq\": " + seq + ", \"boot\": true, \"settled\": " + settled + "}";
    }
}
