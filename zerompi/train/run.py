"""`mpirun -n N python -m zerompi.train`: train the MLP with ZeRO and report what it cost.

    1. parse and check the arguments           (every rank; errors printed once, all exit 2)
    2. load the data, build the engine, load initial weights, check the save path
    3. for each step: this rank's rows of each micro-batch -> train_step (zerompi/step.py)
       at the step's learning rate (zerompi/train/schedule.py) and loss scale (zerompi/train/loss_scale.py)
    4. held-out accuracy, consolidated weights, and the ledger report (zerompi/train/report.py)

Every rank sees the same global batch sequence (zerompi/train/data.py's BatchSchedule). Step s's
global batch of G rows is cut into K micro-batches of G/K rows, and rank r takes rows
[r*b, (r+1)*b) of each, b = G / (K N):

    global batch  | micro-batch 0               | micro-batch 1               | ...
                  | rank 0 | rank 1 | ... | N-1 | rank 0 | rank 1 | ... | N-1 |

so the run computes what one process would compute on the whole batch, for every stage, N and K.

Exit status: 0 done; 2 bad input (one line on stderr); 3 training diverged (a non-finite loss or
gradient in float32/float64/bf16, or the fp16 loss scale collapsed): the last good weights are
saved where --save-weights is set; 4 preempted (SIGTERM/SIGUSR1): a checkpoint was written to
--save-dir, continue with --resume; 5 the ranks disagreed on a collective (--check-collectives);
6 a collective waited past --collective-timeout (zerompi/observe/watchdog.py); 1 an unexpected failure
(traceback, one line naming the rank, MPI_Abort).
"""
import math
import os
import sys
import time
import traceback

import numpy as np
from threadpoolctl import threadpool_limits

from ..adam import AdamConfig
from ..comm import Communicator
from ..devices.nccl import NcclCommunicator
from .config import ArgumentError, check_config, device_choice, parse_args
from .data import BatchSchedule, DataError, load_digits, load_npz, make_synthetic
from ..devices.device import check_device, select_device, take
from ..engine import build_engine
from ..exit_codes import ExitCode
from .launch import blas_threads, launch_mismatch, launcher_rank, threads_variable_error
from .loss_scale import LossScaler
from .metrics import MetricsLog
from ..overlap import OverlapConfig
from ..precision import precision_for
from .report import build_report, format_json, format_table
from .schedule import learning_rate
from .status_line import StatusLine
from ..observe.trace import Tracer, write_trace
from ..step import count_correct, train_step
from ..checkpoint.training import Preemption, check_save_dir, save_training_checkpoint, start_from
from ..observe.watchdog import report_then_abort, stagger
from ..checkpoint.weights import check_writable, save_weights

MAX_INFERRED_CLASSES = 100_000       # a larger label is far more likely a broken file than intended


def load_data(cfg):
    """(dataset, error message or None)."""
    try:
        if cfg.data == "digits":
            data = load_digits()
        elif cfg.data == "synthetic":
            data = make_synthetic(cfg.seed)
        else:
            data = load_npz(cfg.data)
    except DataError as e:
        return None, str(e)
    if not cfg.classes and data.num_classes > MAX_INFERRED_CLASSES:
        return None, (f"{data.name} has labels up to {data.num_classes - 1}: more than "
                      f"{MAX_INFERRED_CLASSES} classes; if that is intended, pass --classes")
    classes = cfg.classes or data.num_classes
    if data.num_classes > classes:
        return None, (f"labels out of range: {data.name} has labels up to {data.num_classes - 1} but "
                      f"--classes {classes} allows 0..{classes - 1}")
    if cfg.batch_size > data.x_train.shape[0]:
        return None, (f"--batch-size {cfg.batch_size} is larger than the {data.x_train.shape[0]} "
                      f"training samples of {data.name}")
    return data, None


