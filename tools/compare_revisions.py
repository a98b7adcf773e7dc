"""Train a matrix of configurations at two revisions and compare the final weights byte for byte.

    python tools/compare_revisions.py REV_A REV_B [--quick] [--jobs J] [--steps S] [--offload-b]

A revision is a git revision of the repository holding this tool (a sha, branch, tag, HEAD~2...),
the word WORKTREE (this repository's working tree, uncommitted files included), or the path of a
directory holding a `zerompi` package (e.g. another git worktree). A git revision is exported with
`git archive` into a temporary folder under runs/compare/ (gitignored), removed at the end.

Each configuration is one `mpirun -n N python -m zerompi.train ...` run with the revision's folder
as its working directory and PYTHONPATH, so that the revision's own zerompi is imported (checked
once per revision), OMP_NUM_THREADS=1 (BLAS threads do not depend on the machine or on --jobs), in
its own session, killed as a process group after RUN_TIMEOUT_S. The matrix:

    stage {0,1,2,3} x N ranks {1,2,3} x dtype {float32,bf16,fp16} x overlap {off,on} x grad-accum {1,2}
    = 144 runs, and beside them (EXTRA): float64 the same way (48 runs), hybrid sharding
    (--shard-group 2 at N = 4, stages 1-3) and hpZ (--hpz at N = 4, stage 3) for every dtype and
    grad-accum (32 runs): 224 runs per revision. --quick: N {2,3}, dtype {float32,bf16},
    grad-accum 2 only, and one hybrid and one hpZ run per stage = 36 runs.

Every run: --hidden 13,7 (odd sizes; the shipped `digits` data has 64 features, 10 classes),
--batch-size 12 (16 at N = 4: divisible by N * grad-accum), --steps 4 (--steps), --lr 1e-2, --bucket-mb 0.001
(stages 0-1 reduce in several buckets), --device cpu, no logging, --save-weights OUT.npz.

Two configurations are identical when both .npz files hold the same array names and every array has
the same dtype, shape and bytes. Whether the .npz files themselves are byte-identical is reported
for information only. A failed run (non-zero exit or timeout) counts as a difference, unless both
revisions failed the same way (same exit status and error lines in stderr): "both failed".

Flag translation: flags are spelled per revision, detected once from that revision's `--help`
text; see FLAG_SPELLINGS, the one place to add a rename (an option none of whose spellings is in
the help text stops the tool, naming it). The starting revision spells overlap `--overlap on|off`;
the refactor spells it `--overlap` / `--no-overlap`.

--offload-b: REV_B's runs keep their optimizer state in a file (--offload-optimizer file, a scratch
--offload-dir per run): `compare_revisions.py WORKTREE WORKTREE --offload-b` compares the whole
matrix with and without offload at one revision (docs/offload.md). Its runs are never cached.

Cache: a git revision's weights are kept in runs/compare/cache/<sha>/<config>.npz (the config name
holds every matrix value and --steps), so a baseline trains only once; directories are never
cached. Delete runs/compare/cache after changing BASE_OPTIONS.

Prints one line per configuration that differs, a table by stage x dtype and a summary line; exits
0 when every configuration is identical (or both failed the same way), 1 otherwise, 2 on misuse.
"""
import argparse
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent       # the repository holding this tool
COMPARE_DIR = REPO / "runs" / "compare"              # gitignored (/runs/)
CACHE_DIR = COMPARE_DIR / "cache"
WORKTREE = "WORKTREE"
RUN_TIMEOUT_S = 120
KILL_GRACE_S = 5          # after a timeout's SIGTERM, before SIGKILL
STDERR_TAIL_LINES = 8

STAGES = (0, 1, 2, 3)
RANKS = (1, 2, 3)
DTYPES = ("float32", "bf16", "fp16")
OVERLAPS = (False, True)
GRAD_ACCUMS = (1, 2)
QUICK = dict(ranks=(2, 3), dtypes=("float32", "bf16"), grad_accums=(2,))

# Options every run gets (option name -> value), spelled through FLAG_SPELLINGS like the rest.
BASE_OPTIONS = {"hidden": "13,7", "batch_size": 12, "lr": "1e-2", "bucket_mb": 0.001, "device": "cpu",
                "log_every": 0, "report": "none", "progress": "lines"}


