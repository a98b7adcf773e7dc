"""Checkpoints end to end: `mpirun -n N python -m zerompi.train --save-dir ...` with real signals and kills.

    exact resume      a run resumed from its step-20 checkpoint ends bitwise where the
                      uninterrupted run ends: every stage, float32, bf16 and fp16 (loss scaler state)
    reshard           a (N=2, stage 3) checkpoint resumed at (N=3, stage 1) and (N=1, stage 0)
    preemption        SIGUSR1 / SIGTERM to mpirun: exit 4, one "signalled" line, a complete checkpoint
                      at that step; --resume finishes bitwise like an uninterrupted run
    kill during save  rank 1 SIGKILLs itself inside the step-20 save (tests/support/kill_during_save.py):
                      no hang, `latest` still names step 10, and resuming gives the uninterrupted
                      run's weights
    rotation          --keep-last; a crafted `parent` in a manifest never deletes anything
    manifests         an edited one is refused; a version-1 one resumes, saying it is not verified
    `latest`          a failed write of it keeps the checkpoint; missing, stale or a FIFO: --resume
                      uses the newest verified checkpoint and says so
    the lock          a second run on one --save-dir is refused naming the holder; a dead holder's
                      lock is taken over; nothing but stale .partial-step_* folders is removed
    flags             --resume on an empty --save-dir, conflicting flags, a changed data order,
                      resuming a finished run, a corrupt checkpoint found by one rank only

Every launch has a wall-clock limit and runs in its own session, so a hang is killed and fails the
test. Runs are tiny (64-9-7-10 MLP on the shipped digits, 30 steps; their 300 held-out rows keep the
end-of-run evaluation short).
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

from test_cli import ERROR_MARK, _mpirun, files_under, launch, load_weights
from test_checkpoint_files import CHECKSUM, as_version_1, edit_manifest, snapshot

TIMEOUT = 120                   # seconds for one launch before it is killed
KILL_DURING_SAVE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "kill_during_save.py")
COMMON = ["--hidden", "9,7", "--batch-size", 12, "--report", "none",
          "--log-every", 0]
STEP10, STEP20, STEP30 = "step_00000010", "step_00000020", "step_00000030"


def _kill_group(process):
    try:
        os.killpg(process.pid, signal.SIGKILL)          # mpirun and every rank it started
    except ProcessLookupError:
        pass


def train_ok(n, *flags, cwd, env=None):
    run = launch(n, *flags, cwd=cwd, env=env)
    assert run.returncode == 0, run.describe()
    assert ERROR_MARK not in run.output and "Traceback" not in run.output, run.describe()
    return run


def fails_once(run, code, *keywords):
    """The run exited with `code` after exactly one error line holding every keyword; returns it."""
    assert run.returncode == code, run.describe()
    assert run.output.count(ERROR_MARK) == 1 and "Traceback" not in run.output, run.describe()
    line = next(line for line in run.output.splitlines() if ERROR_MARK in line)
    for keyword in keywords:
        assert keyword in line, run.describe()
    return line


def inspect_ok(target, cwd):
    result = subprocess.run([sys.executable, "-m", "zerompi.checkpoint", "inspect", target], cwd=cwd,
                            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, f"inspect {target}: {result.stdout}{result.stderr}"
    return result.stdout


def latest_name(save_dir):
    return (save_dir / "latest").read_text().strip()


def manifest_of(folder):
    with open(folder / "manifest.json") as f:
        return json.load(f)


def assert_bitwise_equal(got, want, what):
    assert sorted(got) == sorted(want), what
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, (what, name)
        assert got[name].tobytes() == want[name].tobytes(), (
            f"{what}: {name} differs, max |diff| {np.max(np.abs(got[name] - want[name])):.3g}")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """uninterrupted(n, *flags): the final weights of a plain run with those flags (cached)."""
    root = tmp_path_factory.mktemp("uninterrupted")
    cache = {}

    def get(n, *flags):
        key = (n, *map(str, flags))
        if key not in cache:
            folder = root / f"run{len(cache)}"
            folder.mkdir()
            train_ok(n, *flags, "--save-weights", "w.npz", cwd=folder)
            cache[key] = load_weights(folder / "w.npz")
        return cache[key]
    return get


# ----------------------------------------------------------------------------------------------
# Exact resume
# ----------------------------------------------------------------------------------------------

RESUME_CASES = ([(stage, "float32") for stage in range(4)] + [(stage, "bf16") for stage in range(4)] +
                [(1, "fp16"), (3, "fp16")])


@pytest.mark.parametrize("stage, dtype", RESUME_CASES)
def test_resume_from_the_step_20_checkpoint_is_bitwise_exact(stage, dtype, uninterrupted, tmp_path):
    flags = ["--stage", stage, "--dtype", dtype, "--steps", 30, *COMMON]
    if dtype == "fp16":               # the scale doubles at steps 7, 14, 21, 28: resuming at 20 must
        flags += ["--loss-scale-window", 7]     # restore both the scale and the good-step count
    want = uninterrupted(2, *flags)
    first = train_ok(2, *flags, "--save-dir", "ck", "--save-every", 10, "--save-weights", "b.npz", cwd=tmp_path)
    save_dir = tmp_path / "ck"
    assert sorted(os.listdir(save_dir)) == ["latest", STEP10, STEP20, STEP30]
    assert latest_name(save_dir) == STEP30
    assert_bitwise_equal(load_weights(tmp_path / "b.npz"), want, "saving checkpoints changed the run")
    if dtype == "fp16":
        raised = re.findall(r"^step (\d+): 7 good steps: loss scale raised", first.stdout, re.M)
        assert "21" in raised, first.describe()
        assert manifest_of(save_dir / STEP20)["loss_scale_good_steps"] == 6

    shutil.rmtree(save_dir / STEP30)
    (save_dir / "latest").write_text(STEP20 + "\n")
    run = train_ok(2, *flags, "--save-dir", "ck", "--resume", "--save-weights", "c.npz", cwd=tmp_path)
    assert run.stdout.count(f"resumed from ck/{STEP20} at step 20") == 1, run.describe()
    assert_bitwise_equal(load_weights(tmp_path / "c.npz"), want, f"resumed stage {stage} {dtype}")
    assert latest_name(save_dir) == STEP30 and manifest_of(save_dir / STEP30)["step"] == 30


def test_resume_reshards_onto_other_rank_counts_and_stages(tmp_path):
    flags = ["--dtype", "float64", "--steps", 30, "--hidden", "9,7", "--batch-size", 24,
             "--log-every", 0, "--report", "json"]
    train_ok(2, "--stage", 3, *flags, "--save-dir", "ck", "--save-every", 10, "--save-weights", "a.npz",
             cwd=tmp_path)
    want = load_weights(tmp_path / "a.npz")
    for n, stage in ((3, 1), (1, 0)):
        run = train_ok(n, "--stage", stage, *flags, "--resume", f"ck/{STEP20}", "--save-weights", f"r{n}.npz",
                       cwd=tmp_path)
        assert f"resumed from ck/{STEP20} at step 20" in run.stderr, run.describe()
        report = json.loads(run.stdout)
        assert report["steps"] == 10 and report["ranks"] == n and report["stage"] == stage
        got = load_weights(tmp_path / f"r{n}.npz")
        assert sorted(got) == sorted(want)
        for name, w in want.items():
            assert got[name].dtype == np.float64 and got[name].shape == w.shape
            relative = np.max(np.abs(got[name] - w)) / np.max(np.abs(w))
            assert relative <= 1e-12, f"{name}: relative difference {relative:.3g} (N={n}, stage {stage})"


# ----------------------------------------------------------------------------------------------
# Preemption: a real signal to mpirun
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM], ids=["SIGUSR1", "SIGTERM"])
def test_signal_writes_a_checkpoint_exits_4_and_resume_is_exact(signum, uninterrupted, tmp_path):
    flags = ["--stage", 2, "--lr-schedule", "constant", *COMMON]    # constant: lr does not depend on --steps
    args = [_mpirun(), "-n", "2", sys.executable, "-m", "zerompi.train", "--steps", "1000000",
            "--save-dir", "ck", *map(str, flags), "--log-every", "20"]
    process = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    stdout, stderr, progress = [], [], threading.Event()

    def read(stream, lines, on_progress=None):
        for line in stream:
            lines.append(line)
            if on_progress and line.startswith("step ") and "  loss " in line:
                on_progress.set()
    readers = [threading.Thread(target=read, args=(process.stdout, stdout, progress), daemon=True),
               threading.Thread(target=read, args=(process.stderr, stderr), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        assert progress.wait(60), f"no progress line within 60 s\n{''.join(stdout)}{''.join(stderr)}"
        process.send_signal(signum)                     # to mpirun only: hydra forwards it to the ranks
        returncode = process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running 60 s after the signal\n{''.join(stdout)}{''.join(stderr)}")
    finally:
        if process.poll() is None:
            _kill_group(process)
            process.wait()
        for reader in readers:
            reader.join(10)
    output = "".join(stdout) + "".join(stderr)
    assert returncode == 4, f"exit {returncode}\n{output}"
    assert output.count("signalled") == 1 and ERROR_MARK not in output and "Traceback" not in output, output
    step = int(re.search(r"^step (\d+): signalled: checkpoint written to ck; exiting with status 4", output,
                         re.M).group(1))
    assert step >= 20, output
    save_dir = tmp_path / "ck"
    assert latest_name(save_dir) == f"step_{step:08d}"
    assert manifest_of(save_dir / f"step_{step:08d}")["step"] == step
    assert f"step {step} " in inspect_ok("ck", tmp_path)
    assert not [n for n in os.listdir(save_dir) if n.startswith(".partial-") or n == ".lock"]

    run = train_ok(2, "--steps", step + 5, *flags, "--save-dir", "ck", "--resume", "--save-weights", "r.npz",
                   cwd=tmp_path)
    assert f"resumed from ck/step_{step:08d} at step {step}" in run.stdout, run.describe()
    assert_bitwise_equal(load_weights(tmp_path / "r.npz"), uninterrupted(2, "--steps", step + 5, *flags),
                         f"resumed after {signal.Signals(signum).name} at step {step}")


# ----------------------------------------------------------------------------------------------
# A rank killed in the middle of a save
# ----------------------------------------------------------------------------------------------

def test_rank_killed_during_save_leaves_the_previous_checkpoint_and_resume_is_exact(uninterrupted, tmp_path):
    flags = ["--stage", 3, "--dtype", "float32", "--steps", 30, *COMMON]  # a resume case's: one uninterrupted run
    env = dict(os.environ, ZEROMPI_KILL_DURING_SAVE="1:20")
    killed = launch(2, *flags, "--save-dir", "ck", "--save-every", 10, "--save-weights", "never.npz",
                    cwd=tmp_path, env=env, timeout=60, program=(KILL_DURING_SAVE, "-m", "zerompi.train"))
    assert killed.returncode != 0, killed.describe()
    save_dir = tmp_path / "ck"
    assert latest_name(save_dir) == STEP10, killed.describe()
    assert not (save_dir / STEP20).exists() and not (tmp_path / "never.npz").exists()
    assert set(os.listdir(save_dir)) <= {"latest", STEP10, ".partial-" + STEP20, ".lock"}, os.listdir(save_dir)
    partial = save_dir / (".partial-" + STEP20)
    if partial.exists():          # rank 1 died right after its first shard file: no manifest was written
        assert "rank00001.params.npy" in os.listdir(partial) and "manifest.json" not in os.listdir(partial)
    assert "step 10 " in inspect_ok("ck", tmp_path)

    run = train_ok(2, *flags, "--save-dir", "ck", "--save-every", 10, "--resume", "--save-weights", "r.npz",
                   cwd=tmp_path)
    assert f"resumed from ck/{STEP10} at step 10" in run.stdout, run.describe()
    assert_bitwise_equal(load_weights(tmp_path / "r.npz"), uninterrupted(2, *flags), "resumed after the kill")
    assert sorted(os.listdir(save_dir)) == ["latest", STEP10, STEP20, STEP30]      # the partial is gone


# ----------------------------------------------------------------------------------------------
# Rotation
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("keep_last, kept", [(2, (15, 20)), (0, (5, 10, 15, 20)), (1, (20,)), (None, (10, 15, 20))],
                         ids=["keep-2", "keep-all", "keep-1", "default-3"])
def test_keep_last_keeps_the_newest_checkpoints(keep_last, kept, tmp_path):
    flags = [] if keep_last is None else ["--keep-last", keep_last]
    train_ok(2, "--steps", 20, "--save-every", 5, *flags, *COMMON, "--save-dir", "ck", cwd=tmp_path)
    save_dir = tmp_path / "ck"
    assert sorted(os.listdir(save_dir)) == ["latest"] + [f"step_{s:08d}" for s in kept]
    assert latest_name(save_dir) == "step_00000020"
    for s in kept:
        assert manifest_of(save_dir / f"step_{s:08d}")["step"] == s


def test_rotation_never_deletes_the_checkpoint_latest_names(tmp_path):
    """Resume from an older checkpoint while newer ones of the earlier run are still there: the
    checkpoint just written (and named by `latest`) must survive rotation, and resuming goes on."""
    train_ok(2, "--steps", 30, "--save-every", 10, "--keep-last", 0, *COMMON, "--save-dir", "ck", cwd=tmp_path)
    train_ok(2, "--steps", 15, "--save-every", 5, "--keep-last", 2, *COMMON, "--save-dir", "ck",
             "--resume", f"ck/{STEP10}", cwd=tmp_path)
    save_dir = tmp_path / "ck"
    assert latest_name(save_dir) == "step_00000015"
    assert (save_dir / "step_00000015").is_dir(), sorted(os.listdir(save_dir))
    assert manifest_of(save_dir / "step_00000015")["step"] == 15
    assert "step 15 " in inspect_ok("ck", tmp_path)
    run = train_ok(2, "--steps", 20, "--save-every", 5, "--keep-last", 2, *COMMON, "--save-dir", "ck", "--resume",
                   cwd=tmp_path)
    assert "resumed from ck/step_00000015 at step 15" in run.stdout, run.describe()
    newest = save_dir / latest_name(save_dir)
    assert newest.is_dir() and manifest_of(newest)["step"] == 20, sorted(os.listdir(save_dir))
    assert "step 20 " in inspect_ok("ck", tmp_path)


# ----------------------------------------------------------------------------------------------
# Flags
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("exists", [True, False], ids=["empty-dir", "no-dir"])
def test_resume_with_no_checkpoint_yet_starts_from_step_0_and_says_so(exists, uninterrupted, tmp_path):
    flags = ["--stage", 3, "--dtype", "float32", "--steps", 30, *COMMON]  # a resume case's: one uninterrupted run
    if exists:
        (tmp_path / "ck").mkdir()
    run = train_ok(2, *flags, "--save-dir", "ck", "--resume", "--save-weights", "w.npz", cwd=tmp_path)
    assert run.stdout.count("no checkpoint in ck yet: starting from step 0") == 1, run.describe()
    assert "resumed" not in run.stdout
    assert_bitwise_equal(load_weights(tmp_path / "w.npz"), uninterrupted(2, *flags), "fresh start")
    assert latest_name(tmp_path / "ck") == STEP30


@pytest.mark.parametrize("flags, keywords", [
    (["--resume", "--save-dir", "ck", "--init-weights", "w.npz"], ["--resume and --init-weights"]),
    (["--resume", "ck/step_00000010", "--init-weights", "w.npz"], ["--resume and --init-weights"]),
    (["--save-every", 5], ["--save-every", "need --save-dir"]),
    (["--resume"], ["--resume", "need --save-dir"]),
    (["--save-dir", "ck", "--keep-last", -1], ["--keep-last", ">= 0"]),
    (["--save-dir", "ck", "--save-every", -5], ["--save-every", ">= 0"]),
    (["--save-dir", "nowhere/deeper/file.npz/ck", "--save-weights", "w.npz"], ["--save-dir"]),
], ids=["resume-and-init", "resume-folder-and-init", "save-every-no-dir", "resume-no-dir", "keep-last-negative",
        "save-every-negative", "save-dir-unusable"])
def test_bad_checkpoint_flags_fail_once_with_exit_2_and_write_nothing(flags, keywords, tmp_path):
    if "nowhere/deeper/file.npz/ck" in flags:
        (tmp_path / "nowhere" / "deeper").mkdir(parents=True)
        (tmp_path / "nowhere" / "deeper" / "file.npz").write_bytes(b"a file, not a folder")
    before = files_under(tmp_path)
    run = launch(2, "--steps", 2, *COMMON, *flags, cwd=tmp_path, timeout=60)
    fails_once(run, 2, *keywords)
    assert run.stdout == "", run.describe()
    assert files_under(tmp_path) == before


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished N=2 stage-1 run of 10 steps: its folder (ck/ with latest = step 10, w.npz)."""
    folder = tmp_path_factory.mktemp("finished")
    train_ok(2, "--stage", 1, "--steps", 10, *COMMON, "--save-dir", "ck", "--save-weights", "w.npz", cwd=folder)
    assert latest_name(folder / "ck") == STEP10
    return folder


