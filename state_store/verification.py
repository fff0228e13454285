"""`sessionctl forget --verify`: where users still appear, read as an auditor reads (state_store.audit) -- every file
under every location the product writes, skipping only those the audit's index says cannot name them (`--full`:
every one) -- and the live state asked through Spark where a file of the checkpoint names them. Apart from the
erasure (state_store.erasure) so that a verify that needs no Spark loads none of the erasure's machinery."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from pipelines.config import SessionsConfig
from pipelines.errors import NoCommittedBatch, Result, SessionsError
from pipelines.ingest.erased import UserSpelling, user_hash
from pipelines.job.checkpoint import read_job_metadata
from pipelines.job.operators.jvm import STATE_LAYOUT
from pipelines.job.runtime import spark_failures
from state_store.audit import StoreFiles, scan_for
from state_store.audit_index import MIN_BYTES, AuditIndex
from state_store.kernel import replaced_checkpoints, session

__all__ = ["ForgetVerification", "Verifications", "live_events", "state_layout", "user_ids_of", "verify",
           "verify_forgotten", "verify_forgotten_many", "verify_many"]


@dataclass(frozen=True)
class ForgetVerification(Result):
    """What `sessionctl forget --verify --user U` prints: where U still appears (place -> rows, lines or files)."""
    user_hash: str
    clean: bool
    found: dict[str, int]
    files: dict[str, int] = field(default_factory=dict)  # location/relative path -> mentions, where found
    unreadable: dict[str, str] = field(default_factory=dict)  # location/relative path -> why: never clean while any
    live_state_asked: bool = True  # false: no file of the checkpoint names the users, so its state cannot hold them
    files_read: int = 0     # files read for the verify (all the users of one at once)
    files_skipped: int = 0  # files not read: the audit's index says they cannot name any of the users (not --full)


@dataclass(frozen=True)
class Verifications(Result):
    """What `sessionctl forget --verify` prints for several users: clean only if every one is; `found` summed per
    place; each user's answer in `users`, in the order given (by keyed hash, never the id)."""
    clean: bool
    found: dict[str, int]
    users: list[ForgetVerification]

    @classmethod
    def of(cls, answers: Sequence[ForgetVerification]) -> Verifications:
        found: dict[str, int] = {}
        for answer in answers:
            for place, count in answer.found.items():
                found[place] = found.get(place, 0) + count
        return cls(all(answer.clean for answer in answers), found, list(answers))


def user_ids_of(users: str | Sequence[str]) -> list[str]:
    """The users of an erasure: one id or several, each once, in the order given (SessionsError: none)."""
    ids = list(dict.fromkeys([users] if isinstance(users, str) else users))
    if not ids or not all(ids):
        raise SessionsError("forget needs user ids: --user U (repeatable) or --users-file PATH; an empty id erases "
                            "nobody")
    return ids


def live_events(spark: SparkSession, config: SessionsConfig, user_ids: Sequence[str]) -> dict[str, int]:
    """Each user's open events in the live state (one pass over it, whatever the number of users)."""
    from state_store.state import open_events_of  # the state's readers: only where Spark is asked

    try:
        return open_events_of(spark, config, user_ids)
    except NoCommittedBatch:
        return dict.fromkeys(user_ids, 0)


def _places(config: SessionsConfig) -> list[tuple[str, str]]:
    """(place, location) of everything the product writes, the tables first (so their files count under them)."""
    places = [("raw_events", config.raw_events_table), ("sessions", config.sessions_table),
              ("quarantine", config.quarantine_table), ("savepoints", config.savepoint_uri),
              ("checkpoint", str(config.checkpoint)), ("landed_lines", config.landing_uri),
              ("leases", config.lease_uri), ("warehouse", config.warehouse_uri),
              ("erasure_requests", config.erasure_requests_uri), ("home", str(config.home))]
    return [(place, uri) for place, uri in places if uri]


def verify_forgotten(config: SessionsConfig, spark: SparkSession | Callable[[], SparkSession], user_id: str, *,
                     full: bool = False) -> ForgetVerification:
    """As an auditor would: every file under every location the product writes (tables with every version and their
    logs, savepoints, the checkpoint and those set aside, landing, leases, the home), each read for every spelling
    of U (state_store.audit), and the live state asked through Spark where a file of the checkpoint names U. A large
    file the audit's index says cannot name U is not read (state_store.audit_index); `full`: every file is, the
    index's own too, and the live state is always asked. `spark` may be a callable: Spark is then started only
    if a state store file must be decoded or the live state asked."""
    return verify_forgotten_many(config, spark, [user_id], full=full)[0]


