"""The test oracle: plain single-process AdamW on the whole global batch, in float64.

It shares no arithmetic with what it checks. From zerompi it takes only the plumbing that makes the
two runs start from the same place: the layer shapes (`zerompi.layout.Layout`) and the initial
values (`zerompi.model.init_layer_values`). Everything else is written out here, once, in float64,
the textbook way (no flat buffers, no shards, no MPI, no micro-batches, no in-place tricks):

    forward, per layer:   z = h W^T + b;  h' = GELU(z) (tanh form) after every layer but the last
    loss:                 mean over the n rows of -log softmax(z)[label]
    backward:             dz = (softmax(z) - onehot(label)) / n at the logits; then per layer
                          dW = dz^T h,  db = sum_rows(dz),  dh = dz W,  dz = dh * GELU'(z)
    AdamW:                p = p (1 - lr wd); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
                          p = p - lr m_hat / (sqrt(v_hat) + eps)

so that a wrong formula in zerompi.layers, zerompi.adam or zerompi.step (a dropped bias gradient, a
wrong GELU derivative, a gradient scaled wrongly) makes zerompi differ from it. Its own gradients
are checked against finite differences (tests/proofs/test_layers_match_finite_differences.py).

Mixed precision (storage = float16 or bfloat16) is done the textbook way too: a float64 master copy;
16-bit parameters rounded from it; forward and backward in float64 from the 16-bit parameters; the
whole batch's gradient rounded to 16 bits once; Adam on the master in float64.
"""
import math

import numpy as np

from zerompi.layout import Layout                   # plumbing only: the layer shapes
from zerompi.model import init_layer_values         # plumbing only: the same initial values

GELU_SCALE = math.sqrt(2.0 / math.pi)              # GELU(z) = z/2 (1 + tanh(GELU_SCALE (z + GELU_CUBIC z^3)))
GELU_CUBIC = 0.044715


def initial_weights(sizes, seed, dtype=np.float64):
    """[(weight (O, I), bias (O,)), ...] exactly as zerompi initializes them."""
    layers = []
    for layer in Layout(sizes, 1).layers:
        values = init_layer_values(layer, seed).astype(dtype)
        out, inp = layer.out_features, layer.in_features
        layers.append((values[:out * inp].reshape(out, inp).copy(), values[out * inp:].copy()))
    return layers


def gelu(z):
    """GELU(z) in the tanh form, and tanh(u) for its derivative."""
    t = np.tanh(GELU_SCALE * (z + GELU_CUBIC * z ** 3))
    return 0.5 * z * (1.0 + t), t


def gelu_derivative(z, t):
    """d GELU / dz = (1 + t)/2 + z/2 (1 - t^2) GELU_SCALE (1 + 3 GELU_CUBIC z^2), t = tanh(u)."""
    return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * GELU_SCALE * (1.0 + 3.0 * GELU_CUBIC * z * z)


def loss_and_grads(layers, x, labels):
    """Mean softmax cross-entropy over all rows, and [(dW, db), ...], all in float64 (whatever the
    dtype of layers and x)."""
    layers = [(np.asarray(w, np.float64), np.asarray(b, np.float64)) for w, b in layers]
    h = np.asarray(x, np.float64)
    n, rows = h.shape[0], np.arange(h.shape[0])
    inputs, pres, tanhs = [], [], []
    for i, (w, b) in enumerate(layers):
        inputs.append(h)
        z = h @ w.T + b
        pres.append(z)
        if i < len(layers) - 1:
            h, t = gelu(z)
            tanhs.append(t)
    logits = pres[-1]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -log_softmax[rows, labels].sum() / n
    dz = np.exp(log_softmax)
    dz[rows, labels] -= 1.0
    dz /= n
    grads = [None] * len(layers)
    for i in reversed(range(len(layers))):
        w = layers[i][0]
        if i < len(layers) - 1:
            dz = dz * gelu_derivative(pres[i], tanhs[i])
        grads[i] = (dz.T @ inputs[i], dz.sum(axis=0))
        dz = dz @ w
    return float(loss), grads


def global_norm(grads):
    return float(np.sqrt(sum(np.sum(np.asarray(g, np.float64) ** 2) for layer in grads for g in layer)))


