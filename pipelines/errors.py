"""What an operation ends with, typed (in the bottom layer, so the job and the lifecycle library share it).

Expected operator errors, one type per situation: callers match on the type, never on the message; the message is
what the operator reads. sessionctl prints any SessionsError as one line on stderr (exit 1), Dagster turns it into a
Failure. And the one result convention (`Result`): an operation returns a frozen dataclass, read by attribute;
`to_dict()` is its JSON shape (what sessionctl prints and Dagster ops pass on). Results of the job
(pipelines.ingest.IngestResult) and of the lifecycle library (state_store.results) share this base."""
from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any, ClassVar

__all__ = ["UNREADABLE_SAVEPOINT_FILE", "Result", "CheckpointDamaged", "CheckpointMismatch", "CheckpointMissing", "ConcurrentIngest", "ConfigError", "HomeNotWritable", "JobRunning", "LeaseLost", "LeaseWaitTimedOut", "LifecycleBusy", "NextStepError", "NoCommittedBatch", "NotRunning", "RescaleIncomplete", "RescaleRefused", "RestoreIncomplete", "SavepointDamaged", "SavepointFailed", "SavepointIncompatible", "SavepointNotFound", "SessionsError", "SourceDataLost", "SourceUnavailable", "StateMismatch", "StopIncomplete", "StorageAccessDenied", "StorageUnavailable", "StreamFailed", "savepoint_way_out", "unreadable_savepoint_file"]


class SessionsError(RuntimeError):
    """An expected operator error: printed as one line, never as a traceback."""


class ConfigError(SessionsError, ValueError):
    """A setting that cannot work; the message names the variable and why. (A ValueError too: callers that catch ValueError keep working.)"""


class HomeNotWritable(SessionsError):
    """A command that writes (its checkpoint, tables, leases, logs, erasure key) met a data location it cannot write:
    a read-only mount or missing permissions. The message names the variable, the path and the OS's reason."""


class JobRunning(SessionsError):
    """The job lock is held: the stream (or an operation that needs it stopped) is running."""

    def __init__(self, message: str, holder: str, lock: str) -> None:
        super().__init__(message)
        self.holder = holder  # what the holding process wrote into the lock file: "run (pid 123)"
        self.lock = lock      # the lock file's path


class LifecycleBusy(JobRunning):
    """The lifecycle lock is held: another savepoint, restore, rescale or compaction is running."""


class NoCommittedBatch(SessionsError):
    """Nothing to do: the checkpoint has no committed batch yet (nothing to savepoint or rescale)."""


class CheckpointMissing(SessionsError):
    """No checkpoint, but the output tables already have rows: a fresh start would write them again."""


class CheckpointMismatch(SessionsError):
    """The settings (gap, lateness, buckets) do not fit the ones the checkpoint was made with."""




class SavepointIncompatible(SessionsError):
    """A savepoint this job cannot restore as asked: unknown state schema, or other gap/lateness (--migrate)."""


class SavepointFailed(SessionsError):
    """Taking a savepoint failed; the attempt is recorded as failed, never as complete."""


class StateMismatch(SessionsError):
    """State read back after a restore's bootstrap or a repartition does not match what it must equal."""


class NextStepError(SessionsError):
    """An operation broke part-way or cannot go on as asked; `next_step` is the command or action that the operator
    runs now (the message says it too; Dagster's failure metadata carries it)."""

    def __init__(self, message: str, next_step: str) -> None:
        super().__init__(message)
        self.next_step = next_step


class SavepointNotFound(NextStepError):
    """No savepoint by that id, no complete one for `latest`, or the one named is not complete; `next_step` names
    the savepoints that can be restored (or how to take one)."""


def savepoint_way_out(savepoint_id: str | None = None) -> str:
    """What the operator does about a damaged savepoint (SavepointDamaged's `next_step`)."""
    which = f"savepoint {savepoint_id}" if savepoint_id else "it"
    return ("restore another savepoint (`sessionctl restore --savepoint ID --dry-run` checks one first), start a new "
            f"chain with `sessionctl savepoint --full`; `sessionctl compact` drops {which} once retention no longer "
            "keeps it")


class SavepointDamaged(NextStepError):
    """A savepoint cannot be read as its catalog row and Delta log say: a log entry or data file missing or
    unreadable, a file truncated, or a re-read whose count and checksum differ. `savepoint_id` names the damaged
    savepoint (None when unknown), `next_step` the way out (savepoint_way_out by default)."""

    def __init__(self, message: str, next_step: str | None = None, *, savepoint_id: str | None = None) -> None:
        super().__init__(message, next_step or savepoint_way_out(savepoint_id))
        self.savepoint_id = savepoint_id


