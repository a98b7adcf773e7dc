"""Stage 3's prefetch: start the next layers' parameter all-gathers before they are needed.

Stage 3 asks for a layer's full parameters with `gather(layer, upcoming)`, where `upcoming` is
the rest of the pass in the order it will run (forward: u+1, u+2, ...; backward: u-1, u-2, ...).
With --prefetch P the all-gathers of the next P layers are started on the communication thread,
each into its own one-layer buffer, so that they arrive while layer u computes:

    main thread:   forward 0        | forward 1        | forward 2        |
    comm thread:   AG 0 | AG 1      | AG 2             | AG 3             |      (P = 1)
    buffers:       [0]=layer 0, [1]=layer 1 | [0]=layer 2 | [1]=layer 3 ...

A prefetch is never carried across passes or steps (the parameters change in the step, and an
unused all-gather would be wasted traffic): `drop` forgets them, and one that does not match the
layer asked for is waited for and dropped.
"""
from collections import deque

from ..ledger import PARAMS


class PrefetchingGather:
    def __init__(self, collectives, buffers, shard_of):
        self.collectives, self.buffers, self.shard_of = collectives, buffers, shard_of
        self.prefetch = len(buffers) - 1    # one buffer in use, the others for the layers ahead
        self.ahead = deque()                # (layer index, buffer index, request), in the order of use
        self.in_use = None                  # the buffer the current layer computes with

    def gather(self, layer, upcoming):
        """The layer's full parameters (padded,), all-gathered now or by an earlier prefetch;
        first starts the all-gathers of the next `prefetch` layers of `upcoming`."""
        self.in_use = None                  # the previous layer's compute is done with its buffer
        expected = [u.index for u in [layer, *upcoming[:len(self.ahead) - 1]]]
        if self.ahead and [index for index, _, _ in self.ahead] != expected:
            self.collectives.wait_all()     # not what was prefetched: drop it
            self.drop()
        if not self.ahead:
            self.start(layer)
        _, self.in_use, request = self.ahead.popleft()
        for next_layer in upcoming[len(self.ahead):self.prefetch]:
            self.start(next_layer)
        request.wait()
        return self.buffers[self.in_use][:layer.padded]

    def start(self, layer):
        """All-gather the layer's parameters into a buffer that nothing computes with or waits on."""
        busy = {self.in_use} | {index for _, index, _ in self.ahead}
        index = next(i for i in range(len(self.buffers)) if i not in busy)
        request = self.collectives.allgather(self.shard_of(layer), self.buffers[index][:layer.padded], PARAMS)
        self.ahead.append((layer.index, index, request))

    def drop(self):
        """Forget the prefetched all-gathers (after a wait_all: they have finished)."""
        self.ahead.clear()
