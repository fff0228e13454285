package sessions;

import java.util.ArrayList;
import java.util.List;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.sql.Row;

/**
 * One call of SessionsOperator.advance without Spark, in JSON, so that tests (tests/test_jvm_operator.py) can hold
 * the Java rules against the Python core on generated inputs through py4j. Not used by the job.
 *
 * Request: {"user", "watermark", "rules" (pipelines.job.operators.jvm.rules_json), "state": [[start, id, time, type, count, views]...],
 *           "events": [[id, time, type]...]}; response: {"closed": [[session_id, start, end, count, views, reason]...],
 *           "open": [[start, id, time, type, count, views]...], "late": [index of each late event...], "due": ms|null}.
 * With attributes in the rules: each state row has its partials' text 7th, each
 * event its fields 4th ({column: value}); each closed row has the attributes' values after the reason, each open
 * row its partials' text 7th (after the stored form's round trip).
 */
public final class CoreHarness {
    private static final ObjectMapper JSON = new ObjectMapper();

    private CoreHarness() {}

    public static String advanceJson(String request) throws Exception {
        JsonNode in = JSON.readTree(request);
        String user = in.get("user").asText();
        long watermark = in.get("watermark").asLong();
        Rules rules = Rules.parse(in.get("rules").asText());
        List<Attributes.Attr> attrs = rules.attributes();
        int[] columns = new int[attrs.size()];
        for (int k = 0; k < columns.length; k++) {
            columns[k] = attrs.get(k).column() == null ? -1 : k;
        }
        List<SessionsOperator.R> rows = new ArrayList<>();
        for (JsonNode r : in.get("state")) {
            Object[] parts = attrs.isEmpty() ? SessionsOperator.NO_PARTS : Attributes.fromJson(attrs, text(r.get(6)));
            rows.add(new SessionsOperator.R(r.get(0).asLong(), text(r.get(1)), r.get(2).asLong(), text(r.get(3)),
                                            r.get(4).asLong(), r.get(5).asLong(), rows.size(), parts));
        }
        ObjectNode out = JSON.createObjectNode();
        ArrayNode late = out.putArray("late");
        List<SessionsOperator.R> fresh = new ArrayList<>();
        int index = 0;
        for (JsonNode e : in.get("events")) {  // the split Fn.call makes: late at or below the watermark
            long time = e.get(1).asLong();
            String type = text(e.get(2));
            if (time <= watermark) {
                late.add(index);
            } else {
                Object[] parts = attrs.isEmpty() ? SessionsOperator.NO_PARTS
                    : Attributes.eventPartials(attrs, type, fields(attrs, e.get(3)), columns);
                fresh.add(new SessionsOperator.R(time, text(e.get(0)), time, type, 1,
                                                 SessionsOperator.PAGE_VIEW.equals(type) ? 1 : 0, 0, parts));
            }
            index++;
        }
        SessionsOperator.Walk walk = SessionsOperator.advance(user, rows, fresh, watermark, rules);
        List<SessionsOperator.R> kept = walk.open();
        List<Row> sessions = walk.closed();
        long due = walk.due();
        ArrayNode closed = out.putArray("closed");
        for (Row s : sessions) {
            ArrayNode row = closed.addArray().add(s.getString(1)).add(s.getLong(3)).add(s.getLong(4))
                .add(s.getLong(5)).add(s.getLong(6)).add(s.getString(7));
            for (int k = 0; k < attrs.size(); k++) {
                row.add(JSON.valueToTree(s.get(SessionsOperator.OUTPUT_NAMES.length + k)));
            }
        }
        ArrayNode open = out.putArray("open");
        for (SessionsOperator.R r : StateCodec.decode(StateCodec.encode(kept, attrs), attrs)) {  // the stored form
            ArrayNode row = open.addArray().add(r.start()).add(r.id()).add(r.time()).add(r.type()).add(r.count()).add(r.views());
            if (!attrs.isEmpty()) {
                row.add(Attributes.toJson(attrs, r.parts()));
            }
        }
        if (kept.isEmpty()) {
            out.putNull("due");
        } else {
            out.put("due", due);
        }
        return JSON.writeValueAsString(out);
    }

    /** The stored form's round trip of rows [[start, id, time, type, count, views]...]: {"rows": decode(encode(rows)),
     * "bytes": the encoded length}. */
    public static String roundTripJson(String rowsJson) throws Exception {
        List<SessionsOperator.R> rows = new ArrayList<>();
        for (JsonNode r : JSON.readTree(rowsJson)) {
            rows.add(new SessionsOperator.R(r.get(0).asLong(), text(r.get(1)), r.get(2).asLong(), text(r.get(3)),
                                            r.get(4).asLong(), r.get(5).asLong(), rows.size()));
        }
        byte[] value = StateCodec.encode(rows);
        ObjectNode out = (ObjectNode) JSON.readTree(decodeJson(value));
        out.put("bytes", value.length);
        return JSON.writeValueAsString(out);
    }

    /** A stored value's rows: {"rows": [[start, id, time, type, count, views]...]} (any version this build reads). */
    public static String decodeJson(byte[] value) throws Exception {
        ObjectNode out = JSON.createObjectNode();
        ArrayNode rows = out.putArray("rows");
        for (SessionsOperator.R r : StateCodec.decode(value)) {
            rows.addArray().add(r.start()).add(r.id()).add(r.time()).add(r.type()).add(r.count()).add(r.views());
        }
        return JSON.writeValueAsString(out);
    }

    /** An event's fields as the operator's input row: attribute k's value at index k. */
    private static Row fields(List<Attributes.Attr> attrs, JsonNode given) {
        Object[] values = new Object[attrs.size()];
        for (int k = 0; k < values.length; k++) {
            Attributes.Attr a = attrs.get(k);
            JsonNode v = a.column() == null || given == null ? null : given.get(a.column());
            if (v == null || v.isNull()) {
                continue;
            }
            values[k] = switch (a.type()) {
                case LONG -> v.asLong();
                case DOUBLE -> v.asDouble();
                case STRING -> v.asText();
                case BOOLEAN -> v.asBoolean();
            };
        }
        return org.apache.spark.sql.RowFactory.create(values);
    }

    private static String text(JsonNode node) {
        return node == null || node.isNull() ? null : node.asText();
    }
}
