"""Learning-rate schedules, the fp16 loss scaler, and the precision table."""
import math

import ml_dtypes
import numpy as np
import pytest

from zerompi.train.loop.loss_scale import LossScaler, loss_scale_error
from zerompi.precision import DTYPE_NAMES, precision_for
from zerompi.train.loop.schedule import learning_rate


def test_constant_schedule_with_warmup():
    rates = [learning_rate(s, 100, 0.1, "constant", warmup_steps=4) for s in range(10)]
    assert rates[:4] == pytest.approx([0.025, 0.05, 0.075, 0.1])
    assert rates[4:] == [0.1] * 6


def test_cosine_schedule_goes_from_peak_to_min_lr():
    total, warmup, lr, min_lr = 110, 10, 1e-3, 1e-5
    rates = [learning_rate(s, total, lr, "cosine", warmup, min_lr) for s in range(total)]
    assert rates[warmup - 1] == pytest.approx(lr)                    # end of warm-up: the peak
    assert rates[warmup] == pytest.approx(lr)                        # cosine starts at the peak
    assert rates[warmup + 50] == pytest.approx((lr + min_lr) / 2)    # halfway: the midpoint
    assert all(a >= b for a, b in zip(rates[warmup:], rates[warmup + 1:]))   # non-increasing
    assert rates[-1] == pytest.approx(min_lr + (lr - min_lr) * (1 + math.cos(math.pi * 99 / 100)) / 2)
    assert min(rates[warmup:]) >= min_lr


def test_no_warmup():
    assert learning_rate(0, 10, 0.5, "constant", 0) == 0.5
    assert learning_rate(0, 10, 0.5, "cosine", 0) == pytest.approx(0.5)


def test_loss_scaler_halves_on_overflow_and_doubles_after_a_window():
    scaler = LossScaler(True, initial_scale=1024.0, growth_interval=3, min_scale=1.0)
    assert scaler.update(applied=False) is not None and scaler.scale == 512.0
    assert [scaler.update(True) for _ in range(2)] == [None, None] and scaler.scale == 512.0
    assert "raised" in scaler.update(True) and scaler.scale == 1024.0
    scaler.update(True)
    scaler.update(False)                                  # an overflow resets the run of good steps
    scaler.update(True)
    scaler.update(True)
    assert scaler.scale == 512.0
    assert not scaler.collapsed


def test_loss_scaler_collapses_below_its_floor():
    scaler = LossScaler(True, initial_scale=4.0, growth_interval=100, min_scale=1.0)
    for _ in range(2):
        scaler.update(False)
    assert scaler.scale == 1.0 and not scaler.collapsed
    scaler.update(False)
    assert scaler.collapsed


def test_disabled_scaler_is_one_and_silent():
    scaler = LossScaler(False, initial_scale=1024.0)
    assert scaler.scale == 1.0
    assert scaler.update(False) is None and scaler.scale == 1.0 and not scaler.collapsed


@pytest.mark.parametrize("name, storage, compute, bytes_per_param", [
    ("float64", np.float64, np.float64, (8, 8, 16)),
    ("float32", np.float32, np.float32, (4, 4, 8)),
    ("fp32", np.float32, np.float32, (4, 4, 8)),
    ("bf16", ml_dtypes.bfloat16, np.float32, (2, 2, 12)),
    ("fp16", np.float16, np.float32, (2, 2, 12)),
])
def test_precision_table(name, storage, compute, bytes_per_param):
    precision = precision_for(name)
    assert precision.storage == np.dtype(storage) and precision.compute == np.dtype(compute)
    assert precision.mixed == (np.dtype(storage).itemsize == 2)
    b = precision.bytes_per_param()
    assert (b.param, b.grad, b.optimizer) == bytes_per_param


def test_every_dtype_name_resolves():
    for name in DTYPE_NAMES:
        precision_for(name)
    with pytest.raises(KeyError):
        precision_for("int8")


@pytest.mark.parametrize("initial, floor, keyword", [
    (1e-300, 1e-310, "--loss-scale 1e-300 rounds to 0 in float16"),
    (1.0, 1e-9, "--min-loss-scale 1e-09 rounds to 0 in float16"),
    (2.0, 4.0, "--min-loss-scale 4 is above --loss-scale 2"),
])
def test_a_loss_scale_floor_that_cannot_work_is_refused(initial, floor, keyword):
    """A scale that rounds to 0 in the float16 gradients leaves nothing to unscale (1 / scale
    overflows: NaN weights); a floor above the initial scale stops the run at its first overflow."""
    error = loss_scale_error(True, initial, floor)
    assert error is not None and keyword in error
    assert loss_scale_error(False, initial, floor) is None            # bf16, float32: the scale is 1


def test_the_default_and_the_smallest_loss_scales_are_accepted():
    assert loss_scale_error(True, 2.0 ** 16, 1.0) is None
    smallest = float(np.finfo(np.float16).smallest_subnormal)
    assert loss_scale_error(True, smallest, smallest) is None
