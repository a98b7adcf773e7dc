"""`--version`: zerompi's version, and those of what it runs on, found without starting MPI.

zerompi's version is the installed distribution's (importlib.metadata, from pyproject.toml);
from a checkout that is not installed, zerompi.__version__ (tests/proofs/test_cli.py keeps the two equal).
The MPI library is the one mpi4py would load, asked for its version string through ctypes:
MPI_Get_library_version may be called before MPI_Init (MPI-3.1, 8.1.1), so nothing starts MPI
and nothing imports mpi4py.MPI (which would). mpi4py's own lookup is a private helper of mpi4py
4.x; where it is missing or fails, the line is left out.
"""
import ctypes
import sys

import numpy as np

import zerompi


def version_text():
    """The lines `--version` prints."""
    lines = [f"zerompi {zerompi_version()}",
             f"Python {sys.version.split()[0]}, NumPy {np.__version__}, mpi4py {mpi4py_version()}"]
    library = mpi_library()
    if library:
        lines.append(f"MPI library (as mpi4py would load it): {library}")
    return "\n".join(lines)


def mpi4py_version():
    """mpi4py's version, from its metadata: importing it is left to a run that needs MPI."""
    from importlib import metadata
    try:
        return metadata.version("mpi4py")
    except metadata.PackageNotFoundError:     # a source tree on the path: its module knows
        import mpi4py
        return mpi4py.__version__


def zerompi_version():
    from importlib import metadata             # here: its import would cost every rank's start-up
    try:
        return metadata.version("zerompi")
    except metadata.PackageNotFoundError:
        return zerompi.__version__


def mpi_library():
    """"<first line of MPI_Get_library_version> (<file>)" for the library mpi4py would load, or None."""
    try:
        from mpi4py import _mpiabi
        library = _mpiabi._dlopen_libmpi(None)
        text = ctypes.create_string_buffer(8192)          # MPI_MAX_LIBRARY_VERSION_STRING is smaller
        length = ctypes.c_int()
        if library.MPI_Get_library_version(text, ctypes.byref(length)) != 0:
            return None
    except Exception:                                     # no such helper, no library, no symbol
        return None
    first = " ".join(text.value.decode(errors="replace").splitlines()[0].split()) if text.value else "unknown"
    return f"{first} ({library._name})" if library._name else first
