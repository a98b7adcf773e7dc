"""End-to-end tests of the command line: `mpirun -n N python -m zerompi.train [flags]`.

Each test is a single-process pytest test that launches the real CLI under mpirun as a subprocess
(in its own session, cwd = a fresh tmp_path, with a wall-clock limit: a run that hangs is killed
with its whole process group and the test fails instead of hanging the suite).

    bad input      every bad flag / file: exit 2, "zerompi: error:" printed exactly once, naming
                   the problem, quickly, and nothing written to the working folder
    --help         usage printed once, exit 0
    determinism    the same flags twice give bitwise identical weights and loss lines
    equivalence    N in {1, 4} x stage {0, 1, 2, 3} in float64 agree with N=1 stage 0 to 1e-12
    resume         --init-weights loads what --save-weights wrote, across N and stage
    --report json  stdout is one JSON document whose measurements match the padded formulas
    default run    progress lines, held-out accuracy and the ledger tables
    user .npz      a user dataset with/without a held-out split, shuffled or not

Runs are kept tiny (a few steps, small --hidden) so the file takes well under 90 s on 2 cores.
"""
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest

TIMEOUT = 120           # seconds allowed for one mpirun launch before it is killed
ERROR_FAST = 60         # a bad-input run ends well within this (1-3 s on a quiet machine), not at TIMEOUT
ERROR_MARK = "zerompi: error:"


def _mpirun():
    beside_python = os.path.join(os.path.dirname(sys.executable), "mpirun")
    if os.path.exists(beside_python):
        return beside_python
    found = shutil.which("mpirun")
    if found is None:
        pytest.skip("mpirun not found next to sys.executable or on PATH")
    return found


class Run:
    def __init__(self, args, returncode, stdout, stderr, seconds):
        self.args, self.returncode, self.stdout, self.stderr, self.seconds = \
            args, returncode, stdout, stderr, seconds

    @property
    def output(self):
        return self.stdout + self.stderr

    def describe(self):
        return (f"command: {' '.join(self.args)}\nexit code: {self.returncode} after {self.seconds:.1f} s\n"
                f"--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}")


def launch(n, *flags, cwd, timeout=TIMEOUT, program=("-m", "zerompi.train"), env=None, preexec_fn=None):
    """Run `mpirun -n n python -m zerompi.train *flags` (or another python program) in cwd, in
    the environment env (None: this one), preexec_fn run in the child first (e.g. a ulimit);
    returns a Run (never hangs)."""
    return run_command([_mpirun(), "-n", str(n), sys.executable, *program, *map(str, flags)], cwd=cwd,
                       timeout=timeout, env=env, preexec_fn=preexec_fn)


def run_command(args, cwd, timeout=TIMEOUT, env=None, preexec_fn=None):
    """Run args (an mpirun command line) in cwd, in its own session; returns a Run, or fails the
    test when it runs past timeout (killed with its whole process group: it never hangs)."""
    start = time.perf_counter()
    process = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, text=True, start_new_session=True, env=env,
                               preexec_fn=preexec_fn)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)     # mpirun and every rank it started
        except ProcessLookupError:
            pass
        stdout, stderr = process.communicate()
        pytest.fail(f"timed out after {timeout} s: {' '.join(args)}\n--- stdout ---\n{stdout}"
                    f"\n--- stderr ---\n{stderr}")
    return Run(args, process.returncode, stdout, stderr, time.perf_counter() - start)


def train_ok(n, *flags, cwd):
    run = launch(n, *flags, cwd=cwd)
    assert run.returncode == 0, run.describe()
    assert ERROR_MARK not in run.output and "Traceback" not in run.output, run.describe()
    return run


def load_weights(path):
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def files_under(folder):
    """Every file and folder under `folder`, hidden ones included, as sorted relative paths."""
    found = []
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            found.append(os.path.relpath(os.path.join(root, name), folder))
    return sorted(found)


def loss_lines(output):
    """The progress lines without their timing columns, time per step and elapsed time (the only
    parts that may differ by run)."""
    return [re.sub(r" +[\d.e+]+ [um]?s/step  [\d:]+$", "", line) for line in output.splitlines()
            if line.startswith("step ") and "loss" in line]


# ----------------------------------------------------------------------------------------------
# Inputs the bad-input cases need, written into the test's tmp_path before the run
# ----------------------------------------------------------------------------------------------

def _good_xy(rows=40, features=4, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, features)), rng.integers(0, classes, rows)


def _text_file(folder):
    with open(os.path.join(folder, "data.txt"), "w") as f:
        f.write("this is not an npz archive\n1,2,3\n")
    return "data.txt"


def _wrong_keys(folder):
    x, y = _good_xy()
    np.savez(os.path.join(folder, "keys.npz"), inputs=x, labels=y)
    return "keys.npz"


def _x_1d(folder):
    _, y = _good_xy()
    np.savez(os.path.join(folder, "flat.npz"), x=np.arange(40, dtype=np.float64), y=y)
    return "flat.npz"


def _labels_too_large(folder):
    x, y = _good_xy()
    y[7] = 5                                   # max label 5 needs 6 classes; we allow 3
    np.savez(os.path.join(folder, "labels.npz"), x=x, y=y)
    return "labels.npz"


def _huge_label(folder):
    x, y = _good_xy()
    y[0] = 10**9                               # a broken file, not a billion-class problem
    np.savez(os.path.join(folder, "huge.npz"), x=x, y=y)
    return "huge.npz"


def _nan_in_x(folder):
    x, y = _good_xy()
    x[3, 2] = np.nan
    np.savez(os.path.join(folder, "nan.npz"), x=x, y=y)
    return "nan.npz"


