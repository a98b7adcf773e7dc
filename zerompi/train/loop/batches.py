"""Which rows make each step's global batch, and this rank's rows of each micro-batch, gathered on the device.

BatchSchedule: which training rows make up the global batch of each step. It depends only on
(num_samples, global_batch, seed, shuffle), never on the number of ranks, so every world size
trains on exactly the same batches. MicroBatches splits each among the ranks. Step s's
global batch of G rows is cut into M micro-batches of G/M rows, and rank r takes rows
[r*b, (r+1)*b) of each, b = G / (M N):

    global batch  | micro-batch 0               | micro-batch 1               | ...
                  | rank 0 | rank 1 | ... | N-1 | rank 0 | rank 1 | ... | N-1 |

so the run computes what one process would compute on the whole batch, for every stage, N and M.
The training set moves to the device once; each step, only the indices of this rank's rows do.
"""
import numpy as np

from .data import DataError


class BatchSchedule:
    """The global batch of training-row indices for every step.

    Step s is in epoch e = s // steps_per_epoch. The epoch's order of the S rows is
        arange(S)                                            when not shuffled
        np.random.default_rng([seed, e]).permutation(S)      when shuffled
    and step s takes the (s % steps_per_epoch)-th block of G rows of that order. steps_per_epoch
    is S // G: the last S % G rows of each epoch's order are dropped, so every step has exactly G
    rows (when shuffled, different rows are dropped each epoch).
    """

    def __init__(self, num_samples: int, global_batch: int, seed: int, shuffle: bool):
        if global_batch <= 0:
            raise DataError(f"batch size {global_batch} must be positive")
        if global_batch > num_samples:
            raise DataError(f"batch size {global_batch} is larger than the {num_samples} "
                            f"training samples")
        if shuffle and seed < 0:
            raise DataError(f"shuffle seed {seed} must be non-negative")
        self.num_samples = num_samples
        self.global_batch = global_batch
        self.seed = seed
        self.shuffle = shuffle
        self.steps_per_epoch = num_samples // global_batch
        self._epoch = None           # the epoch whose order is in self._order
        self._order = None           # (S,) int64, read-only, computed once per epoch

    def epoch_order(self, epoch: int) -> np.ndarray:
        """(S,) int64, read-only: the order in which epoch `epoch` visits the training rows."""
        if epoch != self._epoch:
            if self.shuffle:
                order = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
            else:
                order = np.arange(self.num_samples)
            self._order = order.astype(np.int64, copy=False)
            self._order.flags.writeable = False
            self._epoch = epoch
        return self._order

    def global_indices(self, step: int) -> np.ndarray:
        """(G,) int64, read-only: indices into x_train of the global batch of 0-based `step`."""
        if step < 0:
            raise DataError(f"step {step} must be non-negative")
        epoch, step_in_epoch = divmod(step, self.steps_per_epoch)
        start = step_in_epoch * self.global_batch
        return self.epoch_order(epoch)[start:start + self.global_batch]


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
