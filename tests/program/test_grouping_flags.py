"""--shard-group and --hpz on the command line: what they accept, and one line for what they do not
(zerompi/train/options/grouping.py). The runs themselves: tests/proofs/test_hierarchical_equals_single_process_adamw.py
and tests/proofs/test_hierarchy_on_nodes.py."""
import pytest

from zerompi.train.options.config import parse_args
from zerompi.train.options.grouping import grouping_error


def error(argv, num_ranks=8):
    return grouping_error(parse_args(argv, 0, num_ranks), num_ranks)


@pytest.mark.parametrize("argv", [[], ["--shard-group", "world"], ["--shard-group", "node"], ["--shard-group", "4"],
                                  ["--shard-group", "1", "--stage", "1"], ["--hpz"], ["--hpz", "--stage", "3"]])
def test_valid_groupings_pass(argv):
    assert error(argv) is None


@pytest.mark.parametrize("argv,words", [
    (["--shard-group", "3"], "--shard-group 3 does not divide the 8 ranks"),
    (["--shard-group", "0"], "--shard-group 0 does not divide"),
    (["--shard-group", "nodes"], "must be world, node or a number"),
    (["--shard-group", "-2"], "must be world, node or a number"),
    (["--shard-group", "2", "--stage", "0"], "needs --stage 1, 2 or 3"),
    (["--hpz", "--stage", "2"], "needs --stage 3"),
    (["--hpz", "--shard-group", "node"], "choose one"),
    (["--hpz", "--overlap"], "leave --overlap off"),
    (["--shard-group", "2", "--overlap"], "leave --overlap off"),
])
def test_invalid_groupings_are_one_line(argv, words):
    message = error(argv)
    assert words in message and "\n" not in message
