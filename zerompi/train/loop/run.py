"""`mpirun -n N python -m zerompi.train`: train the MLP with ZeRO and report what it cost.

    main        parse and check the arguments (every rank; an error is printed once and every rank
                exits BAD_INPUT), start MPI on the chosen device, guard the collectives, handle
                the stop signals (zerompi/train/loop/signals.py)
    setup       load the data, build the engine, load the initial or resumed weights, check the
                output paths; this rank's batch buffers (zerompi/train/loop/batches.py), the loss
                scaler, the progress and metrics lines, the trace; print the run's header
    train_loop  each step: this rank's rows of each micro-batch -> train_step (zerompi/step.py) at
                the step's learning rate (zerompi/train/loop/schedule.py) and loss scale
                (zerompi/train/loop/loss_scale.py); then divergence, progress, checkpoints, signals
    finish      held-out accuracy, consolidated weights, then the side files (metrics, trace) and
                the ledger report (zerompi/train/outputs/report.py)

Step s's global batch of G rows is cut into M micro-batches (--grad-accum) of G/M rows, and each
rank takes its b = G / (M N) rows of each (zerompi/train/loop/batches.py): the run computes what one
process would compute on the whole batch, for every stage, N and M.

Weights and checkpoints come first: --metrics, --tensorboard and --trace are side files, and a
write of theirs that fails during the run costs one warning line (zerompi/train/outputs/metrics.py,
zerompi/train/outputs/tensorboard.py, zerompi/observe/trace.py), never the run. Inside the loop an
inf or NaN gets one verdict (zerompi/train/loop/divergence.py), not a RuntimeWarning from every rank.

Exit status: zerompi/util/exit_codes.py, one enumeration; each `except` of main below maps one kind
of ending onto it (a signal, an offload file, memory, a bug) and ends the job with one line.
"""
import math
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from ...checkpoint.weights import check_writable, save_weights
from ...cpu import CPU, blas_threads
from ...devices import communicator_on
from ...devices.nccl import NcclCommunicator
from ...engine import build_engine
from ...hierarchy import hierarchy_for
from ...inprocess import RankFailed
from ...ledger import GRADS, METRICS, PARAMS
from ...quantize import SCALES
from ...memory import model_size_error
from ...mpi import MpiUnavailable, launcher_rank
from ...observe import guards_for
from ...observe.trace import Tracer, create_trace_file
from ...observe.watchdog import await_announced_abort
from ...offload import OffloadedAdamW, OffloadedStage3
from ...plan import RunShape
from ...plan.preflight import preflight_error
from ...step import count_correct, train_step
from ...util.exit_codes import ExitCode
from ...util.inputs import printable
from ...util.words import format_bytes
from ..options.agreement import agree, data_fields, run_fields, start_fields
from ..options.before_mpi import choices_before_mpi
from ..options.config import TrainConfig, parse_args
from ..options.config_checks import check_config
from ..options.device_choice import check_device, select_device
from ..options.errors import ArgumentError
from ..options.grouping import grouping_error, resolve_grouping
from ..options.launch import launch_mismatch, threads_variable_error
from ..options.shape import run_shape
from .batches import MicroBatches
from .checkpoints import check_save_dir, save_training_checkpoint, start_from
from .data import Dataset, load_data
from .divergence import Stalls, not_finite_message, stop, stop_if_parameters_not_finite
from .end_job import end_job, end_with
from .in_process import run_in_process
from .loss_scale import LossScaler, loss_scale_error
from .offload_folder import adam_config_for
from .schedule import learning_rate
from .signals import Interrupted, Signals
from ..outputs.destination import launcher_terminal, live_progress
from ..outputs.header import print_header
from ..outputs.metrics import MetricsFile, StepMetrics, slurm_restarts
from ..outputs.progress import Progress
from ..outputs.report import build_report, format_json, format_table
from ..outputs.tensorboard import TensorBoardLog, tensorboard_missing


@dataclass
class RunState:
    """What setup() builds for the loop and the finish."""
    cfg: TrainConfig
    comm: object                 # zerompi/comm.py's Communicator, or the NCCL one
    out: object                  # where rank 0 prints: stdout, stderr (--report json), or the live line
    data: Dataset
    shape: RunShape              # the run resolved: sizes, stage, precision, rows, grouping, ... (zerompi/plan/)
    engine: object               # zerompi/engine.py's Engine
    scaler: LossScaler
    first_step: int              # 0, or the step of the checkpoint resumed from
    lineage: dict                # the resumed checkpoint, for the manifests of the next ones
    batches: MicroBatches
    status: object               # status_line.py's StatusLine, the live progress line (rank 0), or None
    progress: Progress
    metrics: StepMetrics | None  # the per-step records for --metrics and --tensorboard
    tracer: Tracer | None
    stalls: Stalls               # steps in a row that changed no weight (divergence.py)


