"""Per-step metrics on rank 0: StepMetrics measures each step into one record (a dict), and its
sinks write it: `--metrics FILE.jsonl` (MetricsFile, here: one JSON object per line) and
`--tensorboard DIR` (zerompi/train/outputs/tensorboard.py).

    {"step": 12, "time": 1793712345.123, "restarts": 0, "loss": 0.731, "accuracy": 0.781, "lr": 0.0018,
     "grad_norm": 1.93, "applied": true, "loss_scale": 1.0, "step_seconds": 0.0071,
     "samples_per_second": 18028.2,
     "comm": {"grads": {"calls": 3, "bytes": 156744.0, "inter_node_bytes": 0.0, "elements": 39186.0,
                        "seconds": 0.0011}, "params": {...}, "metrics": {...}},
     "memory": {"ledger_bytes": [835012, ...], "peak_rss_bytes": [61235200, ...]},
     "comm_per_rank": {"bytes": [313488.0, ...], "inter_node_bytes": [0.0, ...], "seconds": [0.0021, ...]}}

    step                 1-based: the number of steps done once this one ended
    time                 when the step ended: wall-clock Unix time in seconds (time.time(), UTC
                         by definition). `SLURM_TIME_FORMAT=%s sacct -j JOB -o JobID,Start,End`
                         prints Slurm's times in the same unit, so a line matches a job step (or
                         a requeue) by comparing numbers; `date -d @TIME` reads it
    restarts             how many times this training was restarted from a checkpoint: 0 for a
                         fresh run, then 1 + the count in the checkpoint resumed from (kept in
                         its manifest, zerompi/train/loop/checkpoints.py)
    slurm_restarts       SLURM_RESTART_COUNT (Slurm's requeues of the job), when Slurm set it;
                         it differs from restarts when a requeued job found no checkpoint, or
                         a run was resumed by hand
    loss, accuracy       the step's mean loss and training accuracy over the global batch (all
                         micro-batches, all ranks: the step's own all-reduce); null if not finite
    lr, grad_norm        the step's learning rate; the global gradient norm before clipping
    applied, loss_scale  false: the step was skipped (fp16 overflow) or diverged; the fp16 scale
    step_seconds         rank 0's wall time of the step (batch selection, forward, backward,
                         reductions, Adam), perf_counter; samples_per_second = batch / that
    comm                 per purpose, what rank 0's CommLedger recorded during this step: calls,
                         ring bytes, the part of them that is inter-node (the ledger's flat-ring
                         model, zerompi/ledger.py) and elements (as in the end-of-run report),
                         seconds inside MPI.
                         With --overlap a collective is counted in the step it finishes in
                         (stage 1-2 parameter all-gathers finish in the next step's forward; the
                         last step's after the loop, in no line), and its seconds are the
                         communication thread's, not time the step waited
    quant_error          --quant-error: the step's relative L2 error of qwZ's gathered weights and
                         of qgZ's reduced gradients against exact calls beside them, over every
                         rank (zerompi/quantize/error.py; null for what is not quantized)
    offload              --offload-optimizer: rank 0's bytes moved between tiers in this step
                         (to_host, to_device, file_read, file_written; zerompi/offload/adam.py)
    memory               every rank's MemoryLedger total (all its allocated buffers) and OS peak RSS,
                         in rank order; ONLY on step 1, every --log-every steps and the last step
    comm_per_rank        every rank's ring bytes, inter-node ring bytes and seconds inside MPI in
                         this step (all purposes), in rank order; at the same steps as memory. The
                         bytes are equal on every rank (each collective moves the same volume per
                         rank); the inter-node bytes are those of the ranks whose ring successor is
                         on another node; the seconds show which rank waits for the others

Memory and each rank's communication are gathered (one Gather of five numbers per rank, a
collective every rank joins) only at those steps, not every step: the ledger total cannot change
inside the loop (nothing is allocated there) and the peak RSS rarely does, so a per-step
collective would buy nothing.

Crash safety: each line is built whole and handed to the kernel in one os.write on a file opened
with O_APPEND, so a crash loses at most the step in progress and never leaves half a line. A fresh
run truncates the file; a resumed run (--resume) appends, so steps the interrupted run logged after
its last checkpoint appear twice: the later line is the resumed run's.

The metrics are side files: a file that cannot be opened is bad input (setup, before any step),
but a write that fails later (a full disk) costs one warning line from rank 0, and training goes
on without that sink; the weights and checkpoints never wait on them.
"""
import json
import math
import os
import sys
import time

import numpy as np

from ...util.inputs import printable

SLURM_RESTARTS = "SLURM_RESTART_COUNT"     # set by Slurm in a requeued job: its requeue count
MAX_COUNT = 2 ** 53 - 1                     # integers JSON readers and TensorBoard's floats hold exactly


def slurm_restarts(environ):
    """Slurm's requeue count from the environment, or None where it is unset or not a count
    (ASCII digits, at most MAX_COUNT): the metrics leave it out rather than fail."""
    value = environ.get(SLURM_RESTARTS, "")
    if not (value.isascii() and value.isdigit()) or len(value) > len(str(MAX_COUNT)) or int(value) > MAX_COUNT:
        return None
    return int(value)


