"""Cost growth: step time and per-rank bytes as N grows (1, 2, 4, 8) and as the model grows 4x.

    python benchmarks/growth.py [--ranks 1,2,4,8] [--widths 256,512,1024,2048] [--base-width 1024]
        [--stages 0,1,2,3] [--overlap off] [--json PATH]

Not run under mpirun: it launches `mpirun -n N python benchmarks/step_time.py` once per N (the
MLP W-W-W-W-W, 4 layers of W x W, Psi ~ 4 W^2, so each doubling of W is 4x the parameters; 64
rows per rank, so the global batch grows with N) and once per width at N = 2, without peers and
without the machine-limit measurements, and tabulates what step_time measured: the median step
time, the per-rank model-state bytes (params + grads + optimizer, from the MemoryLedger), the
per-rank total the ledger allocated (with activations and work buffers), and the per-rank ring
bytes communicated per step (from the CommLedger). Rows where N exceeds the cores are marked:
there the ranks share cores, so the step time measures time-slicing as much as ZeRO.

Beside each measured step, the cost model's prediction (zerompi/train/commands/cost.py: the
row's plan priced by step_cost) with a calibration made at that N just before its rows
(`mpirun -n N python -m zerompi.plan calibrate`, as a user would), and predicted / measured. A
calibration during which other processes took more than --others-limit of the machine is void
(calibrate writes no file): the rows of that N say so, with no prediction.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from zerompi.overlap import OverlapConfig                            # noqa: E402
from zerompi.plan import RunShape, plan_run                          # noqa: E402
from zerompi.precision import precision_for                          # noqa: E402
from machine import machine_line                                     # noqa: E402
from zerompi.train.commands.calibrate import read_calibration        # noqa: E402
from zerompi.train.commands.cost import step_cost                    # noqa: E402
from zerompi.util.exit_codes import ExitCode                         # noqa: E402

ROWS = 64


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="1,2,4,8")
    p.add_argument("--widths", default="256,512,1024,2048")
    p.add_argument("--base-width", type=int, default=1024, help="the width of the N sweep")
    p.add_argument("--stages", default="0,1,2,3")
    p.add_argument("--overlap", default="off", help="on or off (one of them)")
    p.add_argument("--others-limit", default="0.1", help="calibrate's --others-limit (default 0.1)")
    p.add_argument("--json", default=None, help="write every number to this file")
    args = p.parse_args(argv)
    args.ranks = [int(n) for n in args.ranks.split(",")]
    args.widths = [int(w) for w in args.widths.split(",")]
    return args


def mpirun():
    beside_python = os.path.join(os.path.dirname(sys.executable), "mpirun")
    return beside_python if os.path.exists(beside_python) else "mpirun"


def measure(n, width, args):
    """step_time.py's numbers for N = n and the W-W-W-W-W MLP, one dict per stage."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "step.json")
        command = [mpirun(), "-n", str(n), sys.executable, os.path.join(HERE, "step_time.py"),
                   "--sizes", ",".join([str(width)] * 5), "--stages", args.stages, "--overlap", args.overlap,
                   "--batch-per-rank", str(ROWS), "--peers", "none", "--limits", "off", "--repeats", "3", "--steps", "5", "--warmup", "2",
                   "--json", path]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, timeout=600)
        with open(path) as f:
            return json.load(f)["stages"]


def calibration(n, others_limit):
    """This machine calibrated at N = n (zerompi.plan calibrate), as a Machine; or, where the
    calibration was void (exit status 9), its line."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "machine.json")
        run = subprocess.run([mpirun(), "-n", str(n), sys.executable, "-m", "zerompi.plan", "calibrate", "--out", path,
                              "--others-limit", others_limit], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})  # 1 BLAS thread per rank
        if run.returncode == ExitCode.MEASUREMENT_VOID:
            return run.stderr.strip()
        if run.returncode:
            raise SystemExit(f"growth.py: the calibration at N = {n} failed: {run.stderr.strip()}")
        return read_calibration(path)


def predicted_s(n, width, stage, machine, overlap):
    """The cost model's step time of the row: the run's plan priced on the calibrated machine."""
    shape = RunShape(tuple([width] * 5), stage, precision_for("float32"), ROWS, n, overlap=OverlapConfig(overlap == "on"))
    return step_cost(plan_run(shape), machine).step_s


def main(argv=None):
    args = parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    runs = [(n, args.base_width) for n in args.ranks]
    runs += [(2, w) for w in args.widths if (2, w) not in runs]
    rows = []
    print(f"cost growth | MLP W-W-W-W-W float32 | {ROWS} rows per rank | overlap {args.overlap} | {cores} cores | "
          f"{machine_line()}")
    print(" N     W      Psi  stage  step ms  predicted  pred/meas | model state MB/rank  ledger MB/rank  "
          "comm MB/rank/step")
    machines = {}
    for n, width in runs:
        if n not in machines:
            machines[n] = calibration(n, args.others_limit)
            if isinstance(machines[n], str):
                print(f"N = {n}: no predictions: {machines[n]}")
        for row, r in measure(n, width, args).items():
            stage = row.split()[0]
            void = isinstance(machines[n], str)
            r["predicted_s"] = None if void else predicted_s(n, width, int(stage), machines[n], args.overlap)
            rows.append({"ranks": n, "width": width, "stage": int(stage), **r})
            note = "  (N > cores)" if n > cores else ""
            prediction = f"{'void':>10} {'-':>10}" if void else \
                f"{1e3 * r['predicted_s']:10.1f} {r['predicted_s'] / r['step_s']:10.2f}"
            print(f"{n:>2} {width:>5} {r['num_params'] / 1e6:7.2f}M {stage:>5} {1e3 * r['step_s']:8.1f} {prediction} | "
                  f"{r['model_state_mb']:19.1f} {r['ledger_mb']:15.1f} {r['ring_mb_per_step']:18.1f}{note}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cores": cores, "overlap": args.overlap, "rows": rows}, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
