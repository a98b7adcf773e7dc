"""Flat buffers, padding and shards: where every parameter lives.

A *unit* is the group of tensors that is communicated together; here one linear layer (its weight
and bias). Each unit is stored in one contiguous flat buffer, padded with zeros to a multiple of
the number of ranks N so that it splits into N equal shards. Rank r owns shard r of every unit:

    unit u, numel = O*I + O, padded = N * ceil(numel / N), shard_size = padded / N

    full unit buffer  |  weight (O, I) row-major  | bias (O,) | pad (zeros) |
                      |<------------------------ padded ------------------->|
    shards            |  rank 0   |  rank 1   |  rank 2   |  ...  | rank N-1 |
                      |<-shard--->|

The whole model is the units laid end to end (the "full" layout, Psi_pad elements), and the
owned shards of all units laid end to end (the "shard" layout, Psi_pad / N elements):

    full   | unit 0 (padded_0) | unit 1 (padded_1) | ... |
    shard  | unit 0 shard | unit 1 shard | ... |          (rank r's owned_range of each unit)

Padding elements are zero, have zero gradient, and Adam leaves them at zero (m = v = 0, the
update is 0 / (0 + eps) = 0), so they never change a result. The padding rule is `padded_size`.
With N larger than a unit, most shards of that unit are pure padding: that is allowed.
"""
from dataclasses import dataclass


def padded_size(numel, num_ranks):
    """Smallest multiple of num_ranks that is >= numel (the one padding rule)."""
    return -(-numel // num_ranks) * num_ranks


@dataclass(frozen=True)
class Unit:
    """One linear layer's place in the flat buffers."""
    index: int
    out_features: int       # O
    in_features: int        # I
    full_offset: int        # where the unit starts in the full layout
    shard_offset: int       # where its shard starts in the shard layout
    numel: int              # O*I + O real elements
    padded: int             # numel rounded up to a multiple of N
    shard_size: int         # padded / N

    def owned_range(self, rank):
        """[lo, hi) of the unit's full buffer that rank owns."""
        return rank * self.shard_size, (rank + 1) * self.shard_size

    def views(self, unit_buffer):
        """(weight (O, I), bias (O,)) views into a unit-sized flat buffer (full, not a shard)."""
        weight_numel = self.out_features * self.in_features
        weight = unit_buffer[:weight_numel].reshape(self.out_features, self.in_features)
        bias = unit_buffer[weight_numel:self.numel]
        return weight, bias


class Layout:
    """The units of an MLP with widths sizes[0] -> sizes[1] -> ... -> sizes[-1], for N ranks."""

    def __init__(self, sizes, num_ranks):
        self.sizes = list(sizes)
        self.num_ranks = num_ranks
        self.units = []
        full_offset = shard_offset = 0
        for i, (in_features, out_features) in enumerate(zip(self.sizes[:-1], self.sizes[1:])):
            numel = out_features * in_features + out_features
            padded = padded_size(numel, num_ranks)
            unit = Unit(i, out_features, in_features, full_offset, shard_offset, numel, padded,
                        padded // num_ranks)
            self.units.append(unit)
            full_offset += padded
            shard_offset += unit.shard_size
        self.num_params = sum(u.numel for u in self.units)        # Psi
        self.full_numel = full_offset                              # Psi_pad
        self.shard_numel = shard_offset                            # Psi_pad / N
        self.max_unit_padded = max(u.padded for u in self.units)   # size of a one-unit work buffer

    def full_slice(self, unit):
        """The unit's slice of a full-layout buffer."""
        return slice(unit.full_offset, unit.full_offset + unit.padded)

    def shard_slice(self, unit):
        """The unit's slice of a shard-layout buffer."""
        return slice(unit.shard_offset, unit.shard_offset + unit.shard_size)

    def owned_slice(self, unit, rank):
        """The slice of a full-layout buffer that rank owns within the unit."""
        lo, hi = unit.owned_range(rank)
        return slice(unit.full_offset + lo, unit.full_offset + hi)

    @staticmethod
    def tensor_names(unit):
        """Names of the unit's tensors in consolidated weight files."""
        return f"layers.{unit.index}.weight", f"layers.{unit.index}.bias"
