"""The MLP: sizes[0] -> sizes[1] -> ... -> sizes[-1], GELU after every linear layer but the last.

The MLP object owns only activations; the parameters and gradients belong to the ZeRO stage and
are passed in explicitly, one layer (linear layer) at a time. Activation buffers are allocated once
for a local batch of up to B rows (ledgered as "activations"); a smaller batch uses their first
rows. For layer i with input width I and output width O:

    forward                                  backward (d* are gradients of the loss)
    x_i    (B, I)  input (x_0 = data)        d_pre_i (B, O) = GELU'(pre_i) * d_x_{i+1}
    pre_i  (B, O)  = x_i W_i^T + b_i         dW_i, db_i     = from d_pre_i and x_i
    x_{i+1}(B, O)  = GELU(pre_i)             d_x_i   (B, I) = d_pre_i W_i
    (last layer: pre_i are the logits, and the loss writes d_logits over them in place)

Mixed precision (zerompi/precision.py): the stage hands out 16-bit weights and gradient views,
and the device decides how the matrix multiplies read them (shapes as above):

    CPU: NumPy (no fast 16-bit matmul)          GPU: the device's gemm (zerompi/devices/gemm.py)
    weight, bias widened into param_work        16-bit weight and bias read as they are
      (float32, one layer) on every use
    x_i, d_pre_i float32                        x_i, d_pre_i 16-bit: the tensor cores' operands,
                                                  rounded once by the kernel that writes them
                                                  (GELU forward, GELU backward; d_logits by a copy)
    pre_i, tanh, d_x_i float32                  pre_i, tanh, d_x_i float32: the GEMMs write
                                                  float32, so the GELUs and the loss read float32
    dW, db computed into grad_work (float32,    dW, db accumulated in float32 inside the GEMM
      one layer), then rounded into the 16-bit     and rounded once into the 16-bit views;
      views, or (micro-batch 2..K) added          micro-batches 2..K add to them in float32
      to them and rounded again                   inside the GEMM (beta = 1), rounded again

`grad_work` also serves NumPy's gradient accumulation in full precision (numpy's matmul cannot
add into its output: compute, then add), and widens 16-bit gradients for their sum of squares
(zerompi/step.py); on a GPU the GEMM adds, and a gradient's sum of squares is the 1 x 1
GEMM g g^T (16-bit read, float32 accumulated), so it has none. In full precision on a GPU the
same GEMMs run on float32 or float64 operands (no TF32).

Parameters start as in torch.nn.Linear: W, b ~ U(-1/sqrt(I), 1/sqrt(I)), drawn per layer from
numpy's generator seeded with (seed, layer index), so they do not depend on N or the stage.
"""
import numpy as np

from .layers import (LossScratch, softmax_cross_entropy, gelu_backward, gelu_forward, linear_backward, linear_backward_gemm,
                     linear_forward)


def init_layer_values(layer, seed):
    """The layer's initial real elements (numel,) float64: weight row-major, then bias."""
    rng = np.random.default_rng([seed, layer.index])
    bound = 1.0 / np.sqrt(layer.in_features)
    return rng.uniform(-bound, bound, layer.numel)


