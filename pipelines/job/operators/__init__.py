"""The stateful operators behind one seam (`seam.StateOperator`): the JVM operator that runs, the retired Python
operator's layout that can still be read, and the registry that picks one per checkpoint.

Which operator runs a checkpoint: decided here (the registry), once, from its recorded state layout (or for a new checkpoint),
then handed down (pipelines.job.operators.seam).
"""
from __future__ import annotations

from pipelines.errors import CheckpointMismatch, NoCommittedBatch
from pipelines.job.checkpoint import read_job_metadata
from pipelines.job.operators.buckets import BucketLayout
from pipelines.job.operators.jvm import JvmOperator
from pipelines.job.operators.seam import StateOperator
from pipelines.locations import CheckpointPath

__all__ = ["for_layout", "for_new_checkpoint", "of_checkpoint"]


def for_layout(layout: str | None) -> StateOperator:
    """The operator that owns a checkpoint's state layout; a layout this build cannot read is one line saying so."""
    for operator in (JvmOperator(), BucketLayout()):
        if operator.layout == layout:
            return operator
    raise CheckpointMismatch(
        f"the checkpoint holds state in an older layout ({layout or 'JSON, v1'}) that this build cannot run on: "
        "restore a savepoint (`sessionctl restore --savepoint latest`; v1 savepoints are upgraded and the events "
        "after them replayed exactly once)")


def of_checkpoint(checkpoint: CheckpointPath) -> StateOperator:
    """The operator of an existing checkpoint, from its metadata (for readers given only the path)."""
    meta = read_job_metadata(checkpoint)
    if meta is None:
        raise NoCommittedBatch(f"no state yet: no job metadata in {checkpoint}")
    return for_layout(meta.state_layout)


def for_new_checkpoint() -> StateOperator:
    """The operator a new checkpoint (a fresh start or a restore) is made with: the JVM one, the only runnable one
    (pipelines.config refuses SESSIONS_OPERATOR=python in one line)."""
    return JvmOperator()
