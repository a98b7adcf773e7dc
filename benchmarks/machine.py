"""What every benchmark prints beside its figures: the CPU, the BLAS kernel and the versions of
what ran (a peer not installed says so), so that a figure is read with the machine it came from."""
import platform
from importlib import metadata

from threadpoolctl import threadpool_info

from zerompi.train.options.agreement import cpu_model

PACKAGES = ("numpy", "mpi4py", "numba", "torch", "deepspeed")


def blas_kernels():
    """'openblas 0.3.31 SkylakeX' for each BLAS loaded in this process."""
    return ", ".join(f"{p['internal_api']} {p['version']} {p.get('architecture')}" for p in threadpool_info()
                     if p["user_api"] == "blas") or "none found"


def versions():
    """{name: version} of Python, the MPI library and PACKAGES ('not installed' where absent)."""
    from mpi4py import MPI
    found = {"python": platform.python_version(), "MPI": " ".join(MPI.Get_library_version().splitlines()[0].split())}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def machine_line():
    """One line: the CPU model and the BLAS kernel."""
    return f"{cpu_model()} | BLAS: {blas_kernels()}"
