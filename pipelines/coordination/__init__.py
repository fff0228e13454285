"""How processes and hosts agree: leases with fencing epochs, where leases are stored, whether a holder is alive,
fenced Delta commits -- and, here, the crash campaign's named kill points.

Named kill points for the crash campaign (testkit/campaign.py): with SESSIONS_KILL_AT=<name> in its environment,
a process SIGKILLs itself when it reaches that point -- a crash at an exact moment instead of a random one; with
SESSIONS_PAUSE_AT=<name> it SIGSTOPs itself there instead -- a process frozen at an exact moment (a long GC pause, a
stopped VM), which SIGCONT resumes. Unset (as in production), a kill point does nothing.

Points: `savepoint:files-written` (the executors wrote a savepoint's files, the Delta commit not made),
`savepoint:committed` (its table committed, no catalog row yet), `fold:written` (compaction wrote a folded table's
files, not committed), `fold:committed` (the folded table committed, the catalog not updated), `sink:files-written` (the tasks wrote a
batch's session or quarantine files, the sink's Delta commit for them not made), `ingest:files-written` (Spark
tasks wrote a large landed file's raw_events files, the ingest commit not made), `lease:taken` (a lease's
new epoch record written, nothing done under it yet: the next command must take it over, not wait or wedge),
`rescale:saved` (a rescale's pre-rescale savepoint taken, the state not moved yet), `rescale:moved` (the state
repartitioned or restored, the stream not running again yet: the requester not answered), `restore:checked` (a
restore's checks done, nothing written), `restore:aside` (a restore's
marker written and the old checkpoint set aside, nothing else changed) and `restore:rolled-back` (the outputs rolled
back to the savepoint, the new checkpoint's bootstrap batch not run); `savepoint:native-copied` (a savepoint's native copy
written, its catalog row not recorded), `restore:native-copied` (a native copy put back as the checkpoint, its job
metadata not written and the outputs not rolled back), `forget:state-installed` (an erasure's rewritten state partitions
installed as the live version, their older files that hold the users not removed yet) and `forget:rows-erased` (an
erasure's live state rewritten and its users' raw_events rows deleted; sessions, quarantine, landed files and Delta
logs not yet)."""
from __future__ import annotations

import os
import signal

__all__ = ["kill_point"]

ENV = "SESSIONS_KILL_AT"
PAUSE_ENV = "SESSIONS_PAUSE_AT"
POINTS = ("savepoint:files-written", "savepoint:committed", "fold:written", "fold:committed", "sink:files-written",
          "ingest:files-written", "lease:taken", "rescale:saved", "rescale:moved", "restore:checked", "restore:aside",
          "restore:rolled-back", "savepoint:native-copied", "restore:native-copied", "forget:state-installed", "forget:rows-erased")


def kill_point(name: str) -> None:
    if os.environ.get(ENV) == name:
        _signal_self(signal.SIGKILL)
    elif os.environ.get(PAUSE_ENV) == name:
        _signal_self(signal.SIGSTOP)


def _signal_self(sig: signal.Signals) -> None:
    # The process group when this process leads it (sessionctl started by the campaign: its JVM dies or freezes with
    # it), else this process alone.
    if os.getpgid(0) == os.getpid():
        os.killpg(os.getpid(), sig)
    else:
        os.kill(os.getpid(), sig)
