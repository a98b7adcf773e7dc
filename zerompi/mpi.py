"""The MPI library (mpi4py.MPI), loaded at its first use, so that what needs no MPI runs where no
MPI library can be loaded: --help, --version, --dry-run, `python -m zerompi.plan` and
`python -m zerompi.memory`; and, before MPI starts, this process's rank as its launcher numbered
it (launcher_rank: who prints when MPI cannot tell).

    from .mpi import MPI          then MPI.COMM_WORLD, MPI.IN_PLACE, MPI.SUM, ... as mpi4py.MPI's

MPI itself starts later still, when the first Communicator is built (zerompi/comm.py's init_mpi),
after zerompi/devices/choice.py has chosen the GPU. A library that cannot be loaded (none
installed, a module not loaded on a cluster, MPI4PY_LIBMPI naming no library) raises
MpiUnavailable, whose message is one line.
"""
import mpi4py

mpi4py.rc.initialize = False          # MPI starts in zerompi/comm.py's init_mpi()


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
