"""Step time of zerompi's ZeRO stages 0-3, beside the machine's limits and (optionally) PyTorch.

    mpirun -n 2 python benchmarks/step_time.py [--sizes 1024,2048,2048,2048,2048,10]
        [--batch-per-rank 64] [--repeats 5] [--steps 10] [--warmup 3] [--stages 0,1,2,3]
        [--overlap off,on] [--bucket-mb 25] [--prefetch 1] [--adam numpy|fused] [--keep-last-layer] [--peers ddp,zero,fsdp|none]
        [--json PATH]

Method (every rank runs with 1 BLAS thread, float32, the same MLP and batch shapes):
  zerompi   per stage, with overlap off and on (zerompi/overlap/): build_engine,
            init_params(0), random data per rank, `warmup` steps. Then `repeats` rounds; in each,
            every (stage, overlap) row in turn: Barrier, `steps` train_steps, the last one's
            communication finished. A round's time is the max over ranks of its mean step time; we
            print the median over rounds. Interleaving the rows makes a burst of load from other
            processes hit them all alike. "exposed" is the time per step the training thread
            spent in or waiting for the grads+params collectives (Collectives.exposed_s): with
            overlap off all of their time, with overlap on what the overlap did not hide. "busy"
            is the time inside those collectives (the CommLedger), wherever they ran.
            Memory: the MemoryLedger's total per row (its peak too: nothing is allocated in the
            loop); the process RSS with every row's engine alive at once, printed once.
  limits    measured in this run, with all ranks busy at once as in training, once between
            each round and the next (benchmarks/floors.py: the best sample is the limit, the
            spread of the samples is printed beside it):
            GEMM rate of the step's own GEMMs (every layer's x@W.T, dy.T@x, dy@W at its shapes),
            and, printed beside it, of the three at B x W x W alone (W the widest layer),
            memory bandwidth of an in-place ufunc over four float32 arrays of a row's owned
            elements (AdamW's p, g, m, v: the same footprint, so the same caches),
            Allreduce / Reduce_scatter_block / Allgather of a model-sized float32 buffer.
  others    the share of the machine's CPU that other processes used during the rounds, from
            the kernel's counters (floors.py). The run is void, and says so instead of giving
            results, when a row or an AdamW alone ran below its floor, or others took > 10%.
  floor     compute = training FLOPs per rank and step / the step's GEMM rate;
            optimizer = 7 compulsory passes (read p, g, m, v; write p, m, v) x 4 B x owned
                        elements / bandwidth (zerompi's chunked AdamW makes 11-12 ufunc passes per
                        chunk, but the chunk stays in cache); "adam" prints AdamW.update measured
                        alone on the owned size, and "fused" zerompi/fused/'s loop (when Numba
                        imports; --adam fused: the stage rows' update too), each once per round
                        beside the limits, the median over the rounds;
            comm = allreduce (stage 0), RS + AG (stages 1-2), RS + 2 AG (stage 3), measured as
                   one model-sized call each and as one call per layer (as zerompi calls them);
                   the floor takes the faster of the two.
            The floor leaves out GELU, the loss and bias sums, and assumes no overlap: on a
            machine whose every core runs a rank, MPI's shared-memory copies take the same cores
            as the compute, so hiding them saves waiting, not work. ratio = step / floor.
  parts     where a step goes: its GEMMs (the median of the limit's samples), its elementwise
            kernels (bias adds, GELUs, bias sums) and the gradient norm's dot over the owned
            elements, each measured alone like the limits, once per round, the median over the
            rounds; with the row's AdamW and its exposed communication they leave a "rest"
            = step - the parts: the loss, the metrics all-reduce, Python, the caches the parts
            take from each other; below 0 where the exposed communication holds a wait for the
            other rank's GEMMs, which the GEMMs part counts too.
  versions  the CPU model, Python, the MPI library and NumPy, mpi4py, Numba, PyTorch, DeepSpeed
            (benchmarks/machine.py; "not installed" where absent), printed under the title.
  peers     benchmarks/peers_torch.py (only if torch imports): DDP, ZeroRedundancyOptimizer,
            FSDP2; each zerompi row / each peer; > 1 means zerompi is slower. The matching pairs
            are DDP ~ stage 0, ZeroRedundancyOptimizer ~ stage 1, FSDP2 ~ stage 3.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI
from threadpoolctl import threadpool_info, threadpool_limits

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from zerompi import layers                           # noqa: E402
from zerompi.adam import AdamConfig, AdamW            # noqa: E402
from zerompi.engine import build_engine              # noqa: E402
from zerompi.fused import FusedAdamKernel, compiled_loop   # noqa: E402
from zerompi.ledger import MemoryLedger              # noqa: E402
from zerompi.overlap import OverlapConfig            # noqa: E402
from zerompi.precision import precision_for          # noqa: E402
from zerompi.step import train_step            # noqa: E402
from floors import best, void_reasons   # noqa: E402
from machine import cpu_model, versions   # noqa: E402
from zerompi.util.other_processes import OtherProcesses   # noqa: E402

COMM = MPI.COMM_WORLD
RANK, N = COMM.Get_rank(), COMM.Get_size()
LR = 1e-3


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1024,2048,2048,2048,2048,10")
    p.add_argument("--batch-per-rank", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="timed steps per repeat")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--stages", default="0,1,2,3")
    p.add_argument("--overlap", default="off,on", help="comma list of on/off: time each stage with each")
    p.add_argument("--bucket-mb", type=float, default=OverlapConfig.bucket_mb)
    p.add_argument("--prefetch", type=int, default=OverlapConfig.prefetch)
    p.add_argument("--limits", default="on", help="off: skip the machine limits and floors (growth.py)")
    p.add_argument("--adam", default="numpy", choices=("numpy", "fused"),
                   help="the stage rows' AdamW: zerompi/adam.py's NumPy update, or --fused-adam's loop (Numba)")
    p.add_argument("--keep-last-layer", action="store_true",
                   help="stage 3 rows keep the last layer gathered into backward (zerompi.train --keep-last-layer)")
    p.add_argument("--peers", default="ddp,zero,fsdp", help="comma list, or none")
    p.add_argument("--json", default=None, help="write every number to this file (rank 0)")
    args = p.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.stages = [int(s) for s in args.stages.split(",")]
    args.peers = [] if args.peers == "none" else args.peers.split(",")
    args.overlap = args.overlap.split(",")
    args.kernel = FusedAdamKernel() if args.adam == "fused" else None
    if args.kernel and not numba_imports():
        p.error("--adam fused needs Numba: pip install -e '.[fast]'")
    return args


def warmed_up_step(engine, args):
    """One training step of `engine` (initialized from seed 0) on a fixed random batch of
    args.batch_per_rank rows of this rank, as a function, after args.warmup untimed steps."""
    B = args.batch_per_rank
    engine.init_params(0)
    rng = np.random.default_rng(1000 + RANK)
    x = rng.standard_normal((B, args.sizes[0]), dtype=np.float32)
    y = rng.integers(0, args.sizes[-1], B)

    def step():
        return train_step(engine, [(x, y)], B * N, LR)
    for _ in range(args.warmup):
        step()
    return step


def timed_repeats(step, repeats, steps, warmup):
    """Median over repeats of (max over ranks of the mean time of `steps` calls to step())."""
    for _ in range(warmup):
        step()
    per_repeat = []
    for _ in range(repeats):
        COMM.Barrier()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        per_repeat.append(COMM.allreduce((time.perf_counter() - start) / steps, op=MPI.MAX))
    return statistics.median(per_repeat), per_repeat


def concurrent_time(fn, reps):
    """Median seconds of fn() with all ranks running it at the same moment (max over ranks)."""
    fn()
    times = []
    for _ in range(reps):
        COMM.Barrier()
        start = time.perf_counter()
        fn()
        times.append(COMM.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return statistics.median(times)


def rss_now_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def training_flops(sizes, B):
    """Per rank and step: forward x@W.T, backward dy.T@x and dy@W (none for the first layer)."""
    flops = 0
    for i, (I, O) in enumerate(zip(sizes[:-1], sizes[1:])):
        flops += 2 * B * I * O * (2 if i == 0 else 3)
    return flops


def sample_limits(sizes, B, owned_sizes):
    """One sample of each limit, all ranks at once: {limit: value} (GFLOP/s, GB/s or seconds)."""
    rng = np.random.default_rng(RANK)
    I = O = max(sizes)
    x, W, dy = (rng.standard_normal(s, dtype=np.float32) for s in [(B, I), (O, I), (B, O)])
    out_f, out_w, out_x = np.empty((B, O), np.float32), np.empty((O, I), np.float32), np.empty((B, I), np.float32)
    gemm_flops = 2 * B * I * O
    kinds = {"x@W.T": lambda: np.matmul(x, W.T, out=out_f),
             "dy.T@x": lambda: np.matmul(dy.T, x, out=out_w),
             "dy@W": lambda: np.matmul(dy, W, out=out_x)}
    sample = {}
    for name, fn in kinds.items():
        sample[f"gemm {name}"] = gemm_flops / (concurrent_time(lambda: [fn() for _ in range(10)], 3) / 10) / 1e9
    gemms = step_gemms(sizes, B)
    sample["gemm step"] = training_flops(sizes, B) / concurrent_time(lambda: [fn() for fn in gemms], 3) / 1e9
    for numel in owned_sizes:        # AdamW's footprint: p, g, m, v of the owned elements, each read + written
        sample[f"bandwidth {numel}"] = 8 * 4 * numel / state_pass_seconds(numel) / 1e9
    for how in ("model", "per_layer"):
        for op, seconds in collectives(sizes, how).items():
            sample[f"{how} {op}"] = seconds
    return sample


def step_arrays(sizes, B):
    """[(I, O, x (B, I), W (O, I), dy (B, O))] per layer, random, with the step's shapes."""
    rng = np.random.default_rng(RANK)
    return [(I, O, *(rng.standard_normal(s, dtype=np.float32) for s in [(B, I), (O, I), (B, O)]))
            for I, O in zip(sizes[:-1], sizes[1:])]


