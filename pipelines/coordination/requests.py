"""How an operator reaches a stream that another process or host runs: a request file beside the leases (in the
lease store, so any host can write it), answered by the stream between two batches.

A request names the job lease (token) of the stream it is for: that stream honours it between batches and answers
in a response file -- a stop before it releases the lease; an erasure, and a rescale or a restore once its first
batch after it ran, and goes on. A request for a lease that is gone is stale and ignored by the next stream.

A stop, a rescale and a restore have one slot each (a second stop joins the first). Erasures do not wait for each
other: each request is a file of its own, naming its users (one or many) until the stream answers, and the stream
erases the users of every erasure request it finds in one erasure, answers each and removes them (the answers name
only keyed hashes)."""
from __future__ import annotations

import datetime as dt
import json
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, overload

from pipelines.config import SessionsConfig
from pipelines.coordination.job_leases import running_stream
from pipelines.coordination.lease_stores import LeaseStore, store_for
from pipelines.coordination.leases import Lease, LeaseInfo
from pipelines.errors import StopIncomplete

__all__ = ["ErasureAnswer", "ErasureRequest", "RescaleRequest", "RestoreRequest", "ResumedAnswer", "StateChange",
           "StopAnswer", "StopRequest", "StreamRequest", "answer_request", "await_answer", "pending_request",
           "request_erasure", "request_rescale", "request_restore", "request_stop", "take_answer", "withdraw"]

STOP_REQUEST = "stop.request.json"
ERASE_REQUESTS = "erase.request-"  # + the request's token + .json: one file per request
RESCALE_REQUEST = "rescale.request.json"
RESTORE_REQUEST = "restore.request.json"


@dataclass(frozen=True)
class StopRequest:
    """Stop after the current batch; with `savepoint`, take the savepoint of that last batch as part of the stop."""
    token: str
    run_token: str     # the job lease (token) of the stream it asks to stop
    savepoint: bool
    requested_by: str
    requested_at: str
    native: bool = False  # the savepoint with its native copy (state_store.savepoint.native)

    @property
    def response_name(self) -> str:
        return f"stop.response-{self.token}.json"


@dataclass(frozen=True)
class ErasureRequest:
    """Erase `user_ids` (all in one erasure) between two batches, then go on. As the stream reads them, the erasure
    requests pending together are one: their users, and the requests it answers (`joined`: the others' tokens)."""
    token: str
    run_token: str
    user_ids: list[str]
    requested_by: str
    requested_at: str
    joined: tuple[str, ...] = ()  # never stored: set by pending_request

    @property
    def response_name(self) -> str:
        return f"erase.response-{self.token}.json"


@dataclass(frozen=True)
class RescaleRequest:
    """Rescale the state to `partitions` between two batches, then go on."""
    token: str
    run_token: str
    partitions: int
    requested_by: str
    requested_at: str

    @property
    def response_name(self) -> str:
        return f"rescale.response-{self.token}.json"


@dataclass(frozen=True)
class RestoreRequest:
    """Restore `savepoint` (an id: the requester resolved `latest` and ran the pre-flight) between two batches, then
    go on from it."""
    token: str
    run_token: str
    savepoint: str
    partitions: int | None
    migrate: bool
    requested_by: str
    requested_at: str
    canonical: bool = False  # the canonical rows even where the savepoint's native copy would do

    @property
    def response_name(self) -> str:
        return f"restore.response-{self.token}.json"


StateChange = RescaleRequest | RestoreRequest  # what a stream does between two batches, answered after the next one
StreamRequest = StopRequest | ErasureRequest | StateChange


@dataclass(frozen=True)
class StopAnswer:
    last_committed_batch: int | None
    savepoint: dict[str, Any] | None = None  # the savepoint's catalog row, when one was asked for and taken
    error: str | None = None                  # why the savepoint failed (the stream stopped anyway)


@dataclass(frozen=True)
class ErasureAnswer:
    erased: dict[str, Any] | None = None  # the erasure's result (ForgetResult.to_dict())
    error: str | None = None


@dataclass(frozen=True)
class ResumedAnswer:
    """The answer to a state change (rescale, restore) a stream made between two batches."""
    result: dict[str, Any] | None = None  # the change's result (RescaleResult / RestoreResult .to_dict())
    error: str | None = None
    # The stream's downtime: from the end of its last batch before the change to the end of its first batch after
    # (Spark's own progress times); None when no batch ran within the wait (no new events): `resumed_s` then says
    # when the query was running again.
    downtime_s: float | None = None
    resumed_s: float | None = None


