"""The file tier at the edges (zerompi/offload/stores.py, zerompi/train/loop/offload_folder.py):
checkpoints keep their format and load with or without offload; the scratch files never outlive
their run (kill -9 included); two runs cannot share an offload folder; a folder that would touch a
checkpoint or an input is refused; a full disk and a file cut short mid-run are one line, exit 8,
the last checkpoint whole; a signal ends the run as without offload.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import make_batches, run_steps, train_zero
from test_cli import ERROR_MARK, _mpirun, launch, load_weights, run_command, train_ok
from zerompi.comm import Communicator
from zerompi.offload import FileTier, OffloadedAdamConfig, OffloadError
from zerompi.train.loop.lock import this_process
from zerompi.util.exit_codes import ExitCode

FLAGS = ("--hidden", "48,48", "--batch-size", "24", "--report", "none")
DRIVER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "support", "fault_driver.py")


def offload(folder):
    return ("--offload-optimizer", "file", "--offload-dir", folder)


def scratch_files(folder):
    return sorted(name for name in os.listdir(folder) if name.startswith("zerompi-offload"))


def one_error(run):
    errors = [line for line in run.output.splitlines() if ERROR_MARK in line]
    assert len(errors) == 1 and "Traceback" not in run.output, run.describe()
    return errors[0]


def test_checkpoints_load_with_or_without_offload(tmp_path):
    """3 steps, a checkpoint, 3 more: offload on either side of the checkpoint, or neither, saves the
    same weights bit for bit (N = 2, stage 3); a checkpoint written with offload at (2, stage 3)
    resumes at (3, stage 1) with offload and at (3, stage 2) without, to the same weights within
    float32 reduction order."""
    folder = tmp_path / "offload"
    folder.mkdir()
    train_ok(2, *FLAGS, "--steps", 6, "--save-weights", tmp_path / "straight.npz", cwd=tmp_path)
    expected = load_weights(tmp_path / "straight.npz")
    for name, first, second in (("on-off", offload(folder), ()), ("off-on", (), offload(folder))):
        save = tmp_path / name
        train_ok(2, *FLAGS, *first, "--steps", 3, "--save-dir", save, cwd=tmp_path)
        train_ok(2, *FLAGS, *second, "--steps", 6, "--save-dir", save, "--resume", "latest",
                 "--save-weights", tmp_path / f"{name}.npz", cwd=tmp_path)
        got = load_weights(tmp_path / f"{name}.npz")
        assert all(np.array_equal(got[k], expected[k]) for k in expected), name
    for n, stage, flags in ((3, 1, offload(folder)), (3, 2, ())):
        weights = tmp_path / f"n{n}.npz"
        train_ok(n, *FLAGS, *flags, "--stage", stage, "--steps", 6, "--resume", tmp_path / "on-off" / "step_00000003",
                 "--save-weights", weights, cwd=tmp_path)
        got = load_weights(weights)
        assert all(np.allclose(got[k], expected[k], rtol=1e-5, atol=1e-6) for k in expected)
    assert scratch_files(folder) == []


def test_stage_3_with_its_parameters_in_a_file_saves_the_weights_of_the_run_in_memory(tmp_path):
    """--offload-params file, the optimizer in a file or (a CPU's) host memory, N = 3 (padded
    layers), 2 micro-batches: the same weights bit for bit as in memory; nothing of the parameters
    in memory; the report's file reads and writes per step equal the formula; a checkpoint written
    with it resumes with it and without, to the same weights; no scratch file left."""
    folder = tmp_path / "offload"
    folder.mkdir()
    common = (*FLAGS, "--stage", 3, "--grad-accum", 2, "--hidden", "7,5", "--batch-size", 12)
    train_ok(3, *common, "--steps", 4, "--save-weights", tmp_path / "in_memory.npz", cwd=tmp_path)
    expected = load_weights(tmp_path / "in_memory.npz")
    for optimizer in ("file", "host"):
        save = tmp_path / f"ck-{optimizer}"
        flags = ("--offload-params", "file", "--offload-optimizer", optimizer, "--offload-dir", folder)
        run = train_ok(3, *common, "--steps", 2, *flags, "--save-dir", save, "--report", "json", cwd=tmp_path)
        report = json.loads(run.stdout)
        assert report["offloaded"] == (["optimizer", "params"] if optimizer == "file" else ["params"])
        for row in report["per_rank"]:
            assert row["params"] == 0
            assert row["file_read"] == row["file_read_formula"] and row["file_written"] == row["file_written_formula"]
        resumed = flags if optimizer == "host" else ()     # loaded into offloaded parameters, or in memory
        train_ok(3, *common, "--steps", 4, *resumed, "--save-dir", save, "--resume", "latest",
                 "--save-weights", tmp_path / f"{optimizer}.npz", cwd=tmp_path)
        got = load_weights(tmp_path / f"{optimizer}.npz")
        assert all(np.array_equal(got[k], expected[k]) for k in expected), optimizer
    assert scratch_files(folder) == []


def test_a_folder_locked_by_a_live_run_is_refused_and_a_dead_runs_files_are_removed(tmp_path):
    folder = tmp_path / "offload"
    folder.mkdir()
    lock = folder / f".zerompi-offload.{socket.gethostname()}.lock"
    lock.write_text(this_process().line())                 # held by this (live) test process
    run = launch(2, *FLAGS, "--steps", 2, *offload(folder), cwd=tmp_path)
    assert run.returncode == ExitCode.BAD_INPUT
    assert f"--offload-dir: {lock}: {folder} is in use by another run" in one_error(run)
    lock.unlink()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()                                            # its pid names no process now
    left = folder / f"zerompi-offload.{socket.gethostname()}.{dead.pid}.rank0"
    left.write_bytes(b"a dead run's state")
    kept = folder / "zerompi-offload.another-host.1.rank0"  # another host's: not this host's to judge
    kept.write_bytes(b"")
    train_ok(2, *FLAGS, "--steps", 2, *offload(folder), cwd=tmp_path)
    assert scratch_files(folder) == [kept.name]


def test_kill_9_leaves_no_scratch_file_and_the_next_run_takes_the_lock_over(tmp_path):
    """The files are unlinked while open: a run killed with SIGKILL leaves only its lock, which the
    next run takes over (one line saying so)."""
    folder = tmp_path / "offload"
    folder.mkdir()
    process = subprocess.Popen([_mpirun(), "-n", "2", sys.executable, "-m", "zerompi.train", *map(str, FLAGS),
                                "--steps", "100000", *offload(folder)], cwd=tmp_path, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not any(os.path.exists(f"/proc/{pid}") and open_scratch(pid) for pid in session_pids(process.pid)):
            assert time.monotonic() < deadline and process.poll() is None, "the run never opened its files"
            time.sleep(0.1)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10                        # the ranks may outlive mpirun an instant
    while session_pids(process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert scratch_files(folder) == [] and [p.name for p in folder.iterdir()] != []    # the lock stays
    run = train_ok(2, *FLAGS, "--steps", 2, *offload(folder), cwd=tmp_path)
    assert "took over the stale lock" in run.output
    assert list(folder.iterdir()) == []


def session_pids(root):
    """The pids of root's process tree (mpirun, its proxy, the ranks), root included."""
    parents = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            pass
    tree = [root] if root in parents else []
    for pid in tree:
        tree += [child for child, parent in parents.items() if parent == pid]
    return tree