def step_gemms(sizes, B):
    """Every GEMM of one forward and backward at the step's own shapes and in the step's order, as
    functions: the forward's x@W.T layer by layer, then the backward's dy.T@x and dy@W from the
    last layer to the first (which needs no input gradient), so that each weight comes back from
    as far in the caches as in training."""
    forward, backward = [], []
    for i, (I, O, x, W, dy) in enumerate(step_arrays(sizes, B)):
        y, dW, dx = np.empty((B, O), np.float32), np.empty((O, I), np.float32), np.empty((B, I), np.float32)
        forward.append(lambda x=x, W=W, y=y: np.matmul(x, W.T, out=y))
        backward[:0] = [lambda dy=dy, x=x, dW=dW: np.matmul(dy.T, x, out=dW)] + (
            [lambda dy=dy, W=W, dx=dx: np.matmul(dy, W, out=dx)] if i else [])
    return forward + backward


def step_parts(sizes, B, owned_sizes):
    """One sample of the step's other parts measured alone, all ranks at once, in seconds:
    {"elementwise": every bias add, GELU forward and backward and bias sum at the step's shapes,
     "norm numel": the gradient norm's dot over `numel` owned elements}."""
    elementwise = []
    for i, O in enumerate(sizes[1:]):
        y, dy, b = np.full((B, O), 0.5, np.float32), np.full((B, O), 0.5, np.float32), np.zeros(O, np.float32)
        elementwise += [lambda y=y, b=b: np.add(y, b, out=y), lambda dy=dy, b=b: np.sum(dy, axis=0, out=b)]
        if i < len(sizes) - 2:                     # hidden layers: GELU (zerompi/layers.py)
            pre, out, t, d = (np.full((B, O), 0.5, np.float32) for _ in range(4))
            elementwise += [lambda pre=pre, out=out, t=t: layers.gelu_forward(pre, out, t),
                            lambda dy=dy, pre=pre, t=t, d=d: layers.gelu_backward(dy, pre, t, d)]
    parts = {"elementwise": concurrent_time(lambda: [fn() for fn in elementwise], 3)}
    for numel in owned_sizes:
        g = np.full(numel, 1e-3, np.float32)
        parts[f"norm {numel}"] = concurrent_time(lambda: np.dot(g, g), 3)
    return parts