# A Python task that cannot read a savepoint's data file raises an OSError with this text
# (state_store.savepoint.files.file_batches); the driver gets only text back (a PythonException). The file's savepoint is
# its folder under state/ (state_store.savepoint.catalog: state/<id>/).
UNREADABLE_SAVEPOINT_FILE = "savepoint data file {uri} cannot be read ({cause})"
_UNREADABLE = re.compile(r"savepoint data file (\S*/state/([^/\s]+)/[^/\s]+) cannot be read \((.*)\)")


def unreadable_savepoint_file(text: str) -> SavepointDamaged | None:
    """The executors' failure to read a savepoint data file (its text), as the one line naming the savepoint."""
    found = _UNREADABLE.search(text)
    if found is None:
        return None
    uri, savepoint_id, cause = found.groups()
    return SavepointDamaged(f"savepoint {savepoint_id} is damaged: its data file {uri} cannot be read "
                            f"({cause[:200]}): {savepoint_way_out(savepoint_id)}", savepoint_id=savepoint_id)


class RestoreIncomplete(NextStepError):
    """A restore broke part-way."""


class RescaleRefused(SessionsError):
    """A rescale that cannot be done as asked (a partition count outside 1..state buckets)."""


class RescaleIncomplete(NextStepError):
    """A rescale was interrupted after Spark wrote its repartition batch; `next_step` finishes it."""


class NotRunning(SessionsError):
    """`stop` found no running stream (no live holder of the job lease)."""


class StopIncomplete(NextStepError):
    """A stop (with savepoint) did not complete every step; the stream is stopped or the request still stands."""


class CheckpointDamaged(SessionsError):
    """A state store file is damaged or missing: the message says what recovers it."""


class StreamFailed(SessionsError):
    """The streaming query failed for another reason; the message has its first line and where the log is."""


class StorageUnavailable(SessionsError):
    """An object store (S3) or HDFS did not answer or refused: the message names the endpoint (or the setting and the
    address it tried), the URI and the cause."""


class StorageAccessDenied(SessionsError):
    """HDFS refused this process's user a location (its permissions): the message names the setting, the user, the
    path and HDFS's reason. Not retried: permissions do not come back by themselves."""


class SourceUnavailable(SessionsError):
    """The event source (Kafka) did not answer, refused, or lacks the topic: the message names the bootstrap servers,
    the topic and the cause. Or Spark's executors cannot read a large landed file that their tasks were to read (a
    landing directory that is not shared with them)."""


class SourceDataLost(SessionsError):
    """Messages the raw_events table has not ingested yet are gone from the source (retention or a truncation
    deleted them, or the topic was deleted or recreated under us): the message names the topic, the partition and
    the offsets lost. Never skipped silently."""

    def __init__(self, message: str, topic: str, partition: int, first: int, last: int) -> None:
        super().__init__(message)
        self.topic, self.partition = topic, partition
        self.first, self.last = first, last  # the offsets lost, inclusive


class LeaseLost(SessionsError):
    """This process held a lease and lost it: a newer holder took it (its renewals lapsed past the TTL, or the
    process was paused) -- it is fenced, and writes nothing more. `lease` is the lease's path or URI, `epoch` this
    holder's epoch, `newer` the newer holder's epoch when known."""

    def __init__(self, message: str, lease: str, epoch: int, newer: int | None = None) -> None:
        super().__init__(message)
        self.lease, self.epoch, self.newer = lease, epoch, newer


class LeaseWaitTimedOut(SessionsError):
    """Waiting for a lease that another live holder keeps renewing took longer than its deadline."""

    def __init__(self, message: str, holder: str, lock: str) -> None:
        super().__init__(message)
        self.holder = holder  # what the holder wrote into the lease: "ingest (pid 123 on host, epoch 4)"
        self.lock = lock      # the lease's path or URI


class ConcurrentIngest(SessionsError):
    """raw_events got an ingest commit from another process while this ingest held the ingest lease (a writer that
    does not take the lease): this ingest stops before it commits an ingest_seq twice."""


class Result:
    __dataclass_fields__: ClassVar[dict[str, Any]]  # every result is a dataclass

    # Keys that were only present when set: left out of to_dict() while None, so the JSON keeps its shape.
    _omit_if_none: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for name in self._omit_if_none:
            if out[name] is None:
                del out[name]
        return out