def run(cfg, comm, out, signals):
    """Collective: the whole run, on every rank."""
    state = setup(cfg, comm, out)
    try:
        # an inf or NaN gets one verdict (divergence.py, finish), not a RuntimeWarning from every rank
        with np.errstate(over="ignore", invalid="ignore"):
            train_seconds = train_loop(state, signals)
            finish(state, train_seconds)
    finally:
        if state.tracer is not None:
            state.tracer.discard()           # a run that ends early writes no trace (once written: nothing)


def setup(cfg, comm, out):
    """Collective: every input checked (a problem: one line, every rank exits BAD_INPUT), the
    engine built and its starting weights loaded, the run's header printed."""
    ranks_on_node = comm.ranks_on_this_node()                # they share the node's memory
    data, error = load_data(cfg, ranks_on_node)
    comm.check_all(error)
    agree(comm, data_fields(data), out)                      # the same data on every rank (agreement.py)
    sizes = [data.num_features, *cfg.hidden, cfg.classes or data.num_classes]
    comm.check_all(model_size_error(sizes))
    adam_config = adam_config_for(cfg, comm, comm.device, out)   # --offload-optimizer (offload_folder.py)
    comm.check_all(comm.thread_level_error() if cfg.overlap else None)
    grouping, error = resolve_grouping(cfg, comm)            # where the ranks are: the node map
    comm.check_all(error)
    shape = run_shape(cfg, sizes, comm.size, grouping, comm.node_of_rank, comm.device.is_gpu, comm.rank)
    comm.check_all(preflight_error(shape, comm.rank, comm.device, ranks_on_node))
    precision, rows = shape.precision, shape.rows            # rows: this rank's rows of one micro-batch
    engine = build_engine(sizes, shape.stage, precision, adam_config, rows, comm, shape.micro_batches,
                          shape.overlap.bucket_mb, shape.start_collectives, hierarchy_for(comm, grouping),
                          shape.offload_params and OffloadedStage3, shape.keep_last_layer)
    for path, what in ((cfg.save_weights, "weights"), (cfg.metrics, "metrics"), (cfg.trace, "the trace")):
        comm.check_all(check_writable(path, what) if path and comm.rank == 0 else None)
    comm.check_all(tensorboard_missing() if cfg.tensorboard and comm.rank == 0 else None)
    scaler = LossScaler(precision.storage == np.float16, cfg.loss_scale, cfg.loss_scale_window, cfg.min_loss_scale)
    first_step, note, lineage, resumed = start_from(engine, cfg, scaler)
    agree(comm, start_fields(cfg, resumed), out)             # one --save-dir, one checkpoint or weights file
    comm.check_all(f"the checkpoint is at step {first_step}, past --steps {cfg.steps}: pass a larger --steps"
                   if first_step > cfg.steps else None)
    comm.check_all(check_save_dir(cfg) if cfg.save_dir and comm.rank == 0 else None)
    batches = MicroBatches(cfg, comm, data, precision.compute, rows)
    metrics = start_metrics(cfg, comm, engine, lineage["restarts"])
    tracer = start_trace(cfg, comm, engine)
    state = RunState(cfg=cfg, comm=comm, out=out, data=data, shape=shape, engine=engine,
                     scaler=scaler, first_step=first_step, lineage=lineage, batches=batches, status=None,
                     progress=None, metrics=metrics, tracer=tracer, stalls=Stalls())
    print_header(state, sizes, note)                         # zerompi/train/outputs/header.py
    if comm.rank == 0 and live_progress(cfg.progress, out, os.environ):     # zerompi/train/outputs/destination.py
        from ..outputs.status_line import StatusLine        # here: tqdm's import would cost every rank's start-up
        state.status = state.out = StatusLine(out, first_step, cfg.steps,    # log lines scroll above it
                                              launcher_terminal(out, os.environ))
    state.progress = Progress(cfg, comm, state.out)
    return state


