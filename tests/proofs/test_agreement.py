"""Ranks that must agree (zerompi/train/options/agreement.py), through MPMD launches whose ranks differ in
one thing each (`mpirun -n 1 A : -n 1 B`, each rank its own command line, working folder and
environment, as two nodes' would be).

    refused (exit 2, one line naming the field and which ranks hold which value, nothing written)
        a flag: --lr, --seed, --clip-norm, --beta1, --no-shuffle (these trained silently apart),
        --steps, --stage, --check-collectives, --save-dir on one rank only (these hung),
        --dtype, --hidden (these ended in MPICH's "Message truncated" stack);
        the data: two files of one shape, one relative path under two working folders, another width;
        the versions: NumPy's, zerompi's sources;
        the start: two --save-dir folders, two checkpoints resumed, two --init-weights files
    allowed (trains, the weights of the run whose ranks agree)
        one data file, one checkpoint, one --save-dir under two paths; another BLAS kernel (one
        note line)
"""
import os
import platform
import shutil
import sys

import numpy as np
import pytest

from test_cli import ERROR_MARK, _mpirun, files_under, load_weights, run_command, train_ok

TINY = ["--steps", 4, "--hidden", 8, "--batch-size", 16, "--log-every", 0, "--report", "none"]
DISAGREE = "the ranks disagree on "


def mpmd(*ranks, cwd, program=("-m", "zerompi.train"), timeout=60):
    """One rank per entry, each (flags, mpirun's local options for it: -wdir, -env), all after TINY."""
    args = [_mpirun()]
    for i, (flags, options) in enumerate(ranks):
        args += ([":"] if i else []) + ["-n", "1", *options, sys.executable, *program, *map(str, TINY + flags)]
    return run_command(args, cwd=cwd, timeout=timeout)


def refused(run, field, values):
    """The run stopped with one line naming the field and which ranks hold which value."""
    assert run.returncode == 2, run.describe()
    lines = [line for line in run.output.splitlines() if ERROR_MARK in line]
    assert len(lines) == 1 and "Traceback" not in run.output, run.describe()
    assert f"{DISAGREE}{field}: {values}" in lines[0], run.describe()
    return lines[0]


def write_data(path, seed, features=8):
    rng = np.random.default_rng(seed)
    np.savez(path, x=rng.standard_normal((64, features)), y=rng.integers(0, 3, 64))


ONE_RANK_DIFFERS = [
    (["--lr", 0.1], "--lr", "0.003 on rank 0, 0.1 on rank 1"),
    (["--seed", 1], "--seed", "0 on rank 0, 1 on rank 1"),
    (["--clip-norm", 1.0], "--clip-norm", "0.0 on rank 0, 1.0 on rank 1"),
    (["--beta1", 0.8], "--beta1", "0.9 on rank 0, 0.8 on rank 1"),
    (["--no-shuffle"], "--shuffle", "True on rank 0, False on rank 1"),
    (["--steps", 6], "--steps", "4 on rank 0, 6 on rank 1"),
    (["--stage", 2], "--stage", "3 on rank 0, 2 on rank 1"),
    (["--check-collectives"], "--check-collectives", "False on rank 0, True on rank 1"),
    (["--save-dir", "ck"], "--save-dir", "not set on rank 0, 'ck' on rank 1"),
    (["--dtype", "float64"], "--dtype", "'float32' on rank 0, 'float64' on rank 1"),
    (["--hidden", 16], "--hidden", "8 on rank 0, 16 on rank 1"),
]


@pytest.mark.parametrize("flags, field, values", ONE_RANK_DIFFERS, ids=[c[1] for c in ONE_RANK_DIFFERS])
def test_a_flag_that_differs_on_one_rank_stops_the_job_naming_it(flags, field, values, tmp_path):
    run = mpmd(([], []), (flags, []), cwd=tmp_path)
    refused(run, field, values)
    assert files_under(tmp_path) == []


def test_the_ranks_that_differ_are_named_as_ranges(tmp_path):
    run = mpmd(([], []), ([], []), (["--lr", 0.1], []), ([], []), cwd=tmp_path)
    refused(run, "--lr", "0.003 on ranks 0-1, 3, 0.1 on rank 2")


def test_the_same_flags_from_a_config_file_and_the_command_line_agree(tmp_path):
    (tmp_path / "run.toml").write_text("lr = 0.01\nseed = 3\n")
    run = mpmd((["--lr", 0.01, "--seed", 3, "--save-weights", "a.npz"], []),
               (["--config", "run.toml", "--save-weights", "b.npz"], []), cwd=tmp_path)
    assert run.returncode == 0 and ERROR_MARK not in run.output, run.describe()


