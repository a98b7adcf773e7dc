"""zerompi.adam.AdamW (chunked, in place, on flat buffers) against a textbook AdamW written here."""
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest

from zerompi.adam import CHUNK, AdamConfig, AdamW
from zerompi.ledger import MemoryLedger
from zerompi.precision import precision_for


@dataclass(frozen=True)
class Hyper:
    """AdamConfig plus the learning rate, which zerompi passes to every update (schedules)."""
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

    def adam_config(self):
        return AdamConfig(self.beta1, self.beta2, self.eps, self.weight_decay)


class Opt:
    """zerompi's AdamW at a fixed learning rate, as the textbook version has it."""

    def __init__(self, numel, dtype, hyper, ledger):
        self.inner = AdamW(numel, precision_for(np.dtype(dtype).name), hyper.adam_config(), ledger)
        self.lr = hyper.lr

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def update(self, param, grad, state_slice, grad_multiplier=1.0):
        self.inner.update(param, grad, state_slice, self.lr, grad_multiplier)

CONFIG = Hyper(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1)
STEPS = 4


def textbook_adamw(p0, grads, c):
    """Loshchilov & Hutter's AdamW with Kingma & Ba's bias correction, the way papers write it."""
    p = p0.astype(np.float64)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        g = g.astype(np.float64)
        p = p - c.lr * c.weight_decay * p
        m = c.beta1 * m + (1 - c.beta1) * g
        v = c.beta2 * v + (1 - c.beta2) * g ** 2
        m_hat = m / (1 - c.beta1 ** t)
        v_hat = v / (1 - c.beta2 ** t)
        p = p - c.lr * m_hat / (np.sqrt(v_hat) + c.eps)
    return p, m, v


def problem(numel, dtype, seed=0, steps=STEPS):
    rng = np.random.default_rng(seed)
    p0 = rng.standard_normal(numel).astype(dtype)
    grads = [(rng.standard_normal(numel) * rng.choice([1e-3, 1.0, 10.0], numel)).astype(dtype)
             for _ in range(steps)]
    return p0, grads


def run_zerompi(p0, grads, config, numel=None):
    ledger = MemoryLedger()
    opt = Opt(p0.size if numel is None else numel, p0.dtype, config, ledger)
    p = p0.copy()
    for g in grads:
        g = g.copy()
        opt.begin_step()
        opt.update(p, g, slice(None))
    return p, opt, ledger