def open_scratch(pid):
    try:
        return any("zerompi-offload" in os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


@pytest.mark.parametrize("where, expected", [
    ("missing", "--offload-dir {folder} is not a folder: create it"),
    ("in-save-dir", "--offload-dir {folder} is inside the checkpoint folder {save}: offload files are scratch"),
    ("holds-data", "--offload-dir {folder} holds --data {data}: keep the inputs outside it"),
])
def test_an_offload_folder_that_would_touch_a_checkpoint_or_an_input_is_refused(tmp_path, where, expected):
    save, data = tmp_path / "ck", tmp_path / "inputs" / "d.npz"
    data.parent.mkdir()
    rng = np.random.default_rng(0)
    np.savez(data, x=rng.standard_normal((48, 4)), y=rng.integers(0, 3, 48))
    folder = {"missing": tmp_path / "none", "in-save-dir": save / "scratch", "holds-data": data.parent}[where]
    if where == "in-save-dir":
        folder.mkdir(parents=True)
    run = launch(2, *FLAGS, "--steps", 2, "--data", data, "--save-dir", save, *offload(folder), cwd=tmp_path)
    assert run.returncode == ExitCode.BAD_INPUT
    assert expected.format(folder=folder, save=save, data=data) in one_error(run)
    assert sorted(p.name for p in data.parent.iterdir()) == ["d.npz"]


@pytest.mark.parametrize("flags, expected", [
    (("--offload-optimizer", "file"), "--offload-optimizer file needs --offload-dir DIR"),
    (("--offload-dir", "."), "--offload-dir is the folder of --offload-optimizer file or --offload-params file"),
    (("--offload-params", "file", "--offload-optimizer", "host"), "--offload-params file needs --offload-dir DIR"),
])
def test_the_file_tier_and_its_folder_come_together(tmp_path, flags, expected):
    run = launch(1, *FLAGS, "--steps", 1, *flags, cwd=tmp_path)
    assert run.returncode == ExitCode.BAD_INPUT and expected in one_error(run)


@pytest.mark.parametrize("flags", [("--stage", "2", "--offload-optimizer", "host"), ("--stage", "3"),
                                   ("--stage", "3", "--offload-optimizer", "host", "--overlap"),
                                   ("--stage", "3", "--offload-optimizer", "host", "--hpz")])
def test_parameter_offload_is_refused_where_it_does_not_exist(tmp_path, flags):
    """--offload-params: stage 3 only, with the optimizer offloaded, without --overlap or hpZ."""
    run = launch(1, *FLAGS, "--steps", 1, "--offload-params", "host", *flags, cwd=tmp_path)
    assert run.returncode == ExitCode.BAD_INPUT and "--offload-params is stage 3's" in one_error(run)


def test_the_host_tier_on_a_cpu_run_warns_once_and_trains_as_without(tmp_path):
    plain = train_ok(2, *FLAGS, "--steps", 3, "--save-weights", tmp_path / "a.npz", cwd=tmp_path)
    host = train_ok(2, *FLAGS, "--steps", 3, "--offload-optimizer", "host", "--save-weights", tmp_path / "b.npz",
                    cwd=tmp_path)
    assert host.output.count("zerompi: warning: --offload-optimizer host on a CPU run") == 1
    assert "warning" not in plain.output
    a, b = load_weights(tmp_path / "a.npz"), load_weights(tmp_path / "b.npz")
    assert all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("fault, ranks, expected", [
    ("disk-full", "1", "rank 1: cannot give the offload file {folder}/zerompi-offload."),
    ("truncate-offload", "0", "rank 0: the offload file {folder}/zerompi-offload."),
])
def test_a_full_disk_or_a_file_cut_short_is_one_line_exit_8_and_the_checkpoint_stays_whole(tmp_path, fault, ranks,
                                                                                          expected):
    folder, save = tmp_path / "offload", tmp_path / "ck"
    folder.mkdir()
    run = run_command([_mpirun(), "-n", "2", sys.executable, DRIVER, fault, ranks, "4", *map(str, FLAGS),
                       "--steps", "8", "--save-dir", str(save), "--save-every", "2", *offload(folder)], cwd=tmp_path)
    assert run.returncode == ExitCode.OFFLOAD_FAILED, run.describe()
    line = one_error(run)
    assert expected.format(folder=folder) in line, line
    assert ("No space left on device" if fault == "disk-full" else "shorter than this run made it") in line
    if fault == "truncate-offload":                        # steps 2 and 4 were saved, whole
        assert sorted(os.listdir(save)) == ["latest", "step_00000002", "step_00000004"], os.listdir(save)
        train_ok(2, *FLAGS, "--steps", 6, "--save-dir", save, "--resume", "latest", cwd=tmp_path)
    assert scratch_files(folder) == []


def test_a_signal_with_save_dir_checkpoints_and_exits_4_leaving_no_scratch(tmp_path):
    folder, save = tmp_path / "offload", tmp_path / "ck"
    folder.mkdir()
    run = run_command([_mpirun(), "-n", "2", sys.executable, DRIVER, "signal:TERM:mpirun", "0", "3", *map(str, FLAGS),
                       "--steps", "50", "--save-dir", str(save), *offload(folder)], cwd=tmp_path)
    assert run.returncode == ExitCode.PREEMPTED, run.describe()
    assert "step_00000004" in os.listdir(save) and scratch_files(folder) == []


def test_an_io_error_of_the_io_thread_is_raised_in_the_step_that_needs_the_tile(tmp_path):
    """A write that fails on the I/O thread (here: the file opened read-only under the store) is
    raised in the main thread, as an OffloadError of one line, by the step that needs its buffer
    again, or by the next finish()."""
    batches = make_batches([12, 37, 53, 7], 2, rows=24)
    adam = OffloadedAdamConfig(tier=FileTier(str(tmp_path), 0), tile=300)
    engine, _ = train_zero(1, [12, 37, 53, 7], np.float32, batches[:1], Communicator(), adam=adam)
    store = engine.stage.adam.store
    (tmp_path / "copy").write_bytes(os.pread(store.fd, os.fstat(store.fd).st_size, 0))
    read_only = os.open(tmp_path / "copy", os.O_RDONLY)   # reads as the file does; writes fail
    writable, store.fd = store.fd, read_only
    try:
        with pytest.raises(OffloadError, match=r"^cannot write the offload file .*: Bad file descriptor$") as raised:
            run_steps(engine, batches[1:])
        assert "\n" not in str(raised.value)
    finally:
        store.fd = writable
        os.close(read_only)


def test_a_file_cut_short_while_writes_are_in_flight_is_found_though_they_fill_it_again(tmp_path):
    """Tiles written after the cut extend the file to its size again, over holes that read as zeros:
    the next finish() finds the holes (fewer blocks than posix_fallocate gave it) and says so."""
    adam = OffloadedAdamConfig(tier=FileTier(str(tmp_path), 0), tile=300)
    engine, _ = train_zero(1, [12, 37, 53, 7], np.float32, make_batches([12, 37, 53, 7], 1, rows=24),
                           Communicator(), adam=adam)
    store = engine.stage.adam.store
    if store.blocks == 0:
        pytest.skip("this file system does not allocate the whole file at posix_fallocate")
    store.start_step()
    for k, (lo, hi, tile) in enumerate(store.tiles_of(slice(0, store.numel))):
        if k == store.tile_count - 1:                       # every read done; writes of tiles in flight
            os.ftruncate(store.fd, 0)                       # another process, through /proc/PID/fd
    with pytest.raises(OffloadError, match=r"is shorter than this run made it \(cut to \d+ bytes, or holes"):
        store.finish()
    assert os.fstat(store.fd).st_size == store.count * store.numel * 4     # written to its size again


def test_a_parameter_file_cut_short_is_one_offload_error_in_the_step_that_reads_it(tmp_path):
    """--offload-params file: a parameter file cut by another process is found by the next read of
    a layer's shard, one line naming the file, not a wrong weight."""
    tier = FileTier(str(tmp_path), 0)
    adam = OffloadedAdamConfig(tier=tier, param_tier=tier)
    batches = make_batches([12, 37, 53, 7], 2, rows=24)
    engine, _ = train_zero(3, [12, 37, 53, 7], np.float32, batches[:1], Communicator(), adam=adam)
    engine.stage.param_shard.finish()                         # the update's write-backs done: then the cut
    os.ftruncate(engine.stage.param_shard.fd, 100)           # another process, through /proc/PID/fd
    with pytest.raises(OffloadError, match=r"zerompi-offload\..*\.params is shorter than this run made it") as raised:
        run_steps(engine, batches[1:])
    assert "\n" not in str(raised.value)