Answer = StopAnswer | ErasureAnswer | ResumedAnswer
RequestKind = type[StopRequest] | type[ErasureRequest] | type[RescaleRequest] | type[RestoreRequest]
_FILES: dict[RequestKind, str] = {StopRequest: STOP_REQUEST, RescaleRequest: RESCALE_REQUEST,
                                  RestoreRequest: RESTORE_REQUEST}
_ANSWERS: dict[RequestKind, type[Answer]] = {StopRequest: StopAnswer, ErasureRequest: ErasureAnswer,
                                             RescaleRequest: ResumedAnswer, RestoreRequest: ResumedAnswer}
# What the requester runs again when a request was not answered.
_AGAIN: dict[RequestKind, tuple[str, str]] = {StopRequest: ("stop", "stop"),
                                              ErasureRequest: ("take the erasure", "forget"),
                                              RescaleRequest: ("rescale", "rescale"),
                                              RestoreRequest: ("restore", "restore --online")}


def _file(request: StreamRequest | RequestKind) -> str:
    if isinstance(request, ErasureRequest):
        return f"{ERASE_REQUESTS}{request.token}.json"
    return _FILES[request if isinstance(request, type) else type(request)]


def _store(config: SessionsConfig) -> LeaseStore:
    return store_for(config.lease_uri)


def _write(config: SessionsConfig, name: str, payload: dict[str, Any]) -> None:
    _store(config).replace(name, json.dumps(payload, default=str).encode())


def _read(config: SessionsConfig, name: str) -> dict[str, Any] | None:
    record = _store(config).read(name)
    if record is None:
        return None
    try:
        found = json.loads(record.data)
    except ValueError:
        return None
    return dict(found) if isinstance(found, dict) else None


def _requested() -> dict[str, str]:
    return {"token": uuid.uuid4().hex, "requested_by": f"pid {os.getpid()} on {socket.gethostname()}",
            "requested_at": dt.datetime.now(dt.timezone.utc).isoformat()}


def _stored(kind: RequestKind, config: SessionsConfig) -> StreamRequest | None:
    found = _read(config, _file(kind))
    if found is None:
        return None
    try:
        return kind(**found)
    except TypeError:  # not a request this build wrote: ignored, as a stale one would be
        return None


def _ask(config: SessionsConfig, kind: RequestKind, stream: LeaseInfo | Lease, joined_on: tuple[str, ...],
         **fields: Any) -> Any:
    """The stored request of `kind` for `stream` when its `joined_on` fields are these (joined, not repeated), else
    a new one written in its place."""
    current = _stored(kind, config)
    if isinstance(current, kind) and current.run_token == stream.token and \
            all(getattr(current, name) == fields[name] for name in joined_on):
        return current
    values: dict[str, Any] = {"run_token": stream.token, **fields, **_requested()}
    request = kind(**values)
    _write(config, _file(kind), asdict(request))
    return request


def request_stop(config: SessionsConfig, *, stream: LeaseInfo | Lease, savepoint: bool,
                 native: bool = False) -> StopRequest:
    """Ask the stream holding `stream` to stop; a request already made for it is joined, not repeated."""
    request: StopRequest = _ask(config, StopRequest, stream, (), savepoint=savepoint, native=native)
    return request


def request_erasure(config: SessionsConfig, *, stream: LeaseInfo | Lease, user_ids: Sequence[str]) -> ErasureRequest:
    """Ask the stream holding `stream` to erase `user_ids` between two batches, all in one erasure: a request of its
    own, which other erasure requests pending at the same time join (one erasure for all of them)."""
    asked = _requested()
    request = ErasureRequest(token=asked["token"], run_token=stream.token, user_ids=list(user_ids),
                             requested_by=asked["requested_by"], requested_at=asked["requested_at"])
    _write(config, _file(request), {k: v for k, v in asdict(request).items() if k != "joined"})
    return request


def _erasures(config: SessionsConfig, run: LeaseInfo | Lease) -> ErasureRequest | None:
    """The erasure requests pending for the stream holding `run`, as one (oldest first): their users, each once."""
    found = []
    for name in _store(config).names(ERASE_REQUESTS):
        stored = _read(config, name)
        try:
            request = ErasureRequest(**stored) if stored is not None else None
        except TypeError:  # not a request this build wrote: ignored, as a stale one would be
            continue
        if request is not None and request.run_token == run.token and name == _file(request):
            found.append(request)
    if not found:
        return None
    found.sort(key=lambda r: (r.requested_at, r.token))
    users = list(dict.fromkeys(user for request in found for user in request.user_ids))
    first = found[0]
    return ErasureRequest(token=first.token, run_token=first.run_token, user_ids=users,
                          requested_by=first.requested_by, requested_at=first.requested_at,
                          joined=tuple(r.token for r in found[1:]))


