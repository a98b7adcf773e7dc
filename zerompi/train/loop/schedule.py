"""Learning-rate schedules: constant, or linear warm-up then cosine decay.

For 0-based step s of S steps, peak rate lr, W warm-up steps, floor min_lr:

    warm-up (s < W):    lr_s = lr * (s + 1) / W
    constant:           lr_s = lr
    cosine:             lr_s = min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2,   p = (s - W) / (S - W)

(warm-up applies to both; the cosine reaches min_lr at the last step's end, p -> 1.)
"""
import math

SCHEDULES = ("constant", "cosine")


def learning_rate(step, total_steps, lr, schedule="constant", warmup_steps=0, min_lr=0.0):
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + (lr - min_lr) * (1.0 + math.cos(math.pi * progress)) / 2.0