def verify_forgotten_many(config: SessionsConfig, spark: SparkSession | Callable[[], SparkSession],
                          users: Sequence[str], *, full: bool = False, index_min_bytes: int = MIN_BYTES
                          ) -> list[ForgetVerification]:
    """verify_forgotten for several users at once, in the order given: every file read once for all of them (or
    skipped by the index for all of them), the live state asked once. `index_min_bytes`: the smallest file the index
    covers (Spark's state files: any size)."""
    ids = user_ids_of(users)
    spelled = [UserSpelling(user_id) for user_id in ids]
    # Said in _places' order (the tables first), whatever order they are read in.
    found: dict[str, dict[str, int]] = {user_id: dict.fromkeys(dict(_places(config)), 0) for user_id in ids}
    files: dict[str, dict[str, int]] = {user_id: {} for user_id in ids}
    unreadable: dict[str, str] = {}
    seen: set[str] = set()
    index = None if full else AuditIndex(config.home, min_bytes=index_min_bytes)
    # The checkpoint read first: whatever other location holds it, its files count under it (the live state's check).
    places = sorted(_places(config), key=lambda place: place[0] != "checkpoint")
    labelled = [(place, uri, f"{place}:") for place, uri in places]
    # Checkpoints restores set aside live beside the checkpoint (outside it when the home is elsewhere).
    labelled += [("set_aside_checkpoints", str(path), f"set_aside:{path.name}/") for path in replaced_checkpoints(config)]
    # State store files are compressed: read decoded, or named as unreadable. Where the live state is asked whatever
    # the files say, through the Spark that asks it; else in a JVM of their own, with no Spark session, unless Spark
    # was given.
    always_ask = full or state_layout(config) != STATE_LAYOUT
    store_files = StoreFiles(spark, config=None if always_ask else config)
    with store_files, index if index is not None else contextlib.nullcontext():
        for place, uri, label in labelled:
            for user_id, findings in scan_for(uri, spelled, seen=seen, store_files=store_files, index=index).items():
                found[user_id][place] = found[user_id].get(place, 0) + findings.total()
                files[user_id].update({f"{label}{path}": count for path, count in findings.files.items()})
                unreadable.update({f"{label}{path}": why for path, why in findings.unreadable.items()})
    skipped = 0
    if index is not None:
        index.finish()  # every location was scanned: entries no file had are of files gone or changed
        skipped = index.skipped
    # The live state is made of the checkpoint's state files, just read decoded (or skipped by an index entry built
    # from them decoded): in the layout keyed by user, each key row holds the user's id between non-id bytes, so
    # where no file of the checkpoint names any of the users, the state holds none of them, and Spark is not asked.
    named = any(found[user_id].get("checkpoint") for user_id in ids) or any(
        path.startswith("checkpoint:") for path in unreadable)
    ask = always_ask or named
    live = dict.fromkeys(ids, 0)
    if ask:
        started = store_files.session()  # the Spark given, or started now
        assert started is not None  # verify is always given Spark or a way to start it
        live = live_events(started, config, ids)
    answers = []
    for user_id in ids:
        found[user_id]["live_state_events"] = live[user_id]
        clean = not any(found[user_id].values()) and not unreadable
        answers.append(ForgetVerification(user_hash(config, user_id), clean, found[user_id], files[user_id],
                                          dict(unreadable), files_read=len(seen) - skipped, files_skipped=skipped,
                                          live_state_asked=ask))
    return answers


def state_layout(config: SessionsConfig) -> str | None:
    meta = read_job_metadata(config.checkpoint)
    return meta.state_layout if meta is not None else STATE_LAYOUT  # no job yet: no state to ask


def verify(config: SessionsConfig, user_id: str, *, spark: SparkSession | None = None, full: bool = False
           ) -> ForgetVerification:
    """`forget --verify [--full]` of one user (verify_forgotten; Spark started only if it is needed)."""
    with spark_failures(config):
        return verify_forgotten(config, _given_or_started(config, spark), user_id, full=full)


def verify_many(config: SessionsConfig, users: Sequence[str], *, spark: SparkSession | None = None,
                full: bool = False) -> Verifications:
    """`forget --verify [--full]` of several users: every file read once for all of them (verify_forgotten_many)."""
    ids = user_ids_of(users)
    with spark_failures(config):
        return Verifications.of(verify_forgotten_many(config, _given_or_started(config, spark), ids, full=full))


def _given_or_started(config: SessionsConfig, spark: SparkSession | None
                      ) -> SparkSession | Callable[[], SparkSession]:
    """The caller's Spark (state files decoded in its JVM), or a way to start this process's if it is needed."""
    return spark if spark is not None else (lambda: session(config, None))
