#!/usr/bin/env python3
"""zerompi.train with one rank SIGKILLed in the middle of a checkpoint save: a drop-in for `python`.

    ZEROMPI_KILL_DURING_SAVE=RANK:STEP mpirun -n N python tests/support/kill_during_save.py -m zerompi.train [flags]
    ZEROMPI_PYTHON=tests/support/kill_during_save.py      (slurm/common.sh runs "$ZEROMPI_PYTHON" -m zerompi.train)

On rank RANK, right after that rank has written its first shard file of step STEP's checkpoint,
the process sends itself SIGKILL: the other ranks wait in the save's next agreement, the manifest
is never written. The training is the real one (zerompi.train.loop.run.main, real MPI); the driver only
wraps zerompi.checkpoint.save.write_shard_file. Used by tests/proofs/test_checkpoint_cli.py and tests/proofs/test_slurm.py.
`-c CODE` runs as python runs it (slurm/common.sh checks with it that zerompi imports).
"""
import os
import signal
import sys

if sys.argv[1:2] == ["-c"]:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])

from mpi4py import MPI  # noqa: E402

import zerompi.checkpoint.save  # noqa: E402
import zerompi.train.loop.run  # noqa: E402
from zerompi.checkpoint.files import step_folder_name  # noqa: E402

rank, step = map(int, os.environ["ZEROMPI_KILL_DURING_SAVE"].split(":"))
args = sys.argv[1:]
if args[:2] == ["-m", "zerompi.train"]:
    args = args[2:]
real_write_shard_file = zerompi.checkpoint.save.write_shard_file


def write_shard_file_then_die(path, dtype, segments):
    result = real_write_shard_file(path, dtype, segments)
    saving = os.path.basename(os.path.dirname(path))
    if MPI.COMM_WORLD.Get_rank() == rank and saving == ".partial-" + step_folder_name(step):
        os.kill(os.getpid(), signal.SIGKILL)
    return result


zerompi.checkpoint.save.write_shard_file = write_shard_file_then_die
sys.exit(zerompi.train.loop.run.main(args))
