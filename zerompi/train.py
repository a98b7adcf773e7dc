"""`mpirun -n N python -m zerompi.train`: train the MLP with ZeRO and report what it cost.

    1. parse and check the arguments           (every rank; errors printed once, all exit 2)
    2. load the data, build the engine, load initial weights, check the save path
    3. for each step: this rank's rows of the global batch -> train_step (zerompi/train_step.py)
       every --log-every steps: one all-reduce of (loss, correct) and a progress line
    4. held-out accuracy, consolidated weights, and the ledger report (zerompi/report.py)

Every rank sees the same global batch sequence (zerompi/data.py's BatchSchedule) and takes rows
[r*b, (r+1)*b) of it, b = batch_size / N; so the run computes what one process would compute on
the whole batch, for every stage and N.
"""
import os
import sys
import time
import traceback

import numpy as np
from threadpoolctl import threadpool_limits

from .adam import AdamConfig
from .comm import Communicator
from .config import ArgumentError, check_config, parse_args
from .data import BatchSchedule, DataError, load_npz, make_synthetic
from .engine import build_engine
from .report import build_report, format_json, format_table
from .train_step import count_correct, train_step
from .weights import WeightsError, check_writable, read_weights, save_weights


def blas_threads_per_rank(comm):
    """The cores this process may use, divided among the ranks on this node (at least 1)."""
    return max(1, len(os.sched_getaffinity(0)) // comm.ranks_on_this_node())


MAX_INFERRED_CLASSES = 100_000       # a larger label is far more likely a broken file than intended


def load_data(cfg):
    """(dataset, error message or None)."""
    try:
        data = load_npz(cfg.data) if cfg.data else make_synthetic(cfg.seed)
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


def load_initial_weights(engine, cfg):
    """Random init from the seed, or the --init-weights file; returns an error message or None."""
    if not cfg.init_weights:
        engine.init_params(cfg.seed)
        return None
    try:
        for unit, values in read_weights(cfg.init_weights, engine.layout):
            engine.zero.set_unit_params(unit, values.astype(engine.zero.dtype))
    except WeightsError as e:
        return str(e)
    return None


def run(cfg, comm, out):
    data, error = load_data(cfg)
    comm.check_all(error)
    classes = cfg.classes or data.num_classes
    sizes = [data.num_features, *cfg.hidden, classes]
    dtype = np.dtype(cfg.dtype)
    rows_per_rank = cfg.batch_size // comm.size
    adam_config = AdamConfig(cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay)
    engine = build_engine(sizes, cfg.stage, dtype, adam_config, rows_per_rank, comm)
    comm.check_all(load_initial_weights(engine, cfg))
    comm.check_all(check_writable(cfg.save_weights) if cfg.save_weights and comm.rank == 0 else None)

    x_train = data.x_train.astype(dtype)                     # (samples, features)
    schedule = BatchSchedule(x_train.shape[0], cfg.batch_size, cfg.seed, cfg.shuffle)
    x_batch = np.empty((rows_per_rank, data.num_features), dtype)   # this rank's rows of a step
    y_batch = np.empty(rows_per_rank, np.int64)
    mine = slice(comm.rank * rows_per_rank, (comm.rank + 1) * rows_per_rank)
    metrics = np.zeros(2)                                    # (loss summed over steps, correct)

    comm.print0(f"zerompi: ZeRO stage {cfg.stage} on {comm.size} ranks | MLP {'-'.join(map(str, sizes))} "
                f"({engine.layout.num_params:,} parameters) | {cfg.dtype} | global batch {cfg.batch_size} "
                f"({rows_per_rank}/rank) | {cfg.steps} steps | data {data.name}: {x_train.shape[0]} train"
                f"{'' if data.x_test is None else f', {data.x_test.shape[0]} held out'}", file=out)
    start = last_log = time.perf_counter()
    logged_step = 0
    for step in range(cfg.steps):
        rows = schedule.global_indices(step)[mine]
        np.take(x_train, rows, axis=0, out=x_batch)
        np.take(data.y_train, rows, axis=0, out=y_batch)
        loss_part, correct = train_step(engine.zero, engine.mlp, x_batch, y_batch, cfg.batch_size)
        metrics += (loss_part, correct)
        done = step + 1
        if cfg.log_every and (done % cfg.log_every == 0 or done == cfg.steps):
            comm.allreduce_sum(metrics, "metrics")           # (sum of global mean losses, correct)
            now, steps_logged = time.perf_counter(), done - logged_step
            comm.print0(f"step {done:>{len(str(cfg.steps))}}/{cfg.steps} | loss {metrics[0] / steps_logged:.4f}"
                        f" | train acc {100 * metrics[1] / (steps_logged * cfg.batch_size):5.1f}%"
                        f" | {1e3 * (now - last_log) / steps_logged:7.2f} ms/step", file=out)
            metrics[:] = 0
            last_log, logged_step = now, done
    train_seconds = time.perf_counter() - start
    train_comm = {p: comm.ledger.totals({p}) for p in ("grads", "params")}

    if data.x_test is not None:
        accuracy = held_out_accuracy(engine, data, dtype, rows_per_rank)
        comm.print0(f"held-out accuracy {100 * accuracy:.2f}% on {data.x_test.shape[0]} samples"
                    f" | training took {train_seconds:.1f} s", file=out)
    if cfg.save_weights:
        comm.check_all(save_weights(engine, cfg.save_weights))
        comm.print0(f"saved weights to {cfg.save_weights}", file=out)
    report = build_report(engine, train_comm, cfg.steps, cfg.stage)
    if comm.rank == 0 and cfg.report == "table":
        print("\n" + format_table(report), flush=True)
    elif comm.rank == 0 and cfg.report == "json":
        print(format_json(report), flush=True)


def held_out_accuracy(engine, data, dtype, rows_per_rank):
    """Each rank counts its contiguous part of the held-out set; one all-reduce adds them up."""
    comm = engine.comm
    parts = np.array_split(np.arange(data.x_test.shape[0]), comm.size)
    mine = parts[comm.rank]
    num_chunks = -(-max(len(p) for p in parts) // rows_per_rank)   # the same on every rank
    x_test = data.x_test[mine].astype(dtype)
    correct = np.array([count_correct(engine.zero, engine.mlp, x_test, data.y_test[mine],
                                      rows_per_rank, num_chunks)], dtype=np.float64)
    comm.allreduce_sum(correct, "metrics")
    return correct[0] / data.x_test.shape[0]


def main(argv=None):
    comm = Communicator()
    try:
        try:
            cfg, error = parse_args(sys.argv[1:] if argv is None else argv, comm.rank), None
        except ArgumentError as e:
            cfg, error = None, f"{e} (see --help)"
        comm.check_all(error)
        comm.check_all(check_config(cfg, comm.size))
        # progress goes to stderr when stdout must hold nothing but the JSON report
        out = sys.stderr if cfg.report == "json" else sys.stdout
        with threadpool_limits(limits=blas_threads_per_rank(comm)):
            run(cfg, comm, out)
    except SystemExit:
        raise
    except BaseException:                      # a bug or an MPI failure: never leave ranks hanging
        traceback.print_exc()
        sys.stderr.flush()
        comm.mpi.Abort(1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
