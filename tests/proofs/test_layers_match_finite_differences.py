"""zerompi.layers against finite differences and direct formulas, in float64.

Central differences with step EPS = 1e-6 have truncation error ~EPS^2 |f'''| ~ 1e-12 and
round-off ~1e-16 |f| / EPS ~ 1e-10, so analytic and numeric gradients agree to ~1e-8 relative:
RTOL = 1e-6 (with an absolute floor ATOL for elements whose gradient is close to 0). A wrong
sign, a missing factor or a transposed product is off by O(1).
"""
import math
import tracemalloc

import numpy as np
import pytest

from reference import initial_weights, loss_and_grads
from zerompi.layers import (GELU_A, GELU_C, LossScratch, gelu_backward, gelu_forward, linear_backward,
                            linear_forward, softmax_cross_entropy)

EPS = 1e-6
RTOL = 1e-6
ATOL = 1e-9


def numeric_grad(f, a, indices=None):
    """Central-difference gradient of the scalar f() wrt the array a (perturbed in place), at
    the given flat indices (all by default); returns (indices, values)."""
    flat = a.reshape(-1)                       # a view: a must be contiguous
    assert np.shares_memory(flat, a)
    if indices is None:
        indices = np.arange(flat.size)
    out = np.empty(len(indices))
    for k, i in enumerate(indices):
        old = flat[i]
        flat[i] = old + EPS
        plus = f()
        flat[i] = old - EPS
        minus = f()
        flat[i] = old
        out[k] = (plus - minus) / (2 * EPS)
    return indices, out


def gelu_direct(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


# ---------------------------------------------------------------- linear


def test_linear_forward_matches_matmul():
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((4, 5)), rng.standard_normal((3, 5)), rng.standard_normal(3)
    y = np.full((4, 3), np.nan)
    linear_forward(x, w, b, y)
    want = np.array([[sum(x[r, i] * w[o, i] for i in range(5)) + b[o] for o in range(3)] for r in range(4)])
    np.testing.assert_allclose(y, want, rtol=1e-13)


@pytest.mark.parametrize("B,I,O", [(4, 5, 3), (1, 1, 1), (7, 2, 9)])
def test_linear_backward_finite_differences(B, I, O):
    rng = np.random.default_rng(B * 100 + I * 10 + O)
    x, w, b = rng.standard_normal((B, I)), rng.standard_normal((O, I)), rng.standard_normal(O)
    r = rng.standard_normal((B, O))            # loss = sum(y * r), so dL/dy = r
    y = np.empty((B, O))

    def loss():
        linear_forward(x, w, b, y)
        return float(np.sum(y * r))

    dy = r.copy()
    dw, db, dx = np.full((O, I), np.nan), np.full(O, np.nan), np.full((B, I), np.nan)
    linear_backward(dy, x, w, dw, db, dx)
    for analytic, param in ((dw, w), (db, b), (dx, x)):
        _, numeric = numeric_grad(loss, param)
        np.testing.assert_allclose(analytic.reshape(-1), numeric, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(dy, r)       # inputs are left alone

    dw2, db2 = np.empty_like(dw), np.empty_like(db)
    linear_backward(dy, x, w, dw2, db2, None)  # the first layer: no input gradient
    np.testing.assert_array_equal(dw2, dw)
    np.testing.assert_array_equal(db2, db)


# ---------------------------------------------------------------- GELU


def gelu_inputs():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 7)) * 2.5
    x[0, :5] = [0.0, -1e-8, 1e-8, 8.0, -8.0]   # around 0 and in both saturated tails
    return x


