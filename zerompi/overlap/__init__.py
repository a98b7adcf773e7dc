"""Overlap: collectives that run while the next layer computes. A layer a reader of ZeRO can skip.

The stages call typed collectives that return requests (zerompi/collectives.py). With overlap
off those run at once. With overlap on (--overlap) `OverlapConfig.start` returns a
`ThreadedCollectives` (thread.py): the same calls, run in order by one communication thread,
and each request completes when the thread has run its call. Stage 3 also gets a
`PrefetchingGather` (prefetch.py) that starts the next layers' all-gathers early.

    main thread:    backward u=3 | backward u=2 | backward u=1 | backward u=0 | wait_all | Adam
    comm thread:                 |  RS u=3      |    RS u=2    |    RS u=1    | RS u=0 |

The same collectives run on the same buffers in the same order either way, so the results are
bitwise identical (tests/proofs/test_overlap_is_bitwise_identical.py makes any missing wait show up as a difference).

Measured (docs/overlap-and-performance.md): with every core already running a rank, the thread
hides most of the communication but the step gets no shorter, because MPI's shared-memory copies
and polling then run on the cores the compute needs; hence off by default.
"""
from dataclasses import dataclass

from ..collectives import Collectives
from ..engine import BUCKET_MB
from .thread import ThreadedCollectives


@dataclass(frozen=True)
class OverlapConfig:
    enabled: bool = False      # run the step's collectives on a communication thread
    bucket_mb: float = BUCKET_MB   # stages 0-1: hand gradients to communication in buckets of >= this
    prefetch: int = 1          # stage 3: all-gathers started this many layers ahead of their use

    def start(self, comm):
        """The collectives the stages call: at once (overlap off) or on a communication thread
        (zerompi/engine.py's start_collectives)."""
        if self.enabled:
            return ThreadedCollectives(comm, self.prefetch)
        return Collectives(comm)
