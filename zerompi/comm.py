"""The communicator: the only place that calls MPI, and the only place that times it.

Every array collective is one of mpi4py's buffer (uppercase) methods on one contiguous buffer,
never the pickling lowercase ones. Each call is timed and recorded in the CommLedger.

    allreduce_sum(buf)               buf (n,) <- sum over ranks of buf               (stage 0)
    reduce_scatter_sum(full, shard)  shard (n/N,) <- (or +=) sum over ranks of full[r-th block]
    reduce_scatter_sum_in_place(full) -> full[:n/N] holds that sum; the rest is garbage (stage 1)
    allgather(shard, full)           full (n,) <- concatenation of every rank's shard (stage 3)
    allgather_in_place(full)         full[r-th block] is rank r's contribution        (stages 1-2)

reduce-scatter, pictured for N = 3 ranks and a buffer of 3 blocks (a, b, c are blocks):

    rank 0: [a0 b0 c0]                        rank 0: [a0+a1+a2]
    rank 1: [a1 b1 c1]   --reduce-scatter-->  rank 1: [b0+b1+b2]
    rank 2: [a2 b2 c2]                        rank 2: [c0+c1+c2]

all-gather is its mirror image: each rank brings one block and every rank leaves with all three.
An all-reduce is a reduce-scatter followed by an all-gather; that is why ZeRO stages 1 and 2 move
the same volume as plain data parallelism.

16-bit buffers: sums are computed in float32 through a one-layer staging buffer and rounded to 16
bits once (zerompi/precision.py says why); all-gathers move the 16-bit words as they are. The
ledger records the buffer that actually went to MPI, so its bytes show the widened reductions.

Device memory (CuPy arrays, zerompi/devices/device.py): before any MPI call on device memory the CUDA
stream that produced it is synchronized (mpi4py hands MPI the raw pointer and does not wait).
A CUDA-aware MPI (zerompi/devices/mpi_cuda.py) then reads and writes the device buffer itself; any other
MPI gets a preallocated pinned host buffer, the largest collective's worth (`host_staging`):

    reduce-scatter:  device full --copy--> host --Reduce_scatter_block(IN_PLACE)--> host[:n/N]
                     --copy--> device shard
    all-gather:      device block r --copy--> host[r-th block] --Allgather(IN_PLACE)--> host
                     --copy--> device full
    all-reduce:      device --copy--> host --Allreduce(IN_PLACE)--> host --copy--> device

The ledger's seconds include those copies: they are part of what the collective costs there.

MPI is initialized when the first Communicator is built, not when this module is imported, so
that zerompi/devices/device.py can choose the GPU first.

`check_all` turns an error found on some ranks into the same clean exit on all of them.
With --trace, `tracer` (zerompi/observe/trace.py) also receives each timed collective as a span.

Guards, off unless `guard` turns them on (`_begin` runs before every collective, `_end` after):
--check-collectives exchanges a header first (zerompi/observe/collective_check.py), --collective-timeout
ends the job when a collective waits too long (zerompi/observe/watchdog.py).
"""
import atexit
import copy
import os
import sys
import time

import mpi4py
mpi4py.rc.initialize = False          # MPI starts in init_mpi(), after the device is chosen
from mpi4py import MPI                # noqa: E402
import numpy as np                    # noqa: E402

from .observe.collective_check import CollectiveCheck   # noqa: E402
from .exit_codes import ExitCode      # noqa: E402
from .devices.device import CPU               # noqa: E402
from .ledger import CommLedger        # noqa: E402
from .devices.mpi_cuda import cuda_aware      # noqa: E402
from .precision import is_16bit       # noqa: E402
from .observe.watchdog import CollectiveWatchdog   # noqa: E402


def init_mpi():
    """Initialize MPI once (threads allowed to call it: MPI_THREAD_MULTIPLE, mpi4py's default),
    and finalize it at exit."""
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
        atexit.register(lambda: MPI.Is_finalized() or MPI.Finalize())


def _words(buf):
    """16-bit floats as uint16 words (MPI has no bfloat16 type; a gather only copies bits)."""
    return buf.view(np.uint16) if is_16bit(buf) else buf


