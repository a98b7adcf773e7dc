"""SIGINT (Ctrl-C), SIGTERM and SIGUSR1: what each does in each phase of a run.

    start-up and finish          any of them ends the run at once: the signalled rank prints one
    (outside the training loop)  line and every rank exits INTERRUPTED (a start-up blocked on an
                                 input, a slow finish: nothing is waited for); but SIGUSR1 after
                                 training, Slurm's warning before a time limit, is one warning
                                 line: the finish (held-out accuracy, the weights) goes on
    the training loop,           deferred: the handler only sets a flag; after each step one
    with --save-dir              all-reduce tells every rank whether any rank got a signal, so
                                 all of them finish the same step, write the checkpoint and exit
                                 PREEMPTED together (zerompi/train/run.py, checkpoint). A second
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
writes each signal's number into a pipe the thread reads): a signal the main thread has not
handled within ACT_WITHIN_SECONDS is decided by the watcher, in the same way; a run it ends, it
ends from there (`end_now`: the lowest signalled rank's line, then MPI_Abort, run.py). Each
signal is decided once: the handler skips a signal the watcher has decided.
"""
import os
import signal
import sys
import threading
import time

import numpy as np

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
ACT_WITHIN_SECONDS = 1.0         # a signal the main thread has not handled by then, the watcher decides


class Interrupted(BaseException):
    """A signal ended the run; str: what happened, for the one line. A BaseException, like
    KeyboardInterrupt, so that no `except Exception` on the way swallows it."""


class Signals:
    """The handler of the stop signals of one rank, and the flag the ranks agree on after each step."""

    def __init__(self, rank, end_now):
        """end_now(what): ends the run at once from the watcher thread, where the main thread cannot
        (it never returns)."""
        self.rank = rank
        self.end_now = end_now
        self.phase = "during start-up"   # or "in the training loop", "after training"
        self.save_dir = False            # in the loop: a checkpoint can be written
        self.requested = False           # in the loop with --save-dir: a signal is waiting for the step's end
        self.flag = np.zeros(1)
        self._deciding = threading.RLock()
        self._arrived = 0                # stop signals the watcher has seen arrive
        self._handled = 0                # of those, decided by the handler in the main thread
        self._by_watcher = dict.fromkeys(STOP_SIGNALS, 0)   # decided by the watcher, not yet by the handler
        self._ended = False
        wake, self._wakeup = os.pipe()
        os.set_blocking(self._wakeup, False)
        signal.set_wakeup_fd(self._wakeup)
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)
        threading.Thread(target=self._watch, args=(wake,), name="zerompi-signals", daemon=True).start()

    def enter_loop(self, save_dir):
        """The training loop starts: with --save-dir a signal now waits for the step's end."""
        self.phase, self.save_dir = "in the training loop", bool(save_dir)

    def leave_loop(self):
        self.phase, self.save_dir = "after training", False

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
        with self._deciding:
            if self._by_watcher[signum]:        # the watcher decided it while this thread waited
                self._by_watcher[signum] = 0
                return
            self._handled += 1
            what = self._decide(signum)
        if what is not None:
            self.stand_down()
            raise Interrupted(what)

    def _watch(self, wake):
        """The watcher thread: each stop signal the main thread leaves undecided for ACT_WITHIN_SECONDS."""
        while True:
            for signum in os.read(wake, 64):
                if signum not in STOP_SIGNALS:
                    continue
                with self._deciding:
                    self._arrived += 1
                    arrival = self._arrived
                time.sleep(ACT_WITHIN_SECONDS)
                with self._deciding:
                    if self._handled + sum(self._by_watcher.values()) >= arrival or self._ended:
                        continue
                    self._by_watcher[signum] += 1
                    what = self._decide(signal.Signals(signum))
                if what is not None:
                    self._ended = True
                    self.end_now(what)

    def _decide(self, signum):
        """What the signal does now: None (a flag set, or a warning printed), or what ends the run at once."""
        if self._ended:
            return None
        name = signal.Signals(signum).name
        if self.phase == "after training" and signum == signal.SIGUSR1:
            os.write(sys.stderr.fileno(), f"zerompi: warning: rank {self.rank}: SIGUSR1 after training: the run "
                                          f"is finishing; it goes on\n".encode())
        elif self.phase != "in the training loop":
            return f"{name} {self.phase}: ending the run"
        elif not self.save_dir and signum == signal.SIGUSR1:
            os.write(sys.stderr.fileno(), f"zerompi: warning: rank {self.rank}: SIGUSR1 but no --save-dir: "
                                          f"no checkpoint to write; training goes on\n".encode())
        elif not self.save_dir:
            return f"{name} and no --save-dir: ending the run without a checkpoint"
        elif self.requested and signum == signal.SIGINT:
            return "a second SIGINT: ending the run at once, without a checkpoint"
        else:
            self.requested = True
        return None
