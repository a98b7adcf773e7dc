"""Fixtures shared by the tests, and the multi-rank harness.

Tests are grouped by what they prove (tests/proofs/: what README's "What is proven" cites, with the
oracle, reference.py), the rest as the package's parts (tests/reference/, tests/program/), and
tests/repository/ for the repository itself. A multi-rank test is one marked
`@pytest.mark.mpi(min_size=K)` (pytest-mpi), wherever it lives: tests/run_all.py runs
`mpirun -n N python tests/support/mpi_launch.py --with-mpi -m mpi tests` for each N; a plain
`pytest tests` skips them.

`--in-process-ranks N` runs the tests marked both `mpi` and `in_process` on N ranks that are threads of
the pytest process (zerompi/inprocess/; tests/support/helpers.py's world() is each thread's rank),
with pytest-mpi turned off (`-p no:mpi`): tests/run_all.py runs the numerical ones so for every N,
and keeps them on mpirun at N = 1 and 2. A test that needs more ranks than N (`min_size`) skips.

Under --with-mpi, a failing assert on one rank would leave the others waiting in their next
collective forever. So when a test fails on any rank, that rank prints its report and calls
MPI_Abort, which ends every rank of the job at once with a non-zero exit code: a failure, never
a hang.
"""
import os
import signal
import sys
import time

import pytest

IN_PROCESS_SKIP = "needs {} in-process ranks, this run has {}"      # tests/run_all.py reads it as deferred


def pytest_addoption(parser):
    parser.addoption("--in-process-ranks", type=int, default=0, metavar="N",
                     help="run the tests marked mpi and in_process on N in-process ranks (zerompi/inprocess/)")


def pytest_configure(config):
    config.addinivalue_line("markers", "in_process: a multi-rank test that also runs on in-process ranks")
    if not config.pluginmanager.has_plugin("mpi"):                  # -p no:mpi
        config.addinivalue_line("markers", "mpi(min_size): a multi-rank test (pytest-mpi's marker)")
    if config.getoption("--in-process-ranks"):
        from helpers import IN_PROCESS_RANKS
        from zerompi.mpi import init_mpi
        os.environ[IN_PROCESS_RANKS] = str(config.getoption("--in-process-ranks"))   # before modules read N
        init_mpi()            # modules that stay on MPI still ask MPI questions when collected (pytest-mpi is off)


def pytest_collection_modifyitems(config, items):
    n = config.getoption("--in-process-ranks")
    for item in items if n else ():
        marker = item.get_closest_marker("mpi")
        need = marker.kwargs.get("min_size", 1) if marker is not None else 1
        if need > n:
            item.add_marker(pytest.mark.skip(reason=IN_PROCESS_SKIP.format(need, n)))


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Under --in-process-ranks, an in_process test's function runs on every rank's thread."""
    n = pyfuncitem.config.getoption("--in-process-ranks")
    if not n or "in_process" not in pyfuncitem.keywords:
        return None
    from helpers import on_ranks
    on_ranks(pyfuncitem.obj, {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}, n)
    return True


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and item.config.getoption("with_mpi", False):
        from mpi4py import MPI
        if MPI.COMM_WORLD.Get_size() > 1:
            rank = MPI.COMM_WORLD.Get_rank()
            sys.stderr.write(f"\n[rank {rank}] FAILED {item.nodeid} ({report.when})\n{report.longreprtext}\n"
                             f"[rank {rank}] calling MPI_Abort so that no other rank hangs\n")
            sys.stderr.flush()
            time.sleep(0.5)      # the launcher forwards the report before the abort ends it (lost under load)
            MPI.COMM_WORLD.Abort(1)

