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

from ..exit_codes import ExitCode
from .collective_check import CollectiveCheck
from .watchdog import CollectiveWatchdog


class Guards:
    def __init__(self, mpi, rank, size):
        """Off until `turn_on`; mpi: the mpi4py communicator the guarded collectives run on."""
        self.mpi, self.rank, self.size = mpi, rank, size
        self.check = None             # a CollectiveCheck with --check-collectives
        self.watchdog = None          # a CollectiveWatchdog with --collective-timeout

    def turn_on(self, check_collectives=False, collective_timeout=0.0):
        """Turn on --check-collectives and/or the --collective-timeout watchdog (0: off)."""
        if check_collectives:
            self.check = CollectiveCheck(self.rank, self.size)
        if collective_timeout > 0:
            self.watchdog = CollectiveWatchdog(collective_timeout, self.rank, self.mpi.Abort)

    def duplicate(self, mpi):
        """The same guards, turned on the same way, for another communicator `mpi`: a duplicate
        (its own header table and its own watchdog thread: both threads may be in a collective at
        once) or a split one (zerompi/comm.py)."""
        twin = Guards(mpi, mpi.Get_rank(), mpi.Get_size())
        twin.turn_on(self.check is not None, self.watchdog.limit if self.watchdog is not None else 0)
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
                if self.rank == 0:
                    print(f"zerompi: error: {self.check.mismatch_message()}", file=sys.stderr, flush=True)
                raise SystemExit(ExitCode.COLLECTIVE_MISMATCH)          # on every rank: they all hold the same table

    def end(self):
        """After the collective."""
        if self.watchdog is not None:
            self.watchdog.leave()