class StepMetrics:
    """Collective (at the steps that gather): measures each step into a record for the sinks
    (rank 0's; none on the other ranks)."""

    def __init__(self, comm, memory, memory_every, last_step, restarts, slurm_restarts, sinks, offload=None,
                 quant_error=None):
        self.comm, self.memory = comm, memory
        self.quant_error = quant_error     # --quant-error's QuantizationError (zerompi/quantize/error.py), or None
        self.offload, self.moved_before = offload, None     # an OffloadedAdamW (zerompi/offload/), or None
        self.memory_every, self.last_step = memory_every, last_step
        self.run = {"restarts": restarts}
        if slurm_restarts is not None:
            self.run["slurm_restarts"] = slurm_restarts
        self.sinks = sinks
        self.comm_before = None

    def start_step(self):
        self.comm_before = comm_by_purpose(self.comm.ledger)
        if self.offload is not None:
            self.moved_before = self.offload.moved()

    def end_step(self, step, result, lr, loss_scale, batch_size, seconds):
        """Collective at the steps that gather; rank 0's sinks write the step's record."""
        comm = comm_delta(self.comm_before, comm_by_purpose(self.comm.ledger))
        ranks = self.gather_ranks(comm) if self.gather_due(step) else None
        errors = self.quant_error.step_errors() if self.quant_error is not None else None   # collective
        if not self.sinks:
            return
        record = {"step": step, "time": time.time(), **self.run, "loss": finite_or_none(result.loss),
                  "accuracy": result.correct / batch_size, "lr": lr, "grad_norm": finite_or_none(result.grad_norm),
                  "applied": result.applied, "loss_scale": loss_scale, "step_seconds": seconds,
                  "samples_per_second": batch_size / seconds, "comm": comm}
        if self.offload is not None:           # waits for the step's last tile write
            moved = self.offload.moved()
            record["offload"] = {key: value - getattr(self.moved_before, key) for key, value in vars(moved).items()}
        if errors is not None:
            record["quant_error"] = dict(zip(("weights", "grads"), errors))
        if ranks is not None:
            record.update(ranks)
        for sink in self.sinks:
            sink.write(record)
        self.sinks = [sink for sink in self.sinks if sink.open]

    def gather_due(self, step):
        return step == 1 or step == self.last_step or (self.memory_every and step % self.memory_every == 0)

    def gather_ranks(self, comm):
        """Collective: every rank's ledger total, peak RSS, and this step's ring bytes, inter-node
        ring bytes and MPI seconds on rank 0, as lists in rank order (None elsewhere)."""
        mine = np.array([self.memory.total_bytes, self.memory.peak_rss_bytes(),
                         *(sum(c[key] for c in comm.values()) for key in ("bytes", "inter_node_bytes", "seconds"))])
        everyone = np.zeros((self.comm.size, mine.size)) if self.comm.rank == 0 else None
        self.comm.gather_to_root(mine, everyone)
        if everyone is None:
            return None
        return {"memory": {"ledger_bytes": everyone[:, 0].astype(int).tolist(),
                           "peak_rss_bytes": everyone[:, 1].astype(int).tolist()},
                "comm_per_rank": {"bytes": everyone[:, 2].tolist(), "inter_node_bytes": everyone[:, 3].tolist(),
                                  "seconds": everyone[:, 4].tolist()}}

    def close(self):
        for sink in self.sinks:
            sink.close()


class MetricsFile:
    """--metrics: rank 0 appends one JSON line per record."""

    def __init__(self, path, append):
        self.path, self.handle, self.open_error = path, None, None
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
        try:                             # O_NONBLOCK: a FIFO without a reader fails at once, never waits
            self.handle = os.open(path, flags | os.O_NONBLOCK, 0o666)
            os.set_blocking(self.handle, True)
        except OSError as e:
            self.open_error = f"cannot write metrics to {path}: {e.strerror or e}"

    @property
    def open(self):
        return self.handle is not None

    def write(self, record):
        try:
            write_line(self.handle, json.dumps(record, allow_nan=False) + "\n")
        except OSError as e:
            self.give_up(e)

    def close(self):
        """Close the file (a network file system may report a failed write only here)."""
        self.give_up(None)

    def give_up(self, error):
        """Close the file; after a failed write (error), one warning line, and no more lines."""
        handle, self.handle = self.handle, None
        if handle is not None:
            try:
                os.close(handle)
            except OSError as e:
                error = error or e
        if error is not None:
            warn(f"cannot write metrics to {self.path}: {error.strerror or error}; training goes on without them")


def warn(text):
    print(f"zerompi: warning: {printable(text)}", file=sys.stderr, flush=True)


def comm_by_purpose(ledger):
    """{purpose: (calls, ring bytes, ring elements, seconds, inter-node ring bytes)} from a
    CommLedger, so far."""
    return {purpose: ledger.totals({purpose}) + ledger.inter_node({purpose})[:1] for purpose in ledger.purposes()}


def comm_delta(before, after):
    """What was recorded between two comm_by_purpose snapshots, per purpose that made calls."""
    delta = {}
    for purpose, totals in after.items():
        calls, ring_bytes, elements, seconds, inter_bytes = np.subtract(totals, before.get(purpose, (0,) * 5))
        if calls:
            delta[purpose] = {"calls": int(calls), "bytes": float(ring_bytes), "inter_node_bytes": float(inter_bytes),
                              "elements": float(elements), "seconds": float(seconds)}
    return delta


def finite_or_none(value):
    """JSON has no NaN or infinity: a non-finite value is written as null."""
    return float(value) if math.isfinite(value) else None


def write_line(handle, text):
    """One os.write for the whole line (O_APPEND); loop only if the kernel took part of it."""
    data = text.encode()
    while data:
        data = data[os.write(handle, data):]
