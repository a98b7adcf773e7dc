"""One run per save directory: `save_dir/.lock` names the run that uses it.

    save_dir/.lock   one line naming the process of the run's rank 0:
                     "<host> <pid> started=<boot id>:<start time> [slurm=<job id>:<restart count>]"
                     started: when that process started (the kernel's boot id and the process's
                     start time in clock ticks since boot, /proc/<pid>/stat), which tells it apart
                     from a later process given the same pid; slurm: under Slurm, the job and how
                     many times it was requeued (SLURM_JOB_ID, SLURM_RESTART_COUNT)

A lock of the older format, "<host> <pid>", is read too, and judged by host and pid alone.

Rank 0 takes the lock at start, before the run writes or deletes anything in save_dir, and removes
it when its process ends (atexit: a normal end, an error exit, preemption; before an MPI_Abort, which
skips atexit, run.py calls release_locks). The file is created with O_CREAT | O_EXCL, which fails
when it exists, so of two runs starting together exactly one gets it; a lock whose line cannot be
written (a full disk) is removed again before the one-line error. A lock found in place is judged:

    on this host, by a live process that     refused, naming the holder, unless it ends within
      started when the lock says             GRACE_SECONDS (mpirun may return before an aborted
                                             rank has exited: a run requeued at once must not
                                             be refused)
    on this host, by a process that ended,   stale (the run was killed; its pid was given to
      or whose pid is now another process's  another process, after a reboot or in a container):
                                             taken over, said in one line
    on another host, by this Slurm job       stale: the job was requeued after its node failed
      before its latest restart              (SLURM_JOB_ID equal, SLURM_RESTART_COUNT higher
                                             now): taken over, said in one line
    on another host, any other               refused, naming the holder and how to remove the
                                             lock: whether it still runs cannot be checked here
    empty, for EMPTY_STALE_SECONDS           stale: a run ended between creating and writing it
      (by its age, or by waiting that long)
    anything else                            refused: not a lock zerompi wrote

A stale lock is moved aside (rename, atomic) before it is removed, and the file moved is compared
with the one judged (device, inode and modification time: an empty lock written meanwhile is not
the one judged): if another run took the lock over in between, the lock moved is that run's, and
it is put back. Under the lock, rank 0 removes the .partial-step_* folders
a killed run left; nothing else in save_dir is ever removed but by rotation (zerompi/checkpoint/save.py).
"""
import atexit
import errno
import os
import socket
import time
from dataclasses import dataclass

from ...util.inputs import open_regular
from ...util.atomic import process_running
from ...checkpoint.files import LOCK, PARTIAL, CheckpointError, remove_partial, step_of


ATTEMPTS = 3
GRACE_SECONDS = 5.0          # how long a live holder on this host may take to end before a run is refused
EMPTY_STALE_SECONDS = 5.0    # an empty lock this old is stale: its line would have been written at once
MAX_PID = 1 << 22            # Linux's largest pid_max


@dataclass(frozen=True)
class Holder:
    """The process a lock names (the fields of its line)."""
    host: str
    pid: int
    started: str | None = None         # "<boot id>:<start ticks>"; None in the old format or without /proc
    slurm_job: str | None = None       # SLURM_JOB_ID of the run, None outside Slurm
    slurm_restart: int = 0             # SLURM_RESTART_COUNT of the run

    def line(self):
        fields = [self.host, str(self.pid)] + ([f"started={self.started}"] if self.started else []) + \
                 ([f"slurm={self.slurm_job}:{self.slurm_restart}"] if self.slurm_job else [])
        return " ".join(fields) + "\n"

    def describe(self):
        slurm = f", Slurm job {self.slurm_job} restart {self.slurm_restart}" if self.slurm_job else ""
        return f"{self.host} pid {self.pid}{slurm}"

    @staticmethod
    def parse(text):
        """The Holder a lock's text names, or None when it is not a line zerompi wrote."""
        parts = text.split()
        if len(parts) < 2 or not _number(parts[1]) or not 0 < int(parts[1]) < MAX_PID:
            return None
        keys = dict(part.split("=", 1) for part in parts[2:] if "=" in part)
        job, _, restart = keys.get("slurm", "").partition(":")
        if len(parts) - 2 != len(keys) or (job and not (_number(job) and _number(restart))):
            return None
        return Holder(parts[0], int(parts[1]), keys.get("started"), job or None, int(restart) if job else 0)


