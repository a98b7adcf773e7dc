"""The transport for device memory: how a collective's buffer reaches MPI when it lives on a GPU.

The Communicator (zerompi/comm.py) hands every collective to a transport's three methods,
sum_all, sum_scatter and gather_all. On the CPU that is comm.py's MpiTransport, one mpi4py call
each. On a GPU it is a DeviceTransport, which wraps that same MpiTransport (it adds steps around
the very same MPI calls), put in its place by `communicator_on` (zerompi/devices/__init__.py).
Buffers in host memory pass straight through; for device memory:

Before any MPI call on device memory the CUDA stream that produced it is synchronized (mpi4py
hands MPI the raw pointer and does not wait). A CUDA-aware MPI (zerompi/devices/mpi_cuda.py)
then reads and writes the device buffer itself; any other MPI gets a preallocated pinned host
buffer, the largest collective's worth (`host_staging`):

    reduce-scatter:  device full --copy--> host --Reduce_scatter_block(IN_PLACE)--> host[:n/N]
                     --copy--> device shard
    all-gather:      device block r --copy--> host[r-th block] --Allgather(IN_PLACE)--> host
                     --copy--> device full
    all-reduce:      device --copy--> host --Allreduce(IN_PLACE)--> host --copy--> device

The ledger's seconds include those copies: they are part of what the collective costs there.

One workaround: CUDA-aware Open MPI's in-place reduce-scatter on device memory copies only n/N
elements of the buffer to the host and then reads n, so an in-place reduce-scatter of device
memory reduces out of place into the communicator's float32 staging shard and copies the result
to the front.

zerompi/devices/nccl.py's NcclTransport extends this class: device memory goes to NCCL instead,
host memory takes this path.
"""
import copy


class DeviceTransport:
    def __init__(self, mpi_transport, device, rank, size, cuda_aware, cuda_aware_how, staging):
        """mpi_transport: comm.py's MpiTransport (the MPI calls); cuda_aware: whether MPI reads
        device memory, and cuda_aware_how, why we think so; staging: the communicator's
        ReductionStaging (its `shard` takes the out-of-place reduce-scatter above)."""
        self.mpi_transport = mpi_transport
        self.device, self.rank, self.size = device, rank, size
        self.cuda_aware, self.cuda_aware_how = cuda_aware, cuda_aware_how
        self.staging = staging
        self.stages_through_host = not cuda_aware
        self.host_staging = None       # pinned bytes, see reserve_host_staging
        self.memory = None             # the memory ledger host staging is recorded in

    def reserve_host_staging(self, memory, max_bytes):
        """Pinned host memory for the largest collective on device memory, when MPI is not
        CUDA-aware; ledgered as work memory."""
        if self.stages_through_host:
            self.host_staging = self.device.pinned_bytes(max_bytes)
            memory.record("work", "comm.host_staging (pinned host)", self.host_staging)
            self.memory = memory

    def duplicate(self, mpi):
        """This transport on the duplicate communicator `mpi`, with its own pinned host staging
        (both threads may be in a collective at the same moment); the float32 staging is shared."""
        twin = copy.copy(self)
        twin.mpi_transport = self.mpi_transport.duplicate(mpi)
        if self.host_staging is not None:
            twin.host_staging = self.device.pinned_bytes(self.host_staging.nbytes)
            self.memory.record("work", "comm.host_staging (pinned host, thread)", twin.host_staging)
        return twin

    def split(self, sub):
        """This transport for `sub`, a Communicator on some of this one's ranks (its own staging)."""
        return DeviceTransport(self.mpi_transport.split(sub), self.device, sub.rank, sub.size,
                               self.cuda_aware, self.cuda_aware_how, sub.staging)

    def describe(self):
        how = "device buffers straight to MPI" if self.cuda_aware else "staged through pinned host memory"
        return f"MPI CUDA-aware: {'yes' if self.cuda_aware else 'no'} ({self.cuda_aware_how}): {how}"

    def sum_all(self, buf):
        """buf (n,) <- the sum over ranks of buf."""
        if self._staged(buf):
            host = self._to_host_staging(buf)
            self.mpi_transport.sum_all(host)
            self.device.copy_from_host(host, buf)
        else:
            self._wait_for(buf)
            self.mpi_transport.sum_all(buf)

    def sum_scatter(self, send, recv):
        """recv (n/N,) <- the sum over ranks of this rank's block of send (n,); recv None: in
        place, the result lands in send[:n/N]."""
        if self._staged(send):
            host = self._to_host_staging(send)              # reduced in place on the host copy
            self.mpi_transport.sum_scatter(host, None)
            result = host[:send.size // self.size]
            self.device.copy_from_host(result, recv if recv is not None else send[:result.size])
        elif recv is None and self.device.holds(send):
            shard = self.staging.shard[:send.size // self.size]   # the workaround above
            self._wait_for(send)
            self.mpi_transport.sum_scatter(send, shard)
            send[:shard.size] = shard
        else:
            self._wait_for(send)
            self.mpi_transport.sum_scatter(send, recv)

    def gather_all(self, full, shard):
        """full (n,) <- every rank's block of n/N elements, in rank order; this rank's block comes
        from shard (n/N,), or is already in place in full when shard is None."""
        if self._staged(full):
            block = slice(self.rank * (full.size // self.size), (self.rank + 1) * (full.size // self.size))
            host = self._host_twin(full)
            self.device.copy_to_host(shard if shard is not None else full[block], host[block])
            self.mpi_transport.gather_all(host, None)
            self.device.copy_from_host(host, full)
        else:
            self._wait_for(full)
            self.mpi_transport.gather_all(full, shard)

    def exchange(self, send, recv):
        """recv (n,) <- block r: rank r's block of its send (n,) for this rank."""
        if self._staged(recv):
            host = self.host_staging[:send.nbytes + recv.nbytes]
            host_send, host_recv = host[:send.nbytes].view(send.dtype), host[send.nbytes:].view(recv.dtype)
            self.device.copy_to_host(send, host_send)
            self.mpi_transport.exchange(host_send, host_recv)
            self.device.copy_from_host(host_recv, recv)
        else:
            self._wait_for(send)
            self.mpi_transport.exchange(send, recv)

    def _staged(self, array):
        """Whether array goes through the host staging: device memory, and an MPI that cannot read it."""
        return self.host_staging is not None and self.device.holds(array)

    def _wait_for(self, array):
        """Before MPI reads or writes device memory: wait for the kernels that produce it."""
        if self.device.holds(array):
            self.device.synchronize()

    def _host_twin(self, array):
        """The first array.nbytes of the host staging, as a 1-D array of array's dtype."""
        return self.host_staging[:array.nbytes].view(array.dtype)

    def _to_host_staging(self, array):
        host = self._host_twin(array)
        self.device.copy_to_host(array, host)               # waits for the kernels that produce it
        return host
