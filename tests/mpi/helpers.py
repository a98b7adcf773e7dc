"""Shared by the multi-rank tests: a few ZeRO steps on a fixed global batch sequence."""
import numpy as np

from zerompi.adam import AdamConfig
from zerompi.comm import Communicator
from zerompi.engine import build_engine
from zerompi.precision import precision_for
from zerompi.train_step import train_step

GLOBAL_BATCH = 24          # divisible by every N tested: 1, 2, 3, 4, 8
LR, WEIGHT_DECAY = 1e-2, 0.1


def make_batches(sizes, steps, seed=1):
    """[(x (GLOBAL_BATCH, sizes[0]) float64, labels (GLOBAL_BATCH,)), ...], the same on every rank."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((GLOBAL_BATCH, sizes[0])), rng.integers(0, sizes[-1], GLOBAL_BATCH))
            for _ in range(steps)]


def train_zero(stage, sizes, dtype, batches, comm=None, seed=0, micro_batches=1, loss_scale=1.0,
               max_grad_norm=0.0):
    """Run the ZeRO engine on this rank's rows of each global batch (cut into micro_batches, as
    zerompi.train does); returns (engine, [StepResult, ...])."""
    comm = comm if comm is not None else Communicator()
    precision = precision_for(np.dtype(dtype).name)
    rows = GLOBAL_BATCH // (comm.size * micro_batches)
    engine = build_engine(sizes, stage, precision, AdamConfig(weight_decay=WEIGHT_DECAY), rows, comm)
    engine.init_params(seed)
    results = []
    for x, labels in batches:
        x = x.astype(precision.compute).reshape(micro_batches, comm.size, rows, -1)[:, comm.rank]
        labels = labels.reshape(micro_batches, comm.size, rows)[:, comm.rank]
        results.append(train_step(engine.zero, engine.mlp, list(zip(x, labels)), GLOBAL_BATCH, LR,
                                  loss_scale, max_grad_norm))
    return engine, results


def consolidated(engine):
    """[(weight, bias), ...] full copies in float64 (collective in stage 3)."""
    layers = []
    for unit in engine.layout.units:
        weight, bias = unit.views(engine.zero.full_unit_params(unit))
        layers.append((weight.astype(np.float64), bias.astype(np.float64)))
    return layers
