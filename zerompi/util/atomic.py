"""Files that are complete or absent: write under a temporary name, fsync, rename into place.

    with atomic_file("out.npz") as f:      # f is a new "<folder>/.out.npz.tmp-<host>-<pid>-XXXXXXXX"
        ... write ...
    # normal exit: flush, fsync the file, rename over out.npz, fsync the folder
    # an exception: the temporary file is removed and out.npz is untouched

A process killed while it writes (SIGKILL, a node that fails) leaves its temporary file: the next
writer of the same output removes those that processes of this host left and that have ended
(never a live one's; one of another host cannot be checked from here and stays).

POSIX rename within one folder is atomic, so a reader (or a crash at any moment) sees the old file
or the complete new one, never a half-written one. Every file zerompi writes whole goes through
here (weights, exports, manifests, `latest`, the trace); shard files are written inside a
`.partial-` folder that is renamed as a whole (zerompi/checkpoint/save.py), the lock is created
with O_EXCL (zerompi/train/loop/lock.py), and --metrics is appended to line by line (zerompi/train/outputs/metrics.py).
An existing path that is not a regular file (a FIFO, a device such as /dev/null, a folder) is
refused before anything is written: the rename would replace the node itself. A path that is a
symbolic link to a file is written through, as open() writes: the file it names is replaced (the
temporary beside it), and the link stays.

File modes: every file zerompi creates gets the mode a plain open() would give it, 0o666 narrowed
by the umask (and by a default ACL on the folder), so that colleagues sharing a project folder
read the manifests as they read the shards. tempfile.mkstemp would create 0600 whatever the umask,
so the temporary file is created here with os.open(O_CREAT | O_EXCL, 0o666): the kernel applies
the umask at creation, and zerompi never reads it (reading it means setting it, os.umask, which
would race with the threads that MPI and --overlap start).
"""
import errno
import os
import secrets
import socket
import stat
from contextlib import contextmanager

ATTEMPTS = 100               # temporary names tried before giving up (each is 32 random bits)


def fsync_folder(folder):
    """Make a rename inside `folder` durable."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def create_temporary(path):
    """(handle open for writing, its path) of a new file "<folder>/.<name>.tmp-<host>-<pid>-XXXXXXXX"
    beside path: O_EXCL, so never an existing file or a planted link; mode 0o666 less the umask, as
    open() gives. The temporaries of path that ended processes of this host left are removed first."""
    folder, name = os.path.split(os.path.abspath(path))
    prefix = f".{name}.tmp-{socket.gethostname()}-"
    remove_ended_temporaries(folder, prefix)
    for _ in range(ATTEMPTS):
        tmp = os.path.join(folder, f"{prefix}{os.getpid()}-{secrets.token_hex(4)}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name in {ATTEMPTS} attempts", path)


def remove_ended_temporaries(folder, prefix):
    """Remove the regular files "<prefix><pid>-XXXXXXXX" in folder whose process has ended."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        pid, _, tag = name[len(prefix):].partition("-")
        if not (name.startswith(prefix) and pid.isascii() and pid.isdigit() and len(tag) == 8) or \
                process_running(int(pid)):
            continue
        path = os.path.join(folder, name)
        try:
            if stat.S_ISREG(os.lstat(path).st_mode):
                os.unlink(path)
        except OSError:                    # removed meanwhile, or not ours to remove
            pass


def process_running(pid):
    """Whether process pid of this host exists and has not ended (a zombie, ended but not yet
    reaped, has)."""
    if not 0 < pid < 1 << 22:            # Linux's largest pid_max
        return False
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


def written_through(path):
    """The file a write to `path` replaces: the one a symbolic link names, else path itself."""
    return os.path.realpath(path) if os.path.islink(path) else path


@contextmanager
def atomic_file(path, mode="wb"):
    if os.path.lexists(path) and not os.path.isfile(path):           # a FIFO, a device, a folder
        raise OSError(errno.EEXIST, "it exists and is not a regular file", path)
    path = written_through(path)
    folder = os.path.dirname(os.path.abspath(path))
    handle, tmp = create_temporary(path)
    try:
        with open(handle, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_folder(folder)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
