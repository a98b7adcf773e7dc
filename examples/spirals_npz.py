"""Make a dataset file in zerompi's .npz format and train on it.

    python examples/spirals_npz.py spirals.npz
    mpirun -n 4 python -m zerompi.train --data spirals.npz --hidden 64,64 --steps 600 --batch-size 128

Three interleaved spiral arms in the plane (2 features, 3 classes), with a held-out split:
    x        (3000, 2) float64    y        (3000,) int64 in 0..2
    x_test   (600, 2)  float64    y_test   (600,)  int64
"""
import sys

import numpy as np


def spirals(num_samples, rng, arms=3, noise=0.08):
    labels = rng.integers(0, arms, num_samples)
    radius = rng.uniform(0.05, 1.0, num_samples)
    angle = 2 * np.pi * labels / arms + 3.5 * radius + rng.normal(0, noise, num_samples)
    x = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1)
    return x, labels


def main(path):
    rng = np.random.default_rng(0)
    x, y = spirals(3000, rng)
    x_test, y_test = spirals(600, rng)
    np.savez(path, x=x, y=y, x_test=x_test, y_test=y_test)
    print(f"wrote {path}: x {x.shape}, y {y.shape}, x_test {x_test.shape}, y_test {y_test.shape}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "spirals.npz")