def adamw_train(layers, batches, lr, weight_decay, beta1=0.9, beta2=0.999, eps=1e-8, storage=None,
                clip_norm=0.0, seen=None, reduced=None):
    """Run AdamW over [(x, labels), ...] global batches, in float64. storage: None for full
    precision, or a 16-bit dtype for mixed precision (parameters and the whole batch's gradient
    rounded to it). seen: None, or what forward and backward see of the parameters, a function of
    them ([weight 0, bias 0, weight 1, ...] -> the same; qwZ's gathered values). reduced: None, or
    the gradient as a function (layers, x, labels, stored) -> [dweight 0, dbias 0, ...] (qgZ's
    reduction: reduced_through_blocks). Returns (layers in
    the storage dtype, or the given layers' dtype when storage is None; losses; gradient norms
    before clipping)."""
    out_dtype = layers[0][0].dtype if storage is None else np.dtype(storage)
    master = [np.array(p, np.float64) for layer in layers for p in layer]
    m = [np.zeros_like(p) for p in master]
    v = [np.zeros_like(p) for p in master]
    stored = (lambda p: p) if storage is None else (lambda p: p.astype(storage).astype(np.float64))
    losses, norms = [], []
    for t, (x, labels) in enumerate(batches, start=1):
        params = [stored(p) for p in master]                        # what forward sees
        if seen is not None:
            params = [stored(p) for p in seen(params)]
        seen_layers = [(params[2 * i], params[2 * i + 1]) for i in range(len(layers))]
        loss, grads = loss_and_grads(seen_layers, x, labels)
        flat_grads = [stored(g) for layer in grads for g in layer]
        if reduced is not None:
            flat_grads = reduced(seen_layers, x, labels, stored)
        losses.append(loss)
        norm = global_norm([flat_grads])
        norms.append(norm)
        clip = min(1.0, clip_norm / (norm + 1e-6)) if clip_norm > 0 else 1.0
        for p, g, m_p, v_p in zip(master, flat_grads, m, v):
            g = g * clip
            p *= 1 - lr * weight_decay
            m_p[...] = beta1 * m_p + (1 - beta1) * g
            v_p[...] = beta2 * v_p + (1 - beta2) * g * g
            m_hat = m_p / (1 - beta1 ** t)
            v_hat = v_p / (1 - beta2 ** t)
            p -= lr * m_hat / (np.sqrt(v_hat) + eps)
    final = [p.astype(out_dtype) for p in master]
    return [(final[2 * i], final[2 * i + 1]) for i in range(len(layers))], losses, norms


def block_round_trip(x, bits, block):
    """ZeRO++'s quantize-then-dequantize of x (n,), as docs/quantization.md writes it, a block at a
    time in float32: s = max(max|x| / Q, 2^-126), q = clip(rint(x / s), -Q, Q), x^ = q s, Q = 2^(bits-1) - 1.
    Returns (x^ (n,) float32, the levels q (n,), the scales (ceil(n / block),))."""
    levels_each_side = np.float32(2 ** (bits - 1) - 1)
    x = np.asarray(x).astype(np.float32)
    out, levels, scales = [], [], []
    for start in range(0, x.size, block):
        values = x[start:start + block]
        scale = max(np.float32(np.max(np.abs(values))) / levels_each_side, np.float32(2.0 ** -126))
        q = np.clip(np.rint(values / scale), -levels_each_side, levels_each_side)
        out.append(q * scale)
        levels.append(q)
        scales.append(scale)
    return np.concatenate(out), np.concatenate(levels), np.array(scales, np.float32)


def through_blocks(params, num_ranks, bits, block):
    """What ZeRO++ sends of a model's tensors, as the reference sees it: each layer's weight and bias
    (or their gradients), laid end to end, padded with zeros to a multiple of N, cut into N equal
    shards, and each shard through block_round_trip; [weight 0, bias 0, ...] -> the same, in float64.
    qwZ's all-gather of the parameters; each rank's contribution to qgZ's reduction."""
    seen = []
    for weight, bias in zip(params[::2], params[1::2]):
        flat = np.concatenate([weight.ravel(), bias])
        n = -(-flat.size // num_ranks)                              # the shard
        flat = np.concatenate([flat, np.zeros(n * num_ranks - flat.size)])
        flat = np.concatenate([block_round_trip(flat[r * n:(r + 1) * n], bits, block)[0]
                               for r in range(num_ranks)]).astype(np.float64)
        seen += [flat[:weight.size].reshape(weight.shape), flat[weight.size:weight.size + bias.size]]
    return seen


def reduced_through_blocks(layers, x, labels, stored, num_ranks, micro_batches, bits, block, node_size=None):
    """qgZ's reduced gradient, as the reference sees it: the rows of the batch cut as zerompi cuts
    them (M micro-batches of N ranks' rows); each (micro-batch, rank)'s gradient, normalized by the
    whole batch (so that they sum to the batch's gradient) and rounded to the storage dtype, goes
    through_blocks once; the owner sums a micro-batch's N contributions (rounded to the storage dtype
    as the shard keeps them) and the micro-batches add up. With two hops (node_size L: ranks
    r // L share a node), each node's sum of its L contributions goes through_blocks once more, and
    the owner sums the nodes'."""
    rows = x.shape[0] // (micro_batches * num_ranks)
    xs = x.reshape(micro_batches, num_ranks, rows, -1)
    ys = labels.reshape(micro_batches, num_ranks, rows)
    total = None
    for m in range(micro_batches):
        nodes = {}                                  # node -> the sum of its ranks' contributions
        for r in range(num_ranks):
            _, grads = loss_and_grads(layers, xs[m, r], ys[m, r])
            contribution = [stored(g * (rows / x.shape[0])) for layer in grads for g in layer]
            node = r // node_size if node_size else 0
            nodes[node] = [s + q for s, q in zip(nodes.get(node, [0] * len(contribution)),
                                                 through_blocks(contribution, num_ranks, bits, block))]
        if node_size:                               # hop 2: each node's sum through the blocks again
            nodes = {node: through_blocks(s, num_ranks, bits, block) for node, s in nodes.items()}
        summed = [sum(parts) for parts in zip(*nodes.values())]
        total = [stored(s) for s in summed] if total is None else [stored(t + s) for t, s in zip(total, summed)]
    return total
