"""zerompi.overlap on one rank: the queue runs calls in order, reports a failed call at the next
wait instead of hanging, and the buckets group layers as documented."""
import numpy as np
import pytest

from zerompi.comm import Communicator
from zerompi.layout import Layout
from zerompi.overlap import CommQueue, gradient_buckets


@pytest.mark.parametrize("enabled", [False, True], ids=["off", "on"])
def test_calls_run_in_submission_order_and_wait_all_finishes_them(enabled):
    comm = Communicator()
    queue = CommQueue(comm, enabled)
    buffers = [np.full(1000, float(i)) for i in range(20)]
    tickets = [queue.submit("allreduce_sum", b, "grads") for b in buffers]
    queue.wait(tickets[3])
    assert queue.finished >= 4
    queue.wait_all()
    assert queue.finished == queue.submitted == 20 and tickets == list(range(20))
    assert all(np.all(b == i) for i, b in enumerate(buffers))     # N = 1: a sum over one rank
    assert comm.ledger.totals({"grads"})[0] == 20                 # both threads count into one ledger


def test_a_failed_call_on_the_thread_raises_at_the_next_wait():
    queue = CommQueue(Communicator(), True)
    ticket = queue.submit("allreduce_sum", "not a buffer", "grads")
    with pytest.raises(RuntimeError, match="communication thread failed"):
        queue.wait(ticket)
    with pytest.raises(RuntimeError):
        queue.wait_all()


def test_buckets_group_consecutive_layers_last_first_until_the_size_is_reached():
    layers = Layout([100, 200, 300, 50, 10], 1).layers   # 20200, 60300, 15050, 510 elements
    assert [[u.index for u in b] for b in gradient_buckets(layers, 4, 0)] == [[3], [2], [1], [0]]
    assert [[u.index for u in b] for b in gradient_buckets(layers, 4, 25)] == [[3, 2, 1, 0]]
    # 4 bytes each: layer 3 + 2 = 62 KB, then layer 1 = 241 KB, then layer 0
    assert [[u.index for u in b] for b in gradient_buckets(layers, 4, 0.2)] == [[3, 2, 1], [0]]
    assert [[u.index for u in b] for b in gradient_buckets(layers, 4, 0.05)] == [[3, 2], [1], [0]]
