"""--quant-error: how far each step's quantized collectives land from the exact ones.

Beside every quantized call the exact call runs on the same input, under its own purpose
(QUANT_ERROR: the training's purposes, their counts and formulas stay as they are), and each rank
adds up the squared differences and the squared exact values:

    weights   e_w = sqrt( sum ||gathered - exact||^2 / sum ||exact||^2 )   over the step's qwZ gathers
    grads     e_g = sqrt( sum ||reduced - exact||^2 / sum ||exact||^2 )    over its qgZ reductions
                                                                          (each micro-batch's sum)

both summed over every layer and rank: one all-reduce of four numbers per step (step_errors).
Both sides are compared in the compute dtype; in bf16 and fp16 the exact gradient sum is the
exact all-reduce of the 16-bit contributions (widened), and the gathered weights are the 16-bit
values the layers compute with.

What it costs, per step: every quantized call once more exact (an all-gather of the layer's P-byte
words, a reduce-scatter of its compute-dtype values), two passes over each layer, and three
layer-sized work buffers (exact, wide, other). It changes no value the training computes.
"""
import math

import numpy as np

QUANT_ERROR = "quant_error"       # the ledger's purpose of the exact calls beside the quantized ones


class QuantizationError:
    def __init__(self, comm):
        self.comm = comm
        self.sums = [0.0] * 4      # this rank's this step: weights' diff^2, exact^2; grads' diff^2, exact^2
        self.steps = []            # (e_w, e_g) of every step so far (None: not quantized, or not finite)

    def reserve(self, memory, layout, precision, weights):
        """weights: whether qwZ's gathers are measured too (they need the exact gather's buffer)."""
        padded = layout.max_layer_padded
        if weights:
            self.exact = memory.alloc("work", "quantize.error_exact", (padded,), precision.storage)
        self.wide = memory.alloc("work", "quantize.error_wide", (padded,), precision.compute)
        self.other = memory.alloc("work", "quantize.error_other", (padded,), precision.compute)
        self.sum = memory.alloc("work", "quantize.error_square_sum", (1,), precision.compute)
        self.totals = memory.alloc("work", "quantize.error_totals", (4,), "float64")

    def weights(self, shard, gathered):
        """gathered (padded,): qwZ's dequantized layer; shard: this rank's exact piece of it."""
        exact = self.exact[:gathered.size]
        self.comm.allgather(shard, exact, QUANT_ERROR)
        wide, diff = self.wide[:gathered.size], self.other[:gathered.size]
        wide[...], diff[...] = exact, gathered           # both in the compute dtype
        np.subtract(diff, wide, out=diff)
        self._add(0, diff, wide)

    def grads(self, full, reduced):
        """reduced (n,): qgZ's sum of this micro-batch's contributions to this rank's shard (the
        compute dtype); full (N n,): this rank's layer gradient, reduced exactly beside it."""
        wide, exact = self.wide[:full.size], self.other[:reduced.size]
        wide[...] = full
        self.comm.reduce_scatter_sum(wide, exact, QUANT_ERROR)
        diff = self.wide[:reduced.size]                  # wide is used up
        np.subtract(reduced, exact, out=diff)
        self._add(2, diff, exact)

    def _add(self, at, diff, exact):
        """The sums at `at` += ||diff||^2 and ||exact||^2 (both squared in place: ufuncs and a sum,
        which a plan's buffers that hold nothing skip)."""
        for i, x in ((at, diff), (at + 1, exact)):
            np.multiply(x, x, out=x)
            x.sum(keepdims=True, out=self.sum)
            self.sums[i] += float(self.sum[0])

    def step_errors(self):
        """Collective: this step's (e_w, e_g) over every rank, None for what is not quantized or
        not finite (a step whose gradient overflowed); starts the next step's sums."""
        for i, value in enumerate(self.sums):
            self.totals[i] = value
        self.comm.allreduce_sum(self.totals, QUANT_ERROR)
        d_w, e_w, d_g, e_g = (float(x) for x in self.totals)
        self.sums = [0.0] * 4
        self.steps.append(tuple(math.sqrt(d / e) if 0 < e < math.inf and math.isfinite(d) else None
                                for d, e in ((d_w, e_w), (d_g, e_g))))
        return self.steps[-1]
