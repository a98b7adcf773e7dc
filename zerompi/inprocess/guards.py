"""--check-collectives between ranks in one process: zerompi/observe/'s CollectiveCheck, its headers
shown to the other ranks at the hub (where zerompi/observe/guards.py's Guards all-gathers them
over MPI). Before each collective every rank deposits its header (kind, size, dtype, call site); on
a disagreement every rank deposits its description, rank 0 prints the one line naming each side,
and every rank exits COLLECTIVE_MISMATCH. The deadline is the hub's (hub.py): no watchdog thread.
"""
import sys

import numpy as np

from ..observe import CollectiveCheck
from ..util.exit_codes import ExitCode


class InProcessGuards:
    def __init__(self, hub, rank, job_ranks=None):
        """job_ranks: the run's rank of each of the hub's ranks (a split's), by default its own."""
        self.hub, self.rank = hub, rank
        self.job_ranks = list(job_ranks) if job_ranks is not None else list(range(hub.size))
        self.check = None

    def turn_on(self, check_collectives=False, collective_timeout=0.0):
        """--check-collectives; the deadline is the hub's, set when it was made."""
        if check_collectives and self.check is None:
            self.check = CollectiveCheck(self.rank, self.hub.size)

    def begin(self, kind, purpose, buffer):
        if self.check is None:
            return
        check = self.check
        check.fill_header(kind, purpose, buffer)
        check.table[...] = np.stack(self.hub.meet(self.rank, check.header, "check"))
        self.hub.release(self.rank)
        if check.agreed():
            return
        check.descriptions[...] = np.stack(self.hub.meet(self.rank, check.own_description(), "check"))
        self.hub.release(self.rank)
        if self.rank == 0:
            print(f"zerompi: error: {check.mismatch_message(self.job_ranks)}", file=sys.stderr, flush=True)
        raise SystemExit(ExitCode.COLLECTIVE_MISMATCH)

    def end(self):
        pass

    def twin(self, hub, rank, members):
        """The same guards, turned on alike, for a hub of some of these ranks (a split, a duplicate)."""
        twin = InProcessGuards(hub, rank, [self.job_ranks[r] for r in members])
        twin.turn_on(self.check is not None)
        return twin
