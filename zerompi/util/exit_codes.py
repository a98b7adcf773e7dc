"""The exit statuses of `mpirun -n N python -m zerompi.train`: one enumeration, used everywhere.

Every rank exits with the same status (the verdicts are collective: check_all, zerompi/control.py),
so a job script can branch on mpirun's status:

    OK                   0  the run finished: weights, report and checkpoint written as asked
    FAILED               1  an unexpected failure (a bug, an MPI error): a traceback, one line
                            naming the rank, and MPI_Abort so that no rank is left waiting
    BAD_INPUT            2  bad flags, config file, data, environment or output path: one line
                            `zerompi: error: ...` on stderr, nothing written
    DIVERGED             3  a non-finite loss or gradient (float32/float64/bf16), non-finite
                            parameters (any dtype), or the fp16 loss scale fell below
                            --min-loss-scale: the last good weights are saved where --save-weights
                            is set (none when the parameters are not finite)
    PREEMPTED            4  SIGTERM/SIGUSR1/SIGINT during training with --save-dir: every rank
                            finished the step and the checkpoint is in --save-dir; run again with
                            --resume (zerompi/train/loop/signals.py)
    COLLECTIVE_MISMATCH  5  --check-collectives: the ranks disagreed on a collective
                            (zerompi/observe/collective_check.py)
    COLLECTIVE_TIMEOUT   6  a collective waited past --collective-timeout: the watchdog ended
                            the job (zerompi/observe/watchdog.py)
    OUT_OF_MEMORY        7  memory ran out after the preflight had found the plan fits (other
                            processes took memory, fragmentation): one line naming the rank,
                            no traceback; the run's outputs are as a killed run leaves them
                            (checkpoints whole: each is written to a temporary name first)
    OFFLOAD_FAILED       8  an offload file (--offload-optimizer file) could not be created (a full
                            disk), read or written (an I/O error, a file cut short by another
                            process): one line naming the rank and the file; the last checkpoint
                            is whole, the scratch files gone (zerompi/offload/stores.py)
    MEASUREMENT_VOID     9  `zerompi.plan calibrate` only: other processes took more than
                            --others-limit of the machine's CPU while it measured: one line,
                            no calibration file written (zerompi/util/other_processes.py)
    INTERRUPTED        130  a signal ended the run at once, without a checkpoint: SIGINT, SIGTERM
                            or SIGUSR1 outside the training loop, SIGINT or SIGTERM in it without
                            --save-dir, or a second SIGINT (zerompi/train/loop/signals.py); 130 is the
                            shell's status of a program ended by Ctrl-C

An IntEnum is an int: `raise SystemExit(ExitCode.DIVERGED)` exits with status 3, and
`MPI_Abort(ExitCode.FAILED)` with 1.
"""
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1
    BAD_INPUT = 2
    DIVERGED = 3
    PREEMPTED = 4
    COLLECTIVE_MISMATCH = 5
    COLLECTIVE_TIMEOUT = 6
    OUT_OF_MEMORY = 7
    OFFLOAD_FAILED = 8
    MEASUREMENT_VOID = 9
    INTERRUPTED = 130


# one line each, for --help (zerompi/train/options/config.py)
EXIT_MEANINGS = {
    ExitCode.OK: "the run finished",
    ExitCode.FAILED: "an unexpected failure (a bug, an MPI error): traceback",
    ExitCode.BAD_INPUT: "bad flags, config, data, environment or path: one line",
    ExitCode.DIVERGED: "loss, gradients or parameters not finite, or fp16 scale gone",
    ExitCode.PREEMPTED: "signalled with --save-dir: checkpoint written; --resume",
    ExitCode.COLLECTIVE_MISMATCH: "--check-collectives: the ranks disagreed",
    ExitCode.COLLECTIVE_TIMEOUT: "a collective waited past --collective-timeout",
    ExitCode.OUT_OF_MEMORY: "memory ran out after the preflight: one line",
    ExitCode.OFFLOAD_FAILED: "an offload file not created, read or written: one line",
    ExitCode.MEASUREMENT_VOID: "zerompi.plan calibrate: others busy, no file written",
    ExitCode.INTERRUPTED: "a signal ended the run at once, no checkpoint",
}
