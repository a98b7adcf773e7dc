"""How a rank ends the whole job at once: one line from the lowest rank that fails, then MPI_Abort.

Several ranks failing at once (a bad file on every node, a signal to the whole job) must print one
line, not N: rank r waits stagger(r) seconds before it reports (zerompi/observe/watchdog.py), so
the lowest reports first and its abort ends the rest before they speak. The abort skips atexit,
which would release --save-dir's lock: it is released at the last moment instead. `end_with` maps
what a rank raised onto its one line and status (run.py's main).
"""
import time
import traceback

from .lock import release_locks
from .signals import ACT_WITHIN_SECONDS, Interrupted
from ...inprocess import CollectivesDiffer, CollectiveTimeout
from ...offload import OffloadError
from ...util.exit_codes import ExitCode
from ...mpi import abort_job
from ...util.inputs import printable
from ...observe.watchdog import MAX_STAGGER_SECONDS, await_announced_abort, report_then_abort, stagger


def end_job(rank, line, exit_code, standing_by=False, before="", later=0.0, alone=False):
    """End every rank with exit_code and one line (after `before`, a traceback), from the lowest
    rank that fails: rank r waits stagger(r) seconds first (several ranks failing at once: the
    lowest reports, its abort ends the rest). standing_by: the signal watcher, whose main thread
    waits in MPI: a rank but the lowest also gives the lowest one's abort MAX_STAGGER_SECONDS to
    come first; later: seconds more a rank but the lowest gives it (a signal every rank got, which
    the lowest may act on only from its watcher, signals.py); alone: the job is this process (ranks
    in one process, in_process.py): no other to wait for. Never returns."""
    if not alone:
        time.sleep(stagger(rank) + (MAX_STAGGER_SECONDS if standing_by and rank else later if rank else 0))
    report_then_abort(before + printable(line), abort_releasing_locks, exit_code)
    await_announced_abort()                # another thread announced first: its abort ends this process


def abort_releasing_locks(exit_code):
    """MPI_Abort skips atexit, which would release --save-dir's lock: release it at the last moment."""
    release_locks()
    abort_job(exit_code)


def end_with(e, rank, signals, alone=False):
    """End the job for what `rank` raised, with one line and its kind's status (zerompi/util/exit_codes.py);
    alone: ranks in one process (end_job's)."""
    if isinstance(e, Interrupted):             # a signal that ends the run at once (signals.py); rank 0 may
        end_job(rank, f"zerompi: error: rank {rank}: {e}", ExitCode.INTERRUPTED,   # be in MPI, its
                later=2 * ACT_WITHIN_SECONDS, alone=alone)  # watcher acting ACT_WITHIN_SECONDS later
    signals.stand_down()
    for kind, code in ((CollectiveTimeout, ExitCode.COLLECTIVE_TIMEOUT), (CollectivesDiffer, ExitCode.COLLECTIVE_MISMATCH),
                       (OffloadError, ExitCode.OFFLOAD_FAILED)):   # the in-process ranks' deadline and meetings
        if isinstance(e, kind):                # (zerompi/inprocess/hub.py); an offload file (zerompi/offload/)
            end_job(rank, f"zerompi: error: rank {rank}: {e}", code, alone=alone)
    if isinstance(e, MemoryError):             # after the preflight (zerompi/plan/preflight.py): one line
        end_job(rank, f"zerompi: error: rank {rank} ran out of memory ({e or 'MemoryError'}): other processes "
                      f"took memory the preflight had counted, or it fragmented; `--dry-run` shows the plan",
                ExitCode.OUT_OF_MEMORY, alone=alone)
    end_job(rank, f"zerompi: error: rank {rank} failed: {type(e).__name__}: {e}", ExitCode.FAILED,   # a bug or an
            before=traceback.format_exc(), alone=alone)     # MPI failure: never leave ranks hanging