class Progress:
    """Sums of the steps since the last progress line, and the line itself (rank 0 prints).
    Loss, accuracy and gradient norm average the applied steps; ms/step divides by all steps
    (an fp16 step skipped for overflow took its time too)."""

    def __init__(self, cfg, comm, out):
        self.cfg, self.comm, self.out = cfg, comm, out
        self.loss = self.correct = self.norm = 0.0
        self.applied = self.steps = 0
        self.since = time.perf_counter()

    def add(self, result):
        self.steps += 1
        if result.applied:
            self.loss += result.loss
            self.correct += result.correct
            self.norm += result.grad_norm
            self.applied += 1

    def print_line(self, step, lr, scaler):
        cfg, n, now = self.cfg, max(self.applied, 1), time.perf_counter()
        scale = f" | loss scale {scaler.scale:g}" if scaler.enabled else ""
        skipped = f" | {self.steps - self.applied} skipped" if self.applied < self.steps else ""
        self.comm.print0(f"step {step:>{len(str(cfg.steps))}}/{cfg.steps} | loss {self.loss / n:.4f}"
                         f" | train acc {100 * self.correct / (n * cfg.batch_size):5.1f}%"
                         f" | grad norm {self.norm / n:.3g} | lr {lr:.2e}{scale}{skipped}"
                         f" | {1e3 * (now - self.since) / self.steps:7.2f} ms/step", file=self.out)
        self.__init__(cfg, self.comm, self.out)


