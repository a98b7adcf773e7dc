"""zerompi.layout: padding, shards and offsets of the flat buffers."""
import numpy as np
import pytest

from zerompi.layout import Layout, padded_size

SIZES = [[5, 37, 53, 7], [3, 4], [1, 1], [2, 3, 1], [64, 32, 10], [13, 1, 13]]
RANKS = list(range(1, 10)) + [16, 61, 500]            # 500 > every layer of most SIZES


def test_padded_size_cases():
    assert padded_size(12, 4) == 12                   # exact fit
    assert padded_size(13, 4) == 16
    assert padded_size(15, 4) == 16
    assert padded_size(16, 4) == 16
    assert padded_size(3, 8) == 8                     # numel < N: one element per shard at least
    assert padded_size(1, 500) == 500
    assert padded_size(7, 1) == 7                     # N = 1: no padding
    assert padded_size(1, 1) == 1
    assert padded_size(0, 3) == 0


def test_padded_size_is_the_smallest_multiple():
    for n in range(1, 12):
        for numel in range(1, 60):
            p = padded_size(numel, n)
            assert p % n == 0 and numel <= p < numel + n, (numel, n)


def expected_numels(sizes):
    return [o * i + o for i, o in zip(sizes[:-1], sizes[1:])]


@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "-".join(map(str, s)))
def test_layers_and_totals(sizes):
    for n in RANKS:
        layout = Layout(sizes, n)
        numels = expected_numels(sizes)
        assert layout.num_ranks == n and layout.sizes == sizes
        assert [u.index for u in layout.layers] == list(range(len(sizes) - 1))
        assert [(u.in_features, u.out_features) for u in layout.layers] == list(zip(sizes[:-1], sizes[1:]))
        assert [u.numel for u in layout.layers] == numels
        assert [u.padded for u in layout.layers] == [padded_size(k, n) for k in numels]
        for u in layout.layers:
            assert u.shard_size * n == u.padded
            assert u.shard_size >= 1
        assert layout.num_params == sum(numels)
        assert layout.full_numel == sum(u.padded for u in layout.layers)
        assert layout.shard_numel * n == layout.full_numel
        assert layout.shard_numel == sum(u.shard_size for u in layout.layers)
        assert layout.max_layer_padded == max(u.padded for u in layout.layers)
        if n == 1:
            assert layout.full_numel == layout.shard_numel == layout.num_params


@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "-".join(map(str, s)))
def test_offsets_are_contiguous(sizes):
    for n in RANKS:
        layout = Layout(sizes, n)
        full = shard = 0
        for u in layout.layers:
            assert u.full_offset == full and u.shard_offset == shard
            assert layout.full_slice(u) == slice(full, full + u.padded)
            assert layout.shard_slice(u) == slice(shard, shard + u.shard_size)
            full += u.padded
            shard += u.shard_size
        assert full == layout.full_numel and shard == layout.shard_numel


@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "-".join(map(str, s)))
def test_shards_cover_each_layer_exactly_once(sizes):
    for n in RANKS:
        layout = Layout(sizes, n)
        for u in layout.layers:
            covered = np.zeros(u.padded, dtype=int)
            previous_hi = 0
            for r in range(n):
                lo, hi = u.owned_range(r)
                assert lo == previous_hi and hi - lo == u.shard_size     # in rank order, equal sizes
                covered[lo:hi] += 1
                previous_hi = hi
            assert previous_hi == u.padded
            assert np.all(covered == 1)


