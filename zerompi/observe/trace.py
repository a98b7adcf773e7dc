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

Cost: when tracing is off, nothing: no method is wrapped and the ledger has no listener. When on,
a span is two perf_counter calls and one list append (about 150 bytes; per step: three compute
spans per layer, one per collective, one for the loss and the step).

Streaming, in bounded memory: every FLUSH_EVERY_STEPS steps (and at the end) rank 0 gathers the
events every rank recorded since the last flush (one Gatherv of their JSON text, see
Communicator.gather_bytes_to_root) and appends them to the trace file, so a rank holds at most
those steps' events, and rank 0 one such chunk per rank, whatever the number of steps. The file
is written under a temporary name in the trace's folder (`.t.json.tmp-<host>-<pid>-XXXXXXXX`,
zerompi/util/atomic.py) and renamed onto --trace at the end: a reader sees one complete
Chrome trace or none. A run that stops early (diverged, preempted, interrupted) removes the
temporary file and writes no trace; a killed one leaves it, and the next run writing that trace
removes it.

The trace is a side file: a folder where it cannot be created is bad input (set-up), but a write
that fails later (a full disk) costs one warning line from rank 0, the temporary file is removed,
and the run goes on: the weights and checkpoints never depend on it.
"""
import json
import os
import sys
import threading
import time

from ..util.atomic import create_temporary, fsync_folder, written_through
from ..util.inputs import printable

FLUSH_EVERY_STEPS = 32           # steps between two gathers of the events to rank 0's file


class Tracer:
    def __init__(self, comm, file):
        self.comm, self.rank = comm, comm.rank
        self.file = file              # rank 0: the TraceFile being written; None elsewhere
        self.origin = time.perf_counter()
        self.events = []              # Chrome trace events of this rank since the last flush

    def start_clock(self):
        """Collective: a barrier, then time zero on every rank."""
        self.comm.barrier()
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


    def end_step(self, step, start, end):
        """Collective every FLUSH_EVERY_STEPS steps: the step's span, then maybe a flush."""
        self.span(f"step {step}", "step", start, end)
        if step % FLUSH_EVERY_STEPS == 0:
            self.flush()

    def flush(self):
        """Collective: rank 0 appends every rank's events since the last flush to the file."""
        held = len(self.events)           # the --overlap thread may append meanwhile: those stay
        text = ",".join(json.dumps(event) for event in self.events[:held])
        del self.events[:held]
        parts = self.comm.gather_bytes_to_root(text.encode())
        if self.file is not None:
            self.file.append(parts)

    def close(self):
        """Collective, after detach: the last events, then rank 0 puts the file in place."""
        self.flush()
        if self.file is not None:
            self.file.close()

    def discard(self):
        """A run that ends early: rank 0 removes the temporary file (nothing once it is in place)."""
        if self.file is not None:
            self.file.discard()


def metadata_events(ranks):
    """Chrome trace metadata: a process per rank, named and sorted; its two threads named."""
    events = []
    for rank in range(ranks):
        events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        for tid, thread in ((0, "main"), (1, "communication thread (--overlap)")):
            events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": thread}})
    return events


def create_trace_file(path, ranks):
    """Rank 0 at set-up: (a TraceFile for --trace path, None), or (None, a one-line error)."""
    if os.path.lexists(path) and not os.path.isfile(path):
        return None, f"cannot write the trace to {path}: not a regular file"
    try:
        return TraceFile(path, ranks), None
    except OSError as e:
        return None, f"cannot write the trace to {path}: {e.strerror or e}"


class TraceFile:
    """Rank 0: one Chrome trace JSON document, {"traceEvents": [...], "displayTimeUnit": "ms"},
    written as the events come, under a temporary name until close. A failed write: one
    warning line, the temporary file removed, and every later call does nothing."""

    def __init__(self, path, ranks):
        self.path = written_through(path)            # a link to a file: that file is replaced
        self.folder = os.path.dirname(os.path.abspath(self.path))
        handle, self.tmp = create_temporary(self.path)
        self.file = open(handle, "wb")
        self.write(b'{"traceEvents": [\n' + ",\n".join(map(json.dumps, metadata_events(ranks))).encode())

    def append(self, parts):
        """Each rank's events (JSON objects separated by commas; b"" when it has none)."""
        for part in parts:
            if part:
                self.write(b",\n" + part)

    def close(self):
        """End the document, make it durable and rename it onto the trace's path."""
        self.write(b'\n], "displayTimeUnit": "ms"}\n')
        if self.file is None:
            return
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            self.file = None
            os.replace(self.tmp, self.path)
            fsync_folder(self.folder)
        except OSError as e:
            self.give_up(e)

    def write(self, data):
        if self.file is None:
            return
        try:
            self.file.write(data)
        except OSError as e:
            self.give_up(e)

    def give_up(self, error):
        print(printable(f"zerompi: warning: cannot write the trace to {self.path}: {error.strerror or error}; the "
                        f"run goes on without it"), file=sys.stderr, flush=True)
        self.discard()

    def discard(self):
        """Close and remove the temporary file, if any is left."""
        file, self.file = self.file, None
        if file is not None:
            try:
                file.close()
            except OSError:
                pass
        if os.path.exists(self.tmp):
            os.unlink(self.tmp)