class MLP:
    def __init__(self, layout, batch_rows, precision, memory, micro_batches=1):
        self.layers = layout.layers
        self.last = len(self.layers) - 1
        self.gemm = memory.device.gemm               # None: NumPy's matmul
        alloc = memory.alloc
        B, dtype = batch_rows, precision.compute
        operand = precision.storage if self.gemm else dtype        # what the matrix multiplies read
        self.x = [alloc("activations", f"x{u.index}", (B, u.in_features), operand) for u in self.layers]
        self.pre = [alloc("activations", f"pre{u.index}", (B, u.out_features), dtype) for u in self.layers]
        hidden = self.layers[:-1]
        self.tanh_u = [alloc("activations", f"tanh{u.index}", (B, u.out_features), dtype) for u in hidden]
        self.d_pre = [alloc("activations", f"d_pre{u.index}", (B, u.out_features), operand) for u in hidden]
        self.d_x = [None] + [alloc("activations", f"d_x{u.index}", (B, u.in_features), dtype)
                             for u in self.layers[1:]]
        self.d_logits = (alloc("activations", "d_logits", (B, self.layers[-1].out_features), operand)
                         if operand != dtype else None)          # the loss's float32 gradient, rounded
        self.loss_scratch = LossScratch(B, self.layers[-1].out_features, dtype, alloc)
        self.step_totals = alloc("activations", "step_totals", (2,), np.float64)   # (train_step.py)
        self.ones = self.square_sum = None
        if self.gemm:
            self.ones = alloc("work", "mlp.ones", (B,), operand)             # db = 1^T d_pre by GEMM
            self.ones[...] = 1
            self.square_sum = alloc("work", "mlp.square_sum", (1, 1), dtype)  # g g^T (train_step.py)
        self.param_work = (alloc("work", "mlp.param_work", (layout.max_layer_padded,), dtype)
                           if precision.mixed and not self.gemm else None)
        self.grad_work = (alloc("work", "mlp.grad_work", (layout.max_layer_padded,), dtype)
                          if (precision.mixed or micro_batches > 1) and not self.gemm else None)

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

    def compute_params(self, layer, weight, bias):
        """(weight, bias) as the matrix multiplies read them: as given, or widened into param_work."""
        if self.param_work is None:                  # stored = compute dtype, or the GEMM reads 16 bits
            return weight, bias
        wide_weight, wide_bias = layer.views(self.param_work[:layer.padded])
        wide_weight[...] = weight
        wide_bias[...] = bias
        return wide_weight, wide_bias

    def forward_layer(self, layer, x, weight, bias):
        """x (n, I) -> the layer's output (n, O): GELU(pre) for hidden layers, the logits for the last."""
        n, i = x.shape[0], layer.index
        weight, bias = self.compute_params(layer, weight, bias)
        pre = self.pre[i][:n]
        if i == self.last:
            linear_forward(x, weight, bias, pre, self.gemm)
            return pre
        linear_forward(x, weight, None, pre, self.gemm)          # the bias is added by ...
        out = self.x[i + 1][:n]
        gelu_forward(pre, out, self.tanh_u[i][:n], bias)         # ... GELU: one kernel on a GPU
        return out

    def backward_layer(self, layer, d_out, weight, bias, dweight, dbias, accumulate):
        """d_out (n, O), the gradient of the layer's output -> writes (or, with accumulate, adds
        to) dweight, dbias; returns the gradient of its input (n, I), or None for the first layer."""
        n, i = d_out.shape[0], layer.index
        if i == self.last:
            d_pre = d_out                            # the loss already gave d_logits
            if self.d_logits is not None:            # rounded to 16 bits for the GEMMs
                d_pre = self.d_logits[:n]
                d_pre[...] = d_out
        else:
            d_pre = self.d_pre[i][:n]
            gelu_backward(d_out, self.pre[i][:n], self.tanh_u[i][:n], d_pre)
        d_x = None if i == 0 else self.d_x[i][:n]
        if self.gemm:                                # adds into, and rounds into, dweight and dbias
            linear_backward_gemm(self.gemm, d_pre, self.x[i][:n], weight, self.ones, dweight, dbias,
                                 d_x, accumulate)
            return d_x
        weight, _ = self.compute_params(layer, weight, bias)
        if self.param_work is None and not accumulate:   # full precision, first micro-batch
            linear_backward(d_pre, self.x[i][:n], weight, dweight, dbias, d_x)   # straight into place
            return d_x
        work_dweight, work_dbias = layer.views(self.grad_work[:layer.padded])
        linear_backward(d_pre, self.x[i][:n], weight, work_dweight, work_dbias, d_x)
        if accumulate:
            dweight += work_dweight                  # next micro-batch: add
            dbias += work_dbias
        else:
            dweight[...] = work_dweight              # round into 16-bit storage
            dbias[...] = work_dbias
        return d_x
