"""The MLP: sizes[0] -> sizes[1] -> ... -> sizes[-1], GELU after every linear layer but the last.

The MLP object owns only activations; the parameters and gradients belong to the ZeRO stage and
are passed in explicitly, one layer at a time. Activation buffers are allocated once
for a local batch of up to B rows (ledgered as "activations"); a smaller batch uses their first
rows. For layer i with input width I and output width O:

    forward                                  backward (d* are gradients of the loss)
    x_i    (B, I)  input (x_0 = data)        d_pre_i (B, O) = GELU'(pre_i) * d_x_{i+1}
    pre_i  (B, O)  = x_i W_i^T + b_i         dW_i, db_i     = from d_pre_i and x_i
    x_{i+1}(B, O)  = GELU(pre_i)             d_x_i   (B, I) = d_pre_i W_i
    (last layer: pre_i are the logits, and the loss writes d_logits over them in place)

The arithmetic is the device's (zerompi/devices/): on the CPU the NumPy functions of
zerompi/layers.py, on a GPU cuBLAS GEMMs and fused kernels with the same math. The device also
decides what the matrix multiplies read (`operand_dtype`): in mixed precision (zerompi/precision.py)
the stage hands out 16-bit weights and gradient views, and

    CPU: NumPy (no fast 16-bit matmul)          GPU: cuBLAS GEMMs on tensor cores
    weight, bias widened (float32, one layer)   16-bit weight and bias read as they are
    x_i, d_pre_i float32                        x_i, d_pre_i 16-bit, rounded once by the kernel
                                                  that writes them (d_logits by a copy, below)
    pre_i, tanh, d_x_i float32                  pre_i, tanh, d_x_i float32 (the GEMMs write float32)
    dW, db computed in float32, then rounded    dW, db accumulated in float32 inside the GEMM
      into the 16-bit views (or added to them)    and rounded once into the 16-bit views

The device's one-layer work buffers for this (`work`, ledgered as "work") are allocated by the
device and kept here (zerompi/cpu.py and zerompi/devices/gpu.py say what each holds).

Parameters start as in torch.nn.Linear: W, b ~ U(-1/sqrt(I), 1/sqrt(I)), drawn per layer from
numpy's generator seeded with (seed, layer index), so they do not depend on N or the stage.
"""
import numpy as np

from .layers import LossScratch, softmax_cross_entropy


INIT_CHUNK = 1 << 20      # initial values are drawn this many at a time: a run's start holds a chunk, not a layer


def init_layer_chunks(layer, seed):
    """The layer's initial real elements (weight row-major, then bias), uniform in +-1/sqrt(in),
    in chunks: (start, values (at most INIT_CHUNK,) float64), one random stream per layer."""
    rng = np.random.default_rng([seed, layer.index])
    bound = 1.0 / np.sqrt(layer.in_features)
    for start in range(0, layer.numel, INIT_CHUNK):
        yield start, rng.uniform(-bound, bound, min(INIT_CHUNK, layer.numel - start))


def init_layer_values(layer, seed):
    """The layer's initial real elements (numel,) float64: its chunks, one after the other."""
    return np.concatenate([values for _, values in init_layer_chunks(layer, seed)])


class MLP:
    def __init__(self, layout, batch_rows, precision, memory, micro_batches=1):
        self.layers = layout.layers
        self.last = len(self.layers) - 1
        self.device = memory.device                  # where the buffers live and the layers compute
        alloc = memory.alloc
        B, dtype = batch_rows, precision.compute
        operand = self.device.operand_dtype(precision)              # what the matrix multiplies read
        self.x = [alloc("activations", f"x{u.index}", (B, u.in_features), operand) for u in self.layers]
        self.pre = [alloc("activations", f"pre{u.index}", (B, u.out_features), dtype) for u in self.layers]
        hidden = self.layers[:-1]
        self.tanh_u = [alloc("activations", f"tanh{u.index}", (B, u.out_features), dtype) for u in hidden]
        self.d_pre = [alloc("activations", f"d_pre{u.index}", (B, u.out_features), operand) for u in hidden]
        self.d_x = [None] + [alloc("activations", f"d_x{u.index}", (B, u.in_features), dtype)
                             for u in self.layers[1:]]
        self.d_logits = (alloc("activations", "d_logits", (B, self.layers[-1].out_features), operand)
                         if operand != dtype else None)          # the loss's float32 gradient, rounded
        self.loss_scratch = LossScratch(B, self.layers[-1].out_features, dtype, alloc, self.device)
        self.step_totals = alloc("activations", "step_totals", (2,), np.float64)   # (zerompi/step.py)
        self.work = self.device.linear_work(alloc, layout.max_layer_padded, B, precision, micro_batches)

    def loss(self, logits, labels, global_batch, loss_scale):
        """Softmax cross-entropy (zerompi/layers.py) of logits (n, C), with d_logits written over them
        in place; returns (2,) float64 (this rank's part of the mean loss, its correct count),
        in the loss scratch."""
        return softmax_cross_entropy(logits, labels, global_batch, logits, loss_scale, self.loss_scratch)

    def load_input(self, x):
        """Copy a batch x (n, sizes[0]) into the first input buffer; returns the view used."""
        n = x.shape[0]
        self.x[0][:n] = x
        return self.x[0][:n]

    def forward_layer(self, layer, x, weight, bias):
        """x (n, I) -> the layer's output (n, O): GELU(pre) for hidden layers, the logits for the last."""
        n, i = x.shape[0], layer.index
        pre = self.pre[i][:n]
        if i == self.last:
            self.device.linear_forward(x, weight, bias, pre, self.work)            # pre = x W^T + b
            return pre
        out = self.x[i + 1][:n]
        self.device.linear_gelu_forward(x, weight, bias, pre, out, self.tanh_u[i][:n], self.work)
        return out                                                                 # GELU(x W^T + b)

    def backward_layer(self, layer, d_out, weight, bias, dweight, dbias, accumulate):
        """d_out (n, O), the gradient of the layer's output -> writes (or, with accumulate, adds
        to) dweight, dbias; returns the gradient of its input (n, I), or None for the first layer."""
        n, i = d_out.shape[0], layer.index
        if i == self.last:
            d_pre = d_out                            # the loss already gave d_logits
            if self.d_logits is not None:            # rounded to the matrix multiplies' 16 bits
                d_pre = self.d_logits[:n]
                d_pre[...] = d_out
        else:
            d_pre = self.d_pre[i][:n]
            self.device.gelu_backward(d_out, self.pre[i][:n], self.tanh_u[i][:n], d_pre)
        d_x = None if i == 0 else self.d_x[i][:n]
        self.device.linear_backward(d_pre, self.x[i][:n], weight, dweight, dbias, d_x, accumulate, self.work)
        return d_x