def state_pass_seconds(numel):
    """Seconds of one in-place pass over each of four float32 arrays of numel elements."""
    state = [np.ones(numel, np.float32) for _ in range(4)]
    return concurrent_time(lambda: [np.multiply(a, np.float32(1.0000001), out=a) for a in state], 3)


def best_limits(samples, sizes, B, numel_full):
    """The limits from every round's sample: the best of each, and its spread."""
    values = {key: [s[key] for s in samples] for key in samples[0]}
    best_and_spread = {key: best(v, higher_is_better=not key.startswith(("model", "per_layer")))
                       for key, v in values.items()}
    pick = {key: b for key, (b, _) in best_and_spread.items()}
    gemm = {name: pick[f"gemm {name}"] for name in ("x@W.T", "dy.T@x", "dy@W")}
    gemm["all3"] = 3 / sum(1 / r for r in gemm.values())         # harmonic: equal FLOPs each
    gemm["step"] = pick["gemm step"]                            # the floor's: every layer's own shapes
    return {"gemm_shape": [B, max(sizes), max(sizes)], "gemm_gflops": gemm,
            "gemm_step_median_gflops": statistics.median(values["gemm step"]),
            "bandwidth_gbs": {int(key.split()[1]): b for key, b in pick.items() if key.startswith("bandwidth")},
            "collective_s": {how: {op: pick[f"{how} {op}"] for op in ("allreduce", "reduce_scatter", "allgather")}
                             for how in ("model", "per_layer")},
            "collective_bytes": 4 * numel_full, "samples": len(samples),
            "spread": {key: spread for key, (_, spread) in best_and_spread.items()}}


