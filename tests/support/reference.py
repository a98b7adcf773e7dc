"""The test oracle: plain single-process AdamW on the whole global batch.

No flat buffers, no shards, no MPI, no micro-batches: one weight and one bias array per layer, the
layer functions (themselves checked against finite differences in test_layers_match_finite_differences.py), and the AdamW
formula written out the textbook way (sqrt(v_hat), not zerompi.adam's chunked in-place form).

Mixed precision (storage = float16 or bfloat16) is done the textbook way too: an fp32 master copy;
16-bit parameters rounded from it; forward and backward in fp32 from the 16-bit parameters; the
whole batch's gradient rounded to 16 bits once; Adam on the master in fp32.
"""
import numpy as np

from zerompi.layers import gelu_backward, gelu_forward, linear_backward, linear_forward, softmax_cross_entropy
from zerompi.layout import Layout
from zerompi.model import init_layer_values


def initial_weights(sizes, seed, dtype=np.float64):
    """[(weight (O, I), bias (O,)), ...] exactly as zerompi initializes them."""
    layers = []
    for layer in Layout(sizes, 1).layers:
        values = init_layer_values(layer, seed).astype(dtype)
        weight, bias = layer.views(values)
        layers.append((weight.copy(), bias.copy()))
    return layers


def loss_and_grads(layers, x, labels):
    """Mean softmax cross-entropy over all rows, and [(dW, db), ...]."""
    n = x.shape[0]
    inputs, pres, tanhs = [x], [], []
    h = x
    for i, (w, b) in enumerate(layers):
        pre = np.empty((n, w.shape[0]), dtype=x.dtype)
        linear_forward(h, w, b, pre)
        pres.append(pre)
        if i < len(layers) - 1:
            t = np.empty_like(pre)
            h = np.empty_like(pre)
            gelu_forward(pre, h, t)
            tanhs.append(t)
            inputs.append(h)
    d = np.empty_like(pres[-1])
    loss, _ = softmax_cross_entropy(pres[-1], labels, n, d)
    grads = [None] * len(layers)
    for i in reversed(range(len(layers))):
        w = layers[i][0]
        if i < len(layers) - 1:
            d_pre = np.empty_like(d)
            gelu_backward(d, pres[i], tanhs[i], d_pre)
            d = d_pre
        dw, db = np.empty_like(w), np.empty_like(layers[i][1])
        dx = None if i == 0 else np.empty_like(inputs[i])
        linear_backward(d, inputs[i], w, dw, db, dx)
        grads[i] = (dw, db)
        d = dx
    return loss, grads


def global_norm(grads):
    return float(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for layer in grads for g in layer)))


def adamw_train(layers, batches, lr, weight_decay, beta1=0.9, beta2=0.999, eps=1e-8, storage=None,
                clip_norm=0.0):
    """Run AdamW over [(x, labels), ...] global batches. storage: None for full precision in the
    layers' dtype, or a 16-bit dtype for mixed precision. Returns (layers in the storage dtype,
    losses, gradient norms before clipping)."""
    compute = layers[0][0].dtype if storage is None else np.dtype(np.float32)
    master = [p.astype(compute) for layer in layers for p in layer]
    m = [np.zeros_like(p) for p in master]
    v = [np.zeros_like(p) for p in master]
    stored = (lambda p: p) if storage is None else (lambda p: p.astype(storage))
    losses, norms = [], []
    for t, (x, labels) in enumerate(batches, start=1):
        params = [stored(p).astype(compute) for p in master]       # what forward sees
        current = [(params[2 * i], params[2 * i + 1]) for i in range(len(layers))]
        loss, grads = loss_and_grads(current, x.astype(compute), labels)
        flat_grads = [stored(g).astype(compute) for layer in grads for g in layer]
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
    final = [stored(p) for p in master]
    return [(final[2 * i], final[2 * i + 1]) for i in range(len(layers))], losses, norms
