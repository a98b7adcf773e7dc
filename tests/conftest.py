"""Fixtures shared by the single-process tests."""
import signal

import pytest


@pytest.fixture
def no_hang():
    """Fail a test whose blocking open would hang, after 5 s, instead of hanging the suite."""
    def timeout(signum, frame):
        raise TimeoutError("blocked for 5 s")
    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(5)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="session")
def emulated_cluster():
    """A 4-node emulated cluster (tests/support/cluster.py) for the whole session; runs use the
    first 2 or all 4 nodes. Cluster number 1, or $ZEROMPI_TEST_CLUSTER (0-89): test sessions that
    run side by side need different numbers."""
    from support.cluster import emulated_cluster as cluster, session_number
    with cluster(number=session_number(), nodes=4) as c:
        yield c