@pytest.mark.parametrize("numel", [1, 7, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 5])
def test_matches_textbook_adamw_float64(numel):
    p0, grads = problem(numel, np.float64, seed=numel)
    p, opt, _ = run_zerompi(p0, grads, CONFIG)
    want_p, want_m, want_v = textbook_adamw(p0, grads, CONFIG)
    assert opt.t == STEPS
    np.testing.assert_allclose(p, want_p, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(opt.m, want_m, rtol=1e-12, atol=1e-18)
    np.testing.assert_allclose(opt.v, want_v, rtol=1e-12, atol=1e-24)
    # the whole buffer moved, the elements after the last full chunk included
    assert np.all(np.abs(p - p0) > 0)


@pytest.mark.parametrize("numel", [7, CHUNK, 2 * CHUNK + 5])
def test_matches_textbook_adamw_float32(numel):
    p0, grads = problem(numel, np.float32, seed=numel + 1)
    p, opt, _ = run_zerompi(p0, grads, CONFIG)
    assert p.dtype == np.float32 and opt.m.dtype == np.float32 and opt.v.dtype == np.float32
    want_p, _, _ = textbook_adamw(p0, grads, CONFIG)
    # each step moves a parameter by at most ~lr; float32 rounds p (|p| <~ 4) to ~5e-7
    np.testing.assert_allclose(p, want_p, rtol=0, atol=2e-6)


def test_bias_correction_and_weight_decay_matter():
    """Sanity of the oracle comparison: the textbook result differs from what a run without bias
    correction or without weight decay would give, by far more than the tolerances above."""
    p0, grads = problem(50, np.float64, seed=3)
    p, _, _ = run_zerompi(p0, grads, CONFIG)
    no_decay, _, _ = textbook_adamw(p0, grads, Hyper(CONFIG.lr, CONFIG.beta1, CONFIG.beta2, CONFIG.eps, 0.0))
    assert np.max(np.abs(p - no_decay)) > 1e-4
    # without bias correction the first step would be ~ (1 - beta1) / sqrt(1 - beta2) ~ 3.16 x smaller
    q = p0.copy()
    opt = Opt(50, np.float64, Hyper(lr=1e-2), MemoryLedger())
    opt.begin_step()
    opt.update(q, grads[0].copy(), slice(None))
    np.testing.assert_allclose(np.abs(q - p0), 1e-2 * np.abs(grads[0]) / (np.abs(grads[0]) + 1e-8), rtol=1e-9)


def test_memory_is_ledgered():
    for numel, dtype in ((10, np.float64), (CHUNK, np.float32), (2 * CHUNK + 5, np.float64)):
        ledger = MemoryLedger()
        opt = Opt(numel, dtype, CONFIG, ledger)
        size = np.dtype(dtype).itemsize
        assert opt.m.shape == opt.v.shape == (numel,)
        assert opt.m.dtype == opt.v.dtype == opt.work.scratch.dtype == np.dtype(dtype)
        assert not np.shares_memory(opt.m, opt.v)
        assert np.all(opt.m == 0) and np.all(opt.v == 0)
        assert ledger.bytes_by_kind["optimizer"] == 2 * numel * size
        assert ledger.bytes_by_kind["work"] == min(numel, CHUNK) * size   # one chunk of scratch
        assert ledger.bytes_by_kind["params"] == ledger.bytes_by_kind["grads"] == 0
        assert ledger.bytes_by_kind["activations"] == 0
        assert sorted((kind, name) for kind, name, *_ in ledger.buffers) == [
            ("optimizer", "adam.m"), ("optimizer", "adam.v"), ("work", "adam.scratch")]
        assert opt.work.scratch.size == min(numel, CHUNK)     # one chunk, not the whole buffer


def test_chunk_loop_sees_every_chunk():
    """A gradient that is nonzero only in the third chunk's tail moves only those elements."""
    numel = 2 * CHUNK + 5
    p0 = np.ones(numel)
    g = np.zeros(numel)
    g[-3:] = [1.0, -2.0, 0.5]
    g[CHUNK - 1] = 4.0                           # the last element of the first chunk
    g[CHUNK] = -4.0                              # the first element of the second chunk
    p, opt, _ = run_zerompi(p0, [g], Hyper(lr=0.1))
    moved = np.flatnonzero(p != 1.0)
    np.testing.assert_array_equal(moved, [CHUNK - 1, CHUNK, numel - 3, numel - 2, numel - 1])
    np.testing.assert_allclose(p[moved], 1.0 - 0.1 * np.sign(g[moved]), rtol=1e-7)


@pytest.mark.parametrize("numel,split", [(11, 4), (2 * CHUNK + 5, CHUNK + 3), (CHUNK + 2, 1)])
def test_state_slices_split_equals_whole(numel, split):
    """Stage 1/2/3 update each layer's owned range with its own slice of m, v: two calls on two
    halves must equal one call on the whole buffer, bitwise (every element is independent)."""
    p0, grads = problem(numel, np.float64, seed=split)
    whole, opt_whole, _ = run_zerompi(p0, grads, CONFIG)

    opt = Opt(numel, np.float64, CONFIG, MemoryLedger())
    p = p0.copy()
    for g in grads:
        g = g.copy()
        opt.begin_step()
        opt.update(p[split:], g[split:], slice(split, numel))     # order does not matter
        opt.update(p[:split], g[:split], slice(0, split))
    np.testing.assert_array_equal(p, whole)
    np.testing.assert_array_equal(opt.m, opt_whole.m)
    np.testing.assert_array_equal(opt.v, opt_whole.v)


def test_state_slice_selects_the_state():
    """Updating one range touches only that range's m and v; the rest stays zero."""
    numel = 20
    opt = Opt(numel, np.float64, CONFIG, MemoryLedger())
    p = np.ones(5)
    g = np.arange(1.0, 6.0)
    opt.begin_step()
    opt.update(p, g, slice(10, 15))
    np.testing.assert_allclose(opt.m[10:15], (1 - CONFIG.beta1) * g, rtol=1e-15)
    np.testing.assert_allclose(opt.v[10:15], (1 - CONFIG.beta2) * g ** 2, rtol=1e-15)
    assert np.all(opt.m[:10] == 0) and np.all(opt.m[15:] == 0)
    assert np.all(opt.v[:10] == 0) and np.all(opt.v[15:] == 0)


def test_first_step_is_lr_times_sign():
    """With wd = 0, after bias correction m_hat = g and v_hat = g^2 at t = 1, so the first update
    is lr * g / (|g| + eps): ~lr * sign(g) whatever the gradient's scale."""
    rng = np.random.default_rng(7)
    g = rng.choice([-1.0, 1.0], 1000) * 10.0 ** rng.uniform(-3, 3, 1000)   # |g| in [1e-3, 1e3]
    lr = 1e-3
    p0 = rng.standard_normal(1000)
    p, _, _ = run_zerompi(p0, [g], Hyper(lr=lr, weight_decay=0.0))
    np.testing.assert_allclose(p0 - p, lr * g / (np.abs(g) + 1e-8), rtol=1e-10)
    np.testing.assert_allclose(p0 - p, lr * np.sign(g), rtol=2e-5)       # eps / |g| <= 1e-5
    # with a large eps the exact form is visible: eps is added after the bias correction of v
    eps = 0.5
    p, _, _ = run_zerompi(p0, [g], Hyper(lr=lr, eps=eps, weight_decay=0.0))
    np.testing.assert_allclose(p0 - p, lr * g / (np.abs(g) + eps), rtol=1e-10)


def test_padding_stays_exactly_zero():
    numel = CHUNK + 9
    rng = np.random.default_rng(8)
    pad = np.zeros(numel, dtype=bool)
    pad[rng.choice(numel, 100, replace=False)] = True
    pad[-5:] = True                               # the layout's padding sits at the end of a layer
    for dtype in (np.float32, np.float64):
        p0 = rng.standard_normal(numel).astype(dtype)
        p0[pad] = 0
        grads = []
        for _ in range(STEPS):
            g = rng.standard_normal(numel).astype(dtype)
            g[pad] = 0
            grads.append(g)
        p, opt, _ = run_zerompi(p0, grads, CONFIG)
        assert np.all(p[pad] == 0) and not np.any(np.signbit(p[pad]))
        assert np.all(opt.m[pad] == 0) and np.all(opt.v[pad] == 0)
        assert np.all(opt.m[~pad] != 0)               # every real element was updated...
        assert np.mean(p[~pad] != p0[~pad]) > 0.999   # ...and moved (float32 rounding can bring
        #                                               the odd one back exactly to where it began)


@pytest.mark.parametrize("storage", [ml_dtypes.bfloat16, np.float16], ids=["bf16", "fp16"])
def test_mixed_precision_updates_the_fp32_master_and_rounds_into_16_bit_params(storage):
    """16-bit params and grads: Adam runs on the fp32 master (the textbook result in fp32) and
    writes round(master) into the params; grad_multiplier unscales the gradient exactly."""
    numel, scale = 2 * CHUNK + 3, 1024.0
    p0, grads = problem(numel, np.float32, seed=3)
    ledger = MemoryLedger()
    opt = Opt(numel, storage, CONFIG, ledger)
    opt.master[:] = p0
    params = p0.astype(storage)
    for g in grads:
        opt.begin_step()
        opt.update(params, (g * scale).astype(storage), slice(None), grad_multiplier=1.0 / scale)
    rounded_grads = [(g * scale).astype(storage).astype(np.float64) / scale for g in grads]
    want_p, want_m, want_v = textbook_adamw(p0, rounded_grads, CONFIG)
    assert opt.master.dtype == np.float32 and opt.m.dtype == np.float32
    # fp32 state against the float64 textbook: float32 rounding of sums of gradients up to 10 * scale
    np.testing.assert_allclose(opt.master, want_p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(opt.m, want_m, rtol=1e-5, atol=1e-6)
    assert params.dtype == storage
    assert np.array_equal(params, opt.master.astype(storage))   # params are the rounded master
    assert ledger.bytes_by_kind["optimizer"] == 3 * 4 * numel    # master, m, v: 12 bytes/param
