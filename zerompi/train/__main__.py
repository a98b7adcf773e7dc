"""`python -m zerompi.train`: the training program (zerompi/train/loop/run.py).

--help and --version are answered first, so they work where MPI cannot start (a login node
without a working PMI); then --dry-run, which needs no MPI library (zerompi/train/commands/dry_run.py;
the library is loaded at its first use, zerompi/mpi.py). Under a launcher only its rank 0 prints
them. Where the MPI library cannot be loaded, a run is one line, exit 2 (zerompi/train/loop/run.py).
"""
import os
import sys

from .options.before_mpi import answer_without_mpi

answer_without_mpi(sys.argv[1:], os.environ)       # --help, --version: printed, exit 0
from .commands.dry_run import answer_dry_run                 # noqa: E402

answer_dry_run(sys.argv[1:], os.environ)           # --dry-run: the plan printed, exit 0 (docs/planning.md)
from .loop.run import main                                # noqa: E402

raise SystemExit(main())
