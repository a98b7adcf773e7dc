"""This rank's rows of each micro-batch of a step, gathered on the device.

Every rank sees the same global batch sequence (zerompi/train/data.py's BatchSchedule). Step s's
global batch of G rows is cut into M micro-batches of G/M rows, and rank r takes rows
[r*b, (r+1)*b) of each, b = G / (M N):

    global batch  | micro-batch 0               | micro-batch 1               | ...
                  | rank 0 | rank 1 | ... | N-1 | rank 0 | rank 1 | ... | N-1 |

so the run computes what one process would compute on the whole batch, for every stage, N and M.
The training set moves to the device once; each step, only the indices of this rank's rows do.
"""
import numpy as np

from .data import BatchSchedule


class MicroBatches:
    """The training set on the device, and this rank's (M, b) rows of every step."""

    def __init__(self, cfg, comm, data, dtype, rows):
        device, xp = comm.device, comm.device.xp                 # NumPy, or CuPy: the data set moves once
        M = cfg.grad_accum
        self.comm, self.device, self.rows = comm, device, rows
        self.x_train = device.from_numpy(data.x_train.astype(dtype))     # (samples, features)
        self.y_train = device.from_numpy(data.y_train)                   # (samples,)
        self.schedule = BatchSchedule(self.x_train.shape[0], cfg.batch_size, cfg.seed, cfg.shuffle)
        self.x = xp.empty((M, rows, data.num_features), dtype)           # this rank's rows, per micro-batch
        self.y = xp.empty((M, rows), np.int64)
        # the indices of those rows: written on the host, uploaded without a wait (a GPU's copy is
        # queued; the host writes them again only after the step's read of its sums has waited)
        self.indices_host = device.pinned_bytes(M * rows * 8).view(np.int64).reshape(M, rows)
        self.indices = xp.empty((M, rows), np.int64)

    def load(self, step):
        """Gather step's rows: global batch -> M micro-batches -> this rank's rows of each.
        Returns the (x, y) of each micro-batch, views that the next load overwrites."""
        M, comm = self.x.shape[0], self.comm
        rows = self.schedule.global_indices(step).reshape(M, comm.size, self.rows)[:, comm.rank]   # (M, b)
        np.copyto(self.indices_host, rows)
        self.device.upload(self.indices_host, self.indices)
        for m in range(M):
            self.device.take(self.x_train, self.indices[m], self.x[m], axis=0)
            self.device.take(self.y_train, self.indices[m], self.y[m], axis=0)
        return zip(self.x, self.y)
