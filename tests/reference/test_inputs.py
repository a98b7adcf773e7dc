"""zerompi/util/inputs.py: only regular files are read (a FIFO never blocks), and declared sizes are
checked against the memory this process may still use."""
import os
import resource
import subprocess
import sys

import pytest

from zerompi.util.inputs import available_bytes, check_fits, open_regular


class Refused(ValueError):
    pass


def test_a_regular_file_is_read(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("hello")
    with open_regular(str(path), Refused, "r") as f:
        assert f.read() == "hello"


@pytest.mark.parametrize("make, kind", [
    (lambda p: os.mkfifo(p), "a FIFO"),
    (lambda p: os.mkdir(p), "a folder"),
])
def test_a_fifo_or_folder_is_refused_without_blocking(tmp_path, make, kind, no_hang):
    path = str(tmp_path / "x")
    make(path)
    with pytest.raises(Refused, match=f"x: is {kind}"):
        open_regular(path, Refused)


def test_a_device_and_a_missing_file_are_refused():
    with pytest.raises(Refused, match="is a character device"):
        open_regular("/dev/zero", Refused)
    with pytest.raises(Refused, match="no such file"):
        open_regular("/nonexistent/zerompi-input", Refused)


def test_the_address_space_limit_bounds_what_may_be_allocated():
    """Under ulimit -v, available_bytes is below the limit and check_fits refuses beyond it."""
    limit = 4 << 30
    code = ("import resource; from zerompi.util.inputs import available_bytes, check_fits;"
            f"resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}));"
            "a = available_bytes(); print(a);"
            "check_fits(a - (1 << 20), 'small', ValueError);"
            "check_fits(a + (64 << 20), 'big', ValueError)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    available = int(run.stdout.split()[0])
    assert 0 < available < limit
    assert "ValueError: big needs" in run.stderr and "more than the" in run.stderr


def test_ranks_on_a_node_share_its_memory():
    one, four = available_bytes(1), available_bytes(4)
    if resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY and one is not None:
        assert four <= one // 4 * 1.05
    with pytest.raises(Refused, match="huge needs .* more than"):
        check_fits(10 ** 18, "huge", Refused)
