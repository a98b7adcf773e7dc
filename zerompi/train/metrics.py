"""`--metrics FILE.jsonl`: one JSON object per training step, written by rank 0 as the step ends.

    {"step": 12, "loss": 0.731, "accuracy": 0.781, "lr": 0.0018, "grad_norm": 1.93, "applied": true,
     "loss_scale": 1.0, "step_seconds": 0.0071, "samples_per_second": 18028.2,
     "comm": {"grads": {"calls": 3, "bytes": 156744.0, "elements": 39186.0, "seconds": 0.0011},
              "params": {...}, "metrics": {...}},
     "memory": {"ledger_bytes": [835012, ...], "peak_rss_bytes": [61235200, ...]}}

    step                 1-based: the number of steps done once this one ended
    loss, accuracy       the step's mean loss and training accuracy over the global batch (all
                         micro-batches, all ranks: the step's own all-reduce); null if not finite
    lr, grad_norm        the step's learning rate; the global gradient norm before clipping
    applied, loss_scale  false: the step was skipped (fp16 overflow) or diverged; the fp16 scale
    step_seconds         rank 0's wall time of the step (batch selection, forward, backward,
                         reductions, Adam), perf_counter; samples_per_second = batch / that
    comm                 per purpose, what rank 0's CommLedger recorded during this step: calls,
                         ring bytes and elements (as in the end-of-run report), seconds inside MPI.
                         With --overlap a collective is counted in the step it finishes in
                         (stage 1-2 parameter all-gathers finish in the next step's forward; the
                         last step's after the loop, in no line), and its seconds are the
                         communication thread's, not time the step waited
    memory               every rank's MemoryLedger total (all its allocated buffers) and OS peak RSS,
                         in rank order; ONLY on step 1, every --log-every steps and the last step

Memory is gathered (one Gather of two numbers per rank, a collective every rank joins) only at
those steps, not every step: the ledger total cannot change inside the loop (nothing is allocated
there) and the peak RSS rarely does, so a per-step collective would buy nothing.

Crash safety: each line is built whole and handed to the kernel in one os.write on a file opened
with O_APPEND, so a crash loses at most the step in progress and never leaves half a line. A fresh
run truncates the file; a resumed run (--resume) appends, so steps the interrupted run logged after
its last checkpoint appear twice: the later line is the resumed run's.

The metrics are a side file: a file that cannot be opened is bad input (setup, before any step),
but a write that fails later (a full disk) costs one warning line from rank 0, and training goes
on without them; the weights and checkpoints never wait on them.
"""
import json
import math
import os
import sys

import numpy as np


class MetricsLog:
    def __init__(self, path, comm, memory, memory_every, last_step, append=False):
        self.path, self.comm, self.memory = path, comm, memory
        self.memory_every, self.last_step = memory_every, last_step
        self.handle = None
        self.open_error = None           # one line if rank 0 cannot open the file (setup: bad input)
        if comm.rank == 0:
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
            try:                         # O_NONBLOCK: a FIFO without a reader fails at once, never waits
                self.handle = os.open(path, flags | os.O_NONBLOCK, 0o666)
                os.set_blocking(self.handle, True)
            except OSError as e:
                self.open_error = f"cannot write metrics to {path}: {e.strerror or e}"
        self.comm_before = None

    def start_step(self):
        self.comm_before = comm_by_purpose(self.comm.ledger)

    def end_step(self, step, result, lr, loss_scale, batch_size, seconds):
        """Collective at the steps that gather memory; rank 0 writes the step's line."""
        comm_after = comm_by_purpose(self.comm.ledger)
        memory = self.gather_memory() if self.memory_due(step) else None
        if self.handle is None:
            return
        line = {"step": step, "loss": finite_or_none(result.loss), "accuracy": result.correct / batch_size,
                "lr": lr, "grad_norm": finite_or_none(result.grad_norm), "applied": result.applied,
                "loss_scale": loss_scale, "step_seconds": seconds, "samples_per_second": batch_size / seconds,
                "comm": comm_delta(self.comm_before, comm_after)}
        if memory is not None:
            line["memory"] = memory
        try:
            write_line(self.handle, json.dumps(line, allow_nan=False) + "\n")
        except OSError as e:
            self.give_up(e)

    def memory_due(self, step):
        return step == 1 or step == self.last_step or (self.memory_every and step % self.memory_every == 0)

    def gather_memory(self):
        """Collective: every rank's (ledger total, peak RSS) on rank 0, as lists in rank order."""
        mine = np.array([self.memory.total_bytes, self.memory.peak_rss_bytes()], dtype=np.float64)
        everyone = np.zeros((self.comm.size, 2)) if self.comm.rank == 0 else None
        self.comm.gather_to_root(mine, everyone)
        if everyone is None:
            return None
        return {"ledger_bytes": everyone[:, 0].astype(int).tolist(),
                "peak_rss_bytes": everyone[:, 1].astype(int).tolist()}

    def close(self):
        """Rank 0: close the file (a network file system may report a failed write only here)."""
        self.give_up(None)

    def give_up(self, error):
        """Rank 0: close the file; after a failed write (error), one warning line, and no more lines."""
        handle, self.handle = self.handle, None
        if handle is not None:
            try:
                os.close(handle)
            except OSError as e:
                error = error or e
        if error is not None:
            print(f"zerompi: warning: cannot write metrics to {self.path}: {error.strerror or error}; training "
                  f"goes on without them", file=sys.stderr, flush=True)


def comm_by_purpose(ledger):
    """{purpose: (calls, ring bytes, ring elements, seconds)} from a CommLedger, so far."""
    return {purpose: ledger.totals({purpose}) for purpose in ledger.purposes()}


def comm_delta(before, after):
    """What was recorded between two comm_by_purpose snapshots, per purpose that made calls."""
    delta = {}
    for purpose, totals in after.items():
        calls, ring_bytes, elements, seconds = np.subtract(totals, before.get(purpose, (0, 0, 0, 0)))
        if calls:
            delta[purpose] = {"calls": int(calls), "bytes": float(ring_bytes), "elements": float(elements),
                              "seconds": float(seconds)}
    return delta


def finite_or_none(value):
    """JSON has no NaN or infinity: a non-finite value is written as null."""
    return float(value) if math.isfinite(value) else None


def write_line(handle, text):
    """One os.write for the whole line (O_APPEND); loop only if the kernel took part of it."""
    data = text.encode()
    while data:
        data = data[os.write(handle, data):]