def run(cfg, comm, out, preemption):
    data, error = load_data(cfg)
    comm.check_all(error)
    classes = cfg.classes or data.num_classes
    sizes = [data.num_features, *cfg.hidden, classes]
    precision = precision_for(cfg.dtype)
    K = cfg.grad_accum
    rows = cfg.batch_size // (comm.size * K)                 # this rank's rows of one micro-batch
    adam_config = AdamConfig(cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay)
    overlap = OverlapConfig(enabled=cfg.overlap, bucket_mb=cfg.bucket_mb, prefetch=cfg.prefetch)
    comm.check_all(comm.thread_level_error() if overlap.enabled else None)
    engine = build_engine(sizes, cfg.stage, precision, adam_config, rows, comm, K, overlap)
    comm.check_all(check_writable(cfg.save_weights) if cfg.save_weights and comm.rank == 0 else None)
    for path, what in ((cfg.metrics, "metrics"), (cfg.trace, "the trace")):
        comm.check_all(check_writable(path, what) if path and comm.rank == 0 else None)
    scaler = LossScaler(precision.storage == np.float16, cfg.loss_scale, cfg.loss_scale_window,
                        cfg.min_loss_scale)
    first_step, note, lineage = start_from(engine, cfg, scaler)
    comm.check_all(f"the checkpoint is at step {first_step}, past --steps {cfg.steps}: pass a larger --steps"
                   if first_step > cfg.steps else None)
    comm.check_all(check_save_dir(cfg) if cfg.save_dir and comm.rank == 0 else None)

    device, xp = comm.device, comm.device.xp                 # NumPy, or CuPy: the data set moves once
    x_train = device.from_numpy(data.x_train.astype(precision.compute))   # (samples, features)
    y_train = device.from_numpy(data.y_train)                # (samples,)
    schedule = BatchSchedule(x_train.shape[0], cfg.batch_size, cfg.seed, cfg.shuffle)
    x_micro = xp.empty((K, rows, data.num_features), precision.compute)   # this rank's rows, per micro-batch
    y_micro = xp.empty((K, rows), np.int64)
    # the indices of those rows: written on the host, uploaded without a wait (a GPU's copy is
    # queued; the host writes them again only after the step's read of its sums has waited)
    batch_host = device.pinned_bytes(K * rows * 8).view(np.int64).reshape(K, rows)
    batch = xp.empty((K, rows), np.int64)
    live = comm.rank == 0 and (cfg.progress == "live" or (cfg.progress == "auto" and out.isatty()))
    status = StatusLine(out, first_step, cfg.steps, cfg.batch_size) if live else None
    out = status or out                                      # log lines scroll above the live line
    progress = Progress(cfg, comm, out)
    metrics = (MetricsLog(cfg.metrics, comm, engine.memory, cfg.log_every, cfg.steps, append=bool(cfg.resume))
               if cfg.metrics else None)
    tracer = comm.tracer = Tracer(comm.rank) if cfg.trace else None
    engine.zero.queue.comm.tracer = tracer                   # --overlap: the thread's communicator too
    if tracer is not None:
        tracer.start_clock(comm)

    comm.print0(f"zerompi: ZeRO stage {cfg.stage} on {comm.size} ranks | MLP {'-'.join(map(str, sizes))} "
                f"({engine.layout.num_params:,} parameters) | {cfg.dtype} | global batch {cfg.batch_size} "
                f"= {comm.size} ranks x {K} micro-batches x {rows} rows | {cfg.steps} steps | data "
                f"{data.name}: {x_train.shape[0]} train"
                f"{'' if data.x_test is None else f', {data.x_test.shape[0]} held out'}", file=out)
    if device.is_gpu:
        comm.print0(f"device: {device.name} on rank 0 | {comm.describe_transport()}", file=out)
    if note:
        comm.print0(note, file=out)
    start = time.perf_counter()
    for step in range(first_step, cfg.steps):
        step_start = time.perf_counter()
        if metrics is not None:
            metrics.start_step()
        # global batch -> K micro-batches -> this rank's rows of each
        np.copyto(batch_host, schedule.global_indices(step).reshape(K, comm.size, rows)[:, comm.rank])
        device.upload(batch_host, batch)
        for k in range(K):
            take(x_train, batch[k], x_micro[k], axis=0)
            take(y_train, batch[k], y_micro[k], axis=0)
        lr = learning_rate(step, cfg.steps, cfg.lr, cfg.lr_schedule, cfg.warmup_steps, cfg.min_lr)
        loss_scale = scaler.scale
        result = train_step(engine.zero, engine.mlp, zip(x_micro, y_micro), cfg.batch_size, lr,
                            loss_scale, cfg.clip_norm)
        step_end = time.perf_counter()
        if tracer is not None:
            tracer.span(f"step {step + 1}", "step", step_start, step_end)
        if metrics is not None:
            metrics.end_step(step + 1, result, lr, loss_scale, cfg.batch_size, step_end - step_start)
        event = scaler.update(result.applied)
        if event:
            comm.print0(f"step {step + 1}: {event}", file=out)
        if not result.applied and not scaler.enabled:
            stop(engine, cfg, not_finite_message(step + 1, result, comm), status)
        if scaler.collapsed:
            stop(engine, cfg, f"step {step + 1}: the fp16 loss scale fell to {scaler.scale:g}, below "
                              f"--min-loss-scale {cfg.min_loss_scale:g}: gradients keep overflowing", status)
        progress.add(result)
        done = step + 1
        if cfg.log_every and progress.steps and (done % cfg.log_every == 0 or done == cfg.steps):
            progress.print_line(done, lr, scaler)
        if status is not None:
            status.update(done, result.loss)
        preempted = cfg.save_dir and preemption.agreed(comm) and done < cfg.steps   # the last step just ends
        if cfg.save_dir and (preempted or done == cfg.steps or (cfg.save_every and done % cfg.save_every == 0)):
            save_training_checkpoint(engine, cfg, done, scaler, lineage)
        if preempted:
            comm.print0(f"step {done}: signalled: checkpoint written to {cfg.save_dir}; exiting with status "
                        f"{ExitCode.PREEMPTED:d} (continue with --resume)", file=out)
            raise SystemExit(ExitCode.PREEMPTED)
    engine.zero.finish_communication()                      # the last step's all-gathers
    steps_run = cfg.steps - first_step
    train_seconds = time.perf_counter() - start
    if status is not None:
        status.close()
    if metrics is not None:
        metrics.close()
    if tracer is not None:
        comm.tracer = engine.zero.queue.comm.tracer = None
        write_trace(tracer, comm, cfg.trace)
    train_comm = {p: comm.ledger.totals({p}) for p in ("grads", "params")}

    if data.x_test is not None:
        accuracy = held_out_accuracy(engine, data, precision.compute, rows)
        comm.print0(f"held-out accuracy {100 * accuracy:.2f}% on {data.x_test.shape[0]} samples"
                    f" | training took {train_seconds:.1f} s", file=out)
    if cfg.save_weights:
        comm.check_all(save_weights(engine, cfg.save_weights))
        comm.print0(f"saved weights to {cfg.save_weights}", file=out)
    report = build_report(engine, train_comm, steps_run, cfg.stage, K)
    if comm.rank == 0 and cfg.report == "table":
        print("\n" + format_table(report), flush=True)
    elif comm.rank == 0 and cfg.report == "json":
        print(format_json(report), flush=True)


