"""Where rank 0's output really goes: does `--progress auto` draw the live line?

A live line is control codes ("\\r", erase) redrawn ten times a second: right on a terminal a person
watches, garbage in a file. isatty() on the rank's stdout answers the question only where the
launcher hands the rank the real destination, so `auto` combines it with what the launcher says:

    --progress live      the live line (the user asked)
    --progress lines     never
    --progress auto      the live line only when one of these holds, outside a Slurm job:
      1. stdout is a terminal, and not Open MPI's (a plain run; Open MPI: see 3)
      2. under MPICH's or Intel MPI's mpirun (hydra: PMI_RANK set), whose ranks write to a pipe
         that the launcher copies to its own output, as it comes: stdout is that pipe (the
         rank's parent is hydra_pmi_proxy: no shell redirected it), mpirun's output a terminal,
         and mpirun neither writes files (-outfile-pattern) nor prefixes lines (-l, -prepend-*)
      3. under Open MPI (OMPI_COMM_WORLD_SIZE set) the launcher's own stdout is a terminal. Open
         MPI's mpirun gives every rank a pseudo-terminal even when mpirun's stdout is a file, so
         isatty() says yes for out.txt
    Inside a Slurm job the output is a job's log far more often than a terminal (sbatch writes
    slurm-*.out; an Open MPI mpirun in a batch script hands its ranks terminals): lines, unless
    this is `srun --pty` (SLURM_JOB_ID set and SLURM_PTY_PORT too).

The launcher's output (2, 3): rank 0 looks up its ancestors in /proc for the launcher (hydra:
mpirun, mpiexec, mpiexec.hydra, above its hydra_pmi_proxy; Open MPI 4: orterun; 5: prterun) and
reads where that process's fd 1 (fd 2 for --report json, whose progress goes to stderr) points: a
terminal (/dev/pts/*, /dev/tty*, /dev/console) lets the line be drawn, fitted to that terminal's
width (launcher_terminal); a file, a pipe, an ancestor that is a remote node's daemon (orted,
prted: mpirun runs on another host), no such ancestor, or no /proc: lines. When the destination
cannot be known, lines are the choice that is never wrong.
"""
import os
import stat

SLURM_JOB, SLURM_PTY = "SLURM_JOB_ID", "SLURM_PTY_PORT"
OPEN_MPI = "OMPI_COMM_WORLD_SIZE"
OPEN_MPI_LAUNCHERS = ("mpirun", "mpiexec", "orterun", "prterun")
OPEN_MPI_DAEMONS = ("orted", "prted")       # a rank on another node than mpirun's
HYDRA = "PMI_RANK"                          # MPICH's and Intel MPI's launcher (and srun's PMI)
HYDRA_LAUNCHERS = ("mpirun", "mpiexec", "mpiexec.hydra")
HYDRA_PROXY = "hydra_pmi_proxy"             # the rank's parent; it reads the rank's pipes
HYDRA_REWRITES = {"-outfile-pattern", "-errfile-pattern", "-prepend-rank", "-prepend-pattern", "-l"}
TERMINALS = ("/dev/pts/", "/dev/tty", "/dev/console")
MAX_ANCESTORS = 16


def live_progress(choice, stream, environ):
    """True if rank 0 should draw the live line on `stream` for --progress `choice`."""
    if choice != "auto":
        return choice == "live"
    if environ.get(SLURM_JOB) and not environ.get(SLURM_PTY):
        return False
    if environ.get(OPEN_MPI):
        return stream.isatty() and launcher_writes_to_terminal(os.getpid(), stream.fileno())
    return stream.isatty() or (HYDRA in environ and launcher_terminal(stream, environ) is not None)


def launcher_terminal(stream, environ):
    """The terminal that hydra's mpirun copies `stream` to, or None: for the live line's width.
    Only where `stream` is the pipe this rank's hydra_pmi_proxy reads (its parent: not a shell
    that redirects it) and mpirun copies it as it comes (no -outfile-pattern, no prefix of its
    own on each line, which the width would not count). None too where `stream` is itself a
    terminal (its own width counts)."""
    if HYDRA not in environ or stream.isatty() or command_name(parent_of(os.getpid()) or 0) != HYDRA_PROXY:
        return None
    try:
        if not stat.S_ISFIFO(os.fstat(stream.fileno()).st_mode):
            return None
    except (OSError, ValueError):
        return None
    target = _launchers_target(os.getpid(), stream.fileno(), HYDRA_LAUNCHERS, ())
    return target if target and not (set(_launcher_arguments()) & HYDRA_REWRITES) else None


def launcher_writes_to_terminal(pid, fd):
    """True if the nearest Open MPI launcher among pid's ancestors (same host) has a terminal as
    its file descriptor fd (1: stdout, 2: stderr, where the rank's own fd goes); False when it
    has not, or when that cannot be found out."""
    return _launchers_target(pid, fd, OPEN_MPI_LAUNCHERS, OPEN_MPI_DAEMONS) is not None


def _launchers_target(pid, fd, launchers, daemons):
    """The terminal the nearest of pid's ancestors named in `launchers` has as its fd, or None
    (not a terminal; an ancestor in `daemons` first; no launcher; no /proc)."""
    launcher = _launcher(pid, launchers, daemons)
    try:
        target = os.readlink(f"/proc/{launcher}/fd/{fd}") if launcher else ""
    except OSError:
        return None
    return target if target.startswith(TERMINALS) else None


def _launcher(pid, launchers, daemons):
    """The pid of the nearest of pid's ancestors named in `launchers`, or None."""
    for _ in range(MAX_ANCESTORS):
        pid = parent_of(pid)
        name = command_name(pid) if pid else None
        if name is None or name in daemons:
            return None
        if name in launchers:
            return pid
    return None


def _launcher_arguments():
    """The command-line arguments of this rank's hydra launcher ([] when not found)."""
    launcher = _launcher(os.getpid(), HYDRA_LAUNCHERS, ())
    try:
        with open(f"/proc/{launcher}/cmdline", "rb") as f:
            return [word.decode(errors="replace") for word in f.read().split(b"\0")] if launcher else []
    except OSError:
        return []


def parent_of(pid):
    """pid's parent process id from /proc/PID/stat, or None (no /proc, the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])   # "pid (comm) state ppid ...": comm may hold ")"


def command_name(pid):
    """The process's command name (/proc/PID/comm: its executable's file name, at most 15
    characters), or None."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None
