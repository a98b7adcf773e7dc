"""Regenerate zerompi/train/datasets/digits.npz from scikit-learn's copy of the UCI handwritten digits.

    pip install scikit-learn && python tools/make_digits.py

Source: E. Alpaydin, C. Kaynak, "Optical Recognition of Handwritten Digits", UCI Machine Learning
Repository (1998), CC BY 4.0; the 1,797 8x8 images that scikit-learn ships as load_digits().
Written: x (1497, 64) uint8 pixel counts 0..16, y (1497,) uint8 labels 0..9, and a held-out split
x_test (300, 64), y_test (300,), split by a fixed permutation (numpy default_rng(0)).
"""
import os

import numpy as np
from sklearn.datasets import load_digits

HELD_OUT = 300


def main():
    digits = load_digits()
    x = digits.data.astype(np.uint8)               # (1797, 64), values 0..16
    y = digits.target.astype(np.uint8)             # (1797,), 0..9
    order = np.random.default_rng(0).permutation(len(y))
    train, test = order[HELD_OUT:], order[:HELD_OUT]
    path = os.path.join(os.path.dirname(__file__), "..", "zerompi", "train", "datasets", "digits.npz")
    np.savez_compressed(path, x=x[train], y=y[train], x_test=x[test], y_test=y[test])
    print(f"wrote {os.path.normpath(path)}: {len(train)} train, {len(test)} held out")


if __name__ == "__main__":
    main()