def _number(text):
    return text.isascii() and text.isdigit()


def process_start(pid):
    """"<boot id>:<start ticks>" of process pid (the kernel's, /proc), or None where unknown."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        with open(f"/proc/{pid}/stat") as f:
            return f"{boot}:{f.read().rsplit(')', 1)[1].split()[19]}"     # field 22: starttime
    except (OSError, IndexError):
        return None


def this_process(environ=os.environ):
    """The Holder this process writes into a lock it takes."""
    job = environ.get("SLURM_JOB_ID", "")
    restart = environ.get("SLURM_RESTART_COUNT", "0")
    slurm = (job, int(restart) if _number(restart) else 0) if _number(job) else (None, 0)
    return Holder(socket.gethostname(), os.getpid(), process_start(os.getpid()), *slurm)


def take_lock(save_dir, name=LOCK):
    """Take save_dir's lock (the file `name` in it) for this process until it ends; returns a
    one-line note when a stale lock was taken over, else None. Raises CheckpointError (one line)
    when another run holds it. --offload-dir's locks are taken the same way (offload_folder.py)."""
    path = os.path.join(save_dir, name)
    me = this_process()
    note = None
    for _ in range(ATTEMPTS):
        if _create(path, me):
            atexit.register(_release, path, me)
            _held.append((path, me))
            return note
        found = _found(path, save_dir)
        if found is None:                               # removed meanwhile: try again
            continue
        holder, identity = found
        why = _why_stale(path, save_dir, holder, me)    # raises when it is not stale
        if _set_aside(path, identity):
            note = f"{path}: took over the stale lock of {why}"
    raise CheckpointError(f"{path}: could not be taken in {ATTEMPTS} attempts: other runs are starting in {save_dir}")


def remove_stale_partials(save_dir):
    """Remove the .partial-step_* entries of saves that never completed (call under the lock): in
    a folder, what a save writes, then the folder; a file or a symbolic link itself (never what the
    link points to). A save would otherwise fail on its name after all the training, so a folder
    that holds anything else is refused (CheckpointError), and left as it is."""
    for name in os.listdir(save_dir):
        path = os.path.join(save_dir, name)
        if not (name.startswith(PARTIAL) and step_of(name[len(PARTIAL):])):
            continue
        if not (os.path.isdir(path) and not os.path.islink(path)):
            os.unlink(path)
            continue
        left = remove_partial(path)
        if left:
            raise CheckpointError(f"{path} holds what zerompi did not write ({', '.join(left[:3])}"
                                  f"{', ...' if len(left) > 3 else ''}): a save of that step would need the "
                                  f"name; move it away")


def _create(path, me):
    """Create the lock holding `me`'s line; False if it exists. A line that cannot be written
    (ENOSPC, EDQUOT, EIO) leaves no lock behind. Then the path must still name the file written: a
    run that found it empty for EMPTY_STALE_SECONDS (this process stalled between creating and
    writing it) may have taken it over meanwhile."""
    try:
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)   # less the umask
    except FileExistsError:
        return False
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be created: {e.strerror or e}") from None
    written = os.fstat(handle)
    try:
        line = me.line().encode()
        if os.write(handle, line) != len(line):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError as e:                                 # a full disk, a quota
        _unlink_if(path, written)
        raise CheckpointError(f"{path}: cannot be written: {e.strerror or e}") from None
    finally:
        os.close(handle)
    try:
        now = os.stat(path)
    except FileNotFoundError:
        now = None
    if now is None or (now.st_dev, now.st_ino) != (written.st_dev, written.st_ino):
        raise CheckpointError(f"{path}: taken over by another run while this one was writing it; if no run "
                              f"uses {os.path.dirname(path)}, start again")
    return True


def _unlink_if(path, status):
    """Remove path if it is still the file of `status` (never another run's lock)."""
    try:
        now = os.stat(path)
        if (now.st_dev, now.st_ino) == (status.st_dev, status.st_ino):
            os.unlink(path)
    except FileNotFoundError:
        pass