# ---- flag translation ------------------------------------------------------------------------------
# option -> [(marker, spell)], newest spelling first: the first marker found (as a whole flag) in the
# revision's `python -m zerompi.train --help` text wins, and spell(value) gives the arguments.
# An option not listed here is spelled `--option-name VALUE`. To follow a rename, put the new
# spelling in front, e.g. "grad_accum": [value_flag("--micro-batches"), value_flag("--grad-accum")].
def value_flag(flag):
    """The spelling `FLAG VALUE`, detected by FLAG in the help text."""
    return flag, lambda value: [flag, str(value)]


FLAG_SPELLINGS = {
    "overlap": [("--no-overlap", lambda on: ["--overlap" if on else "--no-overlap"]),      # refactor
                ("--overlap", lambda on: ["--overlap", "on" if on else "off"])],           # d7b5234
    "grad_accum": [value_flag("--grad-accum")],
    "hpz": [("--hpz", lambda on: ["--hpz"])],
}


def default_spelling(option):
    return value_flag("--" + option.replace("_", "-"))


def has_flag(help_text, flag):
    """Whether `flag` appears in the help text as a whole flag (not as a prefix of a longer one)."""
    return re.search(r"(?<![\w-])" + re.escape(flag) + r"(?![\w-])", help_text) is not None


def detect_spellings(help_text, options):
    """{option: spell function} for this revision; stops naming an option it cannot spell."""
    spellings = {}
    for option in options:
        candidates = FLAG_SPELLINGS.get(option, [default_spelling(option)])
        found = [spell for marker, spell in candidates if has_flag(help_text, marker)]
        if not found:
            markers = ", ".join(marker for marker, _ in candidates)
            fail(f"none of {markers} in this revision's --help: add its "
                 f"spelling of {option!r} to FLAG_SPELLINGS")
        spellings[option] = found[0]
    return spellings


# ---- configurations --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    stage: int
    ranks: int
    dtype: str
    overlap: bool
    grad_accum: int
    steps: int
    shard_group: int = 0      # hybrid sharding's S (0: flat)
    hpz: bool = False

    @property
    def name(self):
        grouping = f"-shard{self.shard_group}" if self.shard_group else "-hpz" if self.hpz else ""
        return (f"stage{self.stage}-n{self.ranks}-{self.dtype}-overlap_{'on' if self.overlap else 'off'}"
                f"-ga{self.grad_accum}-steps{self.steps}{grouping}")

    def options(self):
        """Every training option of this run except --save-weights, by option name."""
        grouping = dict(shard_group=self.shard_group) if self.shard_group else dict(hpz=True) if self.hpz else {}
        batch = dict(batch_size=16) if self.ranks == 4 else {}          # divisible by 4 x grad-accum
        return dict(BASE_OPTIONS, stage=self.stage, dtype=self.dtype, overlap=self.overlap,
                    grad_accum=self.grad_accum, steps=self.steps, **grouping, **batch)


def config_matrix(quick, steps):
    ranks = QUICK["ranks"] if quick else RANKS
    dtypes = QUICK["dtypes"] if quick else DTYPES
    grad_accums = QUICK["grad_accums"] if quick else GRAD_ACCUMS
    configs = [Config(*values, steps) for values in itertools.product(STAGES, ranks, dtypes, OVERLAPS, grad_accums)]
    return configs + extra_configs(quick, steps)


def extra_configs(quick, steps):
    """float64 as the matrix runs the others; hybrid sharding and hpZ on 4 ranks (EXTRA)."""
    dtypes = QUICK["dtypes"][:1] if quick else DTYPES + ("float64",)
    grad_accums = QUICK["grad_accums"] if quick else GRAD_ACCUMS
    wide = [] if quick else [Config(*values, steps) for values in
                             itertools.product(STAGES, RANKS, ("float64",), OVERLAPS, GRAD_ACCUMS)]
    hybrid = [Config(stage, 4, dtype, False, accum, steps, shard_group=2)
              for stage, dtype, accum in itertools.product((1, 2, 3), dtypes, grad_accums)]
    hpz = [Config(3, 4, dtype, False, accum, steps, hpz=True) for dtype, accum in itertools.product(dtypes, grad_accums)]
    return wide + hybrid + hpz