def collectives(sizes, how):
    """Seconds of each collective over the whole model: one model-sized call, or one call per
    layer as zerompi makes them (MPI may pick a different algorithm per message size)."""
    layout = build_engine(sizes, 0, precision_for("float32"), AdamConfig(), 1).layout
    counts = [layout.full_numel] if how == "model" else [u.padded for u in layout.layers]
    fulls = [np.ones(n, np.float32) for n in counts]
    shards = [np.empty(n // N, np.float32) for n in counts]
    pairs = list(zip(fulls, shards))
    return {"allreduce": concurrent_time(lambda: [COMM.Allreduce(MPI.IN_PLACE, f, op=MPI.SUM) for f in fulls], 5),
            "reduce_scatter": concurrent_time(lambda: [COMM.Reduce_scatter_block(f, s, op=MPI.SUM)
                                                       for f, s in pairs], 5),
            "allgather": concurrent_time(lambda: [COMM.Allgather(s, f) for f, s in pairs], 5)}


def numba_imports():
    try:
        compiled_loop()
    except Exception:                  # not installed, or built for another NumPy
        return False
    return True


def adam_kernels():
    """{column: kernel} of the AdamW updates timed alone: the NumPy one, and the fused loop when Numba imports."""
    return {"adam_alone_s": None, **({"adam_fused_s": FusedAdamKernel()} if numba_imports() else {})}


def measure_adam(numel, kernel=None, seconds_reps=3):
    """AdamW.update alone on `numel` float32 elements (one rank's owned state), by kernel
    (None: the NumPy update; zerompi/fused/'s FusedAdamKernel)."""
    adam = AdamW(numel, precision_for("float32"), AdamConfig(kernel=kernel), MemoryLedger())
    p, g = np.ones(numel, np.float32), np.full(numel, 1e-3, np.float32)

    def step():
        adam.begin_step()
        adam.update(p, g, slice(0, numel), LR)
    return concurrent_time(step, seconds_reps)


class StageRun:
    """One zerompi stage with overlap off or on: built and warmed up once, then timed in rounds
    between the other stages' (so that a burst of load from elsewhere hits them all alike)."""

    def __init__(self, stage, overlap, args):
        B = args.batch_per_rank
        config = OverlapConfig(overlap == "on", args.bucket_mb, args.prefetch)
        self.engine = build_engine(args.sizes, stage, precision_for("float32"), AdamConfig(kernel=args.kernel), B,
                                   bucket_mb=config.bucket_mb, start_collectives=config.start,
                                   keep_last_layer=args.keep_last_layer and stage == 3)
        self.step = warmed_up_step(self.engine, args)
        self.stage, self.round_s, self.steps = stage, [], 0
        layout = self.engine.layout
        self.owned_elements = layout.shard_numel if stage >= 1 else layout.full_numel
        self.busy_s = self.exposed_s = self.ring_bytes = 0.0

    def time_round(self, steps):
        """`steps` steps, the last one's communication included; max over ranks of the mean."""
        stage, ledger = self.engine.stage, self.engine.comm.ledger
        _, ring_before, _, busy_before = ledger.totals({"grads", "params"})
        exposed_before = stage.collectives.exposed_s
        COMM.Barrier()
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        stage.finish_communication()
        self.round_s.append(COMM.allreduce((time.perf_counter() - start) / steps, op=MPI.MAX))
        _, ring_after, _, busy_after = ledger.totals({"grads", "params"})
        self.busy_s += busy_after - busy_before
        self.exposed_s += stage.collectives.exposed_s - exposed_before
        self.ring_bytes += ring_after - ring_before
        self.steps += steps

    def result(self):
        engine, per_step = self.engine, lambda total: COMM.allreduce(total / self.steps, op=MPI.MAX)  # noqa: E731
        state = sum(engine.memory.bytes_by_kind[k] for k in ("params", "grads", "optimizer"))
        return {"step_s": statistics.median(self.round_s), "repeats_s": self.round_s,
                "comm_busy_s": per_step(self.busy_s), "comm_exposed_s": per_step(self.exposed_s),
                "ring_mb_per_step": per_step(self.ring_bytes) / 1e6,
                "ledger_mb": COMM.allreduce(engine.memory.total_bytes, op=MPI.MAX) / 1e6,
                "model_state_mb": COMM.allreduce(state, op=MPI.MAX) / 1e6,
                "owned_elements": self.owned_elements,
                "full_elements": engine.layout.full_numel, "num_params": engine.layout.num_params}


def floors(stage, res, limits, flops):
    def comm_time(c):
        return {0: c["allreduce"], 1: c["reduce_scatter"] + c["allgather"],
                2: c["reduce_scatter"] + c["allgather"], 3: c["reduce_scatter"] + 2 * c["allgather"]}[stage]
    comm = min(comm_time(c) for c in limits["collective_s"].values())    # the faster way of calling
    compute = flops / (limits["gemm_gflops"]["step"] * 1e9)
    optimizer = 7 * 4 * res["owned_elements"] / (limits["bandwidth_gbs"][res["owned_elements"]] * 1e9)
    return {"compute_s": compute, "optimizer_s": optimizer, "comm_s": comm,
            "total_s": compute + optimizer + comm}


def ratios(stages):
    """{row: measured / floor} of every row's step and of its AdamW alone (either update)."""
    found = {}
    for row, r in stages.items():
        found[f"stage {row}"] = r["step_s"] / r["floor"]["total_s"]
        for key, name in (("adam_alone_s", "AdamW"), ("adam_fused_s", "the fused AdamW")):
            if key in r:
                found[f"{name} of stage {row}"] = r[key] / r["floor"]["optimizer_s"]
    return found


def blas_report():
    info = [{k: d.get(k) for k in ("user_api", "internal_api", "architecture", "version", "num_threads")}
            for d in threadpool_info()]
    env = {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    return {"threadpools": info, "env": env}


def main(argv=None):
    args = parse_args(argv)
    out = {"args": vars(args), "ranks": N, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    with threadpool_limits(limits=1):
        out["blas"], out["cpu"], out["versions"] = blas_report(), cpu_model(), versions()
        probe = build_engine(args.sizes, 0, precision_for("float32"), AdamConfig(), 1)
        numel_full, num_params = probe.layout.full_numel, probe.layout.num_params
        del probe
        flops = training_flops(args.sizes, args.batch_per_rank)
        out["flops_per_rank_step"] = flops
        limits = None
        runs = {f"{stage} {overlap}": StageRun(stage, overlap, args)
                for stage in args.stages for overlap in args.overlap}
        owned_sizes = sorted({run.owned_elements for run in runs.values()})
        others, samples, adam_rounds, part_rounds = OtherProcesses(COMM), [], [], []
        others.start()
        for _ in range(args.repeats):                   # the limits sampled between the rounds
            for run in runs.values():
                run.time_round(args.steps)
            if args.limits == "on":
                samples.append(sample_limits(args.sizes, args.batch_per_rank, owned_sizes))
                adam_rounds.append({(key, numel): measure_adam(numel, kernel) for key, kernel in adam_kernels().items()
                                    for numel in owned_sizes})
                part_rounds.append(step_parts(args.sizes, args.batch_per_rank, owned_sizes))
        out["stages"] = {}
        if samples:
            out["limits"] = limits = best_limits(samples, args.sizes, args.batch_per_rank, numel_full)
        for row, run in runs.items():
            out["stages"][row] = res = run.result()
            if limits:
                for key in adam_kernels():              # the median over the rounds
                    res[key] = statistics.median(r[key, run.owned_elements] for r in adam_rounds)
                res["parts_s"] = {"gemms": flops / (limits["gemm_step_median_gflops"] * 1e9),
                                  "elementwise": statistics.median(r["elementwise"] for r in part_rounds),
                                  "norm": statistics.median(r[f"norm {run.owned_elements}"] for r in part_rounds)}
                res["floor"] = floors(run.stage, res, limits, flops)
        out["others_share"] = others.share()
        if limits:
            out["void"] = void_reasons(ratios(out["stages"]), out["others_share"])
        out["rss_mb"] = COMM.allreduce(rss_now_bytes(), op=MPI.MAX) / 1e6
        out["rss_peak_mb"] = COMM.allreduce(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                                            op=MPI.MAX) / 1e6
        del runs
        out["peers"] = {}
        if args.peers:
            try:
                from peers_torch import run_peers
                out["peers"] = run_peers(COMM, args, timed_repeats)
            except ImportError as e:
                out["peers"] = {"error": f"torch not available: {e}"}
    if RANK == 0:
        if limits:
            print_table(out, num_params)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1, default=str)
            print(f"wrote {args.json}")


def print_table(out, num_params):
    a, lim = out["args"], out["limits"]
    ms = lambda s: f"{1e3 * s:8.1f}"    # noqa: E731
    print(f"zerompi step time | {out['ranks']} ranks x 1 BLAS thread | MLP {'-'.join(map(str, a['sizes']))} "
          f"({num_params:,} params, float32) | batch {a['batch_per_rank']}/rank | "
          f"median of {a['repeats']} x {a['steps']} steps")
    for tp in out["blas"]["threadpools"]:
        print(f"BLAS: {tp['user_api']}: {tp['internal_api']} {tp['version']} kernel {tp['architecture']}")
    print(f"CPU: {out['cpu']} | " + ", ".join(f"{k} {v}" for k, v in out["versions"].items()))
    env = out["blas"]["env"]
    print(f"OPENBLAS_CORETYPE={env['OPENBLAS_CORETYPE']} OPENBLAS_L2_SIZE={env['OPENBLAS_L2_SIZE']}"
          + ("  (unsetting both may select a faster kernel)" if any(env.values()) else ""))
    g, spread = lim["gemm_gflops"], lim["spread"]
    print(f"\nlimits (all ranks at once; the best of {lim['samples']} samples, one between each round; the "
          f"spread of the samples in brackets):\n  GEMM {'x'.join(map(str, lim['gemm_shape']))} GFLOP/s per rank: "
          + ", ".join(f"{k} {v:.1f}" + (f" [{100 * spread['gemm ' + k]:.0f}%]" if k != "all3" else "")
          for k, v in g.items() if k != "step")
          + f"\n  the step's GEMMs (every layer at its own shape) GFLOP/s per rank: {g['step']:.1f} "
            f"[{100 * spread['gemm step']:.0f}%], their median {lim['gemm_step_median_gflops']:.1f}")
    print("  ufunc bandwidth over AdamW's p, g, m, v GB/s per rank: " + ", ".join(
        f"{numel:,} elements {gbs:.1f} [{100 * spread[f'bandwidth {numel}']:.0f}%]"
        for numel, gbs in lim["bandwidth_gbs"].items()))
    print(f"  collectives on {lim['collective_bytes'] / 1e6:.1f} MB")
    for how, c in lim["collective_s"].items():
        print(f"    {how:>8} calls: " + ", ".join(f"{k} {1e3 * v:.1f} ms [{100 * spread[f'{how} {k}']:.0f}%]"
                                            for k, v in c.items()))
    void = out["void"]
    if void:
        print("\nVOID, not a result: " + "; ".join(void))
    print(f"  training FLOPs per rank and step: {out['flops_per_rank_step'] / 1e9:.2f} GFLOP")
    print(f"other processes: {100 * out['others_share']:.1f}% of the machine's CPU during the rounds "
          f"(kernel counters, /proc/stat)")
    peers = {name: p for name, p in out["peers"].items() if name != "error" and "error" not in p}
    print(f"stage rows' AdamW: {a['adam']}" + (" | stage 3 keeps the last layer" if a["keep_last_layer"] else ""))
    print("\nstage overlap  step ms  exposed  busy ms  adam ms  fused | floor: compute  optim   comm  total | "
          "ratio | ledger MB" + "".join(f" | /{name}" for name in peers))
    for row, r in out["stages"].items():
        stage, overlap = row.split()
        f = r["floor"]
        print(f"{stage:>5} {overlap:>7} {ms(r['step_s'])} {ms(r['comm_exposed_s'])} {ms(r['comm_busy_s'])} "
              f"{ms(r['adam_alone_s'])} {ms(r['adam_fused_s'])[2:] if 'adam_fused_s' in r else '     -'} |      "
              f"{ms(f['compute_s'])}{ms(f['optimizer_s'])[1:]}{ms(f['comm_s'])[1:]}{ms(f['total_s'])[1:]} | "
              f"{r['step_s'] / f['total_s']:5.2f} | {r['ledger_mb']:9.1f}"
              + "".join(f" | {r['step_s'] / p['step_s']:5.2f}" for p in peers.values()))
    print(f"process memory per rank with every row's engine built at once: RSS {out['rss_mb']:.0f} MB, "
          f"peak {out['rss_peak_mb']:.0f} MB")
    if void:
        print("VOID: the table above is not a result (see why above)")
    print_parts(out)
    if not out["peers"]:
        return
    print("\npeer                        step ms   (the /peer columns above: zerompi step / peer step)")
    for name, p in out["peers"].items():
        if "error" in p or name == "error":
            print(f"{name:<27} failed: {p['error'] if isinstance(p, dict) else p}")
            continue
        print(f"{p['label']:<27} {ms(p['step_s'])}")


def step_accounts(r, adam):
    """{part: seconds} of one row's step: its parts measured alone (medians over the rounds), the
    row's AdamW update, the communication the training thread waited for, and the rest."""
    parts = dict(r["parts_s"], adam=r["adam_fused_s" if adam == "fused" else "adam_alone_s"],
                 comm=r["comm_exposed_s"])
    return dict(parts, rest=r["step_s"] - sum(parts.values()))


def print_parts(out):
    print("\nwhere a step goes (each part alone, all ranks at once, the median over the rounds; comm: the "
          "exposed time; rest = step - the parts):\nstage overlap  step ms =  GEMMs  elementwise  norm  AdamW  "
          " comm   rest | GEMMs / floor's compute")
    for row, r in out["stages"].items():
        a = step_accounts(r, out["args"]["adam"])
        print(f"{row.split()[0]:>5} {row.split()[1]:>7} {1e3 * r['step_s']:8.1f}   " + " ".join(
            f"{1e3 * a[k]:{w}.1f}" for k, w in (("gemms", 6), ("elementwise", 12), ("norm", 5), ("adam", 6),
                                                ("comm", 6), ("rest", 6)))
            + f" | {a['gemms'] / r['floor']['compute_s']:5.2f}")


if __name__ == "__main__":
    main()
