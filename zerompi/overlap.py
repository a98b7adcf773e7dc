"""Overlapping communication with compute: a queue of collectives run by one communication thread.

The stages hand their collectives to a CommQueue instead of calling the communicator directly:

    ticket = queue.submit("allgather", *args)     a Communicator method's name: returns at once,
                                                  the call runs in the background
    ...compute that does not touch the call's buffers...
    queue.wait(ticket)                            before the buffers are read or reused
    queue.wait_all()                              before anything reads what the calls wrote

    main thread:    backward u=3 | backward u=2 | backward u=1 | backward u=0 | wait_all | Adam
    comm thread:                 |  RS u=3      |    RS u=2    |    RS u=1    | RS u=0 |

With overlap on, one worker thread runs the calls in submission order, on a duplicate of the MPI
communicator (MPI_Comm_dup): the main thread's own collectives (the metrics all-reduce, the stop
signal) then never interleave with the worker's on one communicator, and every rank runs the
worker's calls in the same order, since every rank submits the same sequence. This needs
MPI_THREAD_MULTIPLE (mpi4py asks for it). Why a thread, not non-blocking collectives: MPICH
progresses MPI_Ireduce_scatter only inside MPI calls (so it would advance only when polled
between layers), and Open MPI's non-blocking collectives are not CUDA-aware; the thread issues
the same blocking Communicator calls as overlap off, so it works wherever they work. mpi4py
releases the GIL inside MPI calls and NumPy inside its matrix multiplies, so both threads run.

With overlap off, submit runs the call at once on the calling thread. Either way the same calls
run on the same buffers in the same order, so the results are bitwise identical (tested).

Exposed communication time (`exposed_s`): what the main thread spent waiting for communication,
the part that overlapping did not hide. With overlap off that is the whole time of every call.

Measured (README, Speed): with every core already running a rank, the thread hides most of the
communication but the step gets no shorter, because MPI's shared-memory copies and polling then
run on the cores the compute needs; hence off by default.
"""
import threading
import time
from collections import deque
from dataclasses import dataclass

from .observe.collective_check import call_site


class CommQueue:
    def __init__(self, comm, overlap):
        self.overlap = overlap
        self.exposed_s = 0.0          # seconds the main thread waited for (or ran) communication
        self.submitted = 0            # tickets handed out: 0, 1, 2, ...
        self.finished = 0             # calls completed, in order
        self.comm = comm              # whose methods the calls are
        if not overlap:
            return
        error = comm.thread_level_error()
        if error:
            raise RuntimeError(error)
        self.comm = comm.duplicate()                 # shares the ledger and staging buffers
        self.pending = deque()                       # (method name, args, kwargs), oldest first
        self.error = None
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="zerompi-comm", daemon=True)
        self.thread.start()

    def submit(self, method, *args, **kwargs):
        """Run comm.<method>(*args, **kwargs) (a Communicator method name) after everything
        submitted before it. Returns the ticket to wait for."""
        ticket = self.submitted
        self.submitted += 1
        if not self.overlap:
            start = time.perf_counter()
            getattr(self.comm, method)(*args, **kwargs)
            self.exposed_s += time.perf_counter() - start
            self.finished += 1
            return ticket
        site = call_site() if self.comm.check is not None else None   # --check-collectives: the caller's line
        with self.changed:
            self.pending.append((method, args, kwargs, site))
            self.changed.notify_all()
        return ticket

    def wait(self, ticket):
        """Return when the call with this ticket (and every one before it) has finished."""
        if ticket is None or self.finished > ticket:
            return
        start = time.perf_counter()
        with self.changed:
            while self.finished <= ticket and self.error is None:
                self.changed.wait()
        self.exposed_s += time.perf_counter() - start
        if isinstance(self.error, SystemExit):     # --check-collectives' verdict: the same exit
            raise SystemExit(self.error.code)
        if self.error is not None:
            raise RuntimeError("a collective on the communication thread failed") from self.error

    def wait_all(self):
        self.wait(self.submitted - 1)

    def _run(self):
        made_current = False
        while True:
            with self.changed:
                while not self.pending:
                    self.changed.wait()
                method, args, kwargs, site = self.pending[0]
            try:
                if not made_current:
                    self.comm.device.make_current()  # a GPU is current per host thread (CUDA)
                    made_current = True
                if site is not None:
                    self.comm.check.site = site
                getattr(self.comm, method)(*args, **kwargs)
            except BaseException as error:         # reported to the main thread by wait()
                with self.changed:
                    self.error = error
                    self.changed.notify_all()
                return
            with self.changed:
                self.pending.popleft()
                self.finished += 1
                self.changed.notify_all()


@dataclass(frozen=True)
class OverlapConfig:
    enabled: bool = False      # run the step's collectives on a communication thread (README: Speed)
    bucket_mb: float = 4.0     # stages 0-1: hand gradients to communication in buckets of >= this
    prefetch: int = 1          # stage 3: all-gathers started this many layers ahead of their use


def gradient_buckets(layers, itemsize, bucket_mb):
    """Consecutive layers in backward order (last layer first), grouped so that each group but the
    last holds at least bucket_mb MB of gradients: [[layer 3, layer 2], [layer 1, layer 0]], ..."""
    buckets, current, current_bytes = [], [], 0
    for layer in reversed(layers):
        current.append(layer)
        current_bytes += layer.padded * itemsize
        if current_bytes >= bucket_mb * 1e6:
            buckets.append(current)
            current, current_bytes = [], 0
    if current:
        buckets.append(current)
    return buckets