@pytest.mark.parametrize("change, flag", [(["--seed", 1], "--seed"), (["--batch-size", 24], "--batch-size"),
                                          (["--no-shuffle"], "--shuffle")], ids=["seed", "batch-size", "shuffle"])
def test_resume_with_another_data_order_is_refused_naming_the_flag(change, flag, finished, tmp_path):
    shutil.copytree(finished / "ck", tmp_path / "ck")
    before = snapshot(tmp_path / "ck")
    run = launch(2, "--stage", 1, "--steps", 20, *COMMON, *change, "--save-dir", "ck", "--resume",
                 "--save-weights", "never.npz", cwd=tmp_path, timeout=60)
    fails_once(run, 2, flag, f"ck/{STEP10}")
    assert not (tmp_path / "never.npz").exists()
    assert snapshot(tmp_path / "ck") == before


def test_resume_of_a_finished_run_runs_no_steps_and_exits_0(finished, tmp_path):
    shutil.copytree(finished / "ck", tmp_path / "ck")
    before = snapshot(tmp_path / "ck")
    run = train_ok(2, "--stage", 1, "--steps", 10, *COMMON, "--report", "json", "--save-dir", "ck", "--resume",
                   "--save-weights", "again.npz", cwd=tmp_path)
    assert f"resumed from ck/{STEP10} at step 10" in run.stderr, run.describe()
    assert json.loads(run.stdout)["steps"] == 0
    assert_bitwise_equal(load_weights(tmp_path / "again.npz"), load_weights(finished / "w.npz"), "no steps")
    assert snapshot(tmp_path / "ck") == before                 # nothing saved again


