package sessions;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import org.apache.spark.sql.SQLContext;
import org.apache.spark.sql.execution.streaming.Source;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.sources.StreamSourceProvider;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

import scala.Option;
import scala.Tuple2;

/**
 * The stream's source over the raw_events Delta table ({@code spark.readStream.format("sessions_raw")}): the rows
 * with ingest_seq in (start, end] make a micro-batch, planned from the table's Delta log in the driver and read by
 * Spark's Parquet reader in the executors (RawEventsStream, RawEventsLog).
 *
 * <p>Options:
 * <ul>
 *   <li>{@code path}: the table (s3:// is read as s3a://);</li>
 *   <li>{@code fields}: JSON {@code [[column, type], ...]}, the typed input fields (raw_events' field_* columns) the
 *   stream carries to the operator for the session spec's attributes;</li>
 *   <li>{@code maxVersionsPerTrigger}: at most this many ingest_seq per batch;</li>
 *   <li>{@code targetSeq}: stop at this ingest_seq (the batch a restore runs after the restored batch 0);</li>
 *   <li>{@code settle}: "false": no empty batch after data.</li>
 * </ul>
 */
public final class RawEvents implements StreamSourceProvider, DataSourceRegister {
    public static final String NAME = "sessions_raw";

    /** The columns every batch has, in order, before the fields': only what the operator reads (a rejected line never
     * reaches the stream: the sink reads it, and a late event's provenance, from raw_events). */
    static final StructType COLUMNS = new StructType()
        .add("event_id", DataTypes.StringType).add("user_id", DataTypes.StringType)
        .add("event_time", DataTypes.TimestampType).add("event_type", DataTypes.StringType)
        .add("ingest_seq", DataTypes.LongType).add("line_key", DataTypes.LongType)
        .add("origin", DataTypes.StringType);

    private static final Map<String, DataType> TYPES = Map.of("string", DataTypes.StringType,
        "long", DataTypes.LongType, "double", DataTypes.DoubleType, "boolean", DataTypes.BooleanType,
        "timestamp", DataTypes.TimestampType);

    @Override
    public String shortName() {
        return NAME;
    }

    @Override
    public Tuple2<String, StructType> sourceSchema(SQLContext sqlContext, Option<StructType> schema,
                                                   String providerName,
                                                   scala.collection.immutable.Map<String, String> parameters) {
        return new Tuple2<>(NAME, Options.of(parameters).schema());
    }

    @Override
    public Source createSource(SQLContext sqlContext, String metadataPath, Option<StructType> schema,
                               String providerName, scala.collection.immutable.Map<String, String> parameters) {
        return new RawEventsStream((org.apache.spark.sql.classic.SparkSession) sqlContext.sparkSession(),
            Options.of(parameters));
    }

    /** The source's options, read once. */
    record Options(String table, List<Tuple2<String, DataType>> fields, long maxVersions,
                   Long targetSeq, boolean settle) {
        private static final ObjectMapper JSON = new ObjectMapper();

        static Options of(scala.collection.immutable.Map<String, String> parameters) {
            Map<String, String> options = new HashMap<>();
            scala.jdk.javaapi.CollectionConverters.asJava(parameters)
                .forEach((key, value) -> options.put(key.toLowerCase(Locale.ROOT), value));
            String path = options.get("path");
            if (path == null || path.isEmpty()) {
                throw new IllegalArgumentException("the sessions_raw source needs the raw_events table's path");
            }
            String table = path.startsWith("s3://") ? "s3a://" + path.substring("s3://".length()) : path;
            String max = options.getOrDefault("maxversionspertrigger", "");
            String target = options.getOrDefault("targetseq", "");
            return new Options(table, fields(options.getOrDefault("fields", "")), max.isEmpty() ? 0 : Long.parseLong(max),
                target.isEmpty() ? null : Long.valueOf(target),
                !"false".equalsIgnoreCase(options.getOrDefault("settle", "true")));
        }

        private static List<Tuple2<String, DataType>> fields(String option) {
            List<Tuple2<String, DataType>> fields = new ArrayList<>();
            if (option.isEmpty()) {
                return fields;
            }
            try {
                for (JsonNode field : JSON.readTree(option)) {
                    String kind = field.get(1).asText();
                    DataType type = TYPES.get(kind);
                    if (type == null) {
                        throw new IllegalArgumentException("a field of type " + kind + " (the spec's types: "
                            + TYPES.keySet() + ")");
                    }
                    fields.add(new Tuple2<>(field.get(0).asText(), type));
                }
            } catch (java.io.IOException e) {
                throw new IllegalArgumentException("the fields option is not JSON: " + option, e);
            }
            return List.copyOf(fields);
        }

        StructType schema() {
            StructType schema = COLUMNS;
            for (Tuple2<String, DataType> field : fields) {
                schema = schema.add(field._1(), field._2());
            }
            return schema;
        }
    }
}
