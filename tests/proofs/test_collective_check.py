"""--check-collectives under real MPI: ranks that agree pass through, ranks that disagree stop.

Ranks really disagree here: rank 0 calls the communicator with one size (or kind) from one line,
the other ranks with another size (or kind) from another line. Without the check this would hang
or mix unrelated buffers; with it every rank raises SystemExit(ExitCode.COLLECTIVE_MISMATCH) and
rank 0 prints one line naming both call sites.
"""

import numpy as np
import pytest

from zerompi.util.exit_codes import ExitCode
from zerompi.comm import Communicator
from zerompi.observe import guards_for
from zerompi.ledger import GRADS
from zerompi.overlap.thread import ThreadedCollectives

THIS_FILE = "tests/proofs/test_collective_check.py"


def checked_comm():
    return Communicator(guards=guards_for(check_collectives=True))


def line_of(marker):
    """The line number of the line of this file that ends with `# marker`."""
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if line.rstrip().endswith(f"# {marker}"))


@pytest.mark.mpi(min_size=1)
def test_agreeing_ranks_pass_and_the_results_are_unchanged():
    comm = checked_comm()
    checked_before = comm.check.calls                             # the node map, when it was built
    buf = np.full(7, comm.rank + 1.0)
    comm.allreduce_sum(buf, "grads")
    assert np.all(buf == comm.size * (comm.size + 1) / 2)
    full = np.zeros(3 * comm.size, np.float32)
    comm.allgather(np.full(3, comm.rank, np.float32), full, "params")
    assert np.array_equal(full, np.repeat(np.arange(comm.size, dtype=np.float32), 3))
    assert comm.check.calls == checked_before + 2
    assert comm.ledger.totals({"grads", "params"})[0] == 2        # the headers are not ledgered


@pytest.mark.mpi(min_size=2)
def test_ranks_calling_different_sizes_stop_with_both_call_sites(capsys):
    comm = checked_comm()
    with pytest.raises(SystemExit) as stopped:
        if comm.rank == 0:
            comm.allreduce_sum(np.zeros(10), "grads")  # rank 0's call
        else:
            comm.allreduce_sum(np.zeros(12), "grads")  # the others' call
    assert stopped.value.code == ExitCode.COLLECTIVE_MISMATCH
    err = capsys.readouterr().err
    if comm.rank != 0:
        assert err == ""                                          # printed once, by rank 0
        return
    assert err.count("zerompi: error:") == 1, err
    others = "rank 1" if comm.size == 2 else "ranks " + ",".join(map(str, range(1, comm.size)))
    site_0, site_others = line_of("rank 0's call"), line_of("the others' call")
    assert f"rank 0: allreduce of 10 float64 (grads) at {THIS_FILE}:{site_0}" in err, err
    assert f"{others}: allreduce of 12 float64 (grads) at {THIS_FILE}:{site_others}" in err, err


@pytest.mark.mpi(min_size=2)
def test_ranks_calling_different_collectives_stop(capsys):
    comm = checked_comm()
    full = np.zeros(2 * comm.size)
    with pytest.raises(SystemExit) as stopped:
        if comm.rank == comm.size - 1:
            comm.allgather(np.zeros(2), full, "params")
        else:
            comm.reduce_scatter_sum(full, np.zeros(2), "grads")
    assert stopped.value.code == ExitCode.COLLECTIVE_MISMATCH
    err = capsys.readouterr().err
    if comm.rank == 0:
        assert err.count("zerompi: error:") == 1, err
        assert f"rank {comm.size - 1}: allgather of {2 * comm.size} float64 (params)" in err, err
        assert f"reduce_scatter of {2 * comm.size} float64 (grads)" in err, err
    # and the communicator still works afterwards: both exchanges completed on every rank
    buf = np.ones(3)
    comm.allreduce_sum(buf, "grads")
    assert np.all(buf == comm.size)


@pytest.mark.mpi(min_size=2)
def test_a_mismatch_on_the_communication_thread_stops_the_same_way(capsys):
    """--overlap: the check runs on the thread, names the line that submitted the call, and
    the main thread exits with the same status (not an error of the thread)."""
    collectives = ThreadedCollectives(checked_comm())
    with pytest.raises(SystemExit) as stopped:
        if collectives.rank == 0:
            collectives.allreduce(np.zeros(10), GRADS).wait()  # rank 0's queued call
        else:
            collectives.allreduce(np.zeros(12), GRADS).wait()  # the others' queued call
    assert stopped.value.code == ExitCode.COLLECTIVE_MISMATCH
    err = capsys.readouterr().err
    if collectives.rank == 0:
        site_0, site_others = line_of("rank 0's queued call"), line_of("the others' queued call")
        assert err.count("zerompi: error:") == 1, err
        assert f"at {THIS_FILE}:{site_0}" in err and f"at {THIS_FILE}:{site_others}" in err, err