@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "-".join(map(str, s)))
def test_owned_and_shard_slices_agree(sizes):
    """Scattering a full-layout buffer into N shard-layout buffers (rank r takes owned_slice(u, r)
    into shard_slice(u)) and gathering them back gives the buffer again: what the collectives do."""
    for n in (1, 2, 3, 7, 61):
        layout = Layout(sizes, n)
        full = np.arange(layout.full_numel, dtype=np.int64)
        shards = np.full((n, layout.shard_numel), -1, dtype=np.int64)
        for r in range(n):
            for u in layout.layers:
                owned = layout.owned_slice(u, r)
                lo, hi = u.owned_range(r)
                assert owned == slice(u.full_offset + lo, u.full_offset + hi)
                shards[r, layout.shard_slice(u)] = full[owned]
        assert np.all(shards >= 0)                     # every shard element was written
        rebuilt = np.empty_like(full)
        for u in layout.layers:
            # the layer's full buffer is the ranks' shards of it, concatenated in rank order
            rebuilt[layout.full_slice(u)] = shards[:, layout.shard_slice(u)].reshape(-1)
        np.testing.assert_array_equal(rebuilt, full)


@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "-".join(map(str, s)))
def test_views_shapes_order_and_aliasing(sizes):
    for n in (1, 4, 9, 500):
        layout = Layout(sizes, n)
        full = np.zeros(layout.full_numel)
        for u in layout.layers:
            layer_buf = full[layout.full_slice(u)]
            layer_buf[:] = np.arange(u.padded)
            weight, bias = u.views(layer_buf)
            assert weight.shape == (u.out_features, u.in_features)
            assert bias.shape == (u.out_features,)
            # weight row-major first, then bias, then the padding
            np.testing.assert_array_equal(weight, np.arange(u.out_features * u.in_features)
                                          .reshape(u.out_features, u.in_features))
            np.testing.assert_array_equal(bias, np.arange(u.out_features * u.in_features, u.numel))
            assert np.shares_memory(weight, full) and np.shares_memory(bias, full)
            assert not np.shares_memory(weight, bias)
            # writing through the views changes the flat buffer, and nothing past numel
            base = u.full_offset
            weight[-1, -1] = -1.0
            assert full[base + u.out_features * u.in_features - 1] == -1.0
            bias[0] = -2.0
            assert full[base + u.out_features * u.in_features] == -2.0
            bias[-1] = -3.0
            assert full[base + u.numel - 1] == -3.0
            np.testing.assert_array_equal(full[base + u.numel:base + u.padded], np.arange(u.numel, u.padded))
            assert np.count_nonzero(full[layout.full_slice(u)] < 0) == (3 if u.out_features > 1 else 2)
        # layers do not overlap: every layer's views write into its own slice only
        assert np.count_nonzero(full < 0) == sum(3 if u.out_features > 1 else 2 for u in layout.layers)


def test_tensor_names():
    layout = Layout([5, 37, 53, 7], 3)
    assert [Layout.tensor_names(u) for u in layout.layers] == [
        ("layers.0.weight", "layers.0.bias"), ("layers.1.weight", "layers.1.bias"),
        ("layers.2.weight", "layers.2.bias")]


def test_worked_example():
    """[5, 37, 53, 7] over N = 4, by hand: numels 222, 2014, 378 -> padded 224, 2016, 380."""
    layout = Layout([5, 37, 53, 7], 4)
    assert [u.numel for u in layout.layers] == [222, 2014, 378]
    assert [u.padded for u in layout.layers] == [224, 2016, 380]
    assert [u.shard_size for u in layout.layers] == [56, 504, 95]
    assert [u.full_offset for u in layout.layers] == [0, 224, 2240]
    assert [u.shard_offset for u in layout.layers] == [0, 56, 560]
    assert (layout.full_numel, layout.shard_numel, layout.num_params) == (2620, 655, 2614)
    assert layout.max_layer_padded == 2016
    assert layout.layers[1].owned_range(3) == (1512, 2016)
    assert layout.owned_slice(layout.layers[1], 3) == slice(1736, 2240)
    # N larger than a layer: [1, 1] has 2 elements; over 5 ranks, ranks 2..4 own only padding
    tiny = Layout([1, 1], 5).layers[0]
    assert (tiny.numel, tiny.padded, tiny.shard_size) == (2, 5, 1)
    assert [tiny.owned_range(r) for r in range(5)] == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