# ---- revisions -------------------------------------------------------------------------------------
@dataclass
class Revision:
    label: str            # as given on the command line
    sha: str = ""         # git revisions only
    folder: Path = None   # the tree to run; for a git revision, exported when first needed
    offload: bool = False # --offload-b: the optimizer state in a file

    @property
    def description(self):
        return self.sha if self.sha else str(self.folder)

    def cache_path(self, config):
        return CACHE_DIR / self.sha / f"{config.name}.npz" if self.sha and not self.offload else None


def fail(message):
    """Stop with exit status 2 (misuse, or a revision this tool cannot drive)."""
    print(f"compare_revisions: {message}", file=sys.stderr)
    sys.exit(2)


def resolve_revision(label):
    if label == WORKTREE:
        return Revision(label, folder=REPO)
    if (Path(label) / "zerompi" / "__init__.py").is_file():
        return Revision(label, folder=Path(label).resolve())
    found = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", label + "^{commit}"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        fail(f"{label!r} is neither a git revision, {WORKTREE}, "
             f"nor a directory holding zerompi/")
    return Revision(label, sha=found.stdout.strip())


def export_revision(revision, scratch):
    """Extract the git revision's tree into a new folder under `scratch` (git archive | tar -x)."""
    folder = Path(tempfile.mkdtemp(prefix=f"rev-{revision.sha[:12]}-", dir=scratch))
    archive = subprocess.Popen(["git", "-C", str(REPO), "archive", revision.sha], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(folder)], stdin=archive.stdout, check=True)
    archive.stdout.close()
    if archive.wait() != 0:
        fail(f"git archive {revision.sha} failed")
    revision.folder = folder


def run_environment(folder):
    env = dict(os.environ, PYTHONPATH=str(folder), OMP_NUM_THREADS="1")
    env.pop("PYTHONSTARTUP", None)
    return env


def check_import(folder):
    """The revision's own zerompi is the one imported; returns its __init__.py's path."""
    out = subprocess.run([sys.executable, "-c", "import zerompi; print(zerompi.__file__)"], cwd=folder,
                         env=run_environment(folder), capture_output=True, text=True, check=True)
    imported = Path(out.stdout.strip()).resolve()
    if not imported.is_relative_to(folder.resolve()):
        fail(f"in {folder} zerompi is imported from {imported}, not from there")
    return imported


def help_text(folder):
    out = subprocess.run([sys.executable, "-m", "zerompi.train", "--help"], cwd=folder,
                         env=run_environment(folder), capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"`python -m zerompi.train --help` failed in {folder}:\n"
             + out.stderr[-2000:])
    return out.stdout


# ---- running ---------------------------------------------------------------------------------------
@dataclass
class RunResult:
    npz: Path = None          # the saved weights when the run succeeded
    returncode: int = 0
    command: str = ""
    stderr_tail: str = ""
    signature: tuple = ()     # what "failed the same way" compares: see failure_signature()

    @property
    def ok(self):
        return self.npz is not None


def mpirun():
    beside = Path(sys.executable).parent / "mpirun"
    return str(beside) if beside.exists() else "mpirun"


def train_command(config, spellings, out):
    args = [mpirun(), "-n", str(config.ranks), sys.executable, "-m", "zerompi.train"]
    for option, value in config.options().items():
        args += spellings[option](value)
    return args + ["--save-weights", str(out)]


class ProcessGroups:
    """The process groups of the runs in flight, so that an interrupted tool kills them all."""

    def __init__(self):
        self.pids, self.lock = set(), threading.Lock()

    def add(self, pid):
        with self.lock:
            self.pids.add(pid)

    def discard(self, pid):
        with self.lock:
            self.pids.discard(pid)

    def kill_all(self):
        with self.lock:
            for pid in self.pids:
                kill_group(pid)


