"""zerompi/train/loop/lock.py directly: what a lock file may hold, and a holder that is just ending."""
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from zerompi.train.loop import lock
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
    note = lock.take_lock(str(tmp_path))
    ending.wait()
    assert note is not None and "took over the stale lock" in note and "has ended" in note


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


# ----------------------------------------------------------------------------------------------
# Locks that clear: a write that failed, an empty lock, a reused pid, a Slurm job requeued elsewhere
# ----------------------------------------------------------------------------------------------

def fill(folder):
    """Fill the file system under folder to the last byte."""
    with open(folder / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def test_a_lock_whose_write_fails_on_a_full_disk_is_removed_and_named_in_one_line(tmp_path):
    """The empty lock a full disk left refused every later run, with 'None: No space left on device'."""
    from test_observability import small_tmpfs
    with small_tmpfs(tmp_path / "full", size="4k") as full:
        fill(full)
        with pytest.raises(CheckpointError) as refused:
            lock.take_lock(str(full))
        assert str(refused.value) == f"{full}/.lock: cannot be written: No space left on device"
        assert sorted(os.listdir(full)) == ["filler"]
        os.unlink(full / "filler")
        assert lock.take_lock(str(full)) is None                  # the disk has room again: taken
        lock.release_locks()


def test_an_empty_lock_older_than_a_few_seconds_is_stale(tmp_path):
    (tmp_path / ".lock").write_text("")
    old = time.time() - 10 * lock.EMPTY_STALE_SECONDS
    os.utime(tmp_path / ".lock", (old, old))
    note = lock.take_lock(str(tmp_path))
    assert note is not None and "took over" in note and "empty" in note, note
    assert (tmp_path / ".lock").read_text().split()[:2] == [socket.gethostname(), str(os.getpid())]
    lock.release_locks()


def test_an_empty_lock_that_stays_empty_is_stale_after_the_wait(tmp_path, monkeypatch):
    """An empty lock seen just now may be one being written this instant: looked at again, and
    taken over only once it has stayed empty for EMPTY_STALE_SECONDS."""
    monkeypatch.setattr(lock, "EMPTY_STALE_SECONDS", 0.5)
    (tmp_path / ".lock").write_text("")
    start = time.monotonic()
    note = lock.take_lock(str(tmp_path))
    assert note is not None and "empty" in note
    assert time.monotonic() - start >= 0.5
    lock.release_locks()


def test_an_empty_lock_that_is_written_meanwhile_belongs_to_that_run(tmp_path, monkeypatch):
    monkeypatch.setattr(lock, "EMPTY_STALE_SECONDS", 2.0)
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / ".lock").write_text("")
        writer = threading.Timer(0.3, lambda: (tmp_path / ".lock").write_text(
            f"{socket.gethostname()} {running.pid} started={lock.process_start(running.pid)}\n"))
        writer.start()
        monkeypatch.setattr(lock, "GRACE_SECONDS", 0.2)
        with pytest.raises(CheckpointError, match=f"in use by another run .*pid {running.pid}"):
            lock.take_lock(str(tmp_path))
        writer.join()
    finally:
        running.kill()
        running.wait()


