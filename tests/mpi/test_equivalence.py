"""The central property: ZeRO computes what single-process AdamW computes on the same global batch,
for every stage and every N (run under mpirun with N = 1, 2, 3, 4, 8), uneven sizes included.

Tolerances:
  float64: 1e-12 relative to the largest element of each tensor. The only difference from the
    reference is the order in which the rows' gradient contributions are summed (one matmul over
    all rows vs per-rank matmuls summed by MPI): a few ulp (~1e-16) per step.
  float32: the same summation-order difference is ~1e-7 relative in each gradient. Adam's
    update lr * m / (sqrt(v) + eps) depends on the gradient's relative, not absolute, error, so
    each step moves a parameter by at most ~lr * (few 1e-7) more or less than the reference; over
    3 steps with lr = 1e-2 that is ~1e-8. We allow 2e-6 absolute (parameters are O(0.1-1)),
    which a real bug (a missed or doubled shard, a wrong scale) exceeds by orders of magnitude.
"""
import numpy as np
import pytest
from mpi4py import MPI

from helpers import LR, WEIGHT_DECAY, consolidated, make_batches, train_zero
from reference import adamw_train, initial_weights

SIZES = [
    [13, 37, 53, 7],       # odd widths: no unit divides evenly by 2, 3, 4 or 8
    [5, 3, 2],             # units of 18 and 8 elements: N = 8 exceeds most shards' content
    [64, 32, 10],          # even widths
]
STEPS = 3


def reference(sizes, dtype, batches):
    batches = [(x.astype(dtype), labels) for x, labels in batches]
    layers, _ = adamw_train(initial_weights(sizes, 0, dtype), batches, LR, WEIGHT_DECAY)
    return layers


@pytest.mark.mpi
@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "-".join(map(str, s)))
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_float64_equals_single_process_adamw(stage, sizes):
    batches = make_batches(sizes, STEPS)
    got = consolidated(train_zero(stage, sizes, np.float64, batches))
    want = reference(sizes, np.float64, batches)
    for (w, b), (w_ref, b_ref) in zip(got, want):
        for tensor, tensor_ref in ((w, w_ref), (b, b_ref)):
            assert np.max(np.abs(tensor - tensor_ref)) <= 1e-12 * np.max(np.abs(tensor_ref))
    initial = initial_weights(sizes, 0, np.float64)
    assert not np.allclose(got[0][0], initial[0][0])          # training did move the weights


@pytest.mark.mpi
@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "-".join(map(str, s)))
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_float32_equals_single_process_adamw(stage, sizes):
    batches = make_batches(sizes, STEPS)
    got = consolidated(train_zero(stage, sizes, np.float32, batches))
    want = reference(sizes, np.float32, batches)
    for (w, b), (w_ref, b_ref) in zip(got, want):
        assert w.dtype == np.float32
        np.testing.assert_allclose(w, w_ref, rtol=0, atol=2e-6)
        np.testing.assert_allclose(b, b_ref, rtol=0, atol=2e-6)


@pytest.mark.mpi
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_every_rank_ends_with_the_same_model(stage):
    sizes = SIZES[0]
    got = consolidated(train_zero(stage, sizes, np.float64, make_batches(sizes, STEPS)))
    flat = np.concatenate([t.ravel() for layer in got for t in layer])
    first = flat.copy()
    MPI.COMM_WORLD.Bcast(first, root=0)
    assert np.array_equal(flat, first)


@pytest.mark.mpi
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_deterministic_run_after_run(stage):
    sizes = SIZES[0]
    batches = make_batches(sizes, STEPS)
    first = consolidated(train_zero(stage, sizes, np.float32, batches))
    second = consolidated(train_zero(stage, sizes, np.float32, batches))
    for (w1, b1), (w2, b2) in zip(first, second):
        assert np.array_equal(w1, w2) and np.array_equal(b1, b2)


@pytest.mark.mpi
def test_padding_stays_zero():
    """Padding elements of every unit remain exactly zero after training (stages 0-2 hold them)."""
    sizes = SIZES[0]
    for stage in (0, 1, 2):
        engine = train_zero(stage, sizes, np.float64, make_batches(sizes, STEPS))
        for unit in engine.layout.units:
            full = engine.zero.param_full[engine.layout.full_slice(unit)]
            assert np.all(full[unit.numel:] == 0)