def kill_group(pid, sig=signal.SIGKILL):
    """Signal the run's own session's process group (mpirun's). MPICH's hydra proxy and the ranks
    sit in process groups of their own, and end when mpirun does (SIGTERM: mpirun ends them)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def run_one(command, folder, groups):
    """(returncode, stderr) of one run in its own session; on timeout its process group is killed."""
    proc = subprocess.Popen(command, cwd=folder, env=run_environment(folder), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    groups.add(proc.pid)
    try:
        _, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
        return proc.returncode, stderr
    except subprocess.TimeoutExpired:
        kill_group(proc.pid, signal.SIGTERM)
        try:
            _, stderr = proc.communicate(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            _, stderr = proc.communicate()
        return proc.returncode, stderr + f"\ncompare_revisions: timed out after {RUN_TIMEOUT_S} s, killed"
    finally:
        groups.discard(proc.pid)


def train(config, revision, spellings, out, groups):
    command = train_command(config, spellings, out)
    if revision.offload:                            # a folder per run: two runs cannot share one
        folder = out.with_suffix(".offload")
        folder.mkdir()
        command += ["--offload-optimizer", "file", "--offload-dir", str(folder)]
    returncode, stderr = run_one(command, revision.folder, groups)
    if returncode == 0 and out.is_file():
        return RunResult(npz=out)
    stderr = stderr.replace(str(out), "OUT.npz").replace(str(revision.folder), "REV")  # comparable across revisions
    tail = "\n".join(stderr.rstrip().splitlines()[-STDERR_TAIL_LINES:])
    return RunResult(returncode=returncode or -1, command=" ".join(command), stderr_tail=tail,
                     signature=failure_signature(returncode or -1, stderr))


# The ranks' stderr interleaves differently from run to run: a failure is recognised by its exit
# status and the set of its error lines (zerompi's own messages, exception lines, a timeout).
ERROR_LINE = re.compile(r"^(zerompi|compare_revisions)\b.*|^[\w.]*(Error|Exception)\b.*")


def failure_signature(returncode, stderr):
    lines = {line.strip() for line in stderr.splitlines() if ERROR_LINE.match(line.strip())}
    return (returncode, *sorted(lines)) if lines else (returncode, stderr.strip()[-200:])


def train_revision(revision, configs, jobs, scratch, groups):
    """{config: RunResult} for every config: cached weights, else trained here `jobs` at a time."""
    results, pending = {}, []
    for config in configs:
        cached = revision.cache_path(config)
        if cached is not None and cached.is_file():
            results[config] = RunResult(npz=cached)
        else:
            pending.append(config)
    print(f"{revision.label}: {len(configs)} configurations, {len(configs) - len(pending)} cached", flush=True)
    if not pending:
        return results
    if revision.sha:
        export_revision(revision, scratch)
    print(f"{revision.label}: zerompi imported from {check_import(revision.folder)}", flush=True)
    spellings = detect_spellings(help_text(revision.folder), {o for c in pending for o in c.options()})
    outputs = Path(tempfile.mkdtemp(prefix="weights-", dir=scratch))
    start, done = time.monotonic(), 0
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        futures = {pool.submit(train, c, revision, spellings, outputs / f"{c.name}.npz", groups): c
                   for c in pending}
        for future in as_completed(futures):
            results[futures[future]] = keep(revision, futures[future], future.result())
            done += 1
            if done % 12 == 0 or done == len(pending):
                print(f"{revision.label}: trained {done}/{len(pending)} ({time.monotonic() - start:.0f} s)",
                      flush=True)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)     # interrupted: main() kills the runs in flight
    print(f"{revision.label}: {len(pending)} runs took {time.monotonic() - start:.1f} s with --jobs {jobs}",
          flush=True)
    return results


def keep(revision, config, result):
    """Move a git revision's successful weights into the cache (atomically)."""
    cached = revision.cache_path(config)
    if cached is None or not result.ok:
        return result
    cached.parent.mkdir(parents=True, exist_ok=True)
    os.replace(result.npz, cached)
    return RunResult(npz=cached)


# ---- comparing -------------------------------------------------------------------------------------
@dataclass
class Verdict:
    kind: str             # "identical", "differ", "failed" or "both failed"
    detail: str = ""
    same_file: bool = False


