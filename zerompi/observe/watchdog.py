"""--collective-timeout: end the job when a collective has waited too long for the other ranks.

A rank that stops (SIGSTOP, a debugger, a stuck file system) or dies under a launcher that does not
clean up (srun without --kill-on-bad-exit) leaves every other rank waiting in its next collective,
forever: MPI collectives have no timeout. The watchdog gives them one.

    the thread that calls a collective, around it (zerompi/observe/guards.py):
        watchdog.enter(kind, purpose, buffer)     one attribute write and a time stamp
        ...MPI call...
        watchdog.leave()
    one daemon thread per communicator, started once (two with --overlap: the communication
    thread's communicator has its own, see Guards.duplicate):
        every `poll` seconds: if a collective entered more than `limit` seconds ago has not left,
        print which one and which rank waited, and MPI_Abort the job (exit status ExitCode.COLLECTIVE_TIMEOUT)

The world's watchdog starts with the Communicator, at the limit read before MPI starts
(zerompi/train/options/before_mpi.py), so that MPI's first collective is watched too; the limit may
change later (Guards.turn_on: 0 leaves the thread idle).

mpi4py releases the GIL inside MPI calls, so the thread runs while the main thread waits; mpi4py
initializes MPI with MPI_THREAD_MULTIPLE, so the thread may call MPI_Abort.

Printed once: every waiting rank's watchdog would fire at about the same moment, so rank r fires
`stagger(r)` seconds late: the lowest waiting rank prints, pauses REPORT_PAUSE_SECONDS (mpirun
forwards output asynchronously, and an abort right after a print lost the line on a loaded
machine) and aborts, and the abort ends the others before their turn (measured with mpirun: well
under 0.5 s). The same stagger keeps a failure that hits every rank at once (zerompi/train/loop/run.py
main) to one report.

An announced failure always ends the job with its status: should the main thread finish the run
during the pause (the collective that timed out returned after all), main ends with
await_announced_abort, which waits for the abort, and exits with the announced status if it does
not come; it never returns to a normal exit (status 0, and an MPI_Finalize racing the abort).
"""
import os
import sys
import threading
import time

from ..util.exit_codes import ExitCode

STAGGER_SECONDS = 1.0            # per rank; see the docstring
REPORT_PAUSE_SECONDS = 0.5
MAX_STAGGER_SECONDS = 10.0
_announced = []                  # the status of an abort announced in this process (report_then_abort)
_announcing = threading.Lock()


def stagger(rank):
    """Seconds rank waits before reporting a failure others may report too (lowest rank first)."""
    return min(STAGGER_SECONDS * rank, MAX_STAGGER_SECONDS)


def report_then_abort(message, abort, exit_code):
    """Print the one error line, give the launcher time to forward it, and end every rank. Once
    per process: a second caller (--overlap's second watchdog, the main thread) returns at once
    and leaves the job to the first one's abort."""
    with _announcing:
        first = not _announced
        _announced.append(exit_code)     # before the line: from here this process never exits 0
    if not first:
        return
    print(message, file=sys.stderr, flush=True)
    time.sleep(REPORT_PAUSE_SECONDS)
    abort(exit_code)


def await_announced_abort():
    """The main thread, as main ends by any path: if a failure was announced (by a watchdog
    thread, now in its pause), wait for its abort; should it not come, exit with its status."""
    if _announced:
        time.sleep(4 * REPORT_PAUSE_SECONDS)
        sys.stdout.flush()
        os._exit(_announced[0])          # no MPI_Finalize: the abort may be under way


class CollectiveWatchdog:
    def __init__(self, limit, rank, abort):
        self.limit = limit               # seconds a collective may wait (0: none is watched); may change
        self.rank = rank
        self.abort = abort               # abort(exit_code): ends every rank of the job
        self.kind = self.purpose = self.buffer = None   # the collective in progress (for the message)
        self.since = None                # time.monotonic() when it was entered; None: not in one
        threading.Thread(target=self._watch, name="zerompi-watchdog", daemon=True).start()

    @property
    def poll(self):
        """Seconds between two looks: never a busy loop, whatever the limit (1 s while off)."""
        return min(1.0, max(0.01, self.limit / 4)) if self.limit > 0 else 1.0

    def enter(self, kind, purpose, buffer):
        self.kind, self.purpose, self.buffer = kind, purpose, buffer
        self.since = time.monotonic()    # written last: the thread reads it first

    def leave(self):
        self.since = None

    def _watch(self):
        while True:
            limit, since, poll = self.limit, self.since, self.poll
            patience = limit + stagger(self.rank)
            waited = 0.0 if since is None else time.monotonic() - since
            if limit <= 0 or waited < patience:
                time.sleep(min(poll, patience - waited) if limit > 0 else poll)
                continue
            buffer = self.buffer
            size = "" if buffer is None else f", {buffer.size:,} {buffer.dtype} elements"
            report_then_abort(f"zerompi: error: rank {self.rank} waited {waited:.1f} s in {self.kind} "
                              f"({self.purpose}{size}) for ranks that never joined it (limit: --collective-timeout "
                              f"{limit:g}): a rank is stopped, dead, or in another collective "
                              f"(--check-collectives finds that), or the limit is shorter than the collective "
                              f"takes; ending the job", self.abort,
                              ExitCode.COLLECTIVE_TIMEOUT)
            return
