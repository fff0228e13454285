"""A rescale or a restore done beside a running stream (`sessionctl rescale`, `sessionctl restore --online`), between two
batches: `change_state` hands the request to the state layer's handler (OnStateChange) with the query stopped and
the job lease held, and `Resumed` answers the requester once the first batch after the change ran, the downtime
measured by Spark's progress times (`batch_end`). The run loop (pipelines.job.stream.run_continuously) takes the
request, and reads the checkpoint's metadata again after the change; this module owns the change and its answer."""
from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from pipelines.config import SessionsConfig
from pipelines.coordination.leases import Lease
from pipelines.coordination.requests import ResumedAnswer, StateChange, answer_request
from pipelines.errors import SessionsError

__all__ = ["OnStateChange", "Resumed", "batch_end", "change_state", "first_line"]


# Called by the run loop for a rescale or a restore request, with the query stopped and the job lease held; returns
# the change's result. The state layer rescales and restores (state_store.lifecycle); this layer does not know how.
OnStateChange = Callable[[StateChange, SparkSession, Lease], "dict[str, Any]"]


def batch_end(query: StreamingQuery) -> float | None:
    """When the newest batch the query ran ended (epoch s, from Spark's progress: its start plus triggerExecution);
    None before it ran one. An idle trigger reports no addBatch and is no batch."""
    for progress in reversed(query.recentProgress):
        durations = progress.durationMs or {}
        if "addBatch" in durations:
            begun = dt.datetime.fromisoformat(progress.timestamp.replace("Z", "+00:00")).timestamp()
            return begun + durations.get("triggerExecution", 0) / 1000
    return None


@dataclass
class Resumed:
    """A state change done between two batches, answered once the first batch after it ran -- or, with no new
    events, `wait_s` after the query started again, with the downtime unknown and `started` (when the query ran
    again) said instead."""
    request: StateChange
    result: dict[str, Any]
    before_end: float | None  # epoch s: the end of the last batch before the change
    wait_s: float
    started: float | None = None  # epoch s
    deadline: float = float("inf")  # monotonic
    answered: bool = False

    def resume(self) -> None:
        self.started, self.deadline = time.time(), time.monotonic() + self.wait_s

    def check(self, config: SessionsConfig, query: StreamingQuery) -> None:
        end = batch_end(query)
        if end is not None and (self.before_end is None or end > self.before_end):
            self.answer(config, end)
        elif time.monotonic() > self.deadline:
            self.answer(config, None)

    def answer(self, config: SessionsConfig, first_end: float | None) -> None:
        def since_before(moment: float | None) -> float | None:
            return round(moment - self.before_end, 3) if moment is not None and self.before_end is not None else None
        answer_request(config, self.request, ResumedAnswer(result=self.result, downtime_s=since_before(first_end),
                                                           resumed_s=since_before(self.started)))
        self.answered = True


def change_state(config: SessionsConfig, request: StateChange, on_change: OnStateChange | None, *,
                 spark: SparkSession, lease: Lease, before_end: float | None, poll_seconds: float) -> Resumed | None:
    """The rescale or restore between two batches, of a request the run loop took (withdrew: answered later, never
    taken twice), with `spark` and `lease` the run's; `before_end` is the end of the last batch before it (epoch s).
    A failure is answered at once (the stream goes on from the checkpoint as it is: a rescale Spark did not finish, or
    a restore that set the old checkpoint aside and did not finish, makes the query fail with the one line that
    finishes it). Whatever happened, the caller reads the checkpoint's metadata again."""
    try:
        if on_change is None:
            raise SessionsError("this stream cannot rescale or restore (no handler): stop it and run the command")
        result = on_change(request, spark, lease)
    except Exception as error:  # noqa: BLE001 -- the requester is told either way; an unexpected one is raised too
        answer_request(config, request, ResumedAnswer(error=first_line(error)))
        if not isinstance(error, SessionsError):
            raise
        return None
    # The first batch after runs at the query's first trigger when events are waiting; two polls and the stop
    # timeout bound the wait for one.
    return Resumed(request, result, before_end, wait_s=2 * poll_seconds + config.stop_timeout_s)


def first_line(error: BaseException) -> str:
    """The one line a requester is told of a failure (a state change's here; the run loop's erasures and stops too)."""
    return str(error).splitlines()[0] if str(error) else type(error).__name__
