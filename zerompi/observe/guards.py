"""The guards around every collective: --check-collectives and --collective-timeout, both off by default.

The communicator (zerompi/comm.py) and its control messages (zerompi/control.py) call, around
each collective:

    guards.begin(kind, purpose, buffer)     the watchdog starts timing it; the check exchanges
                                            headers and stops every rank on a disagreement
    ...the collective...
    guards.end()                            the watchdog stops timing it

With both off, each is one or two None checks. The check's exchanges go on the same MPI
communicator as the collective they announce, and are not ledgered. What each guard does:
zerompi/observe/collective_check.py and zerompi/observe/watchdog.py.
"""
import sys
import time

from ..util.exit_codes import ExitCode
from ..mpi import MPI, abort_job, init_mpi
from .collective_check import CollectiveCheck
from .watchdog import MAX_STAGGER_SECONDS, CollectiveWatchdog, report_then_abort, stagger


def guards_for(mpi_comm=None, check_collectives=False, collective_timeout=0.0):
    """Guards for a job's communicator (MPI_COMM_WORLD by default), turned on as asked, to hand to
    a Communicator (zerompi/comm.py) so that they guard its first collective: a failure ends
    the whole job (zerompi/mpi.py's abort_job)."""
    init_mpi()
    mpi = mpi_comm if mpi_comm is not None else MPI.COMM_WORLD
    guards = Guards(mpi, mpi.Get_rank(), mpi.Get_size(), abort=abort_job)
    guards.turn_on(check_collectives, collective_timeout)
    return guards


class Guards:
    def __init__(self, mpi, rank, size, job_ranks=None, abort=None):
        """Off until `turn_on`; mpi: the mpi4py communicator the guarded collectives run on.
        job_ranks: the job's rank of each of its ranks, and abort: what ends the whole job, where
        mpi holds some of the job's ranks (`split`); by default its own ranks and MPI_Abort."""
        self.mpi, self.rank, self.size = mpi, rank, size
        self.job_ranks = tuple(job_ranks) if job_ranks is not None else range(size)   # no list of N
        self.abort = abort if abort is not None else mpi.Abort
        self.whole_job = job_ranks is None
        self.check = None             # a CollectiveCheck with --check-collectives
        self.watchdog = None          # a CollectiveWatchdog with --collective-timeout

    def turn_on(self, check_collectives=False, collective_timeout=0.0):
        """Turn on --check-collectives; set the --collective-timeout watchdog's limit (0: off; a
        watchdog already started keeps its thread, idle)."""
        if check_collectives and self.check is None:
            self.check = CollectiveCheck(self.rank, self.size)
        if self.watchdog is not None:
            self.watchdog.limit = collective_timeout
        elif collective_timeout > 0:
            self.watchdog = CollectiveWatchdog(collective_timeout, self.job_ranks[self.rank], self.abort)

    def duplicate(self, mpi):
        """The same guards, turned on the same way, for a duplicate `mpi` of this communicator
        (its own header table and its own watchdog thread: both threads may be in a collective at
        once, zerompi/comm.py)."""
        return self._twin(mpi, self.job_ranks if not self.whole_job else None)

    def split(self, mpi):
        """The same guards, turned on the same way, for `mpi`, a communicator on some of this
        one's ranks (Communicator.split): they name each rank and stagger their reports by its
        rank in the job, and a failure ends the whole job, whose other ranks would wait for these."""
        group, parent = mpi.Get_group(), self.mpi.Get_group()
        ranks = MPI.Group.Translate_ranks(group, list(range(mpi.Get_size())), parent)
        group.Free()
        parent.Free()
        return self._twin(mpi, [self.job_ranks[r] for r in ranks])

    def _twin(self, mpi, job_ranks):
        twin = Guards(mpi, mpi.Get_rank(), mpi.Get_size(), job_ranks, self.abort)
        twin.turn_on(self.check is not None, self.watchdog.limit if self.watchdog is not None else 0.0)
        return twin

    def begin(self, kind, purpose, buffer):
        """Before a collective (buffer: the array it reads, or None)."""
        if self.watchdog is not None:
            self.watchdog.enter(kind, purpose, buffer)
        if self.check is not None:
            self.check.fill_header(kind, purpose, buffer)
            self.mpi.Allgather(self.check.header, self.check.table)
            if not self.check.agreed():
                self.mpi.Allgather(self.check.own_description(), self.check.descriptions)
                self.end()
                message = f"zerompi: error: {self.check.mismatch_message(self.job_ranks)}"
                if not self.whole_job:           # the job's other ranks would wait for these: end the job
                    # this communicator's lowest rank reports (other groups' later, by their rank in
                    # the job); the rest only stand by, should the abort not come
                    wait = stagger(self.job_ranks[self.rank]) + (MAX_STAGGER_SECONDS if self.rank else 0)
                    time.sleep(wait)
                    report_then_abort(message, self.abort, ExitCode.COLLECTIVE_MISMATCH)
                elif self.rank == 0:
                    print(message, file=sys.stderr, flush=True)
                raise SystemExit(ExitCode.COLLECTIVE_MISMATCH)          # on every rank of this communicator

    def end(self):
        """After the collective."""
        if self.watchdog is not None:
            self.watchdog.leave()
