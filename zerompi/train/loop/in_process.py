"""`python -m zerompi.train --in-process-ranks N`: the training program on N ranks that are threads of
this one process, without MPI or mpirun (zerompi/inprocess/; docs/in-process.md).

Each thread runs what an MPI rank runs (run.py's rank_main) on an InProcessCommunicator: the same
checks, setup, steps, checkpoints and report; rank 0 prints. Refused with one line, exit 2: under
an MPI launcher with more than one process (each would run N ranks of its own), --device gpu,
--in-process-nodes that does not divide N (and, after the full parse, config_checks.py's: --comm
nccl). The ranks share one BLAS pool: each BLAS call runs on one thread, so
that N ranks use at most N cores. A collective waits --collective-timeout seconds for every rank
(0: for ever, for a debugger), then every rank stops with the call it waited in and the ranks that
did not come; a rank that raises stops the others at once. Either ends the run as run.py's main
ends an MPI rank's failure: one line, a documented status.
"""
import sys

from threadpoolctl import threadpool_limits

from ...inprocess import run_ranks
from ...mpi import first_number
from ...util.exit_codes import ExitCode
from ..options.launch import LAUNCHER_SIZE_VARIABLES


def in_process_error(early, environ):
    """One line if --in-process-ranks cannot run here, else None."""
    n, nodes = early.in_process_ranks, early.in_process_nodes
    if first_number(environ, LAUNCHER_SIZE_VARIABLES) > 1:
        return "--in-process-ranks runs N ranks in one process: start it without mpirun (or with mpirun -n 1)"
    if early.device == "gpu":
        return "--in-process-ranks runs on the CPU: drop --device gpu"
    if nodes < 1 or n % nodes:
        return f"--in-process-nodes {nodes} does not divide the {n} ranks: use a divisor of {n}"
    return None


def run_in_process(early, rank_program, environ, rank=0):
    """rank_program(comm) on --in-process-ranks threads; raises what run_ranks raises
    (SystemExit as it is, RankFailed naming the rank). rank: this process's launcher rank, which
    alone prints a refusal."""
    error = in_process_error(early, environ)
    if error:
        if rank == 0:
            print(f"zerompi: error: {error}", file=sys.stderr, flush=True)
        raise SystemExit(ExitCode.BAD_INPUT)
    with threadpool_limits(limits=1):
        run_ranks(rank_program, early.in_process_ranks, early.in_process_nodes, early.collective_timeout or None)