def test_a_lock_names_host_pid_start_time_and_the_slurm_job(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    assert lock.take_lock(str(tmp_path)) is None
    written = lock.Holder.parse((tmp_path / ".lock").read_text())
    assert written == lock.Holder(socket.gethostname(), os.getpid(), lock.process_start(os.getpid()), "4242", 3)
    assert written.started is not None
    lock.release_locks()
    assert not (tmp_path / ".lock").exists()


def test_a_live_pid_that_started_after_the_lock_was_written_is_a_reused_pid(tmp_path, monkeypatch):
    """pids are reused (after a reboot, in a container): the process now under the lock's pid is
    not the run that wrote it, so the lock is stale instead of 'in use by another run' forever."""
    monkeypatch.setattr(lock, "GRACE_SECONDS", 0.5)
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = lock.process_start(running.pid)
        boot, ticks = started.rsplit(":", 1)
        (tmp_path / ".lock").write_text(f"{socket.gethostname()} {running.pid} started={boot}:{int(ticks) - 1}\n")
        note = lock.take_lock(str(tmp_path))
        assert note is not None and f"pid {running.pid}" in note and "another process" in note, note
        lock.release_locks()
        (tmp_path / ".lock").write_text(f"{socket.gethostname()} {running.pid} started={started}\n")
        with pytest.raises(CheckpointError, match=f"in use by another run .*pid {running.pid}"):
            lock.take_lock(str(tmp_path))                      # the very process that wrote it: live
    finally:
        running.kill()
        running.wait()


REQUEUED = [("4242", "1", "4242", 0, True),       # this job, before its restart: its node failed
            ("4242", "2", "4242", 1, True),
            ("4242", "1", "4242", 1, False),      # this job, this restart: another rank 0 of it?
            ("4242", "1", "4243", 0, False),      # another job
            (None, None, "4242", 0, False),       # not under Slurm now
            ("4242", "1", None, 0, False)]        # the lock was not written under Slurm


@pytest.mark.parametrize("job, restart, lock_job, lock_restart, taken", REQUEUED)
def test_a_lock_from_another_host_is_taken_over_only_by_its_own_slurm_job_after_a_restart(
        tmp_path, monkeypatch, job, restart, lock_job, lock_restart, taken):
    for name, value in (("SLURM_JOB_ID", job), ("SLURM_RESTART_COUNT", restart)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    slurm = f" slurm={lock_job}:{lock_restart}" if lock_job else ""
    (tmp_path / ".lock").write_text(f"crashed-node 77 started=ab:12{slurm}\n")
    if taken:
        note = lock.take_lock(str(tmp_path))
        assert note is not None and "crashed-node" in note and f"Slurm job {lock_job}" in note, note
        assert f"restart {restart}" in note, note
        lock.release_locks()
    else:
        with pytest.raises(CheckpointError, match="locked by a run on host crashed-node .*remove"):
            lock.take_lock(str(tmp_path))
        assert (tmp_path / ".lock").read_text().startswith("crashed-node 77")


def test_a_lock_of_the_old_format_is_judged_as_before(tmp_path, monkeypatch):
    monkeypatch.setattr(lock, "GRACE_SECONDS", 0.2)
    (tmp_path / ".lock").write_text("elsewhere 77\n")
    with pytest.raises(CheckpointError, match="locked by a run on host elsewhere \\(pid 77\\)"):
        lock.take_lock(str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / ".lock").write_text(f"{socket.gethostname()} {dead.pid}\n")
    note = lock.take_lock(str(tmp_path))
    assert note is not None and f"pid {dead.pid}" in note and "has ended" in note
    lock.release_locks()


def test_a_run_that_stalled_between_creating_and_writing_its_lock_gives_way(tmp_path, monkeypatch):
    """Run A created the lock and stalled before writing it; run B found it empty for 5 s and took
    it over: A wrote its line into the file B had removed, and both held the folder."""
    real_write = os.write
    other = f"{socket.gethostname()} 1 started=x:1\n"

    def stalled_write(fd, data):
        os.unlink(tmp_path / ".lock")                    # what B's takeover does meanwhile
        (tmp_path / ".lock").write_text(other)
        return real_write(fd, data)
    monkeypatch.setattr(lock.os, "write", stalled_write)
    with pytest.raises(CheckpointError, match="taken over by another run while this one was writing it"):
        lock.take_lock(str(tmp_path))
    assert (tmp_path / ".lock").read_text() == other and lock._held == []


@pytest.mark.parametrize("target", ["stale", "dangling"])
def test_a_lock_that_is_a_symbolic_link_is_named_as_one(tmp_path, target):
    """A .lock symlink to a stale lock line read as 'other runs are starting'; a dangling one as
    'no such file'."""
    (tmp_path / "elsewhere").write_text(f"{socket.gethostname()} 1 started=x:1\n")
    os.symlink(tmp_path / ("elsewhere" if target == "stale" else "nothing"), tmp_path / ".lock")
    with pytest.raises(CheckpointError, match="a symbolic link, not a lock zerompi wrote.*remove"):
        lock.take_lock(str(tmp_path))
    assert os.path.islink(tmp_path / ".lock")