def request_rescale(config: SessionsConfig, *, stream: LeaseInfo | Lease, partitions: int) -> RescaleRequest:
    """Ask the stream holding `stream` to rescale its state to `partitions` between two batches (one at a time)."""
    request: RescaleRequest = _ask(config, RescaleRequest, stream, ("partitions",), partitions=partitions)
    return request


def request_restore(config: SessionsConfig, *, stream: LeaseInfo | Lease, savepoint: str, partitions: int | None,
                    migrate: bool, canonical: bool = False) -> RestoreRequest:
    """Ask the stream holding `stream` to restore `savepoint` (an id) between two batches (one at a time)."""
    request: RestoreRequest = _ask(config, RestoreRequest, stream, ("savepoint", "partitions", "migrate", "canonical"),
                                   savepoint=savepoint, partitions=partitions, migrate=migrate, canonical=canonical)
    return request


def pending_request(config: SessionsConfig, run: LeaseInfo | Lease) -> StreamRequest | None:
    """The stop request -- or else an erasure, a rescale or a restore request -- for the stream holding lease `run`
    (checked between batches)."""
    stop = _stored(StopRequest, config)
    if stop is not None and stop.run_token == run.token:
        return stop
    erasures = _erasures(config, run)
    if erasures is not None:
        return erasures
    for kind in (RescaleRequest, RestoreRequest):
        current = _stored(kind, config)
        if current is not None and current.run_token == run.token:
            return current
    return None


def withdraw(config: SessionsConfig, request: StreamRequest) -> None:
    """Remove a request nobody will answer (its stream went away), so the next stream does not see it."""
    current = _read(config, _file(request))
    if current is not None and current.get("token") == request.token:
        _store(config).delete(_file(request))


def answer_request(config: SessionsConfig, request: StreamRequest, answer: Answer) -> None:
    """The stream's answer (a stop's is written before it releases the job lease); the request is done with. Erasure
    requests that joined it get the same answer."""
    _write(config, request.response_name, asdict(answer))
    withdraw(config, request)
    if isinstance(request, ErasureRequest):
        for token in request.joined:
            joined = replace(request, token=token, joined=())
            _write(config, joined.response_name, asdict(answer))
            withdraw(config, joined)


@overload
def take_answer(config: SessionsConfig, request: StopRequest) -> StopAnswer | None: ...
@overload
def take_answer(config: SessionsConfig, request: ErasureRequest) -> ErasureAnswer | None: ...
@overload
def take_answer(config: SessionsConfig, request: StateChange) -> ResumedAnswer | None: ...
def take_answer(config: SessionsConfig, request: StreamRequest) -> Answer | None:
    """The answer to `request` if the stream gave one (the file is removed once read)."""
    found = _read(config, request.response_name)
    if found is None:
        return None
    _store(config).delete(request.response_name)
    return _ANSWERS[type(request)](**found)


@overload
def await_answer(config: SessionsConfig, *, stream: LeaseInfo, request: StopRequest, patience_s: float,
                 withdraw_on_timeout: bool) -> StopAnswer | None: ...
@overload
def await_answer(config: SessionsConfig, *, stream: LeaseInfo, request: ErasureRequest, patience_s: float,
                 withdraw_on_timeout: bool) -> ErasureAnswer | None: ...
@overload
def await_answer(config: SessionsConfig, *, stream: LeaseInfo, request: StateChange, patience_s: float,
                 withdraw_on_timeout: bool) -> ResumedAnswer | None: ...
def await_answer(config: SessionsConfig, *, stream: LeaseInfo, request: StreamRequest, patience_s: float,
                 withdraw_on_timeout: bool) -> Answer | None:
    """The stream's answer to `request`, or None when the stream went away without one (the request is withdrawn
    then); StopIncomplete after `patience_s` seconds (the request stands unless `withdraw_on_timeout`)."""
    deadline = time.monotonic() + patience_s
    while True:
        answer = take_answer(config, request)
        if answer is not None:
            return answer
        holder = running_stream(config)
        if holder is None or holder.token != stream.token:
            answer = take_answer(config, request)  # answered just before it went away
            if answer is None:
                withdraw(config, request)
            return answer
        if time.monotonic() > deadline:
            if withdraw_on_timeout:
                withdraw(config, request)
            what, again = _AGAIN[type(request)]
            raise StopIncomplete(f"the stream ({stream.describe()}) did not {what} within {patience_s:g} s: run "
                                 f"`sessionctl {again}` again" + ("" if withdraw_on_timeout else
                                                                  " to wait for it (the request stands)"),
                                 next_step=f"sessionctl {again}")
        time.sleep(0.5)
