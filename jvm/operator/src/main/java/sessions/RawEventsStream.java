package sessions;

import static org.apache.spark.sql.functions.coalesce;
import static org.apache.spark.sql.functions.col;
import static org.apache.spark.sql.functions.lit;
import static org.apache.spark.sql.functions.negate;
import static org.apache.spark.sql.functions.when;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;


import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxFiles;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.apache.spark.sql.execution.streaming.Offset;
import org.apache.spark.sql.execution.streaming.Source;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

import scala.Option;
import scala.reflect.ClassTag$;

/**
 * One query's reader of raw_events (RawEvents). The driver only finds offsets and plans: each batch is Delta Spark's
 * read of the table, filtered to the batch's ingest_seq range -- files skipped by their statistics, deletion vectors
 * applied, large files split -- run in the executors like any table scan.
 *
 * <p>Offsets (RawEventsOffset): a new checkpoint starts at seq 0; a restored one resumes after its batch 0, which the
 * restore wrote at the savepoint's source position and watermark (RestoredBatch). An idle-close clock row of
 * raw_events (row_kind "clock") is read as a watermark marker (origin "marker").
 */
final class RawEventsStream implements Source, SupportsTriggerAvailableNow {
    private static final String CLOCK_KIND = "clock";  // pipelines.ingest.table.CLOCK_KIND

    /** What a batch reads of raw_events' data files, before the fields' columns. */
    private static final StructType FILE_COLUMNS = new StructType()
        .add("event_id", DataTypes.StringType).add("user_id", DataTypes.StringType)
        .add("event_time", DataTypes.TimestampType).add("event_type", DataTypes.StringType)
        .add("ingest_seq", DataTypes.LongType).add("line_key", DataTypes.LongType).add("line_no", DataTypes.LongType)
        .add("reject_reason", DataTypes.StringType).add("row_kind", DataTypes.StringType);

    private final SparkSession spark;
    private final RawEvents.Options options;
    private final StructType schema;
    private final RawEventsLog log;
    private Long targetSeq;

    RawEventsStream(SparkSession spark, RawEvents.Options options) {
        this.spark = spark;
        this.options = options;
        this.schema = options.schema();
        this.log = new RawEventsLog(new Path(options.table()), spark.sessionState().newHadoopConf());
        this.targetSeq = options.targetSeq();
    }

    @Override
    public StructType schema() {
        return schema;
    }

    @Override
    public Option<Offset> getOffset() {
        throw new UnsupportedOperationException("the sessions_raw source is read with latestOffset(start, limit)");
    }

    @Override
    public ReadLimit getDefaultReadLimit() {
        return options.maxVersions() > 0 ? ReadLimit.maxFiles((int) options.maxVersions()) : ReadLimit.allAvailable();
    }

    @Override
    public void prepareForTriggerAvailableNow() {
        long latest = latestSeq();
        targetSeq = targetSeq == null ? latest : Math.min(targetSeq, latest);
    }

    private static final RawEventsOffset INITIAL = new RawEventsOffset(0, true);

    @Override
    public org.apache.spark.sql.connector.read.streaming.Offset latestOffset(
            org.apache.spark.sql.connector.read.streaming.Offset start, ReadLimit limit) {
        // Spark hands a v1 source null before its first batch: it starts where a v2 source's initialOffset would (and,
        // as for one, a new checkpoint's batch 0 runs even on an empty table).
        return next(start == null ? INITIAL : RawEventsOffset.parse(start.json()), limit);
    }

    private RawEventsOffset next(RawEventsOffset start, ReadLimit limit) {
        long latest = latestSeq();
        if (targetSeq != null) {
            latest = Math.min(latest, targetSeq);
        }
        if (limit instanceof ReadMaxFiles files) {
            latest = Math.min(latest, start.seq() + files.maxFiles());
        }
        if (latest > start.seq()) {
            return new RawEventsOffset(latest, false);
        }
        if (!start.settled() && options.settle()) {
            return new RawEventsOffset(start.seq(), true);
        }
        return start;
    }