def compare_arrays(path_a, path_b):
    """[] when every array matches in name, dtype, shape and bytes, else one note per difference."""
    with np.load(path_a, allow_pickle=False) as a, np.load(path_b, allow_pickle=False) as b:
        notes = [f"only in A: {name}" for name in sorted(set(a.files) - set(b.files))]
        notes += [f"only in B: {name}" for name in sorted(set(b.files) - set(a.files))]
        for name in [n for n in a.files if n in b.files]:
            x, y = a[name], b[name]
            if x.dtype != y.dtype or x.shape != y.shape:
                notes.append(f"{name} ({x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)})")
            elif x.tobytes() != y.tobytes():
                diff = np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))
                notes.append(f"{name} (max abs diff {diff:.3g})")
        return notes


def describe_failure(side, result):
    return (f"\n    {side} failed with exit status {result.returncode}: {result.command}\n"
            + "".join(f"      {line}\n" for line in result.stderr_tail.splitlines())).rstrip()


def judge(result_a, result_b):
    if result_a.ok and result_b.ok:
        notes = compare_arrays(result_a.npz, result_b.npz)
        same_file = result_a.npz.read_bytes() == result_b.npz.read_bytes()
        return Verdict("differ", "; ".join(notes), same_file) if notes else Verdict("identical", "", same_file)
    if not result_a.ok and not result_b.ok and \
            result_a.signature == result_b.signature:
        return Verdict("both failed", describe_failure("both", result_a))
    failures = [describe_failure(side, r) for side, r in (("A", result_a), ("B", result_b)) if not r.ok]
    return Verdict("failed", "".join(failures))


def print_table(configs, verdicts):
    """identical/total per stage x dtype; a '!' marks a cell with a difference or failure."""
    dtypes = sorted({c.dtype for c in configs}, key=(DTYPES + ("float64",)).index)
    print("stage  " + "".join(f"{d:>10}" for d in dtypes))
    for stage in STAGES:
        cells = []
        for dtype in dtypes:
            kinds = [verdicts[c].kind for c in configs if c.stage == stage and c.dtype == dtype]
            same = sum(k in ("identical", "both failed") for k in kinds)
            cells.append(f"{same}/{len(kinds)}{'!' if same < len(kinds) else ' '}")
        print(f"{stage:>5}  " + "".join(f"{cell:>10}" for cell in cells))


def report(configs, verdicts, revision_a, revision_b):
    """Print the differences, the table and the summary; True when nothing differs."""
    for config in configs:
        verdict = verdicts[config]
        if verdict.kind != "identical":
            print(f"{config.name}: {verdict.kind}: {verdict.detail}")
    print_table(configs, verdicts)
    count = {kind: sum(v.kind == kind for v in verdicts.values())
             for kind in ("identical", "differ", "failed", "both failed")}
    both_ran = [v for v in verdicts.values() if v.kind in ("identical", "differ")]
    print(f"npz files byte-identical (informative): {sum(v.same_file for v in both_ran)}/{len(both_ran)}")
    print(f"compare_revisions: {len(configs)} configurations: {count['identical']} identical, "
          f"{count['differ']} differ, {count['failed']} failed, {count['both failed']} both failed "
          f"(REV_A={revision_a.description} REV_B={revision_b.description})")
    return count["differ"] == 0 and count["failed"] == 0


# ---- main ------------------------------------------------------------------------------------------
def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("rev_a", help=f"git revision, {WORKTREE}, or a directory holding zerompi/")
    parser.add_argument("rev_b", help=f"git revision, {WORKTREE}, or a directory holding zerompi/")
    parser.add_argument("--quick", action="store_true", help="a 32-run subset: N 2,3; float32, bf16; grad-accum 2")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (default: 2)")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per run (default: 4)")
    parser.add_argument("--offload-b", action="store_true", help="REV_B's runs keep their optimizer state in a file")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.steps < 1:
        parser.error("--jobs and --steps must be at least 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    revisions = [resolve_revision(args.rev_a), resolve_revision(args.rev_b)]
    revisions[1].offload = args.offload_b
    configs = config_matrix(args.quick, args.steps)
    COMPARE_DIR.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="tmp-", dir=COMPARE_DIR))
    groups = ProcessGroups()
    try:
        results = [train_revision(r, configs, args.jobs, scratch, groups) for r in revisions]
        verdicts = {c: judge(results[0][c], results[1][c]) for c in configs}
        return 0 if report(configs, verdicts, *revisions) else 1
    finally:
        groups.kill_all()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
