"""The operator seam: everything that differs between stateful operators, behind one small typed interface.

An operator owns its state layout (the id a checkpoint records in `_job.json`), applying a batch, the decoding of
its stored values into the canonical rows (savepoints, `status`, `state --user`) and the partition bound. Which
operator a checkpoint runs is decided once -- by its metadata, or for a new checkpoint (pipelines.job.operators:
`for_layout`, `for_new_checkpoint`) -- and the object is handed down; nothing below asks again.

Two implementations: `pipelines.job.operators.jvm.JvmOperator` (Spark's flatMapGroupsWithState keyed by user, the
operator of every new checkpoint) and `pipelines.job.operators.buckets.BucketLayout` (the state of checkpoints made by
the retired Python operator: readable, so that a savepoint moves it to the JVM operator, but not runnable).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.config import MAX_PARTITIONS
from pipelines.core.rules import SessionRules
from pipelines.core.spec import Attribute
from pipelines.core.state_format import CANONICAL_DDL, CANONICAL_SCHEMA, empty_store
from pipelines.core.state_format import to_canonical as canonical
from pipelines.locations import CheckpointPath

__all__ = ["OUTPUT_COLUMNS", "OUTPUT_SCHEMA", "StateOperator", "StoredChunk", "keyed_events", "output_schema", "register_coordinator", "state_reader"]

# The operator's output, defined once: the JVM operator takes this schema from here (and checks the column order it
# builds rows in); the sink reads these columns by name.
OUTPUT_COLUMNS = [
    ("kind", "string"), ("session_id", "string"), ("user_id", "string"),
    ("session_start_ms", "long"), ("session_end_ms", "long"), ("event_count", "long"),
    ("page_views", "long"), ("end_reason", "string"),
    ("event_id", "string"), ("event_time_ms", "long"), ("event_type", "string"),
    ("ingest_seq", "long"), ("line_key", "long"),
]
OUTPUT_SCHEMA = ", ".join(f"{name} {kind}" for name, kind in OUTPUT_COLUMNS)


def output_schema(attributes: Sequence[Attribute]) -> str:
    """OUTPUT_SCHEMA, then a closed session's value of each attribute (Attribute.column, in `attributes` order)."""
    return OUTPUT_SCHEMA + "".join(f", {a.column} {a.result_type}" for a in attributes)



@dataclass(frozen=True)
class StoredChunk:
    """Stored rows of some state keys (pipelines.core.state_format.ROW_FIELDS, times in ms, each user's rows together),
    with how many keys they came from and their stored value bytes."""
    rows: pa.Table
    keys: int
    value_bytes: int