def start_metrics(cfg, comm, engine, restarts):
    """The per-step records and rank 0's sinks for them (--metrics, --tensorboard), or None when
    neither is asked for (nor --quant-error's per-step sums). Collective: a sink rank 0 cannot open is bad input."""
    if not (cfg.metrics or cfg.tensorboard or cfg.quant_error):
        return None
    sinks = []
    if comm.rank == 0:
        sinks = ([MetricsFile(cfg.metrics, append=bool(cfg.resume))] if cfg.metrics else []) + \
                ([TensorBoardLog(cfg.tensorboard)] if cfg.tensorboard else [])
    comm.check_all(next((sink.open_error for sink in sinks if sink.open_error), None))
    offload = engine.stage.adam if isinstance(engine.stage.adam, OffloadedAdamW) else None
    return StepMetrics(comm, engine.memory, cfg.log_every, cfg.steps, restarts, slurm_restarts(os.environ), sinks,
                       offload, engine.stage.collectives.error if cfg.quant_error else None)


def train_loop(state, signals):
    """Collective: steps first_step .. --steps; returns the seconds they took. Ends the job on
    divergence (DIVERGED) or when a rank was signalled (PREEMPTED, after a checkpoint; without
    --save-dir INTERRUPTED, zerompi/train/loop/signals.py)."""
    cfg, engine, metrics, tracer = state.cfg, state.engine, state.metrics, state.tracer
    signals.enter_loop(cfg.save_dir)
    start = time.perf_counter()
    for step in range(state.first_step, cfg.steps):
        step_start = time.perf_counter()
        if metrics is not None:
            metrics.start_step()
        micro_batches = state.batches.load(step)             # this rank's rows of each micro-batch
        lr = learning_rate(step, cfg.steps, cfg.lr, cfg.lr_schedule, cfg.warmup_steps, cfg.min_lr)
        loss_scale = state.scaler.scale
        result = train_step(engine, micro_batches, cfg.batch_size, lr, loss_scale, cfg.clip_norm)
        step_end = time.perf_counter()
        if tracer is not None:
            tracer.end_step(step + 1, step_start, step_end)
        if metrics is not None:
            metrics.end_step(step + 1, result, lr, loss_scale, cfg.batch_size, step_end - step_start)
        scale_or_stop(state, step + 1, result)
        state.stalls.add(result)
        log_progress(state, step + 1, result, lr)
        checkpoint(state, step + 1, signals)
    engine.stage.finish_communication()                      # the last step's all-gathers
    stop_if_parameters_not_finite(engine, cfg, cfg.steps, state.status)   # the last update: no step checked it
    stalled = state.stalls.message(cfg.steps, cfg.steps - state.first_step, state.scaler.scale)
    if stalled:                                              # nothing learnt at the end is no success
        stop(engine, cfg, stalled, state.status)
    signals.leave_loop()
    return time.perf_counter() - start


def scale_or_stop(state, done, result):
    """The fp16 loss scale's update (printed when it changes), and the stop on divergence: a step
    not applied because the parameters are not finite (any dtype), or because the loss is not
    finite (any dtype: in fp16 too, where no loss scale helps a forward pass that overflows), or
    outside fp16 the gradient; or an fp16 loss scale below --min-loss-scale."""
    cfg, scaler = state.cfg, state.scaler
    if not result.applied:                                   # every rank alike: the check is collective
        stop_if_parameters_not_finite(state.engine, cfg, done, state.status)
    if not result.applied and (not scaler.enabled or not math.isfinite(result.loss)):    # no scale helps
        stop(state.engine, cfg, not_finite_message(done, result, state.comm, scaler.enabled), state.status)
    event = scaler.update(result.applied)
    if event:
        state.comm.print0(f"step {done}: {event}", file=state.out)
    if scaler.collapsed:
        stop(state.engine, cfg, f"step {done}: the fp16 loss scale fell to {scaler.scale:g}, below "
                                f"--min-loss-scale {cfg.min_loss_scale:g}: gradients keep overflowing",
             state.status)


def log_progress(state, done, result, lr):
    """A progress line every --log-every steps and at the last; the live line every step."""
    cfg, progress = state.cfg, state.progress
    progress.add(result)
    if cfg.log_every and progress.steps and (done % cfg.log_every == 0 or done == cfg.steps):
        progress.print_line(done, lr, state.scaler)
    if state.status is not None:
        state.status.update(done, result.loss)


