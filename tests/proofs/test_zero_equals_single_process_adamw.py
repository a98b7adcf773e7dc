"""The central property: ZeRO computes what single-process AdamW computes on the same global batch,
for every stage and every N (run with N = 1, 2, 3, 4, 8: on in-process ranks, and under mpirun at N = 1, 2), uneven sizes included;
and so do gradient accumulation, clipping by the global norm, and mixed precision.

Tolerances:
  float64: 1e-12 relative to the largest element of each tensor. The only difference from the
    reference is the order in which the rows' gradient contributions are summed (one matmul over
    all rows vs per-rank matmuls summed by MPI): a few ulp (~1e-16) per step.
  float32: the same summation-order difference is ~1e-7 relative in each gradient. Adam's
    update lr * m / (sqrt(v) + eps) depends on the gradient's relative, not absolute, error, so
    each step moves a parameter by at most ~lr * (few 1e-7) more or less than the reference; over
    3 steps with lr = 1e-2 that is ~1e-8. We allow 2e-6 absolute (parameters are O(0.1-1)),
    which a real bug (a missed or doubled shard, a wrong scale) exceeds by orders of magnitude.
  bf16 / fp16 (fp32 master, m, v): ZeRO rounds each rank's partial gradient to 16 bits before the
    fp32 sum, the reference rounds the whole batch's gradient once: ~2^-8 (bf16) or ~2^-11 (fp16)
    relative per gradient element, which Adam's normalized update turns into ~lr * 2^-8 per step,
    plus at most one 16-bit ulp where the final rounding of the master falls the other way. So
    the mean |difference| must stay below lr / 20 (measured: ~lr / 120 for bf16, lr / 5000 for
    fp16; one unupdated shard at N = 8 would give ~lr / 3), and no element may differ by more than
    2 lr per step: an element whose gradient is ~0 may flip the sign of its update, never more.

Marked in_process: tests/run_all.py also runs them on in-process ranks (tests/conftest.py).
"""
import ml_dtypes
import numpy as np
import pytest

from helpers import (STEPS, assert_mixed_run_matches_reference, consolidated, make_batches, micro_batches_for,
                     reference, train_zero, world, world_size)
from reference import global_norm, initial_weights, loss_and_grads

pytestmark = pytest.mark.in_process

SIZES = [
    [12, 37, 53, 7],       # layers of 481, 2014 and 378 elements: padding at every N > 1 (481 is odd)
    [5, 3, 2],             # layers of 18 and 8 elements: N = 8 exceeds most shards' content
    [64, 32, 10],          # even widths
]
STAGES = [0, 1, 2, 3]
BF16 = ml_dtypes.bfloat16
size_id = lambda s: "-".join(map(str, s))    # noqa: E731


@pytest.mark.mpi
def test_the_first_model_pads_a_shard_at_every_n_and_the_others_divide_evenly_at_some():
    """A layer holds O (I + 1) elements, even whenever I is odd: [13, 37, 53, 7] had no padding at
    N = 2, and the equivalence at N = 2 never saw a padded shard."""
    from zerompi.layout import Layout
    n = world_size()
    padded = [u.padded - u.numel for u in Layout(SIZES[0], n).layers]
    assert (max(padded) > 0) == (n > 1), padded


def assert_close_f64(got, want):
    for (w, b), (w_ref, b_ref) in zip(got, want):
        for tensor, tensor_ref in ((w, w_ref), (b, b_ref)):
            assert np.max(np.abs(tensor - tensor_ref)) <= 1e-12 * np.max(np.abs(tensor_ref))


@pytest.mark.mpi
@pytest.mark.parametrize("sizes", SIZES, ids=size_id)
@pytest.mark.parametrize("stage", STAGES)
def test_float64_equals_single_process_adamw(stage, sizes):
    batches = make_batches(sizes, STEPS)
    got = consolidated(train_zero(stage, sizes, np.float64, batches)[0])
    want, _ = reference(sizes, np.float64, batches)
    assert_close_f64(got, want)
    initial = initial_weights(sizes, 0, np.float64)
    assert not np.allclose(got[0][0], initial[0][0])          # training did move the weights