def _found(path, save_dir):
    """(Holder, or None for an empty lock; the file's (device, inode)) of the lock in place; None
    when it no longer exists. Raises CheckpointError for a lock zerompi did not write."""
    if os.path.islink(path):                            # zerompi creates a file; whose is a link?
        raise CheckpointError(f"{path}: a symbolic link, not a lock zerompi wrote; if no run uses {save_dir}, "
                              f"remove {path}")
    try:
        with open_regular(path, CheckpointError, "r") as f:
            identity = _identity(os.fstat(f.fileno()))
            text = f.read(512)
    except CheckpointError:
        if not os.path.lexists(path):
            return None
        raise
    except UnicodeDecodeError:
        text = "(not text)"
    if not text.strip():
        return None, identity
    holder = Holder.parse(text)
    if holder is None:
        raise CheckpointError(f"{path}: not a lock zerompi wrote ({text.strip()[:60]!r}); if no run uses "
                              f"{save_dir}, remove {path}")
    return holder, identity


def _identity(status):
    return status.st_dev, status.st_ino, status.st_mtime


def _why_stale(path, save_dir, holder, me):
    """Why the lock that names holder (None: an empty lock) is stale, as the note's end; raises
    CheckpointError when it is not."""
    if holder is None:
        return _empty_is_stale(path, save_dir)
    if holder.host != me.host:
        if holder.slurm_job is not None and holder.slurm_job == me.slurm_job and \
                me.slurm_restart > holder.slurm_restart:
            return (f"{holder.describe()}: written by this Slurm job before its restart {me.slurm_restart} "
                    f"(its node failed or was taken away)")
        raise CheckpointError(f"{path}: {save_dir} is locked by a run on host {holder.host} (pid {holder.pid}"
                              f"{', Slurm job ' + holder.slurm_job if holder.slurm_job else ''}), which cannot "
                              f"be checked from here; if no run uses {save_dir} any more, remove {path}")
    deadline = time.monotonic() + GRACE_SECONDS      # a holder just ending (mpirun returned, its rank not yet)
    while _is_holder(holder, me) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _is_holder(holder, me):
        raise CheckpointError(f"{path}: {save_dir} is in use by another run (held by {holder.host}, pid "
                              f"{holder.pid}); wait for it to end or use another folder")
    if holder.pid != me.pid and process_running(holder.pid):
        return f"{holder.describe()}: that pid is now another process's, started after the lock was written"
    return f"{holder.describe()}, a process that has ended"


def _empty_is_stale(path, save_dir):
    """An empty lock is stale once EMPTY_STALE_SECONDS old by its time stamp, or once it stayed
    empty that long while this process waited (a clock of another machine may say otherwise)."""
    try:
        age = time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        return "an empty lock, removed meanwhile"
    if age < EMPTY_STALE_SECONDS:
        time.sleep(EMPTY_STALE_SECONDS)
        found = _found(path, save_dir)                  # written meanwhile: that run's lock
        if found is not None and found[0] is not None:
            return _why_stale(path, save_dir, found[0], this_process())
    return f"an empty lock (no run wrote its line in {EMPTY_STALE_SECONDS:g} s: it ended while creating it)"


def _is_holder(holder, me):
    """Whether the process that wrote the lock runs (not this process: a lock of its own pid is
    an earlier process's); with a start time recorded, that pid's process must have started then."""
    if holder.pid == me.pid or not process_running(holder.pid):
        return False
    return holder.started is None or process_start(holder.pid) in (None, holder.started)


def _set_aside(path, identity):
    """Remove the stale lock, the file judged (identity); False when it is no longer in place."""
    aside = f"{path}.stale-{os.getpid()}"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    if _identity(os.lstat(aside)) != identity:      # a run took it over in between: its lock, put back
        try:
            os.link(aside, path)
        except FileExistsError:
            pass
        os.unlink(aside)
        return False
    os.unlink(aside)
    return True


_held = []                   # (path, Holder) of the locks this process took


def release_locks():
    """Remove the locks this process holds now (before an abort, which skips atexit)."""
    while _held:
        _release(*_held.pop())


def _release(path, me):
    """At exit: remove the lock if it is still this process's."""
    if os.getpid() != me.pid:
        return
    try:
        with open_regular(path, CheckpointError, "r") as f:
            if f.read(512) == me.line():
                os.unlink(path)
    except (OSError, CheckpointError, UnicodeDecodeError):
        pass
