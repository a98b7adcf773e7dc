"""The collectives the stages call: start one, get a request, wait for it before using the buffers.

This is the shape of MPI's non-blocking collectives (MPI_Ireduce_scatter_block, then MPI_Wait):

    request = collectives.reduce_scatter(grad, grad_shard, GRADS)    starts it, returns a Request
    ...compute that does not touch grad or grad_shard...
    request.wait()                                                   grad may be reused now
    collectives.wait_all()                                           everything started has finished

`Collectives` (this file) runs each collective at once, on the calling thread, and returns a
request that is already complete: `wait` does nothing. That is the mainline: with overlap off
(the default) every stage reads as if each call were blocking. zerompi/overlap/ has the same
interface with a communication thread behind it, so that a collective runs while the next layer
computes; the stage files do not change.

    call                                          what it does (zerompi/comm.py has the pictures)
    allreduce(buf)                                buf (n,) <- sum over ranks             stage 0
    reduce_scatter(full, shard, accumulate)       shard (n/N,) <- (+=) sum over ranks of
                                                  this rank's block of full (n,)        stages 2-3
    reduce_scatter_in_place(full)                 full[:n/N] <- that sum                stage 1
    allgather(shard, full)                        full (n,) <- every rank's shard       stage 3
    allgather_in_place(full)                      full (n,) <- every rank's block of it stages 1-2

`purpose` names what the bytes are for in the ledger (zerompi/ledger.py): GRADS or PARAMS here.
`LayerGather` is stage 3's one-layer parameter buffer: all-gather into it, wait, use it.
"""
import time

from .ledger import PARAMS


class Request:
    """A started collective. This one is already complete (overlap off)."""

    def wait(self):
        """Return once the collective has finished (at once: it has)."""


DONE = Request()


class Collectives:
    """Overlap off: every collective runs when it is started; `exposed_s` is their total time
    (the communication that nothing hid; zerompi/overlap/ reports the same for its thread)."""

    buffers_in_flight = 1        # layer gradient buffers worth having: nothing overlaps here
    prefetch = 0                 # layers whose all-gather starts ahead of their use (stage 3)

    def __init__(self, comm):
        self.comm = comm
        self.rank, self.size = comm.rank, comm.size
        self.exposed_s = 0.0

    def allreduce(self, buf, purpose):
        return self._start(self.comm.allreduce_sum, buf, purpose)

    def reduce_scatter(self, full, shard, purpose, accumulate=False):
        return self._start(self.comm.reduce_scatter_sum, full, shard, purpose, accumulate)

    def reduce_scatter_in_place(self, full, purpose):
        return self._start(self.comm.reduce_scatter_sum_in_place, full, purpose)

    def allgather(self, shard, full, purpose):
        return self._start(self.comm.allgather, shard, full, purpose)

    def allgather_in_place(self, full, purpose):
        return self._start(self.comm.allgather_in_place, full, purpose)

    def reserve(self, memory, layout, precision):
        """Work buffers of the collectives' own, for this layout (none here; zerompi/quantize/'s
        quantized blocks need some). The stage calls it first."""

    def wait_all(self):
        """Every collective started so far has finished (here: always)."""

    def close(self):
        """Nothing runs in the background here (zerompi/overlap/'s thread stops)."""

    def layer_gather(self, buffers, shard_of):
        """Stage 3's gather of a layer's parameters into one of `buffers` (1 + prefetch one-layer
        buffers); shard_of(layer) is this rank's shard of the layer's parameters.
        (zerompi/overlap/ returns one that prefetches, zerompi/quantize/ one that gathers int8 blocks.)"""
        return LayerGather(self, buffers, shard_of)

    def _start(self, call, *args):
        start = time.perf_counter()
        call(*args)
        self.exposed_s += time.perf_counter() - start
        return DONE


class LayerGather:
    """Stage 3's parameter all-gather into one reused one-layer buffer (max padded layer,)."""

    def __init__(self, collectives, buffers, shard_of):
        self.collectives, self.buffers, self.shard_of = collectives, buffers, shard_of

    def gather(self, layer, upcoming):
        """full (padded,) <- every rank's shard (shard_size,) of the layer. `upcoming` (the layers
        the pass needs next) is for a prefetching gather; this one gathers only what is asked."""
        full = self.buffers[0][:layer.padded]
        self.collectives.allgather(self.shard_of(layer), full, PARAMS).wait()
        return full

    def drop(self):
        """Forget anything gathered ahead (nothing is, here)."""