class StateOperator(ABC):
    """One stateful operator: see the module docstring."""

    name: str     # as SESSIONS_OPERATOR spells it
    layout: str   # JobMetadata.state_layout of the checkpoints it makes
    retired: str | None = None  # why its checkpoints cannot run any more, and the way out (None: runnable)

    # ---- running ----------------------------------------------------------------------------------------------
    @abstractmethod
    def apply(self, keyed: DataFrame, rules: SessionRules) -> DataFrame:
        """`keyed` (see `keyed_events`, with the fields the rules' attributes read) -> rows of
        `output_schema(rules.attributes)`: kind `session` (closed, with its attributes' values) or `late`."""

    def max_partitions(self, buckets: int) -> int | None:
        """The most state partitions that can hold anything, for a checkpoint that recorded `buckets` (None: no
        bound). Per-user state: MAX_PARTITIONS, so a restore's pre-flight and the restore itself refuse a count Spark
        cannot take (not "restorable", then a failed restore)."""
        return MAX_PARTITIONS

    # ---- reading state (Spark's state data source; decoded in the executors) -------------------------------------
    @abstractmethod
    def stored_values(self, spark: SparkSession, checkpoint: CheckpointPath, batch_id: int | None) -> DataFrame:
        """One row per state key, in whatever columns `decode` reads."""

    @staticmethod
    @abstractmethod
    def decode(batch: pa.RecordBatch) -> Iterator[StoredChunk]:
        """A batch of `stored_values` -> its stored rows (runs in the executors: no state on self)."""

    @abstractmethod
    def users_values(self, spark: SparkSession, checkpoint: CheckpointPath, batch_id: int, user_ids: Sequence[str],
                     buckets: int) -> DataFrame:
        """The `stored_values` rows that can hold any of `user_ids` at committed batch `batch_id` (a point lookup
        reads only those)."""

    def users_rows(self, spark: SparkSession, checkpoint: CheckpointPath, batch_id: int, user_ids: Sequence[str],
                   buckets: int) -> pa.Table:
        """The stored rows (decoded, `decode`'s columns) of `user_ids` at committed batch `batch_id`, in the driver:
        a point lookup's few rows."""
        found = self.users_values(spark, checkpoint, batch_id, user_ids, buckets).toArrow()
        chunks = [chunk.rows for batch in found.to_batches() for chunk in self.decode(batch)]
        if not chunks:
            return empty_store()
        rows = pa.concat_tables(chunks)
        return rows.filter(pc.is_in(rows["user_id"], pa.array(list(user_ids), pa.string())))

    def canonical_rows(self, spark: SparkSession, checkpoint: CheckpointPath, batch_id: int | None) -> DataFrame:
        """The state's rows in canonical form (CANONICAL_DDL): per open session at most one frozen prefix (event_id
        null) and its events above the watermark, each row with its session's start."""
        decode = self.decode

        def to_canonical(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                for chunk in decode(batch):
                    yield from canonical(chunk.rows).select(CANONICAL_SCHEMA.names).to_batches()

        return self.stored_values(spark, checkpoint, batch_id).mapInArrow(to_canonical, CANONICAL_DDL)


def register_coordinator(spark: SparkSession) -> None:
    # The RocksDB provider calls the driver's StateStoreCoordinator, which Spark registers only when the streaming
    # query manager is first used; a fresh process (sessionctl) must touch it before reading state.
    spark.streams.active  # noqa: B018 -- the access itself registers the coordinator


# Spark's RocksDB provider gets every key before it replays a put of the changelog, to keep the store's row count;
# a store loaded only to be read needs no count. Without it a read of 1M keys (4 partitions, local[2]) took 3.4-3.5 s
# against 6.2-6.3 s. (The JVM's stores written or read by jobs of ours: sessions.StateWriter.storeConf.)
_ROW_COUNT = "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows"


def _reading_session(spark: SparkSession) -> SparkSession:
    """A clone of `spark` (its settings and registered functions; the same SparkContext) whose state stores keep no
    row count: a read there leaves the caller's session -- which may run the stream -- as it is."""
    clone = SparkSession(spark.sparkContext, jsparkSession=spark._jsparkSession.cloneSession())
    clone.conf.set(_ROW_COUNT, "false")
    return clone


def state_reader(spark: SparkSession, checkpoint: CheckpointPath, batch_id: int | None) -> DataFrame:
    """Spark's state data source over the checkpoint's one stateful operator (at `batch_id`, else the newest): a
    frame of a clone of `spark` whose stores skip RocksDB's row count (_reading_session)."""
    register_coordinator(spark)
    reader = _reading_session(spark).read.format("statestore")
    if batch_id is not None:
        reader = reader.option("batchId", batch_id)
    return reader.load(str(checkpoint))


def keyed_events(events: DataFrame, rules: SessionRules) -> DataFrame:
    """Source rows -> what an operator takes under `rules`: valid events (and watermark markers, which stop at the
    watermark node) behind a watermark that trails by the lateness, event time in ms, and the fields the attributes
    read. The source never hands over a rejected line (pipelines.job.source), so a quarantined far-future
    event cannot move the watermark."""
    lateness_ms, fields = rules.lateness_ms, rules.spec.operator_fields
    with_watermark = events.withWatermark("event_time", f"{lateness_ms} milliseconds")
    # The marker must reach EventTimeWatermark (it carries a restored savepoint's watermark, or an idle-close clock
    # row's time) and stop there. This filter names event_time so that it stays above the watermark node.
    with_watermark = with_watermark.where((F.col("origin") != "marker") | F.col("event_time").isNull())
    return with_watermark.select(
        "user_id", "event_id",
        F.unix_millis("event_time").alias("event_time_ms"),
        # The operator needs a column marked with the watermark (else no event-time timers and no GroupState
        # watermark), but with an event-time timeout Spark also drops input rows at or below the *previous* batch's
        # watermark before the operator sees them -- those late events would vanish instead of reaching quarantine.
        # A null timestamp carrying the mark gives the one without the other.
        F.lit(None).cast("timestamp").alias("event_time", metadata={"spark.watermarkDelayMs": lateness_ms}),
        "event_type", "ingest_seq", "line_key", *(f.column for f in fields),
    )
