"""Files that are complete or absent: write under a temporary name, fsync, rename into place.

    with atomic_file("out.npz") as f:      # f is a new "<folder>/.out.npz.tmp-XXXXXXXX"
        ... write ...
    # normal exit: flush, fsync the file, rename over out.npz, fsync the folder
    # an exception: the temporary file is removed and out.npz is untouched

POSIX rename within one folder is atomic, so a reader (or a crash at any moment) sees the old file
or the complete new one, never a half-written one. Every file zerompi writes whole goes through
here (weights, exports, manifests, `latest`, the trace); shard files are written inside a
`.partial-` folder that is renamed as a whole (zerompi/checkpoint/save.py), the lock is created
with O_EXCL (lock.py), and --metrics is appended to line by line (zerompi/train/metrics.py).
An existing path that is not a regular file (a FIFO, a device such as /dev/null, a folder) is
refused before anything is written: the rename would replace the node itself.
"""
import errno
import os
import tempfile
from contextlib import contextmanager


def fsync_folder(folder):
    """Make a rename inside `folder` durable."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


@contextmanager
def atomic_file(path, mode="wb"):
    if os.path.lexists(path) and not os.path.isfile(path):           # a FIFO, a device, a folder
        raise OSError(errno.EEXIST, "it exists and is not a regular file", path)
    folder = os.path.dirname(os.path.abspath(path))
    handle, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.tmp-")  # O_EXCL: no planted link
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