def test_resume_beyond_steps_is_refused_or_runs_zero_steps(finished, tmp_path):
    shutil.copytree(finished / "ck", tmp_path / "ck")
    run = launch(2, "--stage", 1, "--steps", 5, *COMMON, "--report", "json", "--save-dir", "ck", "--resume",
                 cwd=tmp_path, timeout=60)
    fails_once(run, 2, "--steps")


def test_resume_from_a_checkpoint_of_another_model_is_refused_naming_it(finished, tmp_path):
    shutil.copytree(finished / "ck", tmp_path / "ck")
    before = snapshot(tmp_path / "ck")
    run = launch(2, "--stage", 1, "--steps", 20, *COMMON, "--hidden", "9,8", "--save-dir", "ck", "--resume",
                 cwd=tmp_path, timeout=60)
    fails_once(run, 2, f"ck/{STEP10}", "sizes [64, 9, 7, 10], but this run builds [64, 9, 8, 10]")
    assert snapshot(tmp_path / "ck") == before


def test_corrupt_shard_found_by_one_rank_fails_every_rank_once(finished, tmp_path):
    """Stage 3 at N=2 reading an N=2 checkpoint: rank 1 alone reads rank 1's files, so rank 1 alone
    sees the flipped byte; every rank must still exit 2 together, with one line, no hang."""
    shutil.copytree(finished / "ck", tmp_path / "ck")
    path = tmp_path / "ck" / STEP10 / "rank00001.params.npy"
    offset = next(f for f in manifest_of(tmp_path / "ck" / STEP10)["files"]
                  if f["rank"] == 1 and f["kind"] == "params")["data_offset"]
    data = bytearray(path.read_bytes())
    data[offset + 3] ^= 0x10
    path.write_bytes(bytes(data))
    before = snapshot(tmp_path / "ck")
    run = launch(2, "--stage", 3, "--steps", 20, *COMMON, "--save-dir", "ck", "--resume", cwd=tmp_path, timeout=60)
    fails_once(run, 2, f"{STEP10}/rank00001.params.npy", "checksum mismatch")
    assert run.seconds < 30, run.describe()
    assert snapshot(tmp_path / "ck") == before


