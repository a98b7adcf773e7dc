"""Control messages between ranks: agreeing on errors, printing once, gathering bookkeeping to rank 0.

None of this is training traffic, so none of it is ledgered; the guards (--check-collectives,
--collective-timeout, zerompi/observe/guards.py) still watch the ones that can disagree or hang.
`ControlMessages` is mixed into the Communicator (zerompi/comm.py), whose `mpi`, `rank`, `size`,
`guards` and `node_of_rank` it uses, so that every caller keeps one object to talk to:

    check_all(error)              every rank passes its error or None; if any has one, the lowest
                                  such rank prints it and every rank exits with the same status
    first_failing_rank(error)     the lowest rank with an error, or None (one MIN all-reduce)
    any_failed(error)             True on every rank when any rank has an error
    max_all(values)               the elementwise maximum over ranks of small int64 arrays
    print0(text)                  print on rank 0 only
    gather_to_root(send, recv)    rank 0 receives every rank's equal-sized array
    gather_bytes_to_root(data)    rank 0 receives every rank's bytes, of any length
    ranks_on_this_node()          how many ranks share this node (and its cores)
    barrier()
"""
import sys

import numpy as np

from .util.exit_codes import ExitCode
from .util.inputs import printable
from .ledger import BOOKKEEPING, CONTROL
from .mpi import MPI


class ControlMessages:
    def check_all(self, error, exit_code=ExitCode.BAD_INPUT):
        """Collective: every rank passes its error message or None. If any rank has one, the
        lowest such rank prints it (one line, once) and every rank raises SystemExit(exit_code)."""
        first_failing = self.first_failing_rank(error)
        if first_failing is not None:
            if self.rank == first_failing:
                print(f"zerompi: error: {printable(error)}", file=sys.stderr, flush=True)
            raise SystemExit(exit_code)

    def first_failing_rank(self, error):
        """Collective: the lowest rank whose error is not None, or None when no rank has one."""
        flag = np.array([self.rank if error is not None else self.size], dtype=np.int64)
        self.guards.begin("allreduce_min", CONTROL, flag)
        self.mpi.Allreduce(MPI.IN_PLACE, flag, op=MPI.MIN)
        self.guards.end()
        return int(flag[0]) if flag[0] < self.size else None

    def any_failed(self, error):
        """Collective: True on every rank when any rank's error is not None."""
        return self.first_failing_rank(error) is not None

    def max_all(self, values):
        """Collective: values (n,) int64 <- the elementwise maximum over every rank's values, in place."""
        self.guards.begin("allreduce_max", CONTROL, values)
        self.mpi.Allreduce(MPI.IN_PLACE, values, op=MPI.MAX)
        self.guards.end()

    def print0(self, text, file=None):
        """Print a line (or lines) on rank 0 only (the one print helper), what a user's path may hold
        that would redraw the terminal escaped (zerompi/util/inputs.py's printable)."""
        if self.rank == 0:
            print(printable(str(text), lines=True), file=file if file is not None else sys.stdout, flush=True)

    def gather_to_root(self, send, recv):
        """Rank 0 receives every rank's equal-sized `send` into recv (size, ...) (the end-of-run
        report and checkpoint manifests)."""
        self.guards.begin("gather", BOOKKEEPING, send)
        self.mpi.Gather(send, recv, root=0)
        self.guards.end()

    def gather_bytes_to_root(self, data):
        """Rank 0 receives every rank's `data` (bytes of any length) as a list, in rank order; None
        elsewhere (the trace, streamed during training). One Gather of the lengths, one Gatherv of
        the bytes (guarded without a buffer: the lengths differ by rank)."""
        send = np.frombuffer(data, dtype=np.uint8)
        length = np.array([send.size], dtype=np.int64)
        lengths = np.zeros(self.size, dtype=np.int64) if self.rank == 0 else None
        self.guards.begin("gather", BOOKKEEPING, length)
        self.mpi.Gather(length, lengths, root=0)
        self.guards.end()
        self.guards.begin("gatherv", BOOKKEEPING, None)
        if self.rank != 0:
            self.mpi.Gatherv(send, None, root=0)
            self.guards.end()
            return None
        received = np.empty(int(lengths.sum()), dtype=np.uint8)
        self.mpi.Gatherv(send, (received, lengths), root=0)
        self.guards.end()
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        return [received[offsets[r]:offsets[r + 1]].tobytes() for r in range(self.size)]

    def ranks_on_this_node(self):
        """How many ranks share this node (and its cores): from the node of each rank, learned
        when the Communicator was built (zerompi/nodes.py)."""
        return self.node_of_rank.count(self.node_of_rank[self.rank])

    def barrier(self):
        self.mpi.Barrier()
