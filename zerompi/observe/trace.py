"""`--trace FILE.json`: a per-rank timeline of compute and communication, in the Chrome trace format.

Open the file in https://ui.perfetto.dev (drag it in) or chrome://tracing: one process per rank
(pid = rank), one row each, with the spans of every step nested as they ran:

    step 12                                                              (cat "step")
      forward 0 | forward 1 | loss | backward 1 | backward 0 | allreduce metrics | adam 0 | adam 1
                                     allgather params ...                (cat "comm", stage 3)
                                                  reduce_scatter grads   (cat "comm", stages 2-3)

Tracing wraps the training step from outside: nothing in the step or the stages mentions it.
`Tracer.attach(engine)` wraps the engine's MLP and Adam methods (compute spans, "compute": each
layer's forward and backward, the loss, Adam's update of each layer) and listens to the
communicator's ledger (communication spans, "comm": every ledgered collective with its op,
purpose and bytes, the buffer handed to MPI, timed where the communicator times it);
`detach` undoes both. Each span is one Chrome "complete" event {"ph": "X", "ts", "dur"} in
microseconds.

Clocks: every rank measures time.perf_counter() from its own origin, taken right after a barrier
at the start of training, so the ranks' timelines line up to within the barrier's exit skew
(microseconds on one node; the same holds across nodes, since only differences are used).

Cost: when tracing is off, nothing: no method is wrapped and the ledger has no listener. When on, a span is two perf_counter calls and one list append; the events stay in
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

    def attach(self, engine):
        """Record the engine's compute and communication from now on (see the module docstring)."""
        mlp, adam = engine.mlp, engine.stage.adam
        layer_at = {engine.stage.owned(layer).state.start: layer.index for layer in engine.layout.layers}
        self.wrapped = [(mlp, "forward_layer"), (mlp, "backward_layer"), (mlp, "loss"), (adam, "update")]
        self.wrap(mlp, "forward_layer", lambda layer, *_: (f"forward {layer.index}", {"layer": layer.index}))
        self.wrap(mlp, "backward_layer", lambda layer, *_: (f"backward {layer.index}", {"layer": layer.index}))
        self.wrap(mlp, "loss", lambda *_: ("loss", {}))
        self.wrap(adam, "update", lambda param, grad, state, *_: (
            f"adam {layer_at[state.start]}", {"layer": layer_at[state.start], "elements": param.size}))
        engine.comm.ledger.listeners.append(self.collective)

    def detach(self, engine):
        """Stop recording: the wrapped methods are the classes' own again."""
        for owner, name in self.wrapped:
            delattr(owner, name)
        engine.comm.ledger.listeners.remove(self.collective)

    def wrap(self, owner, name, describe):
        """owner.name(*args) now records a compute span named by describe(*args)."""
        method = getattr(owner, name)

        def traced(*args, **kwargs):
            start = time.perf_counter()
            result = method(*args, **kwargs)
            span_name, span_args = describe(*args)
            self.span(span_name, "compute", start, **span_args)
            return result
        setattr(owner, name, traced)

    def collective(self, op, purpose, nbytes, start, end):
        """The ledger's listener: one span per ledgered collective."""
        self.span(f"{op} {purpose}", "comm", start, end, op=op, purpose=purpose, bytes=nbytes)


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
        for tid, thread in ((0, "main"), (1, "communication thread (--overlap)")):
            events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": thread}})
        events.extend(json.loads(part))
    with atomic_file(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