@pytest.mark.mpi
@pytest.mark.parametrize("sizes", SIZES, ids=size_id)
@pytest.mark.parametrize("stage", STAGES)
def test_float32_equals_single_process_adamw(stage, sizes):
    batches = make_batches(sizes, STEPS)
    got = consolidated(train_zero(stage, sizes, np.float32, batches)[0])
    want, _ = reference(sizes, np.float32, batches)
    for (w, b), (w_ref, b_ref) in zip(got, want):
        np.testing.assert_allclose(w, w_ref, rtol=0, atol=2e-6)
        np.testing.assert_allclose(b, b_ref, rtol=0, atol=2e-6)


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [BF16, np.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("sizes", SIZES[:2], ids=size_id)
@pytest.mark.parametrize("stage", STAGES)
def test_mixed_precision_equals_single_process_mixed_adamw(stage, sizes, dtype):
    batches = make_batches(sizes, STEPS)
    engine = assert_mixed_run_matches_reference(stage, sizes, dtype, batches)
    assert engine.stage.param_shard.dtype == dtype if stage == 3 else engine.stage.param_full.dtype == dtype


@pytest.mark.mpi
@pytest.mark.parametrize("stage", STAGES)
def test_fp16_loss_scaling_unscales_exactly(stage):
    """Adam's update m / sqrt(v) cannot tell a gradient from 1024 times it, so a forgotten unscale
    would pass every weight comparison. Adam's first moment can: after one step it must be
    (1 - beta1) times the unscaled gradient, and the reported norm must be the unscaled one."""
    sizes = SIZES[0]
    batches = make_batches(sizes, 1)
    engine, results = train_zero(stage, sizes, np.float16, batches, loss_scale=1024.0)
    x, labels = batches[0]
    params16 = [(w.astype(np.float16).astype(np.float32), b.astype(np.float16).astype(np.float32))
                for w, b in initial_weights(sizes, 0)]
    _, grads = loss_and_grads(params16, x.astype(np.float32), labels)
    assert results[0].grad_norm == pytest.approx(global_norm(grads), rel=1e-2)
    for layer, (dw, db) in zip(engine.layout.layers, grads):
        flat = np.concatenate([dw.ravel(), db.ravel(), np.zeros(layer.padded - layer.numel, np.float32)])
        owned = engine.stage.owned(layer)
        state, (lo, hi) = owned.state, owned.range
        np.testing.assert_allclose(engine.stage.adam.m[state], 0.1 * flat[lo:hi], rtol=2e-2, atol=1e-6)


UNIT_ROUNDOFF = {BF16: 2.0 ** -8, np.float16: 2.0 ** -11}     # half a 16-bit ulp, relative


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [BF16, np.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("stage", STAGES)
def test_mixed_precision_reduced_gradient_is_the_global_gradient(stage, dtype):
    """Adam's update m / sqrt(v) barely depends on the gradient's scale, so the weights cannot show
    a 16-bit reduction that gets the scale wrong (the sum divided by N once more, a loss scale not
    divided out). The reduced gradient itself can. After one step, each rank's owned gradient
    (unscaled) must be the float64 global gradient of the oracle at the same 16-bit weights, up to
    what the 16-bit path rounds: each rank's partial gradient g_r once, and their float32 sum once
    (unit roundoff u: 2^-8 bf16, 2^-11 fp16). Over the owned elements
        ||got - want|| <= 2 u (sum_r ||g_r|| + ||g||)      (2: float32 compute, u^2 terms)
    plus fp16's subnormal spacing; and the reported norm within the same bound of the oracle's. A
    scale off by N is off by (1 - 1/N) ||g||: >= 50% at N >= 2, against a bound of (N + 1) 2u
    (~2-7% for bf16 at N = 2-8, <1% for fp16)."""
    sizes, comm = SIZES[0], world()
    n_ranks = comm.size
    loss_scale = 1024.0 if dtype == np.float16 else 1.0
    batches = make_batches(sizes, 1)
    engine, results = train_zero(stage, sizes, dtype, batches, loss_scale=loss_scale)
    assert results[0].applied
    x, labels = batches[0]
    params16 = [(w.astype(dtype), b.astype(dtype)) for w, b in initial_weights(sizes, 0)]
    _, want = loss_and_grads(params16, x, labels)
    rows = x.shape[0] // n_ranks                      # rank r's rows: helpers.run_steps's split
    partials = [[(dw * rows / x.shape[0], db * rows / x.shape[0]) for dw, db in
                 loss_and_grads(params16, x[r * rows:(r + 1) * rows], labels[r * rows:(r + 1) * rows])[1]]
                for r in range(n_ranks)]
    u = UNIT_ROUNDOFF[dtype]

    def flat(layer, grads):
        dw, db = grads[layer.index]
        return np.concatenate([dw.ravel(), db.ravel(), np.zeros(layer.padded - layer.numel)])

    diff_sq = bound = want_sq = 0.0                      # over this rank's owned elements
    for layer in engine.layout.layers:
        owned = engine.stage.owned(layer)
        lo, hi = owned.range
        got = owned.grad.astype(np.float64) / loss_scale
        expected = flat(layer, want)[lo:hi]
        diff_sq += np.sum((got - expected) ** 2)
        want_sq += np.sum(expected ** 2)
        bound += np.linalg.norm(expected) + sum(np.linalg.norm(flat(layer, p)[lo:hi]) for p in partials)
    subnormal = (n_ranks + 1) * 2.0 ** -24 / loss_scale * np.sqrt(engine.layout.shard_numel) if dtype == np.float16 else 0.0
    bound = 2 * u * bound + subnormal
    assert np.sqrt(diff_sq) <= bound
    totals = np.array([diff_sq, bound ** 2, want_sq])
    comm.allreduce_sum(totals, "metrics")                   # over every rank's owned elements
    total_diff, total_bound = np.sqrt(totals[:2])
    assert total_diff <= total_bound
    assert abs(results[0].grad_norm - global_norm(want)) <= total_bound
    assert totals[2] > 0                                    # the gradient is not all zeros


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [BF16, np.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("stage", STAGES)
def test_mixed_precision_accumulation_stays_within_the_mixed_tolerance(stage, dtype):
    """16-bit gradients are added per micro-batch in 16 bits (docs/mixed-precision.md: the error
    grows with M); at M = 2-3 the result stays within the mixed-precision tolerance above."""
    sizes = SIZES[0]
    batches = make_batches(sizes, STEPS)
    assert_mixed_run_matches_reference(stage, sizes, dtype, batches, micro_batches_for(world_size()))


@pytest.mark.mpi
@pytest.mark.parametrize("stage", STAGES)
def test_gradient_accumulation_equals_one_large_batch(stage):
    sizes = SIZES[0]
    batches = make_batches(sizes, STEPS)
    k = micro_batches_for(world_size())
    got = consolidated(train_zero(stage, sizes, np.float64, batches, micro_batches=k)[0])
    want, _ = reference(sizes, np.float64, batches)
    assert_close_f64(got, want)


@pytest.mark.mpi
@pytest.mark.parametrize("stage", STAGES)
def test_accumulation_keeps_no_full_gradient_in_stages_2_and_3(stage):
    """With micro-batches, stages 2-3 still hold only the gradient shard (and one layer gradient buffer)."""
    sizes = SIZES[0]
    k = micro_batches_for(world_size())
    engine, _ = train_zero(stage, sizes, np.float64, make_batches(sizes, 1), micro_batches=k)
    grads = [shape for kind, _, shape, *_ in engine.memory.buffers if kind == "grads"]
    expected = engine.layout.full_numel if stage <= 1 else engine.layout.shard_numel
    assert grads == [(expected,)]


@pytest.mark.mpi
@pytest.mark.parametrize("sizes", SIZES[:2], ids=size_id)
@pytest.mark.parametrize("stage", STAGES)
def test_global_grad_norm_equals_unsharded_norm(stage, sizes):
    """No replicated (stage 0) or padded element is counted twice, none is missed."""
    batches = make_batches(sizes, 1)
    _, results = train_zero(stage, sizes, np.float64, batches)
    x, labels = batches[0]
    _, grads = loss_and_grads(initial_weights(sizes, 0, np.float64), x, labels)
    assert results[0].grad_norm == pytest.approx(global_norm(grads), rel=1e-12)


@pytest.mark.mpi
@pytest.mark.parametrize("stage", STAGES)
def test_clipping_by_global_norm_equals_single_process(stage):
    sizes = SIZES[0]
    batches = make_batches(sizes, STEPS)
    _, norms = reference(sizes, np.float64, batches)
    clip_norm = 0.3 * min(norms)                               # every step is clipped
    got = consolidated(train_zero(stage, sizes, np.float64, batches, max_grad_norm=clip_norm)[0])
    want, _ = reference(sizes, np.float64, batches, clip_norm=clip_norm)
    assert_close_f64(got, want)
    unclipped, _ = reference(sizes, np.float64, batches)
    assert not np.allclose(want[0][0], unclipped[0][0])       # clipping did change the result


@pytest.mark.mpi
@pytest.mark.parametrize("stage", STAGES)
def test_fp16_overflow_skips_the_step_on_every_rank(stage):
    """A loss scale so large that fp16 gradients overflow: every rank skips, nothing changes."""
    sizes = SIZES[0]
    engine, results = train_zero(stage, sizes, np.float16, make_batches(sizes, 1), loss_scale=2.0 ** 40)
    assert not results[0].applied
    assert engine.stage.adam.t == 0                             # Adam's step count did not advance
    for (w, b), (w0, b0) in zip(consolidated(engine), initial_weights(sizes, 0, np.float16)):
        assert np.array_equal(w, w0.astype(np.float64)) and np.array_equal(b, b0.astype(np.float64))
    flags = np.array([results[0].applied], dtype=np.int64)
    world().allreduce_sum(flags, "metrics")
    assert flags[0] == 0                                       # no rank disagreed


@pytest.mark.mpi
def test_every_rank_ends_with_the_same_model():
    """Stage 0: every rank keeps the whole model and updates it itself, from the all-reduced
    gradient, so the ranks' copies could drift apart (a gradient reduced on some ranks only, a
    rank that skipped a step); this compares them, each read where it lives (no collective). (At stages 1-3 each element is updated on its owner only and all-gathered to
    the others: the copies are one by construction, and reading them back is that all-gather, so a
    comparison there could not fail; their values are what the equivalence tests check.)"""
    sizes = SIZES[0]
    engine, _ = train_zero(0, sizes, np.float64, make_batches(sizes, STEPS))
    flat = np.array(engine.stage.param_full)                  # this rank's own copy
    copies = np.zeros((engine.comm.size, flat.size)) if engine.comm.rank == 0 else None
    engine.comm.gather_to_root(flat, copies)
    assert engine.comm.rank != 0 or all(np.array_equal(copy, flat) for copy in copies)


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["float32", "bf16"])
@pytest.mark.parametrize("stage", STAGES)
def test_deterministic_run_after_run(stage, dtype):
    sizes = SIZES[0]
    batches = make_batches(sizes, STEPS)
    first = consolidated(train_zero(stage, sizes, dtype, batches)[0])
    second = consolidated(train_zero(stage, sizes, dtype, batches)[0])
    for (w1, b1), (w2, b2) in zip(first, second):
        assert np.array_equal(w1, w2) and np.array_equal(b1, b2)


@pytest.mark.mpi
def test_padding_stays_zero():
    """Padding elements of every layer remain exactly zero after training: the parameters (stages
    0-2 hold them), Adam's m, and the reduced gradient that Adam reads (stage 1 reduces in place)."""
    sizes = SIZES[0]
    for stage in (0, 1, 2, 3):
        engine, _ = train_zero(stage, sizes, np.float64, make_batches(sizes, STEPS))
        stage_ = engine.stage
        for layer in engine.layout.layers:
            if stage <= 2:
                full = stage_.param_full[engine.layout.full_slice(layer)]
                assert np.all(full[layer.numel:] == 0)
            _, grad, state, (lo, hi) = stage_.owned(layer)
            real = max(0, min(hi, layer.numel) - lo)          # owned elements before the padding
            assert np.all(grad[real:] == 0) and np.all(stage_.adam.m[state][real:] == 0)
