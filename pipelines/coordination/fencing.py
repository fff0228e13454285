"""Fenced Delta commits: a writer proves, at each commit, that it still holds the newest epoch of its lease.

Every fenced commit records its lease's epoch twice: as a Delta application transaction (`Lease.app_id` -> epoch,
kept in the table's snapshot through OPTIMIZE, VACUUM and log checkpoints, so it is read cheaply from any later
version) and in the commit's metadata (`sessions.lease_epoch`, for people reading the history). Before it commits a
writer loads the table, refuses (LeaseLost) when the table already holds a newer epoch of its lease, checks the lease
itself (`Lease.check()`: no newer epoch in the lease store, renewals not lapsed), and commits on exactly the version
it loaded (`max_commit_retries=0`): a commit that loses the race for its version is never rebased by delta-rs onto
the winner -- which may be a newer holder's commit -- but tried again from a fresh load, whose checks see the winner.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError

from pipelines.coordination.leases import Lease

__all__ = ["EPOCH_KEY", "committing", "fence", "fenced_delete"]

log = logging.getLogger(__name__)

EPOCH_KEY = "sessions.lease_epoch"  # commit metadata: the epoch of the writer's (first) lease
LEASES_KEY = "sessions.leases"      # commit metadata: every lease the writer checked, "name:epoch,..."
COMMIT_ATTEMPTS = 8                 # a commit that lost the race for its version is tried again this often at most
T = TypeVar("T")


def fence(table: DeltaTable | None, leases: Sequence[Lease], where: str) -> tuple[list[Transaction], dict[str, str]]:
    """Refuse (LeaseLost) when `table` (as loaded; None: not created yet) holds a newer epoch of one of `leases`, or a
    lease is lost; else the transactions and the commit metadata that record their epochs. Call it right before the
    commit."""
    transactions, metadata = [], {}
    # The lease first: a holder that was paused past its TTL is told so in its own terms (not renewed for N s, who
    # took it), whether or not its renewal thread noticed before this thread ran; the table catches what it cannot.
    for held in leases:
        held.check()
    for held in leases:
        committed = table.transaction_version(held.app_id) if table is not None else None
        if committed is not None and committed > held.epoch:
            held.fence(f"epoch {committed} of it already committed to {where}", committed)
        transactions.append(Transaction(held.app_id, held.epoch))
    if leases:
        metadata[EPOCH_KEY] = str(leases[0].epoch)
        metadata[LEASES_KEY] = ",".join(f"{held.name}:{held.epoch}" for held in leases)
    return transactions, metadata


def committing(attempt: Callable[[], T], where: str) -> T:
    """Run `attempt` -- load the table, check (fence), write with max_commit_retries=0 -- until it commits or its
    checks refuse; a CommitFailedError (another writer committed that version first) is tried again, from a fresh
    load, at most COMMIT_ATTEMPTS times."""
    for number in range(1, COMMIT_ATTEMPTS + 1):
        try:
            return attempt()
        except CommitFailedError as error:
            if number == COMMIT_ATTEMPTS:
                raise
            log.info("a commit to %s lost the race for its version (%s): attempt %d from a fresh load", where,
                     str(error).splitlines()[0] if str(error) else type(error).__name__, number + 1)
            time.sleep(0.05 * number)
    raise AssertionError("unreachable")


def fenced_delete(uri: str, predicate: str, leases: Sequence[Lease], storage_options: dict[str, str] | None = None
                  ) -> int:
    """A Delta DELETE by the holder of `leases` (a restore's roll-back, an erasure): fenced like an append; the rows
    deleted. Without leases, a plain delete."""

    def attempt() -> int:
        table = DeltaTable(uri, storage_options=storage_options)
        transactions, metadata = fence(table, leases, uri)
        properties = CommitProperties(app_transactions=transactions or None, custom_metadata=metadata or None,
                                      max_commit_retries=0 if leases else None)
        return int(table.delete(predicate, commit_properties=properties).get("num_deleted_rows", 0) or 0)

    return committing(attempt, uri)
