"""Temporary files (zerompi/util/atomic.py): created exclusively beside their output, named
with the host and pid of the process writing them, removed on every failure path, and removed by
a later writer of the same output once their process has ended (never a live run's, never one of
another host, which cannot be checked from here)."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from test_cli import _mpirun, train_ok
from zerompi.util.atomic import atomic_file, create_temporary


def ended_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_temporary_names_its_host_and_pid_and_an_ended_writers_is_removed_by_the_next(tmp_path):
    host = socket.gethostname()
    out = tmp_path / "t.json"
    dead = tmp_path / f".t.json.tmp-{host}-{ended_pid()}-0a0b0c0d"
    live = tmp_path / f".t.json.tmp-{host}-{os.getppid()}-01020304"        # pytest's parent: alive
    elsewhere = tmp_path / f".t.json.tmp-other-host-{ended_pid()}-05060708"
    other_output = tmp_path / f".w.npz.tmp-{host}-{ended_pid()}-090a0b0c"
    old_form = tmp_path / ".t.json.tmp-0d0e0f10"                              # no host: cannot be judged
    for path in (dead, live, elsewhere, other_output, old_form):
        path.write_bytes(b"partial")
    handle, tmp = create_temporary(str(out))
    os.close(handle)
    assert os.path.basename(tmp).startswith(f".t.json.tmp-{host}-{os.getpid()}-")
    assert not dead.exists() and live.exists() and elsewhere.exists() and other_output.exists() and old_form.exists()
    os.unlink(tmp)


def test_a_failed_write_leaves_no_temporary(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_file(str(tmp_path / "out.json"), "w") as f:
            f.write("half")
            raise RuntimeError("the writer failed")
    assert os.listdir(tmp_path) == []


def test_a_trace_killed_mid_run_leaves_a_temporary_the_next_run_removes(tmp_path):
    """kill -9 during a --trace run left a randomly named temporary file that no later run removed."""
    flags = ["--steps", 100000, "--hidden", 8, "--batch-size", 16, "--log-every", 0, "--report", "none",
             "--trace", "t.json"]
    process = subprocess.Popen([_mpirun(), "-n", "2", sys.executable, "-m", "zerompi.train", *map(str, flags)],
                               cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not [n for n in os.listdir(tmp_path) if n.startswith(".t.json.tmp-")]:
            assert time.monotonic() < deadline and process.poll() is None, "the run never started its trace"
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        os.killpg(process.pid, signal.SIGKILL)          # mpirun and its ranks: nothing runs its clean-up
        process.wait()
    left = [n for n in os.listdir(tmp_path) if n.startswith(".t.json.tmp-")]
    assert len(left) == 1 and left[0].startswith(f".t.json.tmp-{socket.gethostname()}-"), left
    train_ok(2, *flags[:1], 4, *flags[2:], cwd=tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["t.json"]


def test_an_output_that_is_a_link_to_a_file_is_written_through_it(tmp_path):
    """--save-weights lnk.npz (lnk.npz -> shared/model.npz) replaced the link by a file of its own
    and left the shared model stale; --metrics wrote through the link: now every output does."""
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "model.npz").write_bytes(b"old")
    (tmp_path / "shared" / "t.json").write_bytes(b"old")
    os.symlink("shared/model.npz", tmp_path / "lnk.npz")
    os.symlink("shared/t.json", tmp_path / "t.json")
    train_ok(2, "--steps", 2, "--hidden", 4, "--batch-size", 12, "--log-every", 0, "--report", "none",
             "--save-weights", "lnk.npz", "--trace", "t.json", cwd=tmp_path)
    assert os.path.islink(tmp_path / "lnk.npz") and os.path.islink(tmp_path / "t.json")
    assert (tmp_path / "shared" / "model.npz").read_bytes()[:2] == b"PK"          # the consolidated .npz
    assert (tmp_path / "shared" / "t.json").read_bytes().startswith(b'{"traceEvents"')
    assert sorted(os.listdir(tmp_path / "shared")) == ["model.npz", "t.json"]     # no temporary left
