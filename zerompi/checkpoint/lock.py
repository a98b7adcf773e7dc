"""One run per save directory: `save_dir/.lock` names the run that uses it.

    save_dir/.lock      one line, "<host> <pid>": the host name and process id of the run's rank 0

Rank 0 takes the lock at start, before the run writes or deletes anything in save_dir, and removes
it when its process ends (atexit: a normal end, an error exit, preemption; before an MPI_Abort, which
skips atexit, run.py calls release_locks). The file is created with
O_CREAT | O_EXCL, which fails when it exists, so of two runs starting together exactly one gets it.
A lock found in place is judged by its holder:

    a live process on this host         refused, naming the holder, unless it ends within
                                        GRACE_SECONDS (mpirun may return before an aborted rank
                                        has exited: a run requeued at once must not be refused)
    a process on this host that ended   stale (the run was killed): taken over, said in one line
    a process on another host           refused, naming the holder and how to remove the lock:
                                        whether it still runs cannot be checked from here

A stale lock is moved aside (rename, atomic) before it is removed, and what was moved is read
again: if another run took the lock over in between, the lock moved is that run's, and it is put
back. Under the lock, rank 0 removes the .partial-step_* folders a killed run left; nothing else
in save_dir is ever removed but by rotation (zerompi/checkpoint/save.py).
"""
import atexit
import os
import shutil
import socket
import time

from ..inputs import open_regular
from .files import LOCK, PARTIAL, CheckpointError, step_of


ATTEMPTS = 3
GRACE_SECONDS = 5.0          # how long a live holder on this host may take to end before a run is refused
MAX_PID = 1 << 22            # Linux's largest pid_max


def take_lock(save_dir):
    """Take save_dir's lock for this process until it ends; returns a one-line note when a stale
    lock was taken over, else None. Raises CheckpointError (one line) when another run holds it."""
    path = os.path.join(save_dir, LOCK)
    me = (socket.gethostname(), os.getpid())
    note = None
    for _ in range(ATTEMPTS):
        if _create(path, me):
            atexit.register(_release, path, me)
            _held.append((path, me))
            return note
        holder = _holder(path, save_dir)
        if holder is None:                              # removed meanwhile: try again
            continue
        _refuse_unless_stale(path, save_dir, holder)
        if _set_aside(path, holder, save_dir):
            note = f"{path}: took over the stale lock of {holder[0]} pid {holder[1]}, a process that has ended"
    raise CheckpointError(f"{path}: could not be taken in {ATTEMPTS} attempts: other runs are starting in {save_dir}")


def remove_stale_partials(save_dir):
    """Remove the .partial-step_* folders of saves that never completed (call under the lock)."""
    for name in os.listdir(save_dir):
        path = os.path.join(save_dir, name)
        if name.startswith(PARTIAL) and step_of(name[len(PARTIAL):]) and not os.path.islink(path) \
                and os.path.isdir(path):
            shutil.rmtree(path)


def _create(path, me):
    """Create the lock holding `me`; False if it exists."""
    try:
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)   # less the umask
    except FileExistsError:
        return False
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be created: {e.strerror or e}") from None
    with os.fdopen(handle, "w") as f:
        f.write(f"{me[0]} {me[1]}\n")
    return True


def _holder(path, save_dir):
    """(host, pid) the lock names; None when it no longer exists."""
    try:
        with open_regular(path, CheckpointError, "r") as f:
            text = f.read(512)
    except CheckpointError:
        if not os.path.lexists(path):
            return None
        raise
    except UnicodeDecodeError:
        text = "(not text)"
    parts = text.split()
    if len(parts) != 2 or not (parts[1].isascii() and parts[1].isdigit()) or not 0 < int(parts[1]) < MAX_PID:
        raise CheckpointError(f"{path}: not a lock zerompi wrote ({text.strip()[:60]!r}), or one being written "
                              f"this instant; if no run uses {save_dir}, remove {path}")
    return parts[0], int(parts[1])


def _refuse_unless_stale(path, save_dir, holder):
    host, pid = holder
    if host != socket.gethostname():
        raise CheckpointError(f"{path}: {save_dir} is locked by a run on host {host} (pid {pid}), which cannot "
                              f"be checked from here; if no run uses {save_dir} any more, remove {path}")
    deadline = time.monotonic() + GRACE_SECONDS      # a holder just ending (mpirun returned, its rank not yet)
    while pid != os.getpid() and _running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid != os.getpid() and _running(pid):
        raise CheckpointError(f"{path}: {save_dir} is in use by another run (held by {host}, pid {pid}); wait "
                              f"for it to end or use another --save-dir")


def _running(pid):
    """Whether process pid exists and has not ended (a zombie, ended but not yet reaped, has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:              # another user's process
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):        # no /proc: kill(pid, 0) is all there is
        return True


def _set_aside(path, holder, save_dir):
    """Remove the stale lock; False when another run moved it first."""
    aside = f"{path}.stale-{os.getpid()}"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    try:
        moved = _holder(aside, save_dir)
    except CheckpointError:                         # a lock being written this instant: another run's
        moved = None
    if moved != holder:                             # a run took it over in between: its lock, put back
        try:
            os.link(aside, path)
        except FileExistsError:
            pass
        os.unlink(aside)
        return False
    os.unlink(aside)
    return True


_held = []                   # (path, (host, pid)) of the locks this process took


def release_locks():
    """Remove the locks this process holds now (before an abort, which skips atexit)."""
    while _held:
        _release(*_held.pop())


def _release(path, me):
    """At exit: remove the lock if it is still this process's."""
    if os.getpid() != me[1]:
        return
    try:
        with open_regular(path, CheckpointError, "r") as f:
            if f.read(512).split() == [me[0], str(me[1])]:
                os.unlink(path)
    except (OSError, CheckpointError, UnicodeDecodeError):
        pass