def test_gelu_forward_matches_formula():
    x = gelu_inputs()
    y, t = np.full_like(x, np.nan), np.full_like(x, np.nan)
    gelu_forward(x, y, t)
    np.testing.assert_allclose(y, gelu_direct(x), rtol=1e-14, atol=1e-300)
    np.testing.assert_allclose(t, np.tanh(GELU_C * (x + GELU_A * x ** 3)), rtol=1e-14, atol=1e-300)
    assert GELU_C == pytest.approx(math.sqrt(2 / math.pi), rel=1e-15) and GELU_A == 0.044715
    # known values of the tanh approximation (PyTorch's GELU(approximate="tanh"))
    pts = np.array([1.0, -1.0, 0.0])
    y1, t1 = np.empty(3), np.empty(3)
    gelu_forward(pts, y1, t1)
    np.testing.assert_allclose(y1, [0.8411919906082768, -0.15880800939172324, 0.0], rtol=1e-12)


def test_gelu_backward_finite_differences():
    x = gelu_inputs()
    rng = np.random.default_rng(2)
    dy = rng.standard_normal(x.shape)
    y, t = np.empty_like(x), np.empty_like(x)
    gelu_forward(x, y, t)
    x_before, dy_before = x.copy(), dy.copy()
    dx = np.full_like(x, np.nan)               # separate from dy and x, as required
    gelu_backward(dy, x, t.copy(), dx)         # tanh_u is consumed: pass a copy
    np.testing.assert_array_equal(x, x_before)
    np.testing.assert_array_equal(dy, dy_before)

    yy, tt = np.empty_like(x), np.empty_like(x)

    def loss():
        gelu_forward(x, yy, tt)
        return float(np.sum(yy * dy))

    _, numeric = numeric_grad(loss, x)
    np.testing.assert_allclose(dx.reshape(-1), numeric, rtol=RTOL, atol=ATOL)


def test_gelu_derivative_closed_form_and_consumes_tanh_u():
    x = gelu_inputs()
    y, t = np.empty_like(x), np.empty_like(x)
    gelu_forward(x, y, t)
    t_saved = t.copy()
    dx = np.empty_like(x)
    gelu_backward(np.ones_like(x), x, t, dx)
    tt = t_saved
    want = 0.5 * (1 + tt) + 0.5 * x * (1 - tt ** 2) * GELU_C * (1 + 3 * GELU_A * x ** 2)
    np.testing.assert_allclose(dx, want, rtol=1e-12, atol=1e-12)   # 1 + t cancels in the tails
    assert dx[0, 0] == 0.5                      # GELU'(0) = 1/2
    # the documented contract: tanh_u is used as scratch, so it no longer holds tanh(u)
    assert not np.array_equal(t, t_saved)


# ---------------------------------------------------------------- softmax cross-entropy


def ce_direct(logits, labels, global_batch):
    m = logits.max(axis=1, keepdims=True)
    log_softmax = logits - m - np.log(np.sum(np.exp(logits - m), axis=1, keepdims=True))
    return -np.sum(log_softmax[np.arange(len(labels)), labels]) / global_batch


def test_softmax_cross_entropy_loss_and_gradient():
    rng = np.random.default_rng(3)
    B, C, G = 5, 7, 12                          # the local rows are part of a global batch of 12
    logits = rng.standard_normal((B, C)) * 3
    labels = rng.integers(0, C, B)
    scratch = np.empty_like(logits)

    def loss():
        return softmax_cross_entropy(logits, labels, G, scratch)[0]

    d = np.full_like(logits, np.nan)
    logits_before = logits.copy()
    loss_part, _ = softmax_cross_entropy(logits, labels, G, d)
    np.testing.assert_array_equal(logits, logits_before)
    assert loss_part == pytest.approx(ce_direct(logits, labels, G), rel=1e-13)
    _, numeric = numeric_grad(loss, logits)
    np.testing.assert_allclose(d.reshape(-1), numeric, rtol=RTOL, atol=ATOL)
    # the closed form (softmax - onehot) / G, and rows that sum to 0
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(B), labels] -= 1
    np.testing.assert_allclose(d, p / G, rtol=1e-12, atol=1e-16)
    np.testing.assert_allclose(d.sum(axis=1), 0, atol=1e-15)


