"""zerompi/collectives.py and zerompi/overlap/ on one rank: the collectives run in the order they
were started, a failed call on the thread is reported at the next wait instead of hanging, and the
gradient buckets group layers as documented."""
import numpy as np
import pytest

from zerompi.comm import Communicator
from zerompi.layout import Layout
from zerompi.ledger import GRADS
from zerompi.overlap import OverlapConfig
from zerompi.overlap.thread import ThreadedCollectives


@pytest.mark.parametrize("enabled", [False, True], ids=["off", "on"])
def test_calls_run_in_the_order_started_and_wait_all_finishes_them(enabled):
    comm = Communicator()
    collectives = OverlapConfig(enabled=enabled).start(comm)
    assert isinstance(collectives, ThreadedCollectives) == enabled
    buffers = [np.full(1000, float(i)) for i in range(20)]
    requests = [collectives.allreduce(b, GRADS) for b in buffers]
    requests[3].wait()
    assert all(np.all(b == i) for i, b in enumerate(buffers[:4]))   # N = 1: a sum over one rank
    collectives.wait_all()
    if enabled:
        assert collectives.finished == collectives.started == 20
        assert [r.number for r in requests] == list(range(20))
    assert all(np.all(b == i) for i, b in enumerate(buffers))
    assert comm.ledger.totals({GRADS})[0] == 20                   # both threads count into one ledger


def test_a_failed_call_on_the_thread_raises_at_the_next_wait():
    collectives = ThreadedCollectives(Communicator())
    request = collectives.allreduce("not a buffer", GRADS)
    with pytest.raises(RuntimeError, match="communication thread failed"):
        request.wait()
    with pytest.raises(RuntimeError):
        collectives.wait_all()


def test_buckets_group_consecutive_layers_last_first_until_the_size_is_reached():
    layout = Layout([100, 200, 300, 50, 10], 1)          # 20200, 60300, 15050, 510 elements
    assert [[u.index for u in b] for b in layout.gradient_buckets(4, 0)] == [[3], [2], [1], [0]]
    assert [[u.index for u in b] for b in layout.gradient_buckets(4, 25)] == [[3, 2, 1, 0]]
    # 4 bytes each: layer 3 + 2 = 62 kB, then layer 1 = 241 kB, then layer 0
    assert [[u.index for u in b] for b in layout.gradient_buckets(4, 0.2)] == [[3, 2, 1], [0]]
    assert [[u.index for u in b] for b in layout.gradient_buckets(4, 0.05)] == [[3, 2], [1], [0]]
