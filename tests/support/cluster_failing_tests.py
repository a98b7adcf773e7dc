"""Tests that fail on purpose on the `emulated_cluster` fixture: tests/program/test_emulated_cluster.py
runs them in a pytest of their own, then checks that their cluster is gone. (Not named test_*:
the suite never collects them itself.)"""
import time

import pytest


def test_fails(emulated_cluster):
    assert emulated_cluster.nodes() == [1, 2, 3, 4]
    pytest.fail(f"failing on purpose, on cluster {emulated_cluster.c}, which is up")


@pytest.mark.timeout(2, method="signal")
def test_times_out(emulated_cluster):
    time.sleep(60)


def test_waits_to_be_interrupted(emulated_cluster):
    print("waiting to be interrupted", flush=True)
    time.sleep(60)
