"""The communication thread: the stages' collectives run in order on one background thread.

    request = collectives.reduce_scatter(grad, shard, GRADS)   queued: returns at once
    ...backward of the next layer...
    request.wait()                                            before grad is reused

One worker thread runs the calls in the order they were started, on a duplicate of the MPI
communicator (MPI_Comm_dup): the main thread's own collectives (the metrics all-reduce, the stop
signal) then never interleave with the worker's on one communicator, and every rank runs the
worker's calls in the same order, since every rank starts the same sequence. This needs
MPI_THREAD_MULTIPLE (mpi4py asks for it). Why a thread, not MPI's non-blocking collectives: MPICH
progresses MPI_Ireduce_scatter only inside MPI calls (so it would advance only when polled
between layers), and Open MPI's non-blocking collectives are not CUDA-aware; the thread issues
the same blocking Communicator calls as overlap off, so it works wherever they work. mpi4py
releases the GIL inside MPI calls and NumPy inside its matrix multiplies, so both threads run.

Requests are numbered in the order they are started (0, 1, 2, ...): request k has finished when
the thread has finished k + 1 calls. A call that fails on the thread is reported at the next wait.

Exposed communication time (`exposed_s`): what the main thread spent waiting for communication,
the part that overlapping did not hide.
"""
import threading
import time
from collections import deque

from ..collectives import Collectives
from ..observe import call_site
from .prefetch import PrefetchingGather


class ThreadRequest:
    """The k-th collective started on the communication thread."""

    def __init__(self, collectives, number):
        self.collectives, self.number = collectives, number

    def wait(self):
        self.collectives.wait_for(self.number)


class ThreadedCollectives(Collectives):
    """Collectives (zerompi/collectives.py) run by a communication thread."""

    buffers_in_flight = 2        # one buffer being communicated while the next one is written

    def __init__(self, comm, prefetch=1):
        error = comm.thread_level_error()
        if error:
            raise RuntimeError(error)
        super().__init__(comm.duplicate())           # shares the ledger and staging buffers
        self.prefetch = prefetch
        self.started = 0                             # calls started: 0, 1, 2, ...
        self.finished = 0                            # calls finished, in order
        self.pending = deque()                       # (call, args, call site), oldest first
        self.error = None
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="zerompi-comm", daemon=True)
        self.thread.start()

    def layer_gather(self, buffers, shard_of):
        return PrefetchingGather(self, buffers, shard_of)

    def _start(self, call, *args):
        """Queue call(*args) after everything started before it; returns its request."""
        number = self.started
        self.started += 1
        site = call_site() if self.comm.check is not None else None   # --check-collectives: the caller's line
        with self.changed:
            self.pending.append((call, args, site))
            self.changed.notify_all()
        return ThreadRequest(self, number)

    def wait_for(self, number):
        """Return when call `number` (and every one before it) has finished."""
        if self.finished > number:
            return
        start = time.perf_counter()
        with self.changed:
            while self.finished <= number and self.error is None:
                self.changed.wait()
        self.exposed_s += time.perf_counter() - start
        if isinstance(self.error, SystemExit):     # --check-collectives' verdict: the same exit
            raise SystemExit(self.error.code)
        if self.error is not None:
            raise RuntimeError("a collective on the communication thread failed") from self.error

    def wait_all(self):
        self.wait_for(self.started - 1)

    def close(self):
        """Finish what was started, then end the thread (a plan's engine, zerompi/plan/, ends it
        at once: a plan starts no thread that outlives it)."""
        self.wait_all()
        with self.changed:
            self.pending.append((None, (), None))
            self.changed.notify_all()
        self.thread.join()

    def _run(self):
        made_current = False
        while True:
            with self.changed:
                while not self.pending:
                    self.changed.wait()
                call, args, site = self.pending[0]
            if call is None:                       # close()
                return
            try:
                if not made_current:
                    self.comm.device.make_current()  # a GPU is current per host thread (CUDA)
                    made_current = True
                if site is not None:
                    self.comm.check.site = site
                call(*args)
            except BaseException as error:         # reported to the main thread by wait()
                with self.changed:
                    self.error = error
                    self.changed.notify_all()
                return
            with self.changed:
                self.pending.popleft()
                self.finished += 1
                self.changed.notify_all()
