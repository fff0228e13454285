package sessions;

import java.util.ArrayList;
import java.util.List;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.types.DataTypes;

/** SQL function over a state value of the JVM operator: its rows as array<SessionsOperator.STATE_ROW>, each with its
 * partials of the checkpoint's attributes as text (registered by pipelines/job/operators/jvm.py `register_decoder` as
 * `sessions_jvm_state_rows`; the savepoint, status and lookups read it). */
public final class DecodeState implements UDF1<byte[], List<Row>> {
    private static final long serialVersionUID = 1L;
    private final List<Attributes.Attr> attrs;

    public DecodeState() {
        this(List.of());
    }

    DecodeState(List<Attributes.Attr> attrs) {
        this.attrs = attrs;
    }

    /** Registers the function as `name` for the attributes of the checkpoint's rules (Rules.parse). */
    public static void register(SparkSession spark, String name, String rulesJson) {
        spark.udf().register(name, new DecodeState(Rules.parse(rulesJson).attributes()),
                             DataTypes.createArrayType(SessionsOperator.STATE_ROW));
    }

    @Override
    public List<Row> call(byte[] value) {
        if (value == null) {
            return null;
        }
        List<SessionsOperator.R> rows = StateCodec.decode(value, attrs);
        List<Row> out = new ArrayList<>(rows.size());
        for (SessionsOperator.R r : rows) {
            out.add(RowFactory.create(r.start(), r.id(), r.time(), r.type(), r.count(), r.views(),
                                      Attributes.toJson(attrs, r.parts())));
        }
        return out;
    }
}
