"""SIGINT (Ctrl-C), SIGTERM and SIGUSR1: what each does in each phase of a run.

    start-up and finish          any of them ends the run at once: the signalled rank prints one
    (outside the training loop)  line and every rank exits INTERRUPTED (a start-up blocked on an
                                 input, a slow finish: nothing is waited for); but SIGUSR1 after
                                 training, Slurm's warning before a time limit, is one warning
                                 line: the finish (held-out accuracy, the weights) goes on
    the training loop,           deferred: the handler only sets a flag; after each step one
    with --save-dir              all-reduce tells every rank whether any rank got a signal, so
                                 all of them finish the same step, write the checkpoint and exit
                                 PREEMPTED together (zerompi/train/loop/run.py, checkpoint). A second
                                 SIGINT (Ctrl-C again) ends the run at once: INTERRUPTED
    the training loop,           SIGINT, SIGTERM: end the run at once (INTERRUPTED): there is no
    without --save-dir           checkpoint to write. SIGUSR1, Slurm's warning before a time
                                 limit: one line from the signalled rank, and training goes on

Ending "at once" raises Interrupted in the main thread, whose handler in run.py's main prints the
one line and aborts the job (MPI_Abort), so that no rank waits for the one that left. Once a
signal has ended the run, further ones are ignored (launchers forward signals to every rank, some
more than once): the abort follows within seconds, and SIGKILL still ends a process at once. So
does every other end of the run (done, bad input, preempted): Python puts its own handlers back
to the default before MPI_Finalize runs, where a late SIGTERM would otherwise kill the rank and
turn a preemption's status 4 into 15.

Under mpirun (MPICH's hydra) Ctrl-C in a terminal reaches mpirun, which forwards one SIGINT to
every rank (the ranks run in sessions of their own) and, at a second Ctrl-C, kills them itself;
SIGTERM and SIGUSR1 sent to mpirun are forwarded the same way. Slurm signals every task itself.

A rank waiting in MPI: Python runs a signal's handler in the main thread between two bytecodes,
so while the main thread waits in a collective for a rank that is stopped or slow (MPI calls do
not return on a signal), the handler cannot run, and the signal would wait as long as that rank.
So the signals also reach a watcher thread (signal.set_wakeup_fd: the interpreter's C handler
writes each signal's number into a pipe the thread reads): a signal that ends the run at once in
the phase it arrived in, which the main thread has not acted on within ACT_WITHIN_SECONDS, ends
the run from there (`end_now`: one line, then MPI_Abort, run.py). A signal that only sets the flag
or warns waits for the main thread, as before: in the loop with --save-dir the step cannot end
while a peer is away anyway, and --collective-timeout ends such a job.
"""
import os
import signal
import sys
import threading
import time

import numpy as np

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
STARTING, TRAINING, FINISHING = "during start-up", "in the training loop", "after training"   # the phases
ACT_WITHIN_SECONDS = 1.0         # a signal that ends the run, left by the main thread this long: the watcher's


class Interrupted(BaseException):
    """A signal ended the run; str: what happened, for the one line. A BaseException, like
    KeyboardInterrupt, so that no `except Exception` on the way swallows it."""


class Signals:
    """The handler of the stop signals of one rank, and the flag the ranks agree on after each step."""

    def __init__(self, rank, end_now):
        """end_now(what): ends the run at once from the watcher thread, where the main thread waits
        in MPI (it never returns)."""
        self.rank = rank
        self.end_now = end_now
        self.phase = STARTING            # or TRAINING, FINISHING
        self.save_dir = False            # in the loop: a checkpoint can be written
        self.requested = False           # in the loop with --save-dir: a signal is waiting for the step's end
        self.flag = np.zeros(1)
        self._ended = False              # a signal ended the run, or the run has ended
        wake, self._wakeup = os.pipe()
        os.set_blocking(self._wakeup, False)
        signal.set_wakeup_fd(self._wakeup)
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)
        threading.Thread(target=self._watch, args=(wake,), name="zerompi-signals", daemon=True).start()

    def enter_loop(self, save_dir):
        """The training loop starts: with --save-dir a signal now waits for the step's end."""
        self.phase, self.save_dir = TRAINING, bool(save_dir)

    def leave_loop(self):
        self.phase, self.save_dir = FINISHING, False

    def agreed(self, comm):
        """Collective: True on every rank when any rank has been signalled."""
        self.flag[0] = 1.0 if self.requested else 0.0
        comm.allreduce_sum(self.flag, "control")
        return self.flag[0] > 0

    def stand_down(self):
        """The run is ending (its abort is on the way): from now on the stop signals are ignored."""
        self._ended = True
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)

    def _handle(self, signum, frame):
        """The handler, in the main thread."""
        if self._ended:
            return
        name = signal.Signals(signum).name
        what = ends_at_once(name, self.phase, self.save_dir)
        if what is None and self.phase == FINISHING:          # SIGUSR1 after training
            os.write(sys.stderr.fileno(), f"zerompi: warning: rank {self.rank}: SIGUSR1 after training: the run "
                                          f"is finishing; it goes on\n".encode())
        elif what is None and not self.save_dir:              # SIGUSR1 in the loop
            os.write(sys.stderr.fileno(), f"zerompi: warning: rank {self.rank}: SIGUSR1 but no --save-dir: "
                                          f"no checkpoint to write; training goes on\n".encode())
        elif what is None and self.requested and signum == signal.SIGINT:
            what = "a second SIGINT: ending the run at once, without a checkpoint"
        elif what is None:
            self.requested = True
        if what is not None:
            self.stand_down()
            raise Interrupted(what)

    def _watch(self, wake):
        """The watcher thread: a signal that ends the run at once in the phase it arrived in, and
        that the main thread has not acted on within ACT_WITHIN_SECONDS, ends it from here. (One
        that sets the flag or warns waits for the main thread: what it does depends on what the
        handler decided before, which only the handler knows.)"""
        while True:
            for signum in os.read(wake, 64):
                if signum not in STOP_SIGNALS:
                    continue
                what = ends_at_once(signal.Signals(signum).name, self.phase, self.save_dir)
                if what is None:
                    continue
                time.sleep(ACT_WITHIN_SECONDS)
                if not self._ended:           # the handler has not run: the main thread waits in MPI
                    self._ended = True
                    self.end_now(what)


def ends_at_once(name, phase, save_dir):
    """What a stop signal `name` that ends the run at once in this phase says, or None where it
    does not (the table in the module docstring)."""
    if phase == FINISHING and name == "SIGUSR1":
        return None
    if phase != TRAINING:
        return f"{name} {phase}: ending the run"
    if not save_dir and name != "SIGUSR1":
        return f"{name} and no --save-dir: ending the run without a checkpoint"
    return None
