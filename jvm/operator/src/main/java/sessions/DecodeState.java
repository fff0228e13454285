package sessions;

import java.util.ArrayList;
import java.util.List;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF1;

/** SQL function over a state value of the JVM operator: its rows as array<SessionsOperator.STATE_ROW>
 * (registered by state_store/state.py as `sessions_jvm_state_rows`; the savepoint, status and lookups read it). */
public final class DecodeState implements UDF1<byte[], List<Row>> {
    private static final long serialVersionUID = 1L;

    @Override
    public List<Row> call(byte[] value) {
        if (value == null) {
            return null;
        }
        List<SessionsOperator.R> rows = StateCodec.decode(value);
        List<Row> out = new ArrayList<>(rows.size());
        for (SessionsOperator.R r : rows) {
            out.add(RowFactory.create(r.start, r.id, r.time, r.type, r.count, r.views));
        }
        return out;
    }
}
