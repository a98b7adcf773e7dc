"""Shared by the multi-rank tests: a few ZeRO steps on a fixed global batch sequence."""
import numpy as np

from zerompi.adam import AdamConfig
from zerompi.comm import Communicator
from zerompi.engine import build_engine
from zerompi.train_step import train_step

GLOBAL_BATCH = 24          # divisible by every N tested: 1, 2, 3, 4, 8
LR, WEIGHT_DECAY = 1e-2, 0.1


def make_batches(sizes, steps, seed=1):
    """[(x (GLOBAL_BATCH, sizes[0]) float64, labels (GLOBAL_BATCH,)), ...], the same on every rank."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((GLOBAL_BATCH, sizes[0])), rng.integers(0, sizes[-1], GLOBAL_BATCH))
            for _ in range(steps)]


def train_zero(stage, sizes, dtype, batches, comm=None, seed=0):
    """Run the ZeRO engine on this rank's rows of each global batch; returns the engine."""
    comm = comm if comm is not None else Communicator()
    rows = GLOBAL_BATCH // comm.size
    engine = build_engine(sizes, stage, np.dtype(dtype), AdamConfig(lr=LR, weight_decay=WEIGHT_DECAY), rows, comm)
    engine.init_params(seed)
    mine = slice(comm.rank * rows, (comm.rank + 1) * rows)
    for x, labels in batches:
        train_step(engine.zero, engine.mlp, x[mine].astype(dtype), labels[mine], GLOBAL_BATCH)
    return engine


def consolidated(engine):
    """[(weight, bias), ...] full copies (collective in stage 3)."""
    layers = []
    for unit in engine.layout.units:
        weight, bias = unit.views(engine.zero.full_unit_params(unit))
        layers.append((weight.copy(), bias.copy()))
    return layers