def test_fp16_resume_from_another_dtype_keeps_the_initial_loss_scale(tmp_path):
    """A float32 checkpoint's loss scale (1.0) means nothing to fp16: the run starts at --loss-scale."""
    train_ok(2, "--steps", 3, "--save-dir", "ck", *COMMON, cwd=tmp_path)
    run = train_ok(2, "--steps", 6, "--save-dir", "ck", "--resume", "--dtype", "fp16", *COMMON[:-2],
                   "--log-every", 1, cwd=tmp_path)
    assert "scale 65536" in run.stdout, run.describe()
    assert manifest_of(tmp_path / "ck" / "step_00000006")["loss_scale"] == 65536


def test_fp16_resume_before_the_first_applied_step_is_bitwise_exact(tmp_path):
    """fp16 with a huge loss scale skips its first steps (about 13 of them, halving the scale each
    time); a checkpoint taken then holds the initial 16-bit parameters and the lowered scale, from
    which the resumed run must skip just as many and then apply the same updates, bit for bit.
    (With 12 steps, every one of them skipped, both runs ended on the initial weights: a resume that
    restored nothing passed.)"""
    flags = ["--dtype", "fp16", "--loss-scale", 2.0 ** 30, "--stage", 2, *COMMON]
    train_ok(2, "--steps", 24, *flags, "--save-weights", "straight.npz", cwd=tmp_path)
    skipped = launch(2, "--steps", 1, *flags, "--save-dir", "ck", "--save-weights", "initial.npz", cwd=tmp_path)
    assert skipped.returncode == 3 and "the last step was skipped" in skipped.output, skipped.describe()
    assert manifest_of(tmp_path / "ck" / "step_00000001")["adam_steps"] == 0      # checkpointed all the same
    train_ok(2, "--steps", 24, *flags, "--save-dir", "ck", "--resume", "--save-weights", "resumed.npz", cwd=tmp_path)
    straight, initial = load_weights(tmp_path / "straight.npz"), load_weights(tmp_path / "initial.npz")
    assert any(not np.array_equal(straight[name], initial[name]) for name in straight), "no step was applied"
    assert_bitwise_equal(load_weights(tmp_path / "resumed.npz"), straight, "fp16 resumed before the first applied step")


