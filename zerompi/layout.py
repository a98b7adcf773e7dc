"""Flat buffers, padding and shards: where every parameter lives.

A *layer* (one linear layer: its weight and bias) is the group of tensors that is communicated
together. Each layer is stored in one contiguous flat buffer, padded with zeros to a multiple of
the number of ranks N so that it splits into N equal shards. Rank r owns shard r of every layer:

    layer u, numel = O*I + O, padded = N * ceil(numel / N), shard_size = padded / N

    full layer buffer  |  weight (O, I) row-major  | bias (O,) | pad (zeros) |
                       |<------------------------ padded ------------------->|
    shards             |  rank 0   |  rank 1   |  rank 2   |  ...  | rank N-1 |
                       |<-shard--->|

The whole model is the layers laid end to end (the "full" layout, Psi_pad elements), and the
owned shards of all layers laid end to end (the "shard" layout, Psi_pad / N elements):

    full   | layer 0 (padded_0) | layer 1 (padded_1) | ... |
    shard  | layer 0 shard | layer 1 shard | ... |          (rank r's owned_range of each layer)

Padding elements are zero, have zero gradient, and Adam leaves them at zero (m = v = 0, the
update is 0 / (0 + eps) = 0), so they never change a result. The padding rule is `padded_size`.
With N larger than a layer, most shards of that layer are pure padding: that is allowed.
"""
from dataclasses import dataclass


def bucket_numel(bucket):
    """Elements of a gradient bucket (consecutive layers, contiguous in a full-layout buffer)."""
    return sum(layer.padded for layer in bucket)


def padded_size(numel, num_ranks):
    """Smallest multiple of num_ranks that is >= numel (the one padding rule)."""
    return -(-numel // num_ranks) * num_ranks


@dataclass(frozen=True)
class Layer:
    """One linear layer's place in the flat buffers."""
    index: int
    out_features: int       # O
    in_features: int        # I
    full_offset: int        # where the layer starts in the full layout
    shard_offset: int       # where its shard starts in the shard layout
    numel: int              # O*I + O real elements
    padded: int             # numel rounded up to a multiple of N
    shard_size: int         # padded / N

    def owned_range(self, rank):
        """[lo, hi) of the layer's full buffer that rank owns."""
        return rank * self.shard_size, (rank + 1) * self.shard_size

    def views(self, layer_buffer):
        """(weight (O, I), bias (O,)) views into a layer-sized flat buffer (full, not a shard)."""
        weight_numel = self.out_features * self.in_features
        weight = layer_buffer[:weight_numel].reshape(self.out_features, self.in_features)
        bias = layer_buffer[weight_numel:self.numel]
        return weight, bias


class Layout:
    """The layers of an MLP with widths sizes[0] -> sizes[1] -> ... -> sizes[-1], for N ranks."""

    def __init__(self, sizes, num_ranks):
        self.sizes = list(sizes)
        self.num_ranks = num_ranks
        self.layers = []
        full_offset = shard_offset = 0
        for i, (in_features, out_features) in enumerate(zip(self.sizes[:-1], self.sizes[1:])):
            numel = out_features * in_features + out_features
            padded = padded_size(numel, num_ranks)
            layer = Layer(i, out_features, in_features, full_offset, shard_offset, numel, padded,
                        padded // num_ranks)
            self.layers.append(layer)
            full_offset += padded
            shard_offset += layer.shard_size
        self.num_params = sum(u.numel for u in self.layers)        # Psi
        self.full_numel = full_offset                              # Psi_pad
        self.shard_numel = shard_offset                            # Psi_pad / N
        self.max_layer_padded = max(u.padded for u in self.layers)   # size of a one-layer work buffer

    def full_slice(self, layer):
        """The layer's slice of a full-layout buffer."""
        return slice(layer.full_offset, layer.full_offset + layer.padded)

    def shard_slice(self, layer):
        """The layer's slice of a shard-layout buffer."""
        return slice(layer.shard_offset, layer.shard_offset + layer.shard_size)

    def owned_slice(self, layer, rank):
        """The slice of a full-layout buffer that rank owns within the layer."""
        lo, hi = layer.owned_range(rank)
        return slice(layer.full_offset + lo, layer.full_offset + hi)

    def gradient_buckets(self, itemsize, bucket_mb):
        """Gradient buckets: consecutive layers in backward order (last layer first), grouped so
        that each bucket but the last holds at least bucket_mb MB of gradients of itemsize bytes:
        [[layer 3, layer 2], [layer 1, layer 0]], ... (stages 0-1 start reducing a bucket as soon
        as backward has produced its last layer)."""
        buckets, current, current_bytes = [], [], 0
        for layer in reversed(self.layers):
            current.append(layer)
            current_bytes += layer.padded * itemsize
            if current_bytes >= bucket_mb * 1e6:
                buckets.append(current)
                current, current_bytes = [], 0
        if current:
            buckets.append(current)
        return buckets

    @staticmethod
    def tensor_names(layer):
        """Names of the layer's tensors in consolidated weight files."""
        return f"layers.{layer.index}.weight", f"layers.{layer.index}.bias"
