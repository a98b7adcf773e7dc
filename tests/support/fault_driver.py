"""Run zerompi.train with one real fault on chosen ranks at a chosen step (tests/proofs/test_faults.py).

    mpirun -n N python tests/support/fault_driver.py FAULT RANKS STEP [zerompi.train flags]

RANKS is a comma-separated list of ranks, or "all". At 0-based step STEP, on those ranks only:

    raise       train_step raises RuntimeError                     (an exception on some ranks)
    memory      train_step raises NumPy's MemoryError, as an allocation the preflight did not
                foresee would (another process took the memory)
    kill        the process sends itself SIGKILL, mid-step          (a rank that dies)
    stop        the process sends itself SIGSTOP, mid-step          (a rank that hangs)
    stop-after  the process sends itself SIGSTOP once the step is done (a rank that hangs between
                steps: before the collectives that follow a step, e.g. the trace's gather)
    inf-input   the first input value of this rank's rows is +inf   (bad data on one rank)
    nan-grad:L  layer L's weight gradient gets a NaN right after its backward, before any
                reduction                                           (a bad kernel on one rank)
    signal:SIGS:TO  the signals SIGS (INT, TERM, USR1; INT,INT: two in a row) are sent to TO:
                self, or mpirun (which forwards each to every rank: what Ctrl-C in a
                terminal does)                                      (a signal during training)
    startup-signal:SIG:TO  while loading the data (STEP is not used), the chosen ranks send SIG
                to TO, and every rank waits there for good          (a start-up blocked on an input)
    parse-stall  while reading the command line and config file (STEP is not used), the chosen
                ranks wait for good, answering signals; the others go on into the first
                collective                                         (a config file on a slow disk)
    parse-stop:SIG:TO  the chosen ranks stop (SIGSTOP) while reading the command line; each other
                rank, a second after its own, sends SIG to TO (self or mpirun) while it waits in
                the first collective                               (a signal while a peer is away)
    nodemap-stop  the chosen ranks stop just before the node map, MPI's first collective
    disk-full   creating the offload file (--offload-optimizer file) finds no space: its
                posix_fallocate fails with ENOSPC (STEP is not used)  (a full disk at start)
    truncate-offload  before the step, the offload file is cut to 0 bytes through /proc/self/fd,
                as another process could                           (a file truncated mid-run)

The training itself is the real one (zerompi.train.loop.run.main, real MPI); the driver only wraps the
step function, so every detection and report under test is zerompi's own.
"""
import errno
import os
import signal
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

import zerompi.comm
import zerompi.train.loop.run

fault, ranks, fault_step = sys.argv[1], sys.argv[2], int(sys.argv[3])
rank = MPI.COMM_WORLD.Get_rank()
faulty = ranks == "all" or str(rank) in ranks.split(",")
real_train_step = zerompi.train.loop.run.train_step
real_load_data = zerompi.train.loop.run.load_data
real_parse_args = zerompi.train.loop.run.parse_args
real_node_of_rank = zerompi.comm.node_of_rank
steps_done = 0


def launcher_pid():
    """mpirun's process id: the parent of this rank's parent (hydra's proxy, on one node)."""
    with open(f"/proc/{os.getppid()}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def send_signals(names, to):
    target = os.getpid() if to == "self" else launcher_pid()
    for name in names.split(","):
        os.kill(target, getattr(signal, "SIG" + name))


def load_data_blocked_by_a_signal(cfg, *args):
    if not fault.startswith("startup-signal:"):
        return real_load_data(cfg, *args)
    if faulty:
        send_signals(*fault.split(":")[1:])
    while True:                                   # a read that never returns; a signal interrupts it
        time.sleep(0.05)


def parse_args_stalled_or_stopped(*args):
    if faulty and fault == "parse-stall":
        while True:                               # a read that never returns; a signal interrupts it
            time.sleep(0.05)
    if faulty and fault.startswith("parse-stop"):
        os.kill(os.getpid(), signal.SIGSTOP)
    parsed = real_parse_args(*args)
    if not faulty and fault.startswith("parse-stop:"):
        threading.Timer(1.0, send_signals, fault.split(":")[1:]).start()
    return parsed


def node_of_rank_stopped(mpi_comm):
    if faulty and fault == "nodemap-stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    return real_node_of_rank(mpi_comm)


def faulty_train_step(engine, micro_batches, *args):
    global steps_done
    step, steps_done = steps_done, steps_done + 1
    if not faulty or step != fault_step:
        return real_train_step(engine, micro_batches, *args)
    if fault == "raise":
        raise RuntimeError(f"injected fault at step {step}")
    if fault == "memory":
        np.empty(1 << 62, dtype=np.uint8)              # NumPy's own MemoryError: "Unable to allocate ..."
    if fault in ("kill", "stop"):
        os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    if fault == "stop-after":
        result = real_train_step(engine, micro_batches, *args)
        os.kill(os.getpid(), signal.SIGSTOP)
        return result
    if fault.startswith("signal:"):
        send_signals(*fault.split(":")[1:])
        return real_train_step(engine, micro_batches, *args)
    if fault == "truncate-offload":
        for fd in os.listdir("/proc/self/fd"):
            try:
                if "zerompi-offload" in os.readlink(f"/proc/self/fd/{fd}"):
                    os.truncate(f"/proc/self/fd/{fd}", 0)
            except OSError:                             # a descriptor closed meanwhile
                pass
    micro_batches = list(micro_batches)
    if fault == "inf-input":
        micro_batches[0][0][0, 0] = np.inf
    if fault.startswith("nan-grad:"):
        bad_layer = int(fault.split(":")[1])
        mlp = engine.mlp
        real_backward = mlp.backward_layer

        def backward_layer(layer, d_h, weight, bias, dweight, dbias, accumulate):
            d_in = real_backward(layer, d_h, weight, bias, dweight, dbias, accumulate)
            if layer.index == bad_layer:
                dweight[0, 0] = np.nan
            return d_in
        mlp.backward_layer = backward_layer
        try:
            return real_train_step(engine, micro_batches, *args)
        finally:
            del mlp.backward_layer                # back to the class's method
    return real_train_step(engine, micro_batches, *args)


def no_space(fd, offset, length):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


zerompi.train.loop.run.train_step = faulty_train_step
if fault == "disk-full" and faulty:
    os.posix_fallocate = no_space
zerompi.train.loop.run.load_data = load_data_blocked_by_a_signal
zerompi.train.loop.run.parse_args = parse_args_stalled_or_stopped
zerompi.comm.node_of_rank = node_of_rank_stopped
sys.exit(zerompi.train.loop.run.main(sys.argv[4:]))