def test_two_data_files_of_one_shape_are_refused(tmp_path):
    write_data(tmp_path / "a.npz", 0)
    write_data(tmp_path / "b.npz", 1)
    line = refused(mpmd((["--data", "a.npz", "--save-weights", "w.npz"], []), (["--data", "b.npz", "--save-weights", "w.npz"], []),
                        cwd=tmp_path), "the data (--data)", "a.npz: 64 x 8 train")
    assert "on rank 0, b.npz: 64 x 8 train" in line and line.endswith("environments"), line
    assert not os.path.exists(tmp_path / "w.npz")


def test_one_relative_path_under_two_working_folders_is_refused(tmp_path):
    for folder, seed in (("node1", 0), ("node2", 1)):
        (tmp_path / folder).mkdir()
        write_data(tmp_path / folder / "d.npz", seed)
    line = refused(mpmd((["--data", "d.npz"], ["-wdir", "node1"]), (["--data", "d.npz"], ["-wdir", "node2"]),
                        cwd=tmp_path), "the data (--data)", "d.npz: 64 x 8 train")
    assert "on rank 0, d.npz" in line and "on rank 1" in line, line


def test_data_of_another_width_is_refused_before_any_collective_of_its_size(tmp_path):
    write_data(tmp_path / "a.npz", 0)
    write_data(tmp_path / "wide.npz", 0, features=12)
    line = refused(mpmd((["--data", "a.npz"], []), (["--data", "wide.npz"], []), cwd=tmp_path),
                   "the data (--data)", "a.npz: 64 x 8 train")
    assert "wide.npz: 64 x 12 train" in line, line


def test_one_data_file_under_two_paths_trains_as_the_agreeing_run(tmp_path):
    write_data(tmp_path / "a.npz", 0)
    (tmp_path / "sub").mkdir()
    shutil.copy(tmp_path / "a.npz", tmp_path / "sub" / "copy.npz")
    run = mpmd((["--data", "a.npz", "--save-weights", "w.npz"], []), (["--data", "sub/copy.npz", "--save-weights", "w.npz"], []),
               cwd=tmp_path)
    assert run.returncode == 0 and ERROR_MARK not in run.output, run.describe()
    train_ok(2, *TINY, "--data", "a.npz", "--save-weights", "agreed.npz", cwd=tmp_path)
    got, want = load_weights(tmp_path / "w.npz"), load_weights(tmp_path / "agreed.npz")
    assert all(np.array_equal(got[name], want[name]) for name in want)


FAKE_VERSION = """
import sys
import numpy
import os
import zerompi.train.options.agreement as agreement
from zerompi.mpi import launcher_rank
if launcher_rank(os.environ) == 1:                   # before MPI starts (zerompi starts it)
    if sys.argv[1] == "numpy":
        numpy.__version__ = "1.0.0"
    else:
        agreement.source_digest = lambda: "0123456789abcdef"
from zerompi.train.loop.run import main
sys.exit(main(sys.argv[2:]))
"""


def test_another_numpy_on_one_rank_is_refused(tmp_path):
    import numpy
    program = ("-c", FAKE_VERSION, "numpy")
    refused(mpmd(([], []), ([], []), cwd=tmp_path, program=program), "NumPy's version",
            f"{numpy.__version__} on rank 0, 1.0.0 on rank 1")


def test_other_zerompi_sources_of_the_same_version_are_refused(tmp_path):
    import zerompi
    line = refused(mpmd(([], []), ([], []), cwd=tmp_path, program=("-c", FAKE_VERSION, "sources")),
                   "zerompi's version", f"{zerompi.__version__} (sources ")
    assert f"{zerompi.__version__} (sources 0123456789ab) on rank 1" in line, line


@pytest.mark.skipif(platform.machine() != "x86_64", reason="OpenBLAS kernels of x86-64 (OPENBLAS_CORETYPE)")
def test_another_blas_kernel_is_one_note_and_the_run_goes_on(tmp_path):
    run = mpmd(([], ["-env", "OPENBLAS_CORETYPE", "Prescott"]), ([], ["-env", "OPENBLAS_CORETYPE", "Nehalem"]),
               cwd=tmp_path)
    assert run.returncode == 0 and ERROR_MARK not in run.output, run.describe()
    notes = [line for line in run.output.splitlines() if line.startswith("zerompi: note: the ranks differ in")]
    assert len(notes) == 1 and "the CPU and BLAS kernel" in notes[0] and "Nehalem on rank 1" in notes[0], \
        run.describe()


# ----------------------------------------------------------------------------------------------
# The start: one --save-dir, one checkpoint, one --init-weights file
# ----------------------------------------------------------------------------------------------