# ----------------------------------------------------------------------------------------------
# Crafted manifests: nothing outside the lineage's verified step folders is ever deleted
# ----------------------------------------------------------------------------------------------

STEP2, STEP4, STEP6 = "step_00000002", "step_00000004", "step_00000006"


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory):
    """ck/ of a 4-step N=2 run saved every 2 steps: step_00000002 (parent None), step_00000004."""
    folder = tmp_path_factory.mktemp("four-steps")
    train_ok(2, "--steps", 4, "--save-every", 2, *COMMON, "--save-dir", "ck", cwd=folder)
    assert sorted(os.listdir(folder / "ck")) == ["latest", STEP2, STEP4]
    assert manifest_of(folder / "ck" / STEP4)["parent"] == STEP2
    return folder / "ck"


def with_victim(four_steps, tmp_path):
    shutil.copytree(four_steps, tmp_path / "ck")
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "data.txt").write_text("precious")
    return tmp_path / "ck"


@pytest.mark.parametrize("sealed", [True, False], ids=["checksum-recomputed", "hand-edited"])
def test_resume_from_a_manifest_whose_parent_leaves_the_save_dir_is_refused(sealed, four_steps, tmp_path):
    """The repro of the issue: `parent` = "../victim" in the checkpoint resumed from."""
    save_dir = with_victim(four_steps, tmp_path)
    edit_manifest(save_dir / STEP4, lambda m: m.__setitem__("parent", "../victim"), sealed=sealed)
    before = snapshot(tmp_path)
    run = launch(2, "--steps", 6, *COMMON, "--save-dir", "ck", "--resume", "--keep-last", 2, cwd=tmp_path,
                 timeout=60)
    fails_once(run, 2, f"ck/{STEP4}/manifest.json", "parent '../victim'" if sealed else CHECKSUM)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("parent", ["../victim", "ABSOLUTE", ".", "step_00000002/../../victim", "LINK"],
                         ids=["outside", "absolute", "the-save-dir", "through-a-step", "symlinked-step"])
