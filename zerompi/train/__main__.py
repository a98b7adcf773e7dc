"""`python -m zerompi.train`: the training program (zerompi/train/run.py).

--help and --version are answered first, before anything imports mpi4py.MPI (zerompi/comm.py),
so they work where MPI cannot start (a login node without a working PMI); then --dry-run, which
loads the MPI library but never starts it (zerompi/train/planning.py). Under a launcher only its
rank 0 prints them.
"""
import os
import sys

from .config import answer_without_mpi

answer_without_mpi(sys.argv[1:], os.environ)       # --help, --version: printed, exit 0
from .planning import answer_dry_run                 # noqa: E402 (loads the MPI library, never starts it)

answer_dry_run(sys.argv[1:], os.environ)           # --dry-run: the plan printed, exit 0 (docs/planning.md)
from .run import main                                # noqa: E402 (imports mpi4py.MPI)

raise SystemExit(main())