class Communicator:
    def __init__(self, mpi_comm=None, device=None, mpi_reads_device_memory=None):
        """device: where the training buffers live (zerompi/devices/device.py; the CPU by default).
        mpi_reads_device_memory: whether MPI is CUDA-aware; None asks the library (zerompi/devices/mpi_cuda.py)."""
        init_mpi()
        self.mpi = mpi_comm if mpi_comm is not None else MPI.COMM_WORLD
        self.rank = self.mpi.Get_rank()
        self.size = self.mpi.Get_size()
        self.ledger = CommLedger()
        self.device = device if device is not None else CPU()
        self.cuda_aware, self.cuda_aware_how = False, "not asked: no GPU"
        if self.device.is_gpu:
            self.cuda_aware, self.cuda_aware_how = (
                cuda_aware(MPI, os.environ) if mpi_reads_device_memory is None
                else (mpi_reads_device_memory, "set by the caller"))
        self.stages_through_host = self.device.is_gpu and not self.cuda_aware
        self.staging_full = self.staging_shard = None   # see reserve_staging
        self.host_staging = None                        # see reserve_host_staging
        self.check = self.watchdog = None                # see guard

    def guard(self, check_collectives=False, collective_timeout=0.0):
        """Turn on --check-collectives and/or the --collective-timeout watchdog (0: off)."""
        if check_collectives:
            self.check = CollectiveCheck(self.rank, self.size)
        if collective_timeout > 0:
            self.watchdog = CollectiveWatchdog(collective_timeout, self.rank, self.mpi.Abort)

    def _begin(self, kind, purpose, buffer):
        """Before every collective: the guards that are on; returns the start time."""
        if self.watchdog is not None:
            self.watchdog.enter(kind, purpose, buffer)
        if self.check is not None:
            self.check.fill_header(kind, purpose, buffer)
            self.mpi.Allgather(self.check.header, self.check.table)
            if not self.check.agreed():
                self.mpi.Allgather(self.check.own_description(), self.check.descriptions)
                self._end()
                self.print0(f"zerompi: error: {self.check.mismatch_message()}", file=sys.stderr)
                raise SystemExit(ExitCode.COLLECTIVE_MISMATCH)  # on every rank: they all hold the same table
        return time.perf_counter()

    def _end(self):
        if self.watchdog is not None:
            self.watchdog.leave()

    def reserve_staging(self, memory, max_elements, reduce_dtype):
        """Staging for reductions that cannot run on the buffer itself: 16-bit buffers (widened
        to reduce_dtype, see zerompi/precision.py), accumulating reduce-scatters, and in-place
        reduce-scatters of device memory. The largest reduction's worth (a layer, or a stage-0
        gradient bucket), ledgered as work memory."""
        self.staging_full = memory.alloc("work", "comm.staging_full", (max_elements,), reduce_dtype)
        self.staging_shard = memory.alloc("work", "comm.staging_shard", (max_elements // self.size,),
                                          reduce_dtype)

    def describe_transport(self):
        """One line for the start of a run: how collectives reach device memory, and why."""
        if not self.device.is_gpu:
            return "MPI on host memory"
        how = "device buffers straight to MPI" if self.cuda_aware else "staged through pinned host memory"
        return f"MPI CUDA-aware: {'yes' if self.cuda_aware else 'no'} ({self.cuda_aware_how}): {how}"

    def reserve_host_staging(self, memory, max_bytes):
        """Pinned host memory for the largest collective on device memory (one layer in the
        widest dtype MPI sees), when MPI is not CUDA-aware; ledgered as work memory."""
        if self.stages_through_host:
            self.host_staging = self.device.pinned_bytes(max_bytes)
            memory.record("work", "comm.host_staging (pinned host)", self.host_staging)
            self.staging_memory = memory             # duplicate() ledgers its own there

    def _record(self, op, purpose, wire_buffer, start):
        self._end()
        end = time.perf_counter()
        self.ledger.record(op, purpose, wire_buffer, self.size, end - start)
        for listener in self.ledger.listeners:
            listener(op, purpose, wire_buffer.nbytes, start, end)

    def allreduce_sum(self, buf, purpose):
        """buf <- sum over ranks of buf, in place; 16-bit buffers are summed in reduce_dtype."""
        wire = buf
        if is_16bit(buf):
            wire = self.staging_full[:buf.size]
            wire[...] = buf                                # widen
        start = self._begin("allreduce", purpose, wire)
        self._sum_all(wire)
        self._record("allreduce", purpose, wire, start)
        if wire is not buf:
            buf[...] = wire                                # round once

    def reduce_scatter_sum(self, full, shard, purpose, accumulate=False):
        """shard (n/N,) <- (or +=, with accumulate) the sum over ranks of this rank's block of full (n,)."""
        send = full
        if is_16bit(full):
            send = self.staging_full[:full.size]
            send[...] = full                               # widen
        recv = self.staging_shard[:shard.size] if (accumulate or send is not full) else shard
        start = self._begin("reduce_scatter", purpose, send)
        self._sum_scatter(send, recv)
        self._record("reduce_scatter", purpose, send, start)
        if accumulate:
            shard += recv                                  # gradient accumulation: add this micro-batch
        elif recv is not shard:
            shard[...] = recv                              # round once

    def reduce_scatter_sum_in_place(self, full, purpose):
        """Returns full[:n/N], holding the sum over ranks of this rank's block of full (n,). The
        rest of full is garbage afterwards. (MPI_IN_PLACE: the reduced block lands at the front.)"""
        shard = full[:full.size // self.size]
        if is_16bit(full):
            self.reduce_scatter_sum(full, shard, purpose)  # via staging; shard is read first
            return shard
        start = self._begin("reduce_scatter", purpose, full)
        self._sum_scatter(full, None)
        self._record("reduce_scatter", purpose, full, start)
        return shard

    def allgather(self, shard, full, purpose):
        """full (n,) <- every rank's shard (n/N,), in rank order; 16-bit values travel as 16-bit words."""
        start = self._begin("allgather", purpose, full)
        self._gather_all(_words(full), _words(shard))
        self._record("allgather", purpose, full, start)

    def allgather_in_place(self, full, purpose):
        """MPI_IN_PLACE: this rank's block of `full` is already in place."""
        start = self._begin("allgather", purpose, full)
        self._gather_all(_words(full), None)
        self._record("allgather", purpose, full, start)

    # ---- transport: the only code that moves training buffers between ranks (zerompi/devices/nccl.py
    # overrides these three). Device memory goes to a CUDA-aware MPI directly, once its stream is
    # done, or through the pinned host staging (the pictures in the module docstring).
    def _sum_all(self, buf):
        """buf (n,) <- the sum over ranks of buf."""
        if self._staged(buf):
            host = self._to_host_staging(buf)
            self.mpi.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
            self.device.copy_from_host(host, buf)
        else:
            self._wait_for(buf)
            self.mpi.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    def _sum_scatter(self, send, recv):
        """recv (n/N,) <- the sum over ranks of this rank's block of send (n,); recv None: in
        place, the result lands in send[:n/N]."""
        if self._staged(send):
            host = self._to_host_staging(send)              # reduced in place on the host copy
            self.mpi.Reduce_scatter_block(MPI.IN_PLACE, host, op=MPI.SUM)
            result = host[:send.size // self.size]
            self.device.copy_from_host(result, recv if recv is not None else send[:result.size])
        elif recv is None and self.device.holds(send):
            # CUDA-aware Open MPI's in-place reduce-scatter on device memory copies only n/N
            # elements of the buffer to the host and then reads n: reduce out of place instead
            shard = self.staging_shard[:send.size // self.size]
            self._wait_for(send)
            self.mpi.Reduce_scatter_block(send, shard, op=MPI.SUM)
            send[:shard.size] = shard
        else:
            self._wait_for(send)
            self.mpi.Reduce_scatter_block(MPI.IN_PLACE if recv is None else send,
                                          send if recv is None else recv, op=MPI.SUM)

    def _gather_all(self, full, shard):
        """full (n,) <- every rank's block of n/N elements, in rank order; this rank's block comes
        from shard (n/N,), or is already in place in full when shard is None."""
        block = slice(self.rank * (full.size // self.size), (self.rank + 1) * (full.size // self.size))
        if self._staged(full):
            host = self._host_twin(full)
            self.device.copy_to_host(shard if shard is not None else full[block], host[block])
            self.mpi.Allgather(MPI.IN_PLACE, host)
            self.device.copy_from_host(host, full)
        else:
            self._wait_for(full)
            self.mpi.Allgather(MPI.IN_PLACE if shard is None else shard, full)

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

    def gather_to_root(self, send, recv):
        """Rank 0 receives every rank's equal-sized `send` into recv (size, ...); not ledgered
        (the end-of-run report and checkpoint manifests: bookkeeping, not training traffic)."""
        self._begin("gather", "bookkeeping", send)
        self.mpi.Gather(send, recv, root=0)
        self._end()

    def gather_bytes_to_root(self, data):
        """Rank 0 receives every rank's `data` (bytes of any length) as a list, in rank order; None
        elsewhere. Not ledgered (the end-of-run trace: bookkeeping). One Gather of the lengths, one
        Gatherv of the bytes."""
        send = np.frombuffer(data, dtype=np.uint8)
        lengths = np.zeros(self.size, dtype=np.int64) if self.rank == 0 else None
        self.mpi.Gather(np.array([send.size], dtype=np.int64), lengths, root=0)
        if self.rank != 0:
            self.mpi.Gatherv(send, None, root=0)
            return None
        received = np.empty(int(lengths.sum()), dtype=np.uint8)
        self.mpi.Gatherv(send, (received, lengths), root=0)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        return [received[offsets[r]:offsets[r + 1]].tobytes() for r in range(self.size)]

    def barrier(self):
        self.mpi.Barrier()

    def duplicate(self):
        """A Communicator on a duplicate of this MPI communicator (MPI_Comm_dup) that shares this
        one's ledger and staging buffers: for the communication thread (zerompi/overlap/thread.py), whose
        collectives must never interleave with this thread's on one communicator. The pinned host
        staging and the guards are its own: both threads may be in a collective at the same moment."""
        twin = copy.copy(self)
        twin.mpi = self.mpi.Dup()
        twin.check = twin.watchdog = None
        twin.guard(self.check is not None, self.watchdog.limit if self.watchdog is not None else 0)
        if self.host_staging is not None:
            twin.host_staging = self.device.pinned_bytes(self.host_staging.nbytes)
            self.staging_memory.record("work", "comm.host_staging (pinned host, thread)", twin.host_staging)
        return twin

    @staticmethod
    def thread_level_error():
        """Why a communication thread cannot be used, or None (it needs MPI_THREAD_MULTIPLE)."""
        if MPI.Query_thread() >= MPI.THREAD_MULTIPLE:
            return None
        return (f"--overlap on needs MPI_THREAD_MULTIPLE, but MPI was initialized with thread level "
                f"{MPI.Query_thread()}: use --overlap off")

    def ranks_on_this_node(self):
        """How many ranks share this node (and its cores)."""
        self._begin("split", "launch", None)
        node = self.mpi.Split_type(MPI.COMM_TYPE_SHARED)
        self._end()
        count = node.Get_size()
        node.Free()
        return count

    def print0(self, *args, file=None, **kwargs):
        """Print on rank 0 only (the one print helper)."""
        if self.rank == 0:
            print(*args, file=file if file is not None else sys.stdout, flush=True, **kwargs)

    def first_failing_rank(self, error):
        """Collective: the lowest rank whose error is not None, or None when no rank has one."""
        flag = np.array([self.rank if error is not None else self.size], dtype=np.int64)
        self._begin("allreduce_min", "control", flag)
        self.mpi.Allreduce(MPI.IN_PLACE, flag, op=MPI.MIN)
        self._end()
        return int(flag[0]) if flag[0] < self.size else None

    def any_failed(self, error):
        """Collective: True on every rank when any rank's error is not None."""
        return self.first_failing_rank(error) is not None

    def check_all(self, error, exit_code=ExitCode.BAD_INPUT):
        """Collective: every rank passes its error message or None. If any rank has one, the
        lowest such rank prints it (one line, once) and every rank raises SystemExit(exit_code)."""
        first_failing = self.first_failing_rank(error)
        if first_failing is not None:
            if self.rank == first_failing:
                print(f"zerompi: error: {error}", file=sys.stderr, flush=True)
            raise SystemExit(exit_code)