def checkpoint(state, done, signals):
    """Collective, with --save-dir: a checkpoint every --save-every steps, at the end, and after
    a signal on any rank, when every rank then exits PREEMPTED (at the last step the run just ends).
    Never of non-finite parameters: that is divergence."""
    cfg, comm = state.cfg, state.comm
    preempted = cfg.save_dir and signals.agreed(comm) and done < cfg.steps
    if cfg.save_dir and (preempted or done == cfg.steps or (cfg.save_every and done % cfg.save_every == 0)):
        stop_if_parameters_not_finite(state.engine, cfg, done, state.status)
        started = time.perf_counter()
        save_training_checkpoint(state.engine, cfg, done, state.scaler, state.lineage, state.data.input_scale)
        if comm.rank == 0:                      # rank 0 knows the folder it published
            comm.print0(saved_line(cfg.save_dir, state.lineage["parent"], done, time.perf_counter() - started),
                        file=state.out)
    if preempted:
        comm.print0(f"step {done}: signalled: checkpoint written to {cfg.save_dir}; exiting with status "
                    f"{ExitCode.PREEMPTED:d} (continue with --resume)", file=state.out)
        raise SystemExit(ExitCode.PREEMPTED)


def saved_line(save_dir, folder, done, seconds):
    """The log line of a checkpoint written: its step, folder, size on disk (when the folder can
    still be read: a log line never fails the run) and the seconds it took."""
    path = os.path.join(save_dir, folder)
    try:
        size = f", {format_bytes(sum(entry.stat().st_size for entry in os.scandir(path) if entry.is_file()))}"
    except OSError:
        size = ""
    return f"step {done}: checkpoint {path} written{size} in {seconds:.2f} s"


def finish(state, train_seconds):
    """Collective: close the progress line; held-out accuracy, the consolidated weights; then
    the side files (metrics, trace: a failure there costs a warning, never the weights) and the
    ledger report of the training steps' memory and traffic."""
    cfg, comm, engine, data, out = state.cfg, state.comm, state.engine, state.data, state.out
    steps_run = cfg.steps - state.first_step
    if state.status is not None:
        state.status.close()
    if state.tracer is not None:
        state.tracer.detach(engine)                          # the spans of the training steps only
    train_comm = {p: comm.ledger.totals({p}) + comm.ledger.inter_node({p}) for p in (GRADS, PARAMS, SCALES)}
    train_moved = engine.stage.adam.moved() if isinstance(engine.stage.adam, OffloadedAdamW) else None

    if data.x_test is not None:
        accuracy, not_finite = held_out_accuracy(engine, data, state.shape.precision.compute, state.shape.rows)
        comm.check_all(f"held-out predictions are not finite ({not_finite} of {data.x_test.shape[0]} samples): "
                       f"the weights overflow {cfg.dtype} in the forward pass; nothing saved: lower --lr"
                       if not_finite else None, exit_code=ExitCode.DIVERGED)
        comm.print0(f"held-out accuracy {100 * accuracy:.2f}% on {data.x_test.shape[0]} samples"
                    f" | training took {train_seconds:.1f} s", file=out)
    if cfg.save_weights:
        comm.check_all(save_weights(engine, cfg.save_weights))
        comm.print0(f"saved weights to {cfg.save_weights}", file=out)
    if state.metrics is not None:
        state.metrics.close()
    if state.tracer is not None:
        state.tracer.close()
    report = build_report(engine, train_comm, steps_run, cfg.stage, cfg.grad_accum, state.shape.grouping, train_moved)
    if comm.rank == 0 and cfg.report == "table":
        print("\n" + format_table(report), flush=True)
    elif comm.rank == 0 and cfg.report == "json":
        print(format_json(report), flush=True)


