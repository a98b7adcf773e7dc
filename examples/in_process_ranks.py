"""ZeRO on N ranks that are threads of this one process: no MPI, no mpirun (zerompi/inprocess/).

    python examples/in_process_ranks.py                  # stage 3, N = 4
    python examples/in_process_ranks.py --stage 1 --ranks 2

Each rank trains the same small MLP on its rows of a random batch for a few steps; then every
rank's shard of each layer (which elements it owns), its model-state bytes, and what its ledger
counted per step, printed side by side. Put a breakpoint in zerompi/step.py and every rank stops
there, in one debugger.
"""
import argparse

import numpy as np

from zerompi.adam import AdamConfig
from zerompi.engine import build_engine
from zerompi.inprocess import run_ranks
from zerompi.precision import precision_for
from zerompi.step import train_step

SIZES, ROWS, STEPS = [64, 128, 128, 10], 8, 5


def rank_view(stage, num_ranks):
    def fn(comm):
        engine = build_engine(SIZES, stage, precision_for("float32"), AdamConfig(), ROWS, comm)
        engine.init_params(0)
        rng = np.random.default_rng(comm.rank)                   # this rank's own rows
        for _ in range(STEPS):
            x, y = rng.standard_normal((ROWS, SIZES[0])).astype(np.float32), rng.integers(0, 10, ROWS)
            loss = train_step(engine, [(x, y)], ROWS * num_ranks, 1e-3).loss
        shards = [layer.owned_range(comm.rank) for layer in engine.layout.layers]
        state = {kind: engine.memory.bytes_by_kind[kind] for kind in ("params", "grads", "optimizer")}
        calls = {purpose: sum(e[0] for (_, p), e in engine.comm.ledger.entries.items() if p == purpose) / STEPS
                 for purpose in ("grads", "params")}
        return shards, state, calls, loss
    return fn


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", type=int, default=3, choices=range(4))
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args()
    views = run_ranks(rank_view(args.stage, args.ranks), args.ranks)
    print(f"ZeRO stage {args.stage} on {args.ranks} in-process ranks, MLP {'-'.join(map(str, SIZES))}, "
          f"{STEPS} steps: the same loss on every rank ({', '.join(f'{v[3]:.4f}' for v in views)})")
    print(f"{'rank':>4}  {'its shard of layer 0, 1, 2 (padded elements)':<46} {'params':>8} {'grads':>8} "
          f"{'optimizer':>9}  {'calls/step':>10}")
    for rank, (shards, state, calls, _) in enumerate(views):
        ranges = ", ".join(f"[{a}, {b})" for a, b in shards)
        print(f"{rank:>4}  {ranges:<46} {state['params']:>8,} {state['grads']:>8,} {state['optimizer']:>9,}  "
              f"{calls['grads']:.0f} + {calls['params']:.0f}")


if __name__ == "__main__":
    main()
