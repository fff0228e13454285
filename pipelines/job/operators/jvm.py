"""The JVM operator (jvm/operator/src/main/java/sessions/SessionsOperator.java, a Maven module: jvm/operator/pom.xml):
Spark's flatMapGroupsWithState keyed by user, the same rules as the pure core (pipelines.core.sessionize; tests hold the
two together). A user's state value is their open rows in StateCodec's format, which Python reads only through the
`DecodeState` SQL function, never byte by byte."""
from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.config import REPO_ROOT
from pipelines.core import state_format
from pipelines.core.rules import SessionRules
from pipelines.core.spec import FIELD_COLUMN_PREFIX
from pipelines.errors import ConfigError
from pipelines.job.checkpoint import read_job_metadata
from pipelines.job.operators.seam import StateOperator, StoredChunk, output_schema, register_coordinator, state_reader
from pipelines.locations import CheckpointPath

__all__ = ["JVM_JAR", "STATE_LAYOUT", "JvmOperator", "has_attributes", "register_decoder", "rules_json"]

JVM_JAR = REPO_ROOT / "build" / "jvm" / "sessions-operator.jar"  # built by `make setup` (the Makefile's jvm target)
# One key per user; each value carries its own format version byte (StateCodec.VALUE_FORMAT: v2 written, v1 read),
# so a checkpoint holding both needs no new layout id. SessionsOperator.STATE_LAYOUT says the same (a test holds it).
STATE_LAYOUT = "open_sessions_by_user/jvm-v1"
_DECODE_STATE = "sessions_jvm_state_rows"
# DecodeState's result: a user's rows (tests/test_jvm_operator.py holds it to SessionsOperator.STATE_ROW).
_ROWS_DDL = state_format.spark_type(pa.list_(pa.struct(list(state_format.DECODED_ROW_SCHEMA))))


def has_attributes(checkpoint: CheckpointPath) -> bool:
    """Whether the checkpoint's job (its recorded spec) has attributes: its canonical rows then carry them."""
    meta = read_job_metadata(checkpoint)
    return meta is not None and bool(meta.rules.attributes)


def register_decoder(spark: SparkSession, checkpoint: CheckpointPath) -> str:
    """Registers DecodeState (as the SQL function whose name it returns) for the attributes the checkpoint's job last
    ran with (its metadata's spec): their partials come out as each row's `attributes` text; a partial of an
    attribute the spec no longer has is left out, as the stream leaves it out on its next write."""
    meta = read_job_metadata(checkpoint)
    # without metadata (a checkpoint this build did not make) no attributes: any gap will do, DecodeState reads none
    rules = meta.rules if meta is not None else SessionRules(1, 0, 0)
    _jvm(spark).sessions.DecodeState.register(  # type: ignore[attr-defined]
        spark._jsparkSession, _DECODE_STATE, rules_json(rules))
    return _DECODE_STATE


def _jvm(spark: SparkSession) -> object:
    if not JVM_JAR.exists():
        raise ConfigError(f"the JVM operator needs {JVM_JAR}: run `make setup` to build it")
    jvm = spark._jvm
    assert jvm is not None  # a classic (py4j) session
    return jvm


def rules_json(rules: SessionRules) -> str:
    """The session rules as the JVM operator takes them whole (sessions.Rules): the gap, and the attributes in output
    order, each with its stored identity, aggregate, result type, the keyed column it reads and the event types it
    counts. The lateness is the watermark's (seam.keyed_events), the idle close ingest's."""
    return json.dumps({"gap_ms": rules.gap_ms, "attributes": [
        {"key": a.key, "aggregate": a.aggregate, "type": a.result_type,
         "column": None if a.field is None else f"{FIELD_COLUMN_PREFIX}{a.field}",
         "event_types": list(a.event_types)} for a in rules.attributes]})


class JvmOperator(StateOperator):
    name = "jvm"
    layout = STATE_LAYOUT

    def apply(self, keyed: DataFrame, rules: SessionRules) -> DataFrame:
        spark = keyed.sparkSession
        operator = _jvm(spark).sessions.SessionsOperator  # type: ignore[attr-defined]
        return DataFrame(operator.sessionize(keyed._jdf, rules_json(rules), output_schema(rules.attributes)), spark)

    def stored_values(self, spark: SparkSession, checkpoint: CheckpointPath, batch_id: int | None) -> DataFrame:
        """One row per user: `user_id`, `rows` (array of its open rows, decoded by StateCodec through DecodeState)
        and `bytes` (its stored value's size)."""
        decode = register_decoder(spark, checkpoint)
        return state_reader(spark, checkpoint, batch_id).select(
            F.col("key.user_id").alias("user_id"),
            F.call_function(decode, F.col("value.groupState.value")).alias("rows"),
            F.length("value.groupState.value").alias("bytes"))

    @staticmethod
    def decode(batch: pa.RecordBatch) -> Iterator[StoredChunk]:
        rows = batch.column(1)
        flat = pc.list_flatten(rows)
        users = pc.take(batch.column(0), pc.list_parent_indices(rows))
        table = pa.table({"user_id": users,
                          **{name: flat.field(name) for name in state_format.DECODED_ROW_SCHEMA.names}})
        yield StoredChunk(table, batch.num_rows, int(pc.sum(batch.column(2)).as_py() or 0))

    def users_values(self, spark: SparkSession, checkpoint: CheckpointPath, batch_id: int, user_ids: Sequence[str],
                     buckets: int) -> DataFrame:
        """Point lookups (sessions.StateLookup): only the state partitions that hold the users are read, in the
        driver, at the batch's store version, with the checkpoint's own provider and settings."""
        decode = register_decoder(spark, checkpoint)
        register_coordinator(spark)  # a provider loading a version reports to it
        jvm: Any = _jvm(spark)
        users = spark.sparkContext._gateway.new_array(jvm.java.lang.String, len(user_ids))  # type: ignore[union-attr]
        for i, user_id in enumerate(user_ids):
            users[i] = user_id
        found = DataFrame(jvm.sessions.StateLookup.values(
            spark._jsparkSession, str(checkpoint), batch_id, users), spark)
        return found.select("user_id", F.call_function(decode, F.col("value")).alias("rows"),
                            F.length("value").alias("bytes"))

    def canonical_rows(self, spark: SparkSession, checkpoint: CheckpointPath, batch_id: int | None) -> DataFrame:
        # In SQL, no Python worker: the rows are already columns after DecodeState.
        row = F.explode("rows").alias("r")
        attributes = ["r.attributes"] if has_attributes(checkpoint) else []  # a job without: today's columns
        return self.stored_values(spark, checkpoint, batch_id).select("user_id", row).select(
            "user_id", F.timestamp_millis("r.session_start_ms").alias("session_start"), "r.event_id",
            F.timestamp_millis("r.event_time_ms").alias("event_time"), "r.event_type", "r.event_count",
            "r.page_views", *attributes)

