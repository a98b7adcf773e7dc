"""The initial values on their own (zerompi/model.py's init_layer_chunks): the oracle takes its
initial weights from zerompi, so no equivalence test could see a wrong initialization (drawn with
1/sqrt(out_features) instead of 1/sqrt(in_features), every test passed)."""
import numpy as np
import pytest

from zerompi.layout import Layout
from zerompi.model import INIT_CHUNK, init_layer_chunks, init_layer_values


@pytest.mark.parametrize("sizes", [(300, 7, 40), (7, 300, 5)])
def test_each_layer_is_uniform_in_plus_minus_one_over_sqrt_of_its_fan_in(sizes):
    for layer in Layout(list(sizes), 1).layers:
        values = init_layer_values(layer, seed=0)
        assert values.shape == (layer.numel,) and values.dtype == np.float64
        bound = 1.0 / np.sqrt(layer.in_features)
        assert np.abs(values).max() <= bound
        assert np.abs(values).max() > 0.95 * bound                  # the whole range is used
        mean, variance = values.mean(), values.var()                # uniform(-b, b): mean 0, variance b^2 / 3
        assert abs(mean) < 4 * bound / np.sqrt(3 * values.size)
        assert variance == pytest.approx(bound ** 2 / 3, rel=8 / np.sqrt(values.size))
        bias = values[layer.out_features * layer.in_features:]      # after the weight, (out, in) row-major
        assert bias.size == layer.out_features and np.abs(bias).max() > 0.5 * bound   # drawn, not zeros


def test_the_values_depend_on_the_seed_and_the_layer_only_and_come_in_chunks():
    layout = Layout([64, 128, 10], 4)
    first, second = layout.layers
    assert np.array_equal(init_layer_values(first, 0), init_layer_values(first, 0))
    assert not np.array_equal(init_layer_values(first, 0), init_layer_values(first, 1))
    assert init_layer_values(first, 0)[:5].tolist() != init_layer_values(second, 0)[:5].tolist()
    assert np.array_equal(init_layer_values(first, 3), init_layer_values(Layout([64, 128, 10], 1).layers[0], 3))
    big = Layout([2048, 1024], 1).layers[0]                          # 2.1 M elements: three chunks
    chunks = list(init_layer_chunks(big, 0))
    assert [start for start, _ in chunks] == [0, INIT_CHUNK, 2 * INIT_CHUNK]
    assert sum(values.size for _, values in chunks) == big.numel