def test_rotation_follows_only_verified_parents(parent, four_steps, tmp_path):
    """The crafted parent sits one checkpoint further back (step 2's manifest, checksum
    recomputed): resuming from step 4 with --keep-last 1 deletes step 4 and nothing else."""
    save_dir = with_victim(four_steps, tmp_path)
    if parent == "ABSOLUTE":
        parent = str(tmp_path / "victim")
    if parent == "LINK":
        parent = "step_00000001"
        os.symlink(tmp_path / "victim", save_dir / parent)
    edit_manifest(save_dir / STEP2, lambda m: m.__setitem__("parent", parent))
    victim = snapshot(tmp_path / "victim")
    train_ok(2, "--steps", 6, *COMMON, "--save-dir", "ck", "--resume", "--keep-last", 1, cwd=tmp_path)
    assert snapshot(tmp_path / "victim") == victim
    assert latest_name(save_dir) == STEP6 and not (save_dir / STEP4).exists()
    linked = parent == "step_00000001"        # a valid name: step 2 verifies, joins the lineage, and goes too
    assert (save_dir / STEP2).is_dir() == (not linked)
    assert os.path.islink(save_dir / "step_00000001") == linked         # the link itself is never removed
    assert sorted(os.listdir(tmp_path)) == ["ck", "victim"]


# ----------------------------------------------------------------------------------------------
# The manifest's checksum; version 1
# ----------------------------------------------------------------------------------------------

def test_a_hand_edited_adam_steps_is_refused_and_a_version_1_manifest_resumes_with_a_note(four_steps, tmp_path):
    shutil.copytree(four_steps, tmp_path / "ck")
    save_dir = tmp_path / "ck"
    edit_manifest(save_dir / STEP4, lambda m: m.__setitem__("adam_steps", 5), sealed=False)
    run = launch(2, "--steps", 6, *COMMON, "--save-dir", "ck", "--resume", cwd=tmp_path, timeout=60)
    fails_once(run, 2, f"ck/{STEP4}/manifest.json", CHECKSUM)

    shutil.rmtree(save_dir)
    shutil.copytree(four_steps, save_dir)
    as_version_1(save_dir / STEP4)
    run = train_ok(2, "--steps", 6, *COMMON, "--save-dir", "ck", "--resume", cwd=tmp_path)
    assert run.output.count("not verified") == 1, run.describe()
    line = next(line for line in run.output.splitlines() if "not verified" in line)
    assert f"ck/{STEP4}/manifest.json" in line and "version 1" in line, run.describe()
    assert f"resumed from ck/{STEP4} at step 4" in run.stdout, run.describe()
    assert manifest_of(save_dir / STEP6)["version"] == 2 and CHECKSUM in manifest_of(save_dir / STEP6)


# ----------------------------------------------------------------------------------------------
# `latest`: a failed write keeps the checkpoint; resume finds the newest verified one
# ----------------------------------------------------------------------------------------------