def test_softmax_cross_entropy_divides_by_global_batch():
    """Loss and gradient are divided by the global batch, not the local rows: splitting a batch
    into parts and summing the parts' results gives the whole batch's mean loss and gradient."""
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((6, 4))
    labels = rng.integers(0, 4, 6)
    d_whole = np.empty_like(logits)
    loss_whole, correct_whole = softmax_cross_entropy(logits, labels, 6, d_whole)
    assert loss_whole == pytest.approx(ce_direct(logits, labels, 6), rel=1e-13)
    parts = [slice(0, 2), slice(2, 3), slice(3, 6)]
    loss_sum, correct_sum = 0.0, 0
    for part in parts:
        d_part = np.empty_like(logits[part])
        loss_part, correct = softmax_cross_entropy(logits[part], labels[part], 6, d_part)
        np.testing.assert_allclose(d_part, d_whole[part], rtol=1e-14, atol=1e-17)
        loss_sum += loss_part
        correct_sum += correct
    assert loss_sum == pytest.approx(loss_whole, rel=1e-13)
    assert correct_sum == correct_whole
    # scaling: twice the global batch halves loss and gradient
    d_double = np.empty_like(logits)
    loss_double, _ = softmax_cross_entropy(logits, labels, 12, d_double)
    assert loss_double == pytest.approx(loss_whole / 2, rel=1e-14)
    np.testing.assert_allclose(d_double, d_whole / 2, rtol=1e-14)


def test_softmax_cross_entropy_dlogits_may_alias_logits():
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((8, 5)) * 4
    labels = rng.integers(0, 5, 8)
    d = np.empty_like(logits)
    want = softmax_cross_entropy(logits, labels, 8, d)
    aliased = logits.copy()
    got = softmax_cross_entropy(aliased, labels, 8, aliased)
    np.testing.assert_array_equal(got, want)    # same loss (bitwise) and the same correct count
    np.testing.assert_array_equal(aliased, d)


def test_softmax_cross_entropy_counts_correct():
    logits = np.array([[3.0, 1.0, 0.0],
                       [0.0, 2.0, 1.0],
                       [0.0, 1.0, 5.0],
                       [4.0, 9.0, 1.0],
                       [1.0, 1.5, 0.5]])
    argmax = np.array([0, 1, 2, 1, 1])
    labels = argmax.copy()
    labels[[1, 4]] = [0, 2]                     # two wrong predictions
    for aliased in (False, True):
        z = logits.copy()
        _, correct = softmax_cross_entropy(z, labels, 5, z if aliased else np.empty_like(z))
        assert correct == 3                     # a count held exactly in float64 (beside the loss)
    _, correct = softmax_cross_entropy(logits.copy(), argmax, 5, np.empty_like(logits))
    assert correct == 5


def test_softmax_cross_entropy_with_scratch_allocates_nothing_and_reuses_its_buffers():
    """The training loop's loss writes only into its LossScratch (preallocated for B rows) and the
    dlogits it is given: the same results as fresh buffers, for a batch smaller than B too."""
    rng = np.random.default_rng(7)
    allocated = []

    def alloc(kind, name, shape, dtype):
        allocated.append(name)
        return np.full(shape, 7, dtype)                 # garbage: nothing may depend on it
    scratch = LossScratch(6, 4, np.float64, alloc)
    names = list(allocated)
    for n in (6, 4, 6):
        logits, labels = rng.standard_normal((n, 4)) * 3, rng.integers(0, 4, n)
        want_d = np.empty_like(logits)
        want = softmax_cross_entropy(logits.copy(), labels, 9, want_d, 2.0)
        got_d = logits.copy()
        got = softmax_cross_entropy(got_d, labels, 9, got_d, 2.0, scratch)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got_d, want_d)
        assert got is scratch.totals and allocated == names


