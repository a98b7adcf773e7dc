"""Collectives through NCCL (`--comm nccl`): the Communicator of zerompi/comm.py with another transport.

MPI still starts the job and bootstraps NCCL:

    rank 0:     uid = nccl.get_unique_id()          (128 bytes naming the new NCCL communicator)
    all ranks:  MPI broadcast of uid from rank 0
    all ranks:  NcclCommunicator(N, uid, rank)      on the GPU each rank chose (zerompi/train/options/device_choice.py)

Then the three transport methods (sum_all, sum_scatter, gather_all) run on NCCL, on CuPy's default
stream, reading and writing device memory directly (no host staging, no MPI). NcclTransport extends
the device transport (zerompi/devices/staging.py) rather than replacing it: host arrays (the
held-out accuracy count) still take its path to MPI. Everything else stays with the Communicator:
widening 16-bit reductions to float32, gradient accumulation, the ledger, the guards, and every
control and bookkeeping message (errors, checkpoint manifests, the report) on MPI.
NcclCommunicator is a Communicator that builds this transport, nothing more.

In-place forms differ from MPI's, so each is spelled out:
    reduce-scatter in place: NCCL leaves rank r's result at block r (MPI: at the front), so it is
                             copied to the front after
    all-gather in place:     NCCL reads rank r's block at block r, as MPI does

NCCL calls are asynchronous; each one waits for the device before returning, so that the
ledger's seconds are the collective's real duration (CUDA events could time it without waiting:
not done here).
"""
import numpy as np

from ..comm import Communicator
from ..ledger import CONTROL
from .staging import DeviceTransport


class NcclCommunicator(Communicator):
    def __init__(self, mpi_comm=None, device=None, guards=None):
        super().__init__(mpi_comm, device, guards)
        self.guards.begin("bcast", CONTROL, None)          # the bootstrap: rank 0's unique id
        self.transport = NcclTransport(self.transport, self.device, self.rank, self.size, self.staging)
        self.guards.end()


class NcclTransport(DeviceTransport):
    def __init__(self, mpi_transport, device, rank, size, staging):
        super().__init__(mpi_transport, device, rank, size, True, "NCCL", staging)
        from cupy.cuda import nccl
        self.nccl_module = nccl
        self.nccl = self._bootstrap()

    def _bootstrap(self):
        """A new NCCL communicator over this transport's ranks (collective, on MPI)."""
        uid = self.nccl_module.get_unique_id() if self.rank == 0 else None
        uid = self.mpi_transport.mpi.bcast(uid, root=0)
        return self.nccl_module.NcclCommunicator(self.size, uid, self.rank)

    def duplicate(self, mpi):
        """The --overlap communication thread's twin gets its own NCCL communicator too: the two
        threads must never share one."""
        twin = super().duplicate(mpi)
        twin.nccl = twin._bootstrap()
        return twin

    def describe(self):
        return "collectives on NCCL (bootstrapped over MPI), device memory directly"

    def _nccl_type(self, array):
        return {np.dtype(np.float32): self.nccl_module.NCCL_FLOAT32,
                np.dtype(np.float64): self.nccl_module.NCCL_FLOAT64}[array.dtype]

    def _stream(self):
        """CuPy's default (null) stream, where zerompi's kernels run: the same from any host thread
        (the communication thread of --overlap included; NCCL selects the device itself)."""
        return self.device.xp.cuda.Stream.null

    def sum_all(self, buf):
        if not self.device.holds(buf):
            return super().sum_all(buf)
        stream = self._stream()
        self.nccl.allReduce(buf.data.ptr, buf.data.ptr, buf.size, self._nccl_type(buf),
                            self.nccl_module.NCCL_SUM, stream.ptr)
        self.device.synchronize()

    def sum_scatter(self, send, recv):
        if not self.device.holds(send):
            return super().sum_scatter(send, recv)
        m, stream = send.size // self.size, self._stream()
        out = recv if recv is not None else send[self.rank * m:(self.rank + 1) * m]   # NCCL's in place
        self.nccl.reduceScatter(send.data.ptr, out.data.ptr, m, self._nccl_type(send),
                                self.nccl_module.NCCL_SUM, stream.ptr)
        if recv is None and self.rank > 0:
            send[:m] = out                                 # to the front, as MPI leaves it
        self.device.synchronize()

    def gather_all(self, full, shard):
        if not self.device.holds(full):
            return super().gather_all(full, shard)
        m, stream = full.size // self.size, self._stream()
        source = shard if shard is not None else full[self.rank * m:(self.rank + 1) * m]
        # bytes: 16-bit words and floats alike (a gather only copies)
        self.nccl.allGather(source.data.ptr, full.data.ptr, source.nbytes, self.nccl_module.NCCL_UINT8,
                            stream.ptr)
        self.device.synchronize()