def test_two_save_dirs_are_refused_and_no_checkpoint_is_written(tmp_path):
    line = refused(mpmd((["--save-dir", "ck"], []), (["--save-dir", "ck2"], []), cwd=tmp_path),
                   "--save-dir (one folder for every rank)", "'ck', locked by ")
    assert "'ck2', where rank 0's lock is missing on rank 1" in line, line
    assert files_under(tmp_path) == []                # made, its lock released, then removed empty


def test_one_save_dir_under_two_paths_checkpoints_and_resumes(tmp_path):
    (tmp_path / "node2").mkdir()
    run = mpmd((["--save-dir", "ck"], []), (["--save-dir", "../ck"], ["-wdir", "node2"]), cwd=tmp_path)
    assert run.returncode == 0 and ERROR_MARK not in run.output, run.describe()
    assert (tmp_path / "ck" / "latest").read_text().strip() == "step_00000004"
    again = mpmd((["--save-dir", "ck", "--resume", "--steps", 6], []),
                 (["--save-dir", "../ck", "--resume", "--steps", 6], ["-wdir", "node2"]), cwd=tmp_path)
    assert again.returncode == 0 and "resumed from ck/step_00000004" in again.output, again.describe()


def test_two_checkpoints_resumed_are_refused(tmp_path):
    for folder, lr in (("a", 0.003), ("b", 0.01)):
        train_ok(2, *TINY, "--lr", lr, "--save-dir", folder, cwd=tmp_path)
    (tmp_path / "copy").mkdir()
    shutil.copytree(tmp_path / "a" / "step_00000004", tmp_path / "copy" / "step_00000004")
    same = mpmd((["--resume", "a/step_00000004", "--steps", 6], []),
                (["--resume", "copy/step_00000004", "--steps", 6], []), cwd=tmp_path)
    assert same.returncode == 0 and ERROR_MARK not in same.output, same.describe()
    line = refused(mpmd((["--resume", "a/step_00000004", "--steps", 6, "--save-weights", "w.npz"], []),
                        (["--resume", "b/step_00000004", "--steps", 6, "--save-weights", "w.npz"], []), cwd=tmp_path),
                   "the start (--resume, --init-weights)", "checkpoint 'a/step_00000004', manifest sha256 ")
    assert "checkpoint 'b/step_00000004', manifest sha256 " in line and not os.path.exists(tmp_path / "w.npz"), line
    plain = mpmd((["--save-dir", "a", "--resume", "--steps", 6], []),
                 (["--save-dir", "a", "--resume", "a/step_00000004", "--steps", 6], []), cwd=tmp_path)
    assert plain.returncode == 0 and ERROR_MARK not in plain.output, plain.describe()   # one checkpoint, two forms


def test_two_init_weights_files_of_one_shape_are_refused(tmp_path):
    for name, seed in (("a.npz", 0), ("b.npz", 1)):
        train_ok(2, *TINY, "--seed", seed, "--save-weights", name, cwd=tmp_path)
    refused(mpmd((["--init-weights", "a.npz"], []), (["--init-weights", "b.npz"], []), cwd=tmp_path),
            "the start (--resume, --init-weights)", "weights 'a.npz', sha256 ")


def test_node_local_save_dirs_where_one_holds_a_checkpoint_are_named_as_two_folders(tmp_path):
    """Two ranks resuming from their own node's folder, only one of which holds a checkpoint: the
    ranks compared different lists of fields, and the line blamed other versions of zerompi."""
    for node in ("node1", "node2"):
        (tmp_path / node).mkdir()
    train_ok(1, *TINY, "--batch-size", 16, "--save-dir", "node2/ck", cwd=tmp_path)
    run = mpmd((["--save-dir", "ck", "--resume", "--steps", 6], ["-wdir", "node1"]),
               (["--save-dir", "ck", "--resume", "--steps", 6], ["-wdir", "node2"]), cwd=tmp_path)
    line = refused(run, "--save-dir (one folder for every rank)", "'ck', locked by ")
    assert "'ck', where rank 0's lock is missing on rank 1" in line, line


def test_the_sources_digest_counts_modules_not_an_editors_files(tmp_path, monkeypatch):
    """An editor's lock file (a dangling symlink named .#run.py) beside the package made every run
    end in a traceback."""
    import zerompi
    from zerompi.train.options.agreement import source_digest
    package = tmp_path / "zerompi"
    (package / "train").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "train" / "run.py").write_text("x = 1\n")
    monkeypatch.setattr(zerompi, "__file__", str(package / "__init__.py"))
    clean = source_digest.__wrapped__()
    os.symlink("user@host.1234:1", package / "train" / ".#run.py")
    (package / "train" / "run.py~").write_text("x = 0\n")
    assert source_digest.__wrapped__() == clean
    (package / "train" / "run.py").write_text("x = 2\n")
    assert source_digest.__wrapped__() != clean
