"""The MPI library (mpi4py.MPI), loaded at its first use, so that what needs no MPI runs where no
MPI library can be loaded: --help, --version, --dry-run, `python -m zerompi.plan` and
`python -m zerompi.memory`; and, before MPI starts, this process's rank as its launcher numbered
it (launcher_rank: who prints when MPI cannot tell).

    from .mpi import MPI          then MPI.COMM_WORLD, MPI.IN_PLACE, MPI.SUM, ... as mpi4py.MPI's

MPI itself starts later still, when the first Communicator is built (`init_mpi` below),
after zerompi/train/options/device_choice.py has chosen the GPU. A library that cannot be loaded (none
installed, a module not loaded on a cluster, MPI4PY_LIBMPI naming no library) raises
MpiUnavailable, whose message is one line. `abort_job` ends the whole job from any thread, and
removes the shared memory MPI leaves behind when it is aborted.
"""
import os
import atexit

try:
    import mpi4py                     # the package only (no library): MPI starts in init_mpi() below,
    mpi4py.rc.initialize = False      # not at the first `from mpi4py import MPI` anywhere
except ImportError:                   # ranks in one process (zerompi/inprocess/) need none
    pass

LAUNCHER_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


def first_number(environ, names):
    """The value of the first of the variables `names` that holds a number, else 0."""
    for name in names:
        value = environ.get(name, "")
        if value.isascii() and value.isdigit():
            return int(value)
    return 0


def launcher_rank(environ):
    """This process's rank as the launcher numbered it (0 when unknown)."""
    return first_number(environ, LAUNCHER_RANK_VARIABLES)


class MpiUnavailable(RuntimeError):
    """The MPI library cannot be loaded; str(e) says why, in one line."""


class _LoadedAtFirstUse:
    """Stands for mpi4py.MPI: an attribute looked up here loads the library (once), and is kept."""

    def __getattr__(self, name):
        try:
            from mpi4py import MPI
        except (ImportError, RuntimeError, OSError) as e:
            reason = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
            raise MpiUnavailable(f"the MPI library cannot be loaded ({reason})") from None
        value = getattr(MPI, name)
        setattr(self, name, value)    # the next lookup finds it here, without this method
        return value


MPI = _LoadedAtFirstUse()


def init_mpi():
    """Initialize MPI once (threads allowed to call it: MPI_THREAD_MULTIPLE, mpi4py's default),
    and finalize it at exit."""
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
        atexit.register(lambda: MPI.Is_finalized() or MPI.Finalize())


def abort_job(exit_code):
    """End every rank of the job with exit_code (MPI_Abort), from any thread; before MPI has
    started (or after it ended, or without an MPI library), this process alone. The shared memory
    segments MPI mapped into this process are removed first: MPI_Abort leaves them in /dev/shm
    (a job's own, as it maps them; never another job's), where they would pile up across requeues."""
    remove_mapped_segments()
    try:
        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.COMM_WORLD.Abort(exit_code)
    except MpiUnavailable:
        pass
    os._exit(exit_code)


SEGMENT_PREFIXES = ("mpich_", "ucx_")           # the shared memory MPICH (and UCX under it) creates


def remove_mapped_segments(maps="/proc/self/maps"):
    """Remove the names of the /dev/shm segments of MPI that this process maps (the mappings stay
    valid for the job's ranks until they end)."""
    try:
        with open(maps) as f:
            paths = {line.split(None, 5)[5].strip() for line in f if " /dev/shm/" in line}
    except (OSError, IndexError):
        return
    for path in paths:
        if os.path.basename(path).startswith(SEGMENT_PREFIXES) and os.path.dirname(path) == "/dev/shm":
            try:
                os.unlink(path)
            except OSError:                  # already gone (another rank of the node), or not ours to remove
                pass