    @Override
    public Dataset<Row> getBatch(Option<Offset> start, Offset end) {
        RawEventsOffset from = start.isDefined() ? RawEventsOffset.parse(start.get().json()) : INITIAL;
        RawEventsOffset to = RawEventsOffset.parse(end.json());
        if (to.seq() <= from.seq()) {
            return spark.internalCreateDataFrame(
                spark.sparkContext().emptyRDD(ClassTag$.MODULE$.apply(InternalRow.class)), schema, true);
        }
        return streaming(events(from.seq(), to.seq()));
    }

    /** The rows of raw_events with ingest_seq in (low, high] that are events (no rejected line), in the schema. */
    private Dataset<Row> events(long low, long high) {
        latestSeq();  // the log up to now: the files live at this batch's planning
        List<RawEventsLog.DataFile> files = log.filesFor(low, high);
        Dataset<Row> table;
        if (log.plain() && files.stream().noneMatch(RawEventsLog.DataFile::deletionVector)) {
            // The batch's files straight to Spark's Parquet reader: no snapshot of the table per batch. A column
            // missing from older files reads as null (line_key's and row_kind's fallbacks below).
            if (files.isEmpty()) {
                return spark.createDataFrame(List.<Row>of(), schema);
            }
            table = spark.read().schema(fileColumns())
                .parquet(files.stream().map(RawEventsLog.DataFile::path).toArray(String[]::new));
        } else {
            table = spark.read().format("delta").load(options.table());  // deletion vectors, or a table feature
        }
        Set<String> has = Set.of(table.columns());
        Column seq = col("ingest_seq");
        Dataset<Row> rows = table.where(seq.gt(low).and(seq.leq(high)).and(col("reject_reason").isNull()));
        List<Column> out = new ArrayList<>();
        for (StructField field : schema.fields()) {
            String name = field.name();
            Column value;
            if ("line_key".equals(name)) {
                // Rows written before line_key existed get -line_no: the sink builds the same key from raw_events
                // (pipelines.job.quarantine.late_key).
                value = has.contains("line_key") ? coalesce(col("line_key"), negate(col("line_no")))
                    : negate(col("line_no"));
            } else if ("origin".equals(name)) {
                value = has.contains("row_kind")
                    ? when(col("row_kind").equalTo(CLOCK_KIND), lit("marker")).otherwise(lit("event")) : lit("event");
            } else if (has.contains(name)) {
                value = col(quoted(name));
            } else {
                value = lit(null);  // a field's column in a table written before the field was declared
            }
            out.add(value.cast(field.dataType()).as(name));
        }
        return rows.select(out.toArray(new Column[0]));
    }

    private Dataset<Row> streaming(Dataset<Row> batch) {
        return spark.internalCreateDataFrame(
            ((org.apache.spark.sql.classic.Dataset<Row>) batch).queryExecution().toRdd(), schema, true);
    }

    /** The newest ingest_seq of the table, from its log's new commits. */
    private long latestSeq() {
        try {
            log.update(spark);
            return log.latestSeq();
        } catch (IOException e) {
            // the cause's own words in the message: the Python side tells a storage failure (S3A's, the SDK's) that
            // `run` rides out from one of the data by what the query's failure says
            throw new UncheckedIOException("reading the Delta log of " + options.table() + ": " + e, e);
        }
    }

    private StructType fileColumns() {
        StructType columns = FILE_COLUMNS;
        for (StructField field : schema.fields()) {
            if (!RawEvents.COLUMNS.getFieldIndex(field.name()).isDefined()) {
                columns = columns.add(field);  // a field of the session spec
            }
        }
        return columns;
    }

    private static String quoted(String name) {
        return "`" + name.replace("`", "``") + "`";
    }

    @Override
    public void commit(Offset end) {
        // Nothing to release: the rows stay in raw_events (the replayable log).
    }

    @Override
    public void stop() {
        // Nothing held between batches.
    }

}