def _truncated_npz(folder):
    x, y = _good_xy()
    np.savez(os.path.join(folder, "cut.npz"), x=x, y=y)
    with open(os.path.join(folder, "cut.npz"), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(folder, "cut.npz")) // 2)   # a copy that stopped halfway
    return "cut.npz"


def _x_overflows_float32(folder):
    x, y = _good_xy()
    x[5, 1] = 1e300                            # finite in float64, inf in float32
    np.savez(os.path.join(folder, "big.npz"), x=x, y=y)
    return "big.npz"


def _header_declares_a_huge_shape(folder):
    """x.npy's header declares (1e11, 4) float64 (3.2 TB) over 32 bytes of data."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (10 ** 11, 4)})
    _, y = _good_xy()
    with zipfile.ZipFile(os.path.join(folder, "lies.npz"), "w") as archive:
        archive.writestr("x.npy", header.getvalue() + bytes(32))
        with archive.open("y.npy", "w") as member:
            np.lib.format.write_array(member, y)
    return "lies.npz"


def _good_npz(folder):
    x, y = _good_xy()
    np.savez(os.path.join(folder, "data.npz"), x=x, y=y)
    return "data.npz"


def _fifo(name):
    def maker(folder):
        os.mkfifo(os.path.join(folder, name))
        return name
    return maker


def _a_folder(folder):
    os.mkdir(os.path.join(folder, "out.npz"))
    return "out.npz"


def _a_file(folder):
    with open(os.path.join(folder, "notes.txt"), "w") as f:
        f.write("a file, not a folder\n")
    return "notes.txt"


def _write(name, text):
    def maker(folder):
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
        return name
    return maker


_toml_unknown_keys = _write("run.toml", "stage = 1\nbatchsize = 4\nlearning_rate = 0.1\n")
_toml_invalid = _write("run.toml", "stage = \n")
_toml_bad_value = _write("run.toml", 'lr = "fast"\n')
_ds_unsupported = _write("ds.json", '{"zero_optimization": {"stage": 2, "offload_param": {"device": "gpu"}},'
                                    ' "optimizer": {"type": "Lamb"}, "wall_clock_breakdown": false}')
_ds_inconsistent = _write("ds.json", '{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}')
_ds_invalid = _write("ds.json", '{"zero_optimization": {"stage": 2},}')
_ds_enabled_string = _write("ds.json", '{"fp16": {"enabled": "false"}}')
_ds_nested_deep = _write("ds.json", "[" * 100_000 + "]" * 100_000)


@pytest.fixture(scope="module")
def hidden8_weights(tmp_path_factory):
    """A weights file of the synthetic-data model with --hidden 8 (32-8-10)."""
    folder = tmp_path_factory.mktemp("hidden8")
    train_ok(1, "--hidden", 8, "--steps", 1, "--batch-size", 8, "--log-every", 0, "--report", "none",
             "--save-weights", "w8.npz", cwd=folder)
    return os.path.join(folder, "w8.npz")


# (id, flags, keyword the error line must contain, input maker or None, rank counts)
# The input maker writes its files into the run's folder and returns the name to substitute for
# "{input}" in the flags. Every case runs on 2 ranks (3 where the message counts them: the batch
# that does not split); the ones marked with 1 also at N=1.
BAD_INPUTS = [
    ("stage-7", ["--stage", 7], "argument --stage: invalid choice: 7 (choose from 0, 1, 2, 3)", None, (2, 1)),
    ("steps-0", ["--steps", 0], "--steps must be positive", None, (2,)),
    ("batch-negative", ["--batch-size", -4], "--batch-size must be positive", None, (2,)),
    ("hidden-zero", ["--hidden", "0,5"], "widths must be positive", None, (2,)),
    ("hidden-abc", ["--hidden", "abc"], "expected comma-separated integers", None, (2, 1)),
    ("batch-not-divisible", ["--batch-size", 10], "--batch-size 10 cannot be split over 3 ranks x 1 micro-batch: "
     "use --batch-size 9 or 12, or --micro-batch-size 3 instead (a global batch of 9)", None, (3,)),
    ("dtype-int8", ["--dtype", "int8"], "argument --dtype: invalid choice: 'int8'", None, (2,)),
    ("grad-accum-0", ["--grad-accum", 0], "--grad-accum must be positive", None, (2,)),
    ("batch-not-divisible-by-micro-batches", ["--grad-accum", 5], "over 3 ranks x 5 micro-batches", None, (3,)),
    ("lr-schedule-unknown", ["--lr-schedule", "linear"], "argument --lr-schedule: invalid choice: 'linear'", None,
     (2,)),
    ("warmup-negative", ["--warmup-steps", -1], "--warmup-steps must be >= 0", None, (2,)),
    ("min-lr-above-lr", ["--min-lr", 1.0], "--min-lr must be in [0, --lr]", None, (2,)),
    ("clip-norm-negative", ["--clip-norm", -1], "--clip-norm must be >= 0", None, (2,)),
    ("unknown-flag", ["--frobnicate", 3], "unrecognized arguments: --frobnicate", None, (2, 1)),
    ("data-missing", ["--data", "missing.npz"], "no such file", None, (2, 1)),
    ("data-text", ["--data", "{input}"], "not a valid .npz", _text_file, (2,)),
    ("data-wrong-keys", ["--data", "{input}"], "missing key 'x'", _wrong_keys, (2,)),
    ("data-x-1d", ["--data", "{input}"], "must be 2-D", _x_1d, (2,)),
    ("data-labels-out-of-range", ["--data", "{input}", "--classes", 3], "labels out of range",
     _labels_too_large, (2,)),
    ("data-nan", ["--data", "{input}"], "NaN", _nan_in_x, (2,)),
    ("init-weights-other-shape", ["--hidden", 9, "--init-weights", "{input}"], "has shape",
     "hidden8", (2, 1)),
    ("save-weights-no-folder", ["--save-weights", "nowhere/w.npz"], "does not exist", None, (2, 1)),
    ("seed-negative", ["--seed", -1], "--seed must be >= 0", None, (2,)),
    ("eps-vanishes-in-float32", ["--eps", 1e-50], "--eps 1e-50 vanishes in float32", None, (2,)),
    ("classes-5e18", ["--classes", 5000000000000000000], "more than any machine can address", None, (2,)),
    ("hidden-1e21", ["--hidden", 10 ** 21], "more than any machine can address", None, (2,)),
    ("eps-vanishes-in-bf16", ["--eps", 1e-50, "--dtype", "bf16"], "--eps 1e-50 vanishes in float32", None, (2,)),
    ("eps-vanishes-in-float64", ["--eps", 5e-324, "--dtype", "float64"], "--eps 5e-324 vanishes in float64",
     None, (2,)),
    ("lr-vanishes-in-float32", ["--lr", 1e-50], "--lr 1e-50 vanishes in float32", None, (2,)),
    ("clip-norm-vanishes", ["--clip-norm", 1e-300], "--clip-norm 1e-300 vanishes in float32", None, (2,)),
    ("decay-flips-the-weights", ["--weight-decay", 1e300], "must stay above 0: pass a smaller --weight-decay", None,
     (2,)),
    ("lr-inf", ["--lr", "inf"], "--lr must be a finite number", None, (2,)),
    ("weight-decay-inf", ["--weight-decay", "inf"], "--weight-decay must be a finite number", None, (2,)),
    ("data-huge-label", ["--data", "{input}"], "more than 100000 classes", _huge_label, (2,)),
    ("data-truncated", ["--data", "{input}"], "cut.npz: not a valid .npz", _truncated_npz, (2,)),
    ("save-weights-is-a-folder", ["--save-weights", "{input}"], "it is a folder", _a_folder, (2,)),
    ("save-weights-under-a-file", ["--save-weights", "{input}/w.npz"], "does not exist", _a_file, (2,)),
    ("collective-timeout-negative", ["--collective-timeout", -1], "--collective-timeout must be >= 0", None, (2,)),
    ("config-missing", ["--config", "missing.toml"], "cannot read config file missing.toml", None, (2, 1)),
    ("config-unknown-keys", ["--config", "{input}"], "unknown keys: batchsize, learning_rate",
     _toml_unknown_keys, (2,)),
    ("config-invalid-toml", ["--config", "{input}"], "run.toml is not valid TOML", _toml_invalid, (2,)),
    ("config-bad-value", ["--config", "{input}"], "run.toml: lr='fast' must be a number",
     _toml_bad_value, (2,)),
    ("deepspeed-unsupported", ["--deepspeed-config", "{input}"], "unsupported DeepSpeed settings: "
     "zero_optimization.offload_param.device='gpu' (none, cpu or nvme), optimizer.type='Lamb'",
     _ds_unsupported, (2,)),
    ("deepspeed-inconsistent-batch", ["--config", "{input}"], "--batch-size 12, --micro-batch-size 4 and "
     "--grad-accum 2 disagree on 3 ranks", _ds_inconsistent, (3,)),
    ("deepspeed-invalid-json", ["--config", "{input}"], "ds.json is not valid JSON", _ds_invalid, (2,)),
    ("config-and-deepspeed", ["--config", "a.toml", "--deepspeed-config", "b.json"], "choose one", None, (2,)),
    ("device-unknown", ["--device", "tpu"], "argument --device: invalid choice: 'tpu' (choose from 'auto', 'cpu', "
     "'gpu')", None, (2,)),
    ("comm-unknown", ["--comm", "gloo"], "argument --comm: invalid choice: 'gloo' (choose from 'mpi', 'nccl')", None,
     (2,)),
    ("comm-nccl-on-cpu", ["--comm", "nccl", "--device", "cpu"], "--comm nccl needs --device gpu", None, (2, 1)),
    ("overlap-is-a-switch", ["--overlap", "on"], "unrecognized arguments: on", None, (2,)),
    ("bucket-mb-negative", ["--bucket-mb", -1], "--bucket-mb must be a finite number >= 0", None, (2,)),
    ("prefetch-negative", ["--prefetch", -1], "--prefetch must be >= 0", None, (2,)),
    ("data-overflows-float32", ["--data", "{input}"], "'x' has 1 values that are not finite in float32",
     _x_overflows_float32, (2,)),
    ("data-header-declares-3-TB", ["--data", "{input}"], "'x' declares shape (100000000000, 4) float64",
     _header_declares_a_huge_shape, (2,)),
    ("classes-1e9", ["--classes", 1000000000], "needs", None, (2,)),
    ("init-weights-fifo", ["--init-weights", "{input}"], "w.npz: is a FIFO", _fifo("w.npz"), (2,)),
    ("config-fifo", ["--config", "{input}"], "run.toml: is a FIFO", _fifo("run.toml"), (2, 1)),
    ("deepspeed-enabled-string", ["--deepspeed-config", "{input}"], "fp16.enabled='false' must be true or false",
     _ds_enabled_string, (2,)),
    ("deepspeed-nested-deep", ["--config", "{input}"], "ds.json is not valid JSON: nested too deeply",
     _ds_nested_deep, (2,)),
    ("metrics-is-the-data", ["--data", "{input}", "--metrics", "{input}"], "--metrics data.npz is --data data.npz",
     _good_npz, (2,)),
]

# (id, environment variables, keyword, rank counts): bad environments, checked the same way
BAD_ENVIRONMENTS = [
    ("omp-num-threads-text", {"OMP_NUM_THREADS": "many"}, "OMP_NUM_THREADS='many'", (2, 1)),
    ("omp-num-threads-zero", {"OMP_NUM_THREADS": "0"}, "OMP_NUM_THREADS='0'", (2,)),
    ("omp-num-threads-huge", {"OMP_NUM_THREADS": "99999999999999999999"}, "of at most 65536", (2,)),  # a traceback
]

BAD_INPUT_PARAMS = [pytest.param(n, flags, keyword, maker, None, id=f"{name}-n{n}")
                    for name, flags, keyword, maker, counts in BAD_INPUTS for n in counts] + \
                   [pytest.param(n, [], keyword, None, env, id=f"{name}-n{n}")
                    for name, env, keyword, counts in BAD_ENVIRONMENTS for n in counts]

@pytest.mark.timeout(4 * TIMEOUT)
@pytest.mark.parametrize("n, flags, keyword, maker, env", BAD_INPUT_PARAMS)
def test_bad_input_fails_once_cleanly_and_writes_nothing(n, flags, keyword, maker, env, tmp_path, request):
    name = None
    if maker == "hidden8":
        name = "w8.npz"
        shutil.copy(request.getfixturevalue("hidden8_weights"), tmp_path / name)
    elif maker is not None:
        name = maker(str(tmp_path))
    flags = [f.replace("{input}", name) if isinstance(f, str) and name else f for f in flags]
    before = files_under(tmp_path)
    # the run would be short even if the check were missing: tiny model, few steps, and a
    # --save-weights target whose appearance would show that the run went on
    tiny = ["--steps", 2, "--hidden", 4, "--batch-size", 12, "--log-every", 0, "--report", "none"]
    run = launch(n, *tiny, *flags, *([] if "--save-weights" in flags else ["--save-weights", "out.npz"]),
                 cwd=tmp_path, env=None if env is None else dict(os.environ, **env))

    assert run.returncode == 2, run.describe()
    assert run.output.count(ERROR_MARK) == 1, run.describe()
    error_line = next(line for line in run.output.splitlines() if ERROR_MARK in line)
    assert keyword in error_line, run.describe()
    assert "Traceback" not in run.output, run.describe()
    assert run.stdout == "", run.describe()                # the error goes to stderr, nothing else
    assert run.seconds < ERROR_FAST, run.describe()
    assert files_under(tmp_path) == before, "the failed run left files behind"


# ----------------------------------------------------------------------------------------------
# --help
# ----------------------------------------------------------------------------------------------

def test_help_prints_usage_once_and_exits_0(tmp_path):
    run = launch(3, "--help", cwd=tmp_path)
    assert run.returncode == 0, run.describe()
    assert run.output.count("usage:") == 1, run.describe()
    assert "--stage" in run.stdout and "--save-weights" in run.stdout, run.describe()
    assert ERROR_MARK not in run.output, run.describe()
    assert files_under(tmp_path) == []


def test_help_is_grouped_with_choices_switches_and_defaults():
    """--help comes from TrainConfig's fields: a group per topic, enumerations as {choices},
    booleans as --x/--no-x, and "(default: ...)" wherever there is a default to show."""
    from zerompi.train.options.config import build_parser
    text = " ".join(build_parser().format_help().split())          # unwrapped
    groups = ["config files:", "model:", "data and batches:", "optimizer and schedule:", "precision:",
              "ZeRO and communication:", "checkpoints:", "output:", "exit status"]
    assert [text.index(group) for group in groups] == sorted(text.index(group) for group in groups)
    for flag in ("--stage {0,1,2,3}", "--dtype {float32,float64,bf16,fp16}", "--lr-schedule {constant,cosine}",
                 "--report {table,json,none}", "--device {auto,cpu,gpu}", "--comm {mpi,nccl}",
                 "--progress {auto,live,lines}", "--overlap, --no-overlap", "--shuffle, --no-shuffle",
                 "--check-collectives, --no-check-collectives", "--version"):
        assert flag in text, flag
    assert "partitioned (default: 3)" in text
    assert "(also spelt fp64, fp32, bfloat16, float16)" in text         # every name --dtype accepts is shown
    assert "(default: --no-overlap)" in text and "(default: --shuffle)" in text      # a switch shows as itself
    for empty in ("(default: )", "(default: None)", "(default: False)", "(default: True)"):
        assert empty not in text, empty
    batch = text[text.index("--batch-size ROWS"):text.index("optimizer and schedule:")]
    assert "(default:" not in batch and batch.count("Not given:") == 3      # each says what happens instead


def test_help_ends_with_every_exit_status_and_environment_variable():
    from zerompi.util.exit_codes import ExitCode
    from zerompi.train.options.config import build_parser
    from zerompi.train.options.environment import ENVIRONMENT
    text = build_parser().format_help()
    epilog = text[text.index("exit status"):]
    for code in ExitCode:
        assert re.search(rf"^ +{code.value}  {code.name.lower().replace('_', ' ')}: \S", epilog, re.M), code
    for names, _ in ENVIRONMENT:
        for name in names:
            assert name in epilog, name


def test_help_fits_80_columns():
    env = dict(os.environ, COLUMNS="80")
    text = subprocess.run([sys.executable, "-c", "from zerompi.train.options.config import build_parser; "
                           "build_parser().print_help()"], env=env, capture_output=True, text=True,
                          timeout=60).stdout
    assert text.startswith("usage:") and max(map(len, text.splitlines())) <= 80


ENVIRONMENT_READ = re.compile(r"""(?:environ\.get|environ\[|getenv)\(?\s*["']([A-Za-z_][A-Za-z0-9_]*)["']""")
VARIABLE_NAME = re.compile(r"""["']((?:OMP|PMI|PMIX|OMPI|MPI|PALS|SLURM|ZEROMPI|CUDA|NCCL|I_MPI|MPICH)_[A-Z0-9_]+)["']""")


def test_every_environment_variable_zerompi_reads_is_in_the_help_table():
    """A read written as environ.get("X") / environ["X"] / getenv("X"), and any quoted whole name of
    the launchers' and zerompi's families (the tables of names read in a loop) in a module that
    reads the environment, must be in zerompi/train/options/environment.py's table."""
    from zerompi.train.options.environment import ENVIRONMENT
    listed = {name for names, _ in ENVIRONMENT for name in names}
    package = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "zerompi")
    found = {}
    for root, _, files in os.walk(package):
        for name in files:
            if name.endswith(".py") and name != "environment.py":
                with open(os.path.join(root, name)) as f:
                    source = f.read()
                names = set(ENVIRONMENT_READ.findall(source))
                if "environ" in source or "getenv" in source:
                    names |= set(VARIABLE_NAME.findall(source))
                for variable in names:
                    found.setdefault(variable, os.path.relpath(os.path.join(root, name), package))
    assert found, "the scan found no environment read at all"
    assert {"OMP_NUM_THREADS", "PMI_SIZE", "SLURM_LOCALID", "ZEROMPI_CUDA_AWARE"} <= set(found)
    missing = {variable: where for variable, where in found.items() if variable not in listed}
    assert not missing, f"read but not listed in zerompi/train/options/environment.py: {missing}"


def test_version_is_pyprojects(tmp_path):
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    import zerompi
    from zerompi.train.options.version import version_text, zerompi_version
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        declared = tomllib.load(f)["project"]["version"]
    assert zerompi.__version__ == declared == zerompi_version()
    assert version_text().splitlines()[0] == f"zerompi {declared}"


# MPICH's processes find their process manager through PMI_PORT: a port nobody listens on makes
# MPI_Init fail at once, as on a login node without a working launcher
BROKEN_PMI = {"PMI_PORT": "127.0.0.1:1", "PMI_RANK": "0", "PMI_SIZE": "1"}


def test_help_and_version_work_where_mpi_cannot_start(tmp_path):
    env = dict(os.environ, **BROKEN_PMI)
    broken = subprocess.run([sys.executable, "-c", "from mpi4py import MPI"], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert broken.returncode != 0, "this environment does not break MPI_Init: the test would prove nothing"
    for flag, says in (("--help", "usage: mpirun -n N python -m zerompi.train"), ("--version", "zerompi ")):
        run = subprocess.run([sys.executable, "-X", "importtime", "-m", "zerompi.train", flag], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.startswith(says), run.stdout
        assert "mpi4py.MPI" not in run.stderr                      # -X importtime lists every import
    dry = subprocess.run([sys.executable, "-m", "zerompi.train", "--dry-run", "--ranks", "2"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)    # needs no MPI
    assert dry.returncode == 0 and dry.stdout.startswith("zerompi dry run: MLP 64-128-128-10"), dry.stderr[-2000:]
    assert files_under(tmp_path) == []


NO_MPI_LIBRARY = {"MPI4PY_LIBMPI": "/nonexistent/libmpi.so"}     # mpi4py loads no library then


@pytest.mark.parametrize("command", [["-m", "zerompi.train", "--steps", 2], ["-m", "zerompi.plan", "calibrate",
                                                                                 "--out", "m.json"]])
def test_a_missing_mpi_library_is_one_line_and_the_plans_need_none(command, tmp_path):
    """Where the MPI library could not be loaded, every command ended in a 35-line traceback, also
    --dry-run, which the docs say needs no MPI."""
    env = dict(os.environ, **NO_MPI_LIBRARY)
    broken = subprocess.run([sys.executable, "-c", "from mpi4py import MPI"], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert broken.returncode != 0, "this environment loads an MPI library all the same: the test would prove nothing"
    for launcher in ([], [_mpirun(), "-n", "2"]):
        run = subprocess.run([*launcher, sys.executable, *map(str, command)], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
        assert run.stderr.count(ERROR_MARK) == 1 and "the MPI library cannot be loaded" in run.stderr, run.stderr
    for plan in (["-m", "zerompi.train", "--dry-run", "--ranks", 2],
                 ["-m", "zerompi.plan", "--hidden", 8, "--ranks", 2, "--micro-batch-size", 16, "--gemm-gflops", 1,
                  "--mem-bandwidth-gbs", 1, "--intra-bandwidth-gbs", 1, "--intra-latency-us", 1]):
        run = subprocess.run([sys.executable, *map(str, plan)], env=env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 0 and "per rank" in run.stdout, run.stderr[-2000:]
    assert files_under(tmp_path) == []


def test_version_prints_once_under_mpirun_and_names_the_versions(tmp_path):
    import mpi4py
    run = launch(3, "--version", cwd=tmp_path)
    assert run.returncode == 0, run.describe()
    assert run.stdout.count("zerompi ") == 1, run.describe()
    assert f"NumPy {np.__version__}, mpi4py {mpi4py.__version__}" in run.stdout
    assert "MPI library (as mpi4py would load it): " in run.stdout


def test_exit_statuses_keep_their_numbers():
    """Job scripts branch on them (slurm/common.sh requeues a preempted job on 4)."""
    from zerompi.util.exit_codes import ExitCode
    assert {code.name: int(code) for code in ExitCode} == {
        "OK": 0, "FAILED": 1, "BAD_INPUT": 2, "DIVERGED": 3, "PREEMPTED": 4, "COLLECTIVE_MISMATCH": 5,
        "COLLECTIVE_TIMEOUT": 6, "OUT_OF_MEMORY": 7, "OFFLOAD_FAILED": 8, "MEASUREMENT_VOID": 9, "INTERRUPTED": 130}


# ----------------------------------------------------------------------------------------------
# Determinism: the same flags twice give the same bits
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "fp16"])
def test_divergence_stops_with_one_error_exit_3_and_keeps_the_last_good_weights(dtype, tmp_path):
    """float32: a learning rate that blows the weights up until the loss is not finite.
    fp16: a loss scale that overflows at every step and halves until it is below the floor."""
    flags = (["--lr", "1e30", "--weight-decay", 0, "--lr-schedule", "constant", "--warmup-steps", 0] if dtype == "float32" else
             ["--loss-scale", 2.0 ** 40, "--min-loss-scale", 2.0 ** 30])
    run = launch(3, "--dtype", dtype, "--steps", 50, "--hidden", 8, "--batch-size", 12, "--log-every", 0,
                 "--report", "none", "--save-weights", "w.npz", *flags, cwd=tmp_path)
    assert run.returncode == 3, run.describe()
    assert run.output.count(ERROR_MARK) == 1, run.describe()
    error_line = next(line for line in run.output.splitlines() if ERROR_MARK in line)
    assert "step " in error_line, run.describe()
    assert ("not finite" if dtype == "float32" else "loss scale fell") in error_line, run.describe()
    assert "last good weights are in w.npz" in error_line, run.describe()
    weights = load_weights(tmp_path / "w.npz")
    assert all(np.all(np.isfinite(a)) for a in weights.values())
    if dtype == "fp16":                     # every step overflowed: the initial weights, untouched
        assert run.output.count("gradient overflow: step skipped") == 11, run.describe()


def test_same_flags_twice_give_bitwise_identical_weights_and_losses(tmp_path):
    flags = ["--stage", 2, "--steps", 20, "--hidden", "16,9", "--batch-size", 48, "--log-every", 5,
             "--report", "none", "--save-weights", "w.npz"]
    runs, weights = [], []
    for attempt in ("first", "second"):
        folder = tmp_path / attempt
        folder.mkdir()
        runs.append(train_ok(3, *flags, cwd=folder))
        weights.append(load_weights(folder / "w.npz"))
        assert files_under(folder) == ["w.npz"]                    # no temporary left over
    first, second = weights
    assert sorted(first) == sorted(second) == [f"layers.{i}.{t}" for i in range(3)
                                               for t in ("bias", "weight")]
    for name in first:
        assert first[name].dtype == np.float32
        assert np.array_equal(first[name], second[name]), name
    losses = [loss_lines(r.stdout) for r in runs]
    assert len(losses[0]) == 4                                     # steps 5, 10, 15, 20
    assert losses[0] == losses[1]


@pytest.mark.timeout(4 * TIMEOUT)
@pytest.mark.parametrize("stage", [0, 3])
def test_overlap_on_and_off_save_bitwise_identical_weights(stage, tmp_path):
    """The communication thread changes when collectives run, never what they compute
    (tests/proofs/test_overlap_is_bitwise_identical.py checks it for every stage, N, dtype and setting;
    this is the command line: the flags reach the engine, an unsharded stage and the one that prefetches)."""
    flags = ["--stage", stage, "--steps", 6, "--hidden", "16,9", "--batch-size", 24, "--grad-accum", 2,
             "--log-every", 0, "--report", "none", "--bucket-mb", 0]
    train_ok(3, *flags, "--no-overlap", "--save-weights", "off.npz", cwd=tmp_path)
    train_ok(3, *flags, "--overlap", "--prefetch", 2, "--save-weights", "on.npz", cwd=tmp_path)
    off, on = load_weights(tmp_path / "off.npz"), load_weights(tmp_path / "on.npz")
    assert sorted(off) == sorted(on)
    for name in off:
        assert np.array_equal(off[name], on[name]), name


# ----------------------------------------------------------------------------------------------
# Equivalence: every stage and N trains the same model (float64)
# ----------------------------------------------------------------------------------------------

EQUIVALENCE_FLAGS = ["--dtype", "float64", "--steps", 5, "--hidden", "11,7", "--batch-size", 16,
                     "--seed", 3, "--log-every", 0, "--report", "none", "--save-weights", "w.npz"]


@pytest.fixture(scope="module")
def reference_weights(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reference")
    train_ok(1, "--stage", 0, *EQUIVALENCE_FLAGS, cwd=folder)
    return load_weights(folder / "w.npz")


@pytest.mark.timeout(4 * TIMEOUT)
@pytest.mark.parametrize("n, stage", [(n, stage) for n in (1, 4) for stage in (0, 1, 2, 3)
                                      if (n, stage) != (1, 0)])       # (1, 0): the reference
def test_every_stage_and_rank_count_trains_the_same_weights(n, stage, reference_weights, tmp_path):
    train_ok(n, "--stage", stage, *EQUIVALENCE_FLAGS, cwd=tmp_path)
    weights = load_weights(tmp_path / "w.npz")
    assert sorted(weights) == sorted(reference_weights)
    for name, want in reference_weights.items():
        got = weights[name]
        assert got.dtype == np.float64 and got.shape == want.shape, name
        relative = np.max(np.abs(got - want)) / np.max(np.abs(want))
        assert relative <= 1e-12, f"{name}: relative difference {relative:.3g} (N={n}, stage {stage})"


def test_more_ranks_than_a_layer_has_elements_trains_the_same_in_every_stage(tmp_path):
    """--hidden 1,1: the middle layer has 1 weight and 1 bias, so on 4 ranks two ranks own only
    padding; stage 3 (sharded parameters) pads and agrees with stage 0."""
    flags = ["--hidden", "1,1", "--dtype", "float64", "--steps", 3, "--batch-size", 16,
             "--log-every", 0, "--report", "none"]
    weights = []
    for stage in (0, 3):
        train_ok(4, "--stage", stage, *flags, "--save-weights", f"w{stage}.npz", cwd=tmp_path)
        weights.append(load_weights(tmp_path / f"w{stage}.npz"))
    assert weights[0]["layers.1.weight"].shape == (1, 1)
    for name, want in weights[0].items():
        np.testing.assert_allclose(weights[1][name], want, rtol=1e-12, atol=0, err_msg=name)


# ----------------------------------------------------------------------------------------------
# Save, then start from the saved weights at another N and stage
# ----------------------------------------------------------------------------------------------

def test_init_weights_loads_what_save_weights_wrote_across_n_and_stage(tmp_path):
    common = ["--dtype", "float64", "--hidden", "10,6", "--batch-size", 12, "--log-every", 0,
              "--report", "none"]
    train_ok(2, "--stage", 3, "--steps", 10, *common, "--save-weights", "w1.npz", cwd=tmp_path)
    train_ok(3, "--stage", 1, "--steps", 1, "--lr", 1e-12, *common, "--seed", 7,
             "--init-weights", "w1.npz", "--save-weights", "w2.npz", cwd=tmp_path)
    train_ok(3, "--stage", 1, "--steps", 1, "--lr", 1e-12, *common, "--seed", 7,
             "--save-weights", "fresh.npz", cwd=tmp_path)
    w1, w2, fresh = (load_weights(tmp_path / f) for f in ("w1.npz", "w2.npz", "fresh.npz"))
    assert sorted(w1) == sorted(w2)
    for name in w1:
        assert w2[name].shape == w1[name].shape and w2[name].dtype == np.float64
        # one AdamW step of lr 1e-12 moves each weight by about 1e-12
        np.testing.assert_allclose(w2[name], w1[name], rtol=0, atol=1e-9, err_msg=name)
        if name.endswith("weight"):       # and w1 is not what a random init would give
            assert np.max(np.abs(fresh[name] - w1[name])) > 1e-3, name
    assert sorted(files_under(tmp_path)) == ["fresh.npz", "w1.npz", "w2.npz"]


# ----------------------------------------------------------------------------------------------
# --report json
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, micro_batches, bytes_per_param",
                         [("float32", 1, (4, 4, 8)), ("bf16", 2, (2, 2, 12)), ("fp16", 1, (2, 2, 12))])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_report_json_is_one_document_whose_measurements_match_the_formulas(stage, dtype, micro_batches,
                                                                           bytes_per_param, tmp_path):
    # layers of 455, 40 and 60 elements: two padded at N = 3; --log-every 1 checks that progress
    # lines go to stderr and leave stdout to the JSON document
    run = train_ok(3, "--stage", stage, "--hidden", "7,5", "--batch-size", 12, "--steps", 3,
                   "--dtype", dtype, "--grad-accum", micro_batches, "--log-every", 1, "--report", "json",
                   cwd=tmp_path)
    report = json.loads(run.stdout)
    b = report["bytes_per_param"]
    assert (b["param"], b["grad"], b["optimizer"]) == bytes_per_param
    assert report["micro_batches"] == micro_batches
    assert len(loss_lines(run.stderr)) == 3
    assert report["stage"] == stage and report["ranks"] == 3 and report["steps"] == 3
    assert report["psi"] == 64 * 7 + 7 + 7 * 5 + 5 + 5 * 10 + 10            # the digits: 64 features
    assert report["psi_padded"] > report["psi"]
    assert report["psi_padded"] - report["psi"] <= 3 * (3 - 1)      # at most N-1 per layer
    assert len(report["per_rank"]) == 3
    padded_total = report["memory_formula_padded_bytes"]["total"]
    comm_padded = report["comm_formula_padded_elements_per_step"]
    for rank, row in enumerate(report["per_rank"]):
        measured = row["params"] + row["grads"] + row["optimizer"]
        assert measured == padded_total, f"rank {rank}: {row}"
        assert report["memory_formula_bytes"]["total"] <= measured, f"rank {rank}"
        # bytes: gradients are reduced in the compute dtype (float32), parameters gathered as stored
        assert row["comm_bytes"] == pytest.approx(4 * row["grads_elements"] + bytes_per_param[0]
                                                  * row["params_elements"], rel=1e-12)
        moved = row["grads_elements"] + row["params_elements"]
        assert moved == pytest.approx(comm_padded, rel=1e-12, abs=1e-9), f"rank {rank}: {row}"
    assert files_under(tmp_path) == []


# ----------------------------------------------------------------------------------------------
# The default run's output
# ----------------------------------------------------------------------------------------------

def test_default_run_prints_progress_accuracy_and_ledger(tmp_path):
    run = train_ok(2, "--steps", 30, "--log-every", 10, cwd=tmp_path)
    progress = loss_lines(run.stdout)
    assert [line.split("  loss")[0] for line in progress] == ["step 10/30", "step 20/30", "step 30/30"]
    assert run.stdout.count("held-out accuracy") == 1
    assert run.stdout.count("Memory per rank") == 1
    assert run.stdout.count("Communication per rank") == 1
    assert "ZeRO stage 3 on 2 ranks" in run.stdout
    assert files_under(tmp_path) == []


@pytest.mark.timeout(4 * TIMEOUT)
@pytest.mark.parametrize("n", [3, 6])
def test_the_default_command_runs_on_rank_counts_that_do_not_divide_128(n, tmp_path):
    """No batch option: 16 rows per rank, so the global batch is 16 N (an odd N and an even one)."""
    run = train_ok(n, "--steps", 5, "--log-every", 0, "--report", "none", cwd=tmp_path)
    assert f"global batch {16 * n} = {n} ranks x 1 micro-batch x 16 rows" in run.stdout, run.describe()
    assert files_under(tmp_path) == []


def test_resuming_a_default_batch_run_on_another_n_says_how_to_continue(tmp_path):
    """The global batch came from the default micro-batch, so it changes with N; a checkpoint keeps
    its data order only with its own global batch: the resumed run says which, and runs with it."""
    common = ["--hidden", 8, "--log-every", 0, "--report", "none", "--save-dir", "ck"]
    train_ok(2, "--steps", 2, *common, cwd=tmp_path)                               # global batch 32
    run = launch(3, "--steps", 4, *common, "--resume", cwd=tmp_path)                # 48: refused
    assert run.returncode == 2, run.describe()
    error_line = next(line for line in run.output.splitlines() if ERROR_MARK in line)
    assert "--batch-size 32, this run has 48 (= 16 rows per rank x 1 x the ranks)" in error_line, run.describe()
    run = train_ok(4, "--steps", 4, *common, "--resume", "--batch-size", 32, cwd=tmp_path)
    assert "global batch 32 = 4 ranks x 1 micro-batch x 8 rows" in run.stdout, run.describe()
    assert "resumed from" in run.stdout and "at step 2" in run.stdout, run.describe()


def test_the_main_job_reaches_95_percent_on_the_held_out_digits(tmp_path):
    """`mpirun -n 8 python -m zerompi.train` with its defaults, as README promises."""
    run = train_ok(8, cwd=tmp_path)
    accuracy = float(run.stdout.split("held-out accuracy ")[1].split("%")[0])
    assert accuracy >= 95.0, run.describe()
    assert "data digits: 1497 train, 300 held out" in run.stdout


# ----------------------------------------------------------------------------------------------
# A user .npz dataset, end to end
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("held_out, shuffle", [(True, "--shuffle"), (False, "--no-shuffle")],
                         ids=["with-test-shuffled", "without-test-in-order"])
def test_user_npz_dataset_trains_end_to_end(held_out, shuffle, tmp_path):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((200, 6)).astype(np.float32)
    y = rng.integers(0, 3, 200)
    arrays = {"x": x, "y": y}
    if held_out:
        arrays.update(x_test=rng.standard_normal((50, 6)), y_test=rng.integers(0, 3, 50))
    np.savez(tmp_path / "mine.npz", **arrays)
    # 200 rows / 32 per step = 6 steps per epoch, so 14 steps cross two epoch boundaries
    run = train_ok(2, "--data", "mine.npz", shuffle, "--hidden", 5, "--batch-size", 32, "--steps", 14,
                   "--log-every", 7, "--save-weights", "w.npz", cwd=tmp_path)
    assert "data mine.npz: 200 train" in run.stdout
    assert "MLP 6-5-3" in run.stdout
    assert len(loss_lines(run.stdout)) == 2
    assert ("held-out accuracy" in run.stdout) == held_out
    assert ("50 samples" in run.stdout) == held_out
    weights = load_weights(tmp_path / "w.npz")
    assert weights["layers.0.weight"].shape == (5, 6)
    assert weights["layers.1.weight"].shape == (3, 5)
    assert all(np.all(np.isfinite(w)) for w in weights.values())


@pytest.mark.parametrize("flags, shown", [
    (["--data", "a\x1b[2Jb\nc.npz"], "a\\x1b[2Jb\\nc.npz: no such file"),
    (["--frob\x1b[31mred"], "unrecognized arguments: --frob\\x1b[31mred"),
    (["--save-weights", "no\nwhere/w.npz"], "cannot save weights to no\\nwhere/w.npz"),
])
def test_control_characters_in_what_the_user_names_are_escaped(flags, shown, tmp_path):
    """Paths and unknown flags were echoed raw: a newline broke the one-line rule, ESC [2J cleared
    the screen."""
    run = launch(2, "--hidden", 4, "--batch-size", 12, "--log-every", 0, "--report", "none", *flags, cwd=tmp_path)
    assert run.returncode == 2, run.describe()
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and shown in lines[0] and "\x1b" not in run.output, run.describe()


def test_a_note_naming_a_path_with_an_escape_sequence_shows_it_escaped(tmp_path):
    os.mkdir(tmp_path / "ck\x1b[2J")
    run = train_ok(2, "--steps", 2, "--hidden", 4, "--batch-size", 12, "--log-every", 0, "--report", "none",
                   "--save-dir", "ck\x1b[2J", "--resume", "--save-weights", "w.npz", cwd=tmp_path)
    assert "\x1b" not in run.output and "no checkpoint in ck\\x1b[2J yet" in run.output, run.describe()


def test_one_rank_and_one_micro_batch_are_singular(tmp_path):
    """'on 1 ranks', '1 ranks x 1 micro-batches': counts are written as words are."""
    from zerompi.util.words import counted
    assert [counted(1, "rank"), counted(2, "rank"), counted(1, "micro-batch"), counted(4, "micro-batch")] == [
        "1 rank", "2 ranks", "1 micro-batch", "4 micro-batches"]
    run = train_ok(1, "--steps", 1, "--hidden", 8, "--log-every", 0, "--report", "table", cwd=tmp_path)
    assert "ZeRO stage 3 on 1 rank, float32" in run.stdout and "= 1 rank x 1 micro-batch x 16 rows" in run.stdout
    assert " 1 ranks" not in run.stdout and "1 micro-batches" not in run.stdout, run.stdout