def not_finite_message(step, result, comm):
    """Collective: what was not finite at this step, where first: the layer (the first one whose
    gradient is not finite, the same verdict on every rank) and the lowest rank whose own part of
    the loss is not finite."""
    if result.bad_layer >= 0:
        grad = f"the gradient is not finite, first in layer {result.bad_layer} (layers.{result.bad_layer}.*)"
    elif not math.isfinite(result.grad_norm):
        grad = f"the gradient norm overflows ({result.grad_norm:g})"
    else:
        grad = f"the gradient is finite (norm {result.grad_norm:.3g})"
    rank = comm.first_failing_rank(None if result.local_loss_finite else "loss")
    loss = (f"the loss is {result.loss:g}" if rank is None else
            f"the loss is not finite ({result.loss:g}), first on rank {rank}")
    return f"step {step}: {grad}; {loss}: lower --lr or try --clip-norm"


def stop(engine, cfg, message, status=None):
    """Collective, every rank with the same message: save the last good weights (the failed step
    changed nothing) where a save path is set, print the error once, exit with ExitCode.DIVERGED. The live
    progress line (rank 0, status) is erased first, so that the error is not drawn over it."""
    if status is not None:
        status.close()
    if cfg.save_weights:
        saved = save_weights(engine, cfg.save_weights)
        message += "; " + (saved or f"the last good weights are in {cfg.save_weights}")
    engine.comm.check_all(message, exit_code=ExitCode.DIVERGED)


def held_out_accuracy(engine, data, dtype, rows_per_rank):
    """Each rank counts its contiguous part of the held-out set; one all-reduce adds them up."""
    comm = engine.comm
    parts = np.array_split(np.arange(data.x_test.shape[0]), comm.size)
    mine = parts[comm.rank]
    num_chunks = -(-max(len(p) for p in parts) // rows_per_rank)   # the same on every rank
    x_test = comm.device.from_numpy(data.x_test[mine].astype(dtype))
    y_test = comm.device.from_numpy(data.y_test[mine])
    correct = np.array([count_correct(engine.zero, engine.mlp, x_test, y_test,
                                      rows_per_rank, num_chunks)], dtype=np.float64)
    comm.allreduce_sum(correct, "metrics")
    return correct[0] / data.x_test.shape[0]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    # The GPU is chosen before MPI starts (the Communicator starts it): see zerompi/devices/device.py.
    device, device_error = select_device(device_choice(argv), os.environ)
    comm = Communicator(device=device)
    try:
        mismatch = launch_mismatch(comm.size, os.environ)
        if mismatch:                           # N lone "rank 0"s: only the launcher's rank 0 speaks
            if launcher_rank(os.environ) == 0:
                print(f"zerompi: error: {mismatch}", file=sys.stderr, flush=True)
            raise SystemExit(ExitCode.BAD_INPUT)
        try:
            cfg, error = parse_args(argv, comm.rank, comm.size), None
        except ArgumentError as e:
            cfg, error = None, f"{e} (see --help)"
        comm.check_all(error)
        comm.check_all(check_config(cfg, comm.size))
        ranks_on_node = comm.ranks_on_this_node()            # collective: every rank, before any verdict
        comm.check_all(device_error or check_device(device, cfg.dtype, cfg.comm, ranks_on_node))
        if cfg.comm == "nccl":
            comm = NcclCommunicator(comm.mpi, device)      # the same ranks, training traffic on NCCL
        comm.check_all(threads_variable_error(os.environ))
        comm.guard(cfg.check_collectives, cfg.collective_timeout)
        # from here a SIGTERM/SIGUSR1 only sets a flag; the loop checkpoints at the next step's end
        preemption = Preemption(enabled=bool(cfg.save_dir))
        # progress goes to stderr when stdout must hold nothing but the JSON report
        out = sys.stderr if cfg.report == "json" else sys.stdout
        threads = blas_threads(ranks_on_node, os.environ, len(os.sched_getaffinity(0)))
        with threadpool_limits(limits=threads):
            run(cfg, comm, out, preemption)
    except SystemExit:
        raise
    except BaseException as e:                 # a bug or an MPI failure: never leave ranks hanging
        time.sleep(stagger(comm.rank))         # several ranks failing at once: the lowest one reports
        traceback.print_exc()
        report_then_abort(f"zerompi: error: rank {comm.rank} failed: {type(e).__name__}: {e}", comm.mpi.Abort, ExitCode.FAILED)
    return ExitCode.OK


if __name__ == "__main__":
    raise SystemExit(main())
