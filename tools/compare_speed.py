"""Step time at two revisions, measured interleaved in one sitting: does a change make zerompi slower?

    python tools/compare_speed.py REV_A REV_B [--rounds 3] [--ranks 2] [-- step_time.py flags]

A revision is what tools/compare_revisions.py accepts (a git revision, WORKTREE, or a directory
holding zerompi/); it is exported the same way (that tool's code serves both). Each round runs
`mpirun -n RANKS python benchmarks/step_time.py --peers none --limits off --json ...` once at REV_A
and once at REV_B, alternating, each revision with its own benchmark script, so that a burst of
load from other processes hits both alike. The benchmark itself already takes a median over its
own repeats; this prints, per (stage, overlap) row, the median over rounds at each revision and
the ratio B / A. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset inside the benchmark command
only (they select OpenBLAS's slower kernel on this machine; docs/overlap-and-performance.md).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_revisions import (COMPARE_DIR, check_import, export_revision, mpirun,  # noqa: E402
                               resolve_revision, run_environment)


def benchmark(folder, ranks, extra, json_path):
    """One run of the revision's own benchmarks/step_time.py; returns {row: step seconds}."""
    env = run_environment(folder)
    env.pop("OMP_NUM_THREADS")
    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        env.pop(name, None)
    command = [mpirun(), "-n", str(ranks), sys.executable, "benchmarks/step_time.py", "--peers", "none",
               "--limits", "off", "--json", str(json_path), *extra]
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        sys.exit(f"compare_speed: the benchmark failed in {folder}:\n{done.stderr[-2000:]}")
    with open(json_path) as f:
        return {row: result["step_s"] for row, result in json.load(f)["stages"].items()}


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("rev_a")
    p.add_argument("rev_b")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ranks", type=int, default=2)
    args, extra = p.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    revisions = [resolve_revision(args.rev_a), resolve_revision(args.rev_b)]
    COMPARE_DIR.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="speed-", dir=COMPARE_DIR))
    try:
        for revision in revisions:
            if revision.folder is None:
                export_revision(revision, scratch)
            check_import(revision.folder)
        times = [{}, {}]                      # per revision: row -> [step seconds per round]
        for round_ in range(args.rounds):
            for i, revision in enumerate(revisions):
                result = benchmark(revision.folder, args.ranks, extra, scratch / f"{i}-{round_}.json")
                for row, seconds in result.items():
                    times[i].setdefault(row, []).append(seconds)
                print(f"round {round_ + 1}/{args.rounds}: {revision.description} done", flush=True)
        print(f"\n{'stage overlap':<14} {'A ms/step':>10} {'B ms/step':>10} {'B / A':>7}   "
              f"(medians of {args.rounds} interleaved rounds)")
        for row in times[0]:
            a, b = (1e3 * statistics.median(t[row]) for t in times)
            print(f"{row:<14} {a:>10.2f} {b:>10.2f} {b / a:>7.3f}")
        print(f"A = {revisions[0].description}\nB = {revisions[1].description}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
