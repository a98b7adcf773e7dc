"""Can the MPI library read and write GPU memory itself ("CUDA-aware")?

If it can, zerompi hands device buffers straight to MPI; if not, every collective on device
memory goes through preallocated pinned host buffers (zerompi/comm.py):

    CUDA-aware:      GPU buffer --MPI--> GPU buffer
    not CUDA-aware:  GPU buffer --copy--> pinned host --MPI--> pinned host --copy--> GPU buffer

Handing device memory to an MPI that is not CUDA-aware crashes (or silently reads garbage), so
the answer must be right. Asked in this order; the first that answers decides:

    1. ZEROMPI_CUDA_AWARE=1 or 0   the user's override (a site that knows better)
    2. the MPI-4.1 info key `mpi_memory_alloc_kinds` of MPI_COMM_WORLD: "cuda" or "cuda:device"
       listed (MPICH >= 4.2 and Open MPI >= 6 report it; "cuda:host" or "cuda:managed" alone do
       not cover device memory)
       - absent, or present without "cuda": ask the next
    3. MPIX_Query_cuda_support() from the loaded MPI library (Open MPI and MPICH export it):
       1 or 0. mpi4py does not wrap it and loads libmpi privately (RTLD_LOCAL), so the library is
       found in /proc/self/maps and opened by path with ctypes.
    4. Open MPI's build flag: `ompi_info --parsable --all` reports mpi_built_with_cuda_support
    5. none answered: not CUDA-aware (the safe answer: staging always works)

Step 2's "no cuda" is not final: MPI-4.1 lists "mpi" and "system" always, and other kinds only
where they were requested at start (`mpiexec -memory-alloc-kinds ...`) and are supported; MPIX
(step 3) knows what the library was built and started with.
"""
import ctypes
import shutil
import subprocess

OVERRIDE = "ZEROMPI_CUDA_AWARE"


def cuda_aware(MPI, environ):
    """(True/False, how it was decided: one line for the start-up report)."""
    override = environ.get(OVERRIDE, "")
    if override in ("0", "1"):
        return override == "1", f"{OVERRIDE}={override}"
    kinds = alloc_kinds(MPI)
    if kinds is not None and any(kind in ("cuda", "cuda:device") for kind in kinds.split(",")):
        return True, f"mpi_memory_alloc_kinds={kinds}"
    answer = query_mpix(mpi_library_path())
    if answer is not None:
        return answer, f"MPIX_Query_cuda_support()={int(answer)}"
    built = open_mpi_built_with_cuda()
    if built is not None:
        return built, f"ompi_info: mpi_built_with_cuda_support={str(built).lower()}"
    if kinds is not None:
        return False, f"mpi_memory_alloc_kinds={kinds}"
    return False, "no answer from the MPI library: assumed not CUDA-aware"


def alloc_kinds(MPI):
    """The value of the MPI-4.1 info key on MPI_COMM_WORLD, or None where the library lacks it."""
    info = MPI.COMM_WORLD.Get_info()
    try:
        return info.Get("mpi_memory_alloc_kinds")
    finally:
        info.Free()


def mpi_library_path(maps="/proc/self/maps"):
    """The path of the libmpi this process loaded (Linux), or None."""
    try:
        with open(maps) as f:
            paths = {line.split()[-1] for line in f if "/libmpi" in line}    # libmpi*, libmpich*
    except OSError:
        return None
    # libmpi.so.12 (MPICH), libmpi.so.40 (Open MPI), libmpi_cray.so, libmpi.so (Intel), and
    # Debian's MPICH libmpich.so.12: not libmpifort, libmpicxx etc.
    candidates = sorted(p for p in paths if p.rsplit("/", 1)[-1].startswith(("libmpi.so", "libmpi_cray.so",
                                                                             "libmpich.so")))
    return candidates[0] if candidates else None


def query_mpix(library_path):
    """MPIX_Query_cuda_support() of the library at library_path: True/False, or None where the
    library or the function is missing."""
    if library_path is None:
        return None
    try:
        library = ctypes.CDLL(library_path)   # already loaded: this returns the same library
        query = library.MPIX_Query_cuda_support
    except (OSError, AttributeError):
        return None
    query.restype, query.argtypes = ctypes.c_int, []
    return bool(query())


def open_mpi_built_with_cuda(timeout=20):
    """Open MPI's build flag from ompi_info, or None where ompi_info is not there or says nothing."""
    ompi_info = shutil.which("ompi_info")
    if ompi_info is None:
        return None
    try:
        out = subprocess.run([ompi_info, "--parsable", "--all"], capture_output=True, text=True,
                             timeout=timeout).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        if "mpi_built_with_cuda_support:value:" in line:
            return line.rsplit(":", 1)[-1].strip() == "true"
    return None
