"""The tiers: where a rank's offloaded state is kept, and the stores each opens.

    tier           optimizer state (open)            stage 3's parameter shard (open_params)
    HostTier       HostStore: host memory            HostParams: host memory
    FileTier       FileStore: a file, in tiles       FileParams: a file, a layer at a time
    (planned)      the file tier's buffers ledgered, no file made (zerompi/plan/)

A file is scratch, never a checkpoint: it is created (O_EXCL, O_NOFOLLOW), given its whole size
at once (posix_fallocate: a full disk is found at start, not mid-run), and unlinked while it is
open, so that the kernel frees it when the process ends, however it ends (kill -9 included); a
folder removed or made read-only during the run does not reach the open file.
"""
import os
import socket

import numpy as np

from .params import FileParams, HostParams
from .stores import FILE_PREFIX, FileStore, HostStore, OffloadError


class HostTier:
    """ZeRO-Offload: the optimizer state (or parameters) in (pinned) host memory."""
    name = "host"
    describe = "with --offload-optimizer host"

    def planned(self):
        """The tier a plan builds (zerompi/plan/): host memory on its virtual device holds nothing."""
        return self

    def open(self, names, numel, dtype, tile, ledger):
        return HostStore(names, numel, dtype, tile, ledger)

    def open_params(self, numel, dtype, largest, ledger):
        return HostParams(numel, dtype, ledger)


class FileTier:
    """ZeRO-Infinity: the optimizer state (or parameters) in one scratch file per rank in `folder`."""
    name = "file"
    describe = "with --offload-optimizer file"

    def __init__(self, folder, rank):
        self.folder, self.rank = folder, rank

    def planned(self):
        return PlannedFileTier()

    def file_name(self, what=""):
        return f"{FILE_PREFIX}.{socket.gethostname()}.{os.getpid()}.rank{self.rank}{what}"

    def open(self, names, numel, dtype, tile, ledger):
        fd, path = self.create(len(names) * numel * np.dtype(dtype).itemsize)
        return FileStore(fd, path, names, numel, dtype, tile, ledger)

    def open_params(self, numel, dtype, largest, ledger):
        """Stage 3's parameter shard in a file of its own (zerompi/offload/params.py)."""
        fd, path = self.create(numel * np.dtype(dtype).itemsize, ".params")
        return FileParams(fd, path, numel, dtype, largest, ledger)

    def create(self, nbytes, what=""):
        """A new scratch file of nbytes in the folder, already unlinked: (fd, the path it had)."""
        path = os.path.join(self.folder, self.file_name(what))
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError as e:
            raise OffloadError(f"cannot create the offload file {path}: {e.strerror}") from None
        try:
            os.unlink(path)                        # scratch: freed when the process ends, however
            if nbytes:
                os.posix_fallocate(fd, 0, nbytes)  # the whole size now: a full disk is found here
        except OSError as e:
            os.close(fd)
            raise OffloadError(f"cannot give the offload file {path} its {nbytes} bytes: {e.strerror}") from None
        return fd, path


class PlannedFileTier:
    """A plan's file tier (zerompi/plan/): the columns and tile buffers ledgered, no file made."""

    def open(self, names, numel, dtype, tile, ledger):
        return FileStore(None, "(planned)", names, numel, dtype, tile, ledger)

    def open_params(self, numel, dtype, largest, ledger):
        return PlannedFileParams(None, "(planned)", numel, dtype, largest, ledger)


class PlannedFileParams(FileParams):
    """A plan's parameter file: its buffers ledgered; a plan's gathers read nothing."""

    def read_region(self, k, region):
        """Nothing to read."""

    def write_region(self, k, region):
        """Nothing to write."""
