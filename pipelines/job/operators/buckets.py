"""The state of checkpoints made by the retired Python operator (applyInPandasWithState over hash buckets of users;
values in pipelines.core.state_format's bucket store). Readable -- a savepoint of such a checkpoint, `status` and
`state --user` work -- but not runnable: its checkpoints move to the JVM operator through a savepoint and a restore.

Why retired: the JVM operator runs the same rules with clearly more throughput (benchmarks/README.md has the
figures), and keeping both first-class meant running every stream, lifecycle and crash test twice."""
from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.core import state_format
from pipelines.core.rules import SessionRules
from pipelines.errors import CheckpointMismatch
from pipelines.job.operators.seam import StateOperator, StoredChunk, state_reader
from pipelines.locations import CheckpointPath

__all__ = ["BucketLayout"]

STATE_COLUMN = "state"  # the binary state column of applyInPandasWithState's state schema
# A bucket value: header (magic, cold min due, stale cold rows, cold bytes, hash bytes, dead bytes), then cold rows (an
# Arrow IPC stream of STORE_SCHEMA rows), their users' 32-bit hashes, the dead users (JSON), then hot rows (IPC).
_MAGIC = b"SES2"
_HEADER = struct.Struct("<4sqqIII")


def _ipc_rows(data: bytes | memoryview) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all() if len(data) else state_format.empty_store()


def decode_bucket(value: bytes) -> pa.Table:
    """A stored bucket value -> its live rows (STORE_SCHEMA): cold rows minus dead users, then hot rows."""
    if not value:
        return state_format.empty_store()
    data = memoryview(value)
    magic, _, _, n_cold, n_hash, n_dead = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise ValueError("not a bucket value of state layout open_sessions/v2")
    at = _HEADER.size
    cold = _ipc_rows(data[at:at + n_cold])
    at += n_cold + n_hash  # the hashes were a membership pre-check for writers; a reader needs none
    dead = json.loads(bytes(data[at:at + n_dead])) if n_dead else []
    at += n_dead
    if dead and cold.num_rows:
        cold = cold.filter(pc.invert(pc.is_in(cold["user_id"], value_set=pa.array(sorted(dead), pa.string()))))
    return pa.concat_tables([cold, _ipc_rows(data[at:])])


RETIRED = ("the checkpoint was made by the Python operator, which this build no longer runs: take a savepoint of "
           "it (`sessionctl savepoint`) and restore it (`sessionctl restore --savepoint latest`) to move its state to "
           "the JVM operator")


class BucketLayout(StateOperator):
    name = "python"
    layout = state_format.SCHEMA_ID  # the id these checkpoints recorded (the canonical form's, at the time)
    retired = RETIRED

    def apply(self, keyed: DataFrame, rules: SessionRules) -> DataFrame:
        raise CheckpointMismatch(RETIRED)

    def max_partitions(self, buckets: int) -> int | None:
        return buckets  # at most that many keys

    def stored_values(self, spark: SparkSession, checkpoint: CheckpointPath, batch_id: int | None) -> DataFrame:
        """One row per hash bucket: `v` (its stored value) and `bucket`."""
        return state_reader(spark, checkpoint, batch_id).select(
            F.col(f"value.groupState.{STATE_COLUMN}").alias("v"),
            F.col("key.bucket").alias("bucket")).where(F.col("v").isNotNull())

    @staticmethod
    def decode(batch: pa.RecordBatch) -> Iterator[StoredChunk]:
        for value in batch.column(0).to_pylist():
            yield StoredChunk(decode_bucket(value), 1, len(value))

    def users_values(self, spark: SparkSession, checkpoint: CheckpointPath, batch_id: int, user_ids: Sequence[str],
                     buckets: int) -> DataFrame:
        # the operator's bucket of each user
        wanted = [F.pmod(F.xxhash64(F.lit(user_id)), F.lit(buckets)).cast("int") for user_id in user_ids]
        return self.stored_values(spark, checkpoint, batch_id).where(F.col("bucket").isin(wanted))