LATEST_WRITE_FAILS = """
import errno, os, sys
import zerompi.checkpoint.save as save
write = save.write_text_atomically
def write_but_latest(path, text):                  # an I/O error just when `latest` is rewritten
    if os.path.basename(path) == "latest":
        raise OSError(errno.EIO, os.strerror(errno.EIO), path)
    return write(path, text)
save.write_text_atomically = write_but_latest
from zerompi.train.loop.run import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_failed_write_of_latest_keeps_the_checkpoint_and_resume_finds_it(tmp_path):
    train_ok(2, "--steps", 2, *COMMON, "--save-dir", "ck", cwd=tmp_path)
    save_dir = tmp_path / "ck"
    run = launch(2, "--steps", 4, *COMMON, "--save-dir", "ck", "--resume", cwd=tmp_path, timeout=60,
                 program=("-c", LATEST_WRITE_FAILS))
    line = fails_once(run, 2, f"ck/{STEP4}", "ck/latest")
    assert "incomplete" not in line and "cannot complete" not in line, run.describe()
    assert "complete" in line, run.describe()
    assert manifest_of(save_dir / STEP4)["step"] == 4 and (save_dir / STEP2).is_dir()

    run = train_ok(2, "--steps", 4, *COMMON, "--save-dir", "ck", "--resume", cwd=tmp_path)
    assert f"resumed from ck/{STEP4} at step 4" in run.stdout, run.describe()
    notes = [line for line in run.output.splitlines() if "ck/latest" in line]
    assert len(notes) == 1 and f"using ck/{STEP4}" in notes[0], run.describe()


@pytest.mark.parametrize("make, says", [
    (lambda d: os.unlink(d / "latest"), "missing"),
    (lambda d: (d / "latest").write_text(STEP2 + "\n"), "continues from it"),
    (lambda d: (os.unlink(d / "latest"), os.mkfifo(d / "latest")), "FIFO"),
], ids=["missing", "stale", "a-fifo"])
def test_resume_uses_the_newest_verified_checkpoint_when_latest_is_missing_stale_or_unusable(make, says, four_steps,
                                                                                            tmp_path):
    shutil.copytree(four_steps, tmp_path / "ck")
    make(tmp_path / "ck")
    run = train_ok(2, "--steps", 6, *COMMON, "--save-dir", "ck", "--resume", cwd=tmp_path)
    assert f"resumed from ck/{STEP4} at step 4" in run.stdout, run.describe()
    notes = [line for line in run.output.splitlines() if "ck/latest" in line]
    assert len(notes) == 1 and says in notes[0] and f"using ck/{STEP4}" in notes[0], run.describe()
    assert latest_name(tmp_path / "ck") == STEP6


# ----------------------------------------------------------------------------------------------
# The lock: one run per --save-dir
# ----------------------------------------------------------------------------------------------

def write_lock(save_dir, host, pid):
    save_dir.mkdir(exist_ok=True)
    (save_dir / ".lock").write_text(f"{host} {pid}\n")


def a_dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("host, remove_it", [(None, False), ("node-elsewhere.example", True)],
                         ids=["live-holder-here", "holder-on-another-host"])
def test_a_save_dir_locked_by_another_run_is_refused_naming_the_holder(host, remove_it, four_steps, tmp_path):
    shutil.copytree(four_steps, tmp_path / "ck")
    holder_host, holder_pid = host or socket.gethostname(), os.getpid()      # this test process: alive
    write_lock(tmp_path / "ck", holder_host, holder_pid)
    before = files_under(tmp_path)
    run = launch(2, "--steps", 6, *COMMON, "--save-dir", "ck", "--resume", cwd=tmp_path, timeout=60)
    line = fails_once(run, 2, "ck/.lock", holder_host, str(holder_pid))
    assert ("remove ck/.lock" in line) == remove_it, run.describe()
    assert files_under(tmp_path) == before


def test_a_lock_of_a_dead_run_is_taken_over_and_only_stale_partial_steps_are_removed(four_steps, tmp_path):
    shutil.copytree(four_steps, tmp_path / "ck")
    save_dir = tmp_path / "ck"
    dead = a_dead_pid()
    write_lock(save_dir, socket.gethostname(), dead)
    (save_dir / ".partial-step_00000099").mkdir()                   # left by the dead run
    (save_dir / ".partial-step_00000099" / "rank00000.m.npy").write_text("")
    (save_dir / ".partial-notes").mkdir()                             # not zerompi's
    run = train_ok(2, "--steps", 6, *COMMON, "--save-dir", "ck", "--resume", cwd=tmp_path)
    notes = [line for line in run.output.splitlines() if "stale" in line]
    assert len(notes) == 1 and "ck/.lock" in notes[0] and str(dead) in notes[0], run.describe()
    assert sorted(os.listdir(save_dir)) == [".partial-notes", "latest", STEP2, STEP4, STEP6]


def test_two_runs_on_one_save_dir_the_second_is_refused_and_the_first_finishes(tmp_path):
    args = [_mpirun(), "-n", "2", sys.executable, "-m", "zerompi.train", "--steps", "1000000", "--save-every", "3",
            "--keep-last", "2", "--save-dir", "ck", *map(str, COMMON), "--log-every", "20"]
    first = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        for line in first.stdout:                      # running: its lock is held, saves under way
            if line.startswith("step ") and "  loss " in line:
                break
        second = launch(2, "--steps", 30, "--save-every", 1, *COMMON, "--save-dir", "ck", cwd=tmp_path, timeout=60)
        line = fails_once(second, 2, "ck/.lock", socket.gethostname())
        first.send_signal(signal.SIGTERM)
        output = first.communicate(timeout=60)[0]
    finally:
        if first.poll() is None:
            _kill_group(first)
            first.wait()
    assert first.returncode == 4 and "Traceback" not in output and ERROR_MARK not in output, output
    assert re.search(r"held by .* pid \d+", line), line
    names = os.listdir(tmp_path / "ck")
    assert ".lock" not in names and not [n for n in names if n.startswith(".partial-")], names
    inspect_ok("ck", tmp_path)


def test_a_save_dir_made_for_a_run_refused_after_the_lock_is_removed_again(tmp_path):
    """--save-dir a/b/c with a --resume folder that does not exist: exit 2, and a/b/c was left."""
    run = launch(2, "--steps", 2, *COMMON, "--save-dir", "a/b/c", "--resume", "nothere", cwd=tmp_path, timeout=60)
    assert run.returncode == 2 and "nothere" in run.stderr, run.describe()
    assert os.listdir(tmp_path) == []
    (tmp_path / "kept").mkdir()
    run = launch(2, "--steps", 2, *COMMON, "--save-dir", "kept/ck", "--init-weights", "nope.npz", cwd=tmp_path,
                 timeout=60)
    assert run.returncode == 2 and os.listdir(tmp_path) == ["kept"] and os.listdir(tmp_path / "kept") == []


def test_each_checkpoint_written_is_one_log_line_with_its_folder_size_and_seconds(tmp_path):
    """Each checkpoint written is one log line, on progress's stream: its step, folder, size and seconds."""
    run = train_ok(2, "--steps", 5, "--save-every", 2, *COMMON, "--save-dir", "ck", cwd=tmp_path)
    lines = [line for line in run.stdout.splitlines() if "checkpoint" in line]
    sizes = [sum(os.path.getsize(tmp_path / "ck" / step / name) for name in os.listdir(tmp_path / "ck" / step))
             for step in ("step_00000002", "step_00000004", "step_00000005")]
    assert len(lines) == 3, run.stdout
    for line, step, size in zip(lines, (2, 4, 5), sizes):
        match = re.fullmatch(rf"step {step}: checkpoint ck/step_{step:08d} written, ([\d.]+) kB in [\d.]+ s", line)
        assert match and abs(float(match.group(1)) * 1e3 - size) <= 50, (line, size)


