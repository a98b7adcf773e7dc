"""`--trace FILE.json`: a per-rank timeline of compute and communication, in the Chrome trace format.

Open the file in https://ui.perfetto.dev (drag it in) or chrome://tracing: one process per rank
(pid = rank), one row each, with the spans of every step nested as they ran:

    step 12                                                              (cat "step")
      forward 0 | forward 1 | loss | backward 1 | backward 0 | allreduce metrics | adam 0 | adam 1
                                     allgather params ...                (cat "comm", stage 3)
                                                  reduce_scatter grads   (cat "comm", stages 2-3)

Compute spans ("compute"): each layer's forward and backward (zerompi/step.py), the loss, and
Adam's update of each layer (zerompi/stages/base.py). Communication spans ("comm"): every ledgered
collective, recorded where it is timed (zerompi/comm.py), with its op, purpose and bytes (the
buffer handed to MPI). Each span is one Chrome "complete" event {"ph": "X", "ts", "dur"} in
microseconds.

Clocks: every rank measures time.perf_counter() from its own origin, taken right after a barrier
at the start of training, so the ranks' timelines line up to within the barrier's exit skew
(microseconds on one node; the same holds across nodes, since only differences are used).

Cost: when tracing is off the communicator's `tracer` is None and each instrumented place costs
one None check. When on, a span is two perf_counter calls and one list append; the events stay in
memory (per step: three compute spans per layer, one per collective, one for the loss and the
step; about 150 bytes each) until the end of training, when rank 0 gathers every rank's
events (one Gatherv of their JSON text, see Communicator.gather_bytes_to_root) and writes one file
atomically (zerompi/checkpoint/atomic.py). A run that stops early (diverged, preempted) writes no trace.
"""
import json
import threading
import time

from ..checkpoint.atomic import atomic_file


class Tracer:
    def __init__(self, rank):
        self.rank = rank
        self.origin = time.perf_counter()
        self.events = []              # Chrome trace events of this rank, in the order they ended

    def start_clock(self, comm):
        """Collective: a barrier, then time zero on every rank."""
        comm.barrier()
        self.origin = time.perf_counter()

    @staticmethod
    def now():
        return time.perf_counter()

    def span(self, name, category, start, end=None, **args):
        """One complete event from start to end (perf_counter seconds; end: now)."""
        end = time.perf_counter() if end is None else end
        thread = 0 if threading.current_thread() is threading.main_thread() else 1   # 1: --overlap's thread
        self.events.append({"name": name, "cat": category, "ph": "X", "pid": self.rank, "tid": thread,
                            "ts": round((start - self.origin) * 1e6, 1), "dur": round((end - start) * 1e6, 1),
                            "args": args})


def write_trace(tracer, comm, path):
    """Collective: rank 0 gathers every rank's events and writes one Chrome trace JSON file."""
    parts = comm.gather_bytes_to_root(json.dumps(tracer.events).encode())
    if comm.rank != 0:
        return
    events = []
    for rank, part in enumerate(parts):
        events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        for tid, thread in ((0, "main"), (1, "communication thread (--overlap on)")):
            events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": thread}})
        events.extend(json.loads(part))
    with atomic_file(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