def test_softmax_cross_entropy_allocates_no_temporary_of_the_batch_size():
    """Measured: with its scratch, a call on 16 MB of logits allocates under 1% of that."""
    rows, classes = 4096, 1024
    logits = np.random.default_rng(8).standard_normal((rows, classes)).astype(np.float32)
    labels = np.arange(rows) % classes
    scratch = LossScratch(rows, classes, np.float32, lambda kind, name, shape, dtype: np.zeros(shape, dtype))
    softmax_cross_entropy(logits, labels, rows, logits, 1.0, scratch)        # warm NumPy's caches
    tracemalloc.start()
    softmax_cross_entropy(logits, labels, rows, logits, 1.0, scratch)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < logits.nbytes / 100


def test_softmax_cross_entropy_refuses_what_it_would_get_silently_wrong():
    logits, labels = np.zeros((4, 3)), np.array([0, 1, 2, 3])
    with pytest.raises(IndexError, match=r"labels must lie in \[0, 3\)"):
        softmax_cross_entropy(logits, labels, 4, np.empty_like(logits))
    with pytest.raises(ValueError, match="C-contiguous"):
        softmax_cross_entropy(logits, labels % 3, 4, np.zeros((4, 6))[:, :3])


def test_softmax_cross_entropy_stable_for_huge_logits():
    logits = np.array([[1e4, 1e4 - 1.0, 0.0],
                       [-1e4, 1e4, 0.0],
                       [1e4, 1e4, 1e4]])
    labels = np.array([1, 0, 2])
    d = np.empty_like(logits)
    loss, correct = softmax_cross_entropy(logits, labels, 3, d)
    want = [1.0 + math.log1p(math.exp(-1.0)),   # logsumexp - z_label, computed by hand
            2e4,
            math.log(3.0)]
    assert math.isfinite(loss)
    assert loss == pytest.approx(sum(want) / 3, rel=1e-12)
    assert np.all(np.isfinite(d))
    s = 1.0 / (1.0 + math.exp(-1.0))
    np.testing.assert_allclose(d, np.array([[s, -s, 0.0],
                                            [-1.0, 1.0, 0.0],
                                            [1 / 3, 1 / 3, 1 / 3 - 1.0]]) / 3, rtol=1e-12, atol=1e-300)
    assert correct == 0                         # a tie's argmax is the first index (0), not label 2


# ---------------------------------------------------------------- the whole MLP


@pytest.mark.parametrize("sizes", [[5, 37, 53, 7], [3, 4], [2, 1, 3]], ids=lambda s: "-".join(map(str, s)))
def test_mlp_loss_gradient_finite_differences(sizes):
    """The oracle's whole-MLP gradients (tests/proofs/reference.py, written independently of
    zerompi.layers) against finite differences: the equivalence tests compare zerompi with it."""
    rng = np.random.default_rng(len(sizes) * 7 + sizes[0])
    layers = [(w * 3, b * 3) for w, b in initial_weights(sizes, 0, np.float64)]   # livelier GELUs
    n = 6
    x = rng.standard_normal((n, sizes[0]))
    labels = rng.integers(0, sizes[-1], n)
    loss, grads = loss_and_grads(layers, x, labels)
    assert loss == pytest.approx(forward_loss(layers, x, labels), rel=1e-13)

    def f():
        return loss_and_grads(layers, x, labels)[0]

    for (w, b), (dw, db) in zip(layers, grads):
        assert dw.shape == w.shape and db.shape == b.shape
        for param, grad in ((w, dw), (b, db)):
            k = min(param.size, 12)
            indices = rng.choice(param.size, size=k, replace=False)
            _, numeric = numeric_grad(f, param, indices)
            np.testing.assert_allclose(grad.reshape(-1)[indices], numeric, rtol=RTOL, atol=ATOL)
        assert np.any(dw != 0)


def forward_loss(layers, x, labels):
    """The MLP's mean loss written out independently of zerompi.layers."""
    h = x
    for i, (w, b) in enumerate(layers):
        h = h @ w.T + b
        if i < len(layers) - 1:
            h = gelu_direct(h)
    return ce_direct(h, labels, x.shape[0])
