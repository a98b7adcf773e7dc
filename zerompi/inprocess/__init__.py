"""N ranks in one process, without MPI: for a notebook, a debugger, and tests that need ranks but
not MPI itself.

    from zerompi.inprocess import run_ranks
    results = run_ranks(lambda comm: train(comm), 4)     # comm: rank r's InProcessCommunicator

Each rank is a thread with its own Communicator (communicator.py) and its own buffers; the
collectives meet at a Hub (hub.py): sums in rank order, the same ledgers as over MPI. Nothing here
imports mpi4py (zerompi/mpi.py loads it at the first use of MPI, which these ranks never make).

    hub.py            the N threads' meeting point: two barriers per collective, its deadline
    communicator.py   InProcessTransport and InProcessCommunicator: zerompi/comm.py's
                      Communicator over a hub

An exception on one rank breaks every hub of the run, so that no other rank waits for it; a rank
that does not arrive (it skipped a collective, ran out of batches, is stuck) breaks them after
`timeout` seconds (None: never, for a debugger); ranks in different collectives stop at once,
naming them. run_ranks then raises RankFailed, naming the first rank that failed and why (the
ranks that waited and the ones that did not arrive), within STRAGGLER_SECONDS of that.

The threads share the interpreter lock outside NumPy's kernels and one BLAS thread pool: this is
for watching and checking ZeRO, not for speed.
"""
import threading
import time

from .communicator import InProcessCommunicator, InProcessTransport
from .hub import CollectivesDiffer, CollectiveTimeout, Hub, RanksStopped

__all__ = ["run_ranks", "RankFailed", "RanksStopped", "CollectiveTimeout", "CollectivesDiffer", "InProcessCommunicator",
           "InProcessTransport", "Hub",
           "DEFAULT_TIMEOUT", "STRAGGLER_SECONDS"]

DEFAULT_TIMEOUT = 300.0          # seconds a collective waits for every rank (None: for ever)


class RankFailed(RuntimeError):
    """A rank of run_ranks raised; `rank` is the first that did, `error` what it raised."""

    def __init__(self, rank, error):
        super().__init__(f"rank {rank}: {type(error).__name__}: {error}")
        self.rank, self.error = rank, error


def run_ranks(fn, num_ranks, nodes=1, timeout=DEFAULT_TIMEOUT, pause=None):
    """fn(comm) on each of num_ranks ranks (threads of this process; rank r on node r // (N /
    nodes)); returns [rank 0's result, rank 1's, ...]. pause(number, name, inputs): lockstep, called
    at each collective of the world's communicator while every rank waits in it (hub.py); inputs:
    each rank's buffer, in rank order (copy what you keep). The first rank to fail stops the
    others; its SystemExit (zerompi's one-line errors, which every rank raises alike) is raised as
    it is, any other exception as RankFailed. A rank that does not end within STRAGGLER_SECONDS of that
    (stuck outside any collective) is left behind, a daemon thread."""
    if num_ranks < 1 or nodes < 1 or num_ranks % nodes:
        raise ValueError(f"{num_ranks} ranks on {nodes} nodes: the ranks must fill the nodes evenly")
    hub = Hub(num_ranks, timeout, pause=pause)
    node_of_rank = tuple(r // (num_ranks // nodes) for r in range(num_ranks))
    results, first, lock = [None] * num_ranks, [], threading.Lock()

    def rank_main(rank):
        try:
            results[rank] = fn(InProcessCommunicator(hub, rank, node_of_rank))
        except BaseException as e:                    # noqa: B036 -- a rank's SystemExit included
            with lock:
                first.append((rank, e))               # first[0]: the first to fail, in time
            hub.abort(f"rank {rank} raised {type(e).__name__}: {e}")

    threads = [threading.Thread(target=rank_main, args=(r,), name=f"zerompi rank {r}", daemon=True)
               for r in range(num_ranks)]
    for thread in threads:
        thread.start()
    try:
        wait_for_ranks(threads, first)
    except BaseException:                             # Ctrl-C in a notebook: no rank goes on alone
        hub.abort("the process running the ranks was interrupted")
        raise
    if not first:
        return results
    rank, error = first[0]
    if isinstance(error, SystemExit):
        raise error
    raise RankFailed(rank, error) from error


STRAGGLER_SECONDS = 10.0         # after a rank failed, how long the others get to stop


def wait_for_ranks(threads, first):
    """Until every rank's thread has ended, or STRAGGLER_SECONDS after the first failure."""
    failed_at = None
    while any(thread.is_alive() for thread in threads):
        for thread in threads:
            thread.join(0.05)
        if first and failed_at is None:
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > STRAGGLER_SECONDS:
            return