def test_an_export_says_how_to_feed_the_model_and_a_numpy_forward_pass_agrees(tmp_path):
    """The loader divides the digits by 16: the export's metadata carries the factor (without it a
    forward pass of the raw pixel counts gets another accuracy), and the held-out accuracy
    computed from the export with it is the run's."""
    from safetensors import safe_open
    from zerompi.train.loop.data import DIGITS_PATH
    run = train_ok(2, "--steps", 40, "--hidden", 16, "--save-dir", "ck", "--report", "none", cwd=tmp_path)
    printed = float(re.search(r"held-out accuracy ([\d.]+)%", run.stdout).group(1))
    result = subprocess.run([sys.executable, "-m", "zerompi.checkpoint", "export", "ck", "m.safetensors"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    with safe_open(str(tmp_path / "m.safetensors"), framework="np") as f:
        metadata, tensors = f.metadata(), {name: f.get_tensor(name).astype(np.float64) for name in f.keys()}
    assert metadata["data"] == "digits" and float(metadata["input_scale"]) == 1 / 16, metadata
    digits = np.load(DIGITS_PATH)
    x = digits["x_test"] * float(metadata["input_scale"])
    for i in range(2):                                   # 64-16-10: GELU (tanh form) after the first layer
        x = x @ tensors[f"layers.{i}.weight"].T + tensors[f"layers.{i}.bias"]
        if i == 0:
            x = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    assert round(100 * np.mean(x.argmax(1) == digits["y_test"]), 2) == printed