def held_out_accuracy(engine, data, dtype, rows_per_rank):
    """(accuracy, predictions not finite): each rank counts its contiguous part of the held-out
    set; one all-reduce adds them up."""
    comm = engine.comm
    parts = np.array_split(np.arange(data.x_test.shape[0]), comm.size)
    mine = parts[comm.rank]
    num_chunks = -(-max(len(p) for p in parts) // rows_per_rank)   # the same on every rank
    x_test = comm.device.from_numpy(data.x_test[mine].astype(dtype))
    y_test = comm.device.from_numpy(data.y_test[mine])
    counts = np.array(count_correct(engine, x_test, y_test, rows_per_rank, num_chunks), dtype=np.float64)
    comm.allreduce_sum(counts, METRICS)                      # (correct, rows not finite) over all ranks
    return counts[0] / data.x_test.shape[0], int(counts[1])


def start_trace(cfg, comm, engine):
    """Collective with --trace: this rank's Tracer attached to the engine, rank 0's trace file
    started (zerompi/observe/trace.py), the clocks aligned; None without --trace."""
    if not cfg.trace:
        return None
    file, error = create_trace_file(cfg.trace, comm.size) if comm.rank == 0 else (None, None)
    comm.check_all(error)
    tracer = Tracer(comm, file)
    tracer.attach(engine)
    tracer.start_clock()
    return tracer


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    rank = launcher_rank(os.environ)       # MPI's rank, once it starts (launch.py checks the two agree)
    signals = Signals(rank, lambda what: end_job(rank, f"zerompi: error: rank {rank}: {what}",
                                                 ExitCode.INTERRUPTED, standing_by=True))
    # from here a signal ends the run with one line (zerompi/train/loop/signals.py)
    comm = None
    try:
        # The GPU is chosen before MPI starts (the Communicator starts it): see zerompi/train/options/device_choice.py;
        # the watchdog guards the collectives from the first one, which the Communicator makes.
        early = choices_before_mpi(argv)
        if not early.in_process_ranks:         # else threads, no MPI (in_process.py)
            device, device_error = select_device(early.device, os.environ)
            comm = communicator_on(device, guards=guards_for(collective_timeout=early.collective_timeout))
    except Interrupted as e:                   # reading --config, or MPI starting
        end_job(rank, f"zerompi: error: rank {rank}: {e}", ExitCode.INTERRUPTED)
    except MpiUnavailable as e:                # no MPI, no abort: every rank ends, the launcher's rank 0 says why
        signals.stand_down()
        if rank == 0:
            print(printable(f"zerompi: error: {e}: install one (pip install mpich), or load your site's MPI (its "
                            f"module) before mpi4py (docs/clusters-and-slurm.md)"), file=sys.stderr, flush=True)
        raise SystemExit(ExitCode.BAD_INPUT)
    try:
        if comm is None:
            run_in_process(early, lambda ranks_comm: rank_main(ranks_comm, argv, CPU(), None, signals, True),
                           os.environ, rank)
        else:
            rank_main(comm, argv, device, device_error, signals)
    except SystemExit:
        raise
    except RankFailed as failed:               # an in-process rank raised (in_process.py)
        end_with(failed.error, failed.rank, signals, alone=True)
    except BaseException as e:                 # noqa: B036 -- every ending is mapped onto a status
        end_with(e, comm.rank if comm is not None else 0, signals)
    finally:
        signals.stand_down()                   # the run has ended: a signal now must not change its status
        await_announced_abort()                # a watchdog announced an abort: never exit 0 (watchdog.py)
    return ExitCode.OK


def rank_main(comm, argv, device, device_error, signals, in_process=False):
    """One rank, its communicator made: arguments checked, then run (in_process: a thread, in_process.py)."""
    mismatch = None if in_process else launch_mismatch(comm.size, os.environ)
    if mismatch:                               # N lone "rank 0"s: only the launcher's rank 0 speaks
        if launcher_rank(os.environ) == 0:
            print(f"zerompi: error: {printable(mismatch)}", file=sys.stderr, flush=True)
        raise SystemExit(ExitCode.BAD_INPUT)
    try:
        cfg, error = parse_args(argv, comm.rank, comm.size), None
    except ArgumentError as e:
        cfg, error = None, f"{e} (see --help)"
    comm.check_all(error)
    # progress goes to stderr when stdout must hold nothing but the JSON report
    out = sys.stderr if cfg.report == "json" else sys.stdout
    agree(comm, run_fields(cfg, device), out)         # every rank runs the same training (agreement.py)
    comm.check_all(check_config(cfg, comm.size))
    comm.check_all(grouping_error(cfg, comm.size))
    comm.check_all(loss_scale_error(cfg.precision.storage == np.float16, cfg.loss_scale, cfg.min_loss_scale))
    ranks_on_node = comm.ranks_on_this_node()
    comm.check_all(device_error or check_device(device, cfg.precision, cfg.comm == "nccl", ranks_on_node))
    if cfg.comm == "nccl":                      # the same ranks, training traffic on NCCL, its own watchdog
        comm.guards.turn_on(collective_timeout=0.0)
        comm = NcclCommunicator(comm.mpi, device, guards_for(comm.mpi, collective_timeout=cfg.collective_timeout))
    comm.check_all(threads_variable_error(os.environ))
    comm.guards.turn_on(cfg.check_collectives, cfg.collective_timeout)
    if in_process:                              # one BLAS pool for every rank: in_process.py sized it
        return run(cfg, comm, out, signals)
    with threadpool_limits(limits=blas_threads(ranks_on_node, os.environ, len(os.sched_getaffinity(0)))):
        run(cfg, comm, out, signals)


if __name__ == "__main__":
    raise SystemExit(main())
