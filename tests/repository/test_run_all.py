"""tests/run_all.py's summary counts what pytest reports, skipped tests included, with their reasons."""
import collections
import sys
import textwrap

from run_all import run, summary, tally

SAMPLE = textwrap.dedent('''\
    import pytest

    def test_passes():
        pass

    @pytest.mark.parametrize("n", [1, 2, 3])
    def test_needs_a_slurm(n):
        pytest.skip("no Slurm here")

    def test_needs_a_gpu():
        pytest.skip("no GPU here: CuPy is not installed")

    def test_fails():
        assert 1 == 2
    ''')


def test_a_real_pytest_run_is_counted_with_its_skip_reasons(tmp_path):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    passed, failed, skipped, reasons, ok = run("sample", [sys.executable, "-m", "pytest", "-q", "-rs", "-p",
                                                          "no:cacheprovider", str(tmp_path)])
    assert (passed, failed, skipped, ok) == (1, 1, 4, False)
    assert reasons == {"no Slurm here": 3, "no GPU here: CuPy is not installed": 1}


def test_the_summary_sums_the_runs_and_groups_the_skip_reasons():
    first = (10, 0, 3, collections.Counter({"no Slurm here": 3}), True)
    second = (5, 1, 2, collections.Counter({"no Slurm here": 1, "needs 4 ranks": 1}), False)
    assert summary([first, second]).splitlines() == [
        "all: 15 passed, 1 failed, 5 skipped, 0 deferred (a multi-rank test skipped in a run without the ranks it "
        "needs, and run in another)",
        "  skipped    4: no Slurm here",
        "  skipped    1: needs 4 ranks",
    ]


def test_multi_rank_tests_waiting_for_a_later_run_are_deferred_not_skipped():
    """Multi-rank tests skipped in a run without the ranks they need run in a later one: deferred, apart from the skips."""
    reasons = collections.Counter({"need --with-mpi option to run": 290, "no GPU here": 1,
                                   "Test requires 4 MPI processes, only 2 MPI processes specified, skipping test": 8,
                                   "Test requires 16 MPI processes, only 8 MPI processes specified, skipping test": 2,
                                   "needs 4 in-process ranks, this run has 2": 5, "needs 9 in-process ranks, this run has 8": 1})
    lines = summary([(100, 0, 307, reasons, True)]).splitlines()
    assert lines[0].startswith("all: 100 passed, 0 failed, 4 skipped, 303 deferred"), lines
    assert lines[1:] == ["  skipped    2: Test requires 16 MPI processes, only 8 MPI processes specified, skipping test",
                         "  skipped    1: no GPU here",
                         "  skipped    1: needs 9 in-process ranks, this run has 8",
                         "  deferred 290: need --with-mpi option to run",
                         "  deferred   8: Test requires 4 MPI processes, only 2 MPI processes specified, skipping test",
                         "  deferred   5: needs 4 in-process ranks, this run has 2"]


def test_a_line_without_a_summary_counts_nothing():
    assert tally(["collected 0 items\n"]) == (0, 0, 0, collections.Counter())


def test_a_run_killed_at_its_time_limit_counts_as_failed():
    """The limit kills the run before pytest prints its summary: the total must still say it failed
    (it said "0 failed" while the run had failed)."""
    passed, failed, skipped, reasons, ok = run("slow", [sys.executable, "-c", "import time; time.sleep(30)"],
                                               limit_seconds=1)
    assert (failed, ok) == (1, False)
