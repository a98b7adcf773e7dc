"""Floors that cannot lie: the machine's limits sampled between the timed rounds, the share of
the machine other processes took meanwhile, and the rule that makes a run's numbers void.

A limit measured once (a GEMM rate, a memory bandwidth, a collective's time) is one sample of a
machine that others share: measured while another job held the core, it comes out low, and a
step then looks faster than its own floor. So each limit is sampled once per round, between the
timed rounds of the rows, and the best sample is the limit (the fastest the machine was seen to
do it), with the spread of the samples (worst / best - 1) beside it.

The other processes' share: zerompi/util/other_processes.py (the kernel's counters).

Void: a row faster than its floor (ratio < 1.0: the floor was not one), or other processes
taking more than OTHERS_LIMIT (10%) of the machine. The benchmark then says why and marks its table
void: not a result.
"""
from zerompi.util.other_processes import busy_reason


def best(samples, higher_is_better):
    """(the best of the samples, their spread: worst / best - 1 for times, best / worst - 1 for rates)."""
    top, bottom = (max(samples), min(samples)) if higher_is_better else (min(samples), max(samples))
    return top, (top / bottom - 1 if higher_is_better else bottom / top - 1)


def void_reasons(ratios, others_share):
    """Why a run's numbers are void ([] when they are results): ratios {row: measured / floor}."""
    reasons = [f"{row} ran at {ratio:.2f}x its floor (below 1: the floor was not one)"
               for row, ratio in ratios.items() if ratio < 1.0]
    return reasons + [reason for reason in [busy_reason(others_share)] if reason]
