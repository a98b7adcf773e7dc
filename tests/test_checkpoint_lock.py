"""zerompi/checkpoint/lock.py directly: what a lock file may hold, and a holder that is just ending."""
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from zerompi.checkpoint import lock
from zerompi.checkpoint.files import CheckpointError


@pytest.mark.parametrize("pid", ["99999999999999999999999", "\u0663\u0664", "-5", "0", "12x"])
def test_a_lock_whose_pid_is_no_pid_is_refused_in_one_line(tmp_path, pid):
    """A pid too large for the kernel gave an OverflowError traceback; Arabic-Indic digits read as 34."""
    (tmp_path / ".lock").write_text(f"{socket.gethostname()} {pid}\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match="not a lock zerompi wrote"):
        lock.take_lock(str(tmp_path))


def test_a_holder_on_this_host_that_ends_within_the_grace_period_is_taken_over(tmp_path):
    """mpirun returns before an aborted rank 0 has exited: a run requeued at once found the lock
    of a process about to end and was refused."""
    ending = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])
    threading.Thread(target=ending.wait, daemon=True).start()        # reaped as its parent would
    (tmp_path / ".lock").write_text(f"{socket.gethostname()} {ending.pid}\n")
    start = time.monotonic()
    note = lock.take_lock(str(tmp_path))
    ending.wait()
    assert note is not None and "took over the stale lock" in note
    assert time.monotonic() - start < lock.GRACE_SECONDS + 1


def test_a_holder_that_keeps_running_is_refused_after_the_grace_period(tmp_path, monkeypatch):
    monkeypatch.setattr(lock, "GRACE_SECONDS", 0.5)
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / ".lock").write_text(f"{socket.gethostname()} {running.pid}\n")
        with pytest.raises(CheckpointError, match=f"in use by another run .*pid {running.pid}"):
            lock.take_lock(str(tmp_path))
        assert os.path.exists(tmp_path / ".lock")
    finally:
        running.kill()
        running.wait()
