"""Step time with the optimizer state in memory and in a file (zerompi/offload/), side by side.

    mpirun -n 2 python benchmarks/offload.py --dir DIR [--sizes 1024,2048,2048,2048,2048,10]
        [--stage 3] [--batch-per-rank 64] [--repeats 5] [--steps 5] [--warmup 2] [--json PATH]

Method (every rank with 1 BLAS thread, float32): one engine per tier, built as zerompi.train builds
it (the none row: zerompi/adam.py's AdamConfig; the file row: OffloadedAdamConfig with a FileTier
in DIR; at stage 3 the file+par row: the parameter shard in a file of DIR too, OffloadedStage3),
initialized alike, `warmup` steps. Then `repeats` rounds; in each, every row in turn:
Barrier, `steps` train_steps. A round's time is the max over ranks of its mean step time; the
median over rounds is printed (interleaving makes a burst of load from other processes hit every
row alike). Per row and rank 0, per step: the bytes read from and written to the file (counted from
each pread and pwrite), the I/O threads' achieved GB/s (bytes / their seconds inside them), and the
share of that I/O time hidden behind AdamW and the passes (1 - the time the step waited for a tile
or a layer / the I/O time).
The host tier needs a GPU (on a CPU the host is the device): it has no row here.

ZeRO-Infinity's efficiency (arXiv 2104.07857, section 4): a step whose compute runs at `peak` and
whose data moves at `bw` with arithmetic intensity `ait` (flops per byte moved) has efficiency
ait bw / (ait bw + peak). For the optimizer state moved once per step, ait = the training flops of
a step / the bytes moved, so the formula is printed with this machine's GEMM rate (measured here,
at the step's shapes) and the file row's bandwidth.

The file's writes land in the page cache: the figure is what a run sees, not the disk's own rate
while the state fits in the page cache.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI
from threadpoolctl import threadpool_info, threadpool_limits

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from zerompi.adam import AdamConfig                                  # noqa: E402
from zerompi.comm import Communicator                                # noqa: E402
from zerompi.engine import build_engine                              # noqa: E402
from zerompi.offload import FileTier, OffloadedAdamConfig, OffloadedStage3   # noqa: E402
from zerompi.precision import precision_for                          # noqa: E402
from zerompi.step import train_step                                  # noqa: E402

WORLD = MPI.COMM_WORLD


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", required=True, help="the offload folder (a disk the file tier would use)")
    parser.add_argument("--sizes", default="1024,2048,2048,2048,2048,10")
    parser.add_argument("--stage", type=int, default=3, choices=(0, 1, 2, 3))
    parser.add_argument("--batch-per-rank", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",")]
    return args


class Row:
    def __init__(self, name, adam, args, comm, stage_class=None):
        self.name, self.args = name, args
        self.engine = build_engine(args.sizes, args.stage, precision_for("float32"), adam, args.batch_per_rank, comm,
                                   stage_class=stage_class)
        self.engine.init_params(0)
        rng = np.random.default_rng(WORLD.Get_rank())
        self.x = rng.standard_normal((args.batch_per_rank, args.sizes[0])).astype(np.float32)
        self.labels = rng.integers(0, args.sizes[-1], args.batch_per_rank)
        self.rounds = []
        self.steps(args.warmup)
        self.start = self.counters()

    def steps(self, count):
        global_batch = self.args.batch_per_rank * WORLD.Get_size()
        for _ in range(count):
            train_step(self.engine, [(self.x, self.labels)], global_batch, 1e-4)

    def time_round(self):
        WORLD.Barrier()
        start = time.perf_counter()
        self.steps(self.args.steps)
        mine = (time.perf_counter() - start) / self.args.steps
        self.rounds.append(WORLD.allreduce(mine, op=MPI.MAX))

    def counters(self):
        adam = self.engine.stage.adam
        files = [f for f in (getattr(adam, "store", None), getattr(adam, "params", None)) if f is not None]
        for f in files:
            f.finish()
        return tuple(sum(getattr(f, name) for f in files)
                     for name in ("bytes_read", "bytes_written", "io_seconds", "waited_seconds"))

    def result(self):
        read, written, io_s, waited_s = (b - a for a, b in zip(self.start, self.counters()))
        steps = self.args.steps * len(self.rounds)
        return {"step_s": statistics.median(self.rounds), "spread_s": [min(self.rounds), max(self.rounds)],
                "file_read_per_step": read / steps, "file_written_per_step": written / steps,
                "io_gbs": (read + written) / io_s / 1e9 if io_s else None,
                "hidden_share": 1 - waited_s / io_s if io_s else None,
                "ledger": dict(self.engine.memory.bytes_by_tier)}


def gemm_gflops(args):
    """GFLOP/s of the forward GEMMs at the step's shapes (B x I x O), best of 5."""
    best = 0.0
    for n_in, n_out in zip(args.sizes, args.sizes[1:]):
        x = np.ones((args.batch_per_rank, n_in), np.float32)
        w = np.ones((n_out, n_in), np.float32)
        for _ in range(5):
            start = time.perf_counter()
            x @ w.T
            best = max(best, 2 * x.shape[0] * n_in * n_out / (time.perf_counter() - start) / 1e9)
    return best


def main(argv=None):
    args = parse_args(argv)
    out = {"args": vars(args), "ranks": WORLD.Get_size(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "cpu": platform.processor() or platform.machine()}
    with open("/proc/cpuinfo") as f:
        out["cpu"] = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), out["cpu"])
    with threadpool_limits(limits=1):
        out["blas"] = [{k: d.get(k) for k in ("internal_api", "architecture", "version")} for d in threadpool_info()]
        comm = Communicator()
        tier = FileTier(args.dir, WORLD.Get_rank())
        rows = [Row("none", AdamConfig(), args, comm), Row("file", OffloadedAdamConfig(tier=tier), args, comm)]
        if args.stage == 3:
            rows.append(Row("file+par", OffloadedAdamConfig(tier=tier, param_tier=tier), args, comm, OffloadedStage3))
        for _ in range(args.repeats):
            for row in rows:
                row.time_round()
        out["rows"] = {row.name: row.result() for row in rows}
        out["gemm_gflops"] = WORLD.allreduce(gemm_gflops(args), op=MPI.MIN)
        for row in rows[1:]:
            row.engine.stage.adam.close()
    if WORLD.Get_rank() == 0:
        print_table(out, args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)


def print_table(out, args):
    print(f"{out['date']}  {out['cpu']}  BLAS {out['blas']}")
    print(f"MLP {args.sizes}, stage {args.stage}, {out['ranks']} ranks x {args.batch_per_rank} rows, float32")
    print(f"{'tier':<8} {'step ms':>9} {'x none':>7} {'read MB':>9} {'write MB':>9} {'GB/s':>7} {'hidden':>7}")
    base = out["rows"]["none"]["step_s"]
    for name, r in out["rows"].items():
        gbs = f"{r['io_gbs']:.2f}" if r["io_gbs"] else "-"
        hidden = f"{100 * r['hidden_share']:.0f}%" if r["hidden_share"] is not None else "-"
        print(f"{name:<8} {r['step_s'] * 1e3:>9.2f} {r['step_s'] / base:>7.2f} {r['file_read_per_step'] / 1e6:>9.2f} "
              f"{r['file_written_per_step'] / 1e6:>9.2f} {gbs:>7} {hidden:>7}")
    file_row = out["rows"]["file"]
    flops = 6 * args.batch_per_rank * sum(a * b for a, b in zip(args.sizes, args.sizes[1:]))
    moved = file_row["file_read_per_step"] + file_row["file_written_per_step"]
    if file_row["io_gbs"]:
        ait, bw, peak = flops / moved, file_row["io_gbs"] * 1e9, out["gemm_gflops"] * 1e9
        print(f"ZeRO-Infinity efficiency ait bw / (ait bw + peak): ait = {ait:.1f} flop/B (a step's "
              f"{flops / 1e9:.2f} GFLOP per rank / {moved / 1e6:.1f} MB moved), bw = {bw / 1e9:.2f} GB/s, "
              f"peak = {peak / 1e9:.1f} GFLOP/s -> {ait * bw / (ait * bw + peak):.2f}")


if __name__ == "__main__":
    main()
