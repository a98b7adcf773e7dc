"""Floors that cannot lie: the machine's limits sampled between the timed rounds, the share of
the machine other processes took meanwhile, and the rule that makes a run's numbers void.

A limit measured once (a GEMM rate, a memory bandwidth, a collective's time) is one sample of a
machine that others share: measured while another job held the core, it comes out low, and a
step then looks faster than its own floor. So each limit is sampled once per round, between the
timed rounds of the rows, and the best sample is the limit (the fastest the machine was seen to
do it), with the spread of the samples (worst / best - 1) beside it.

The other processes' share, from the kernel's counters: /proc/stat's busy time of every CPU
(user, nice, system, irq, softirq, and steal: the host's other guests) over the timed section,
less this job's own CPU time (every rank's getrusage, summed; the launcher's little counts as
other), divided by the section's wall time x the CPUs the counters cover.

Void: a row faster than its floor (ratio < 1.0: the floor was not one), or other processes
taking more than OTHERS_LIMIT of the machine. The benchmark then says why and marks its table
void: not a result.
"""
import os
import resource
import time

OTHERS_LIMIT = 0.10
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)      # /proc/stat "cpu": user nice system (idle iowait) irq softirq steal


def busy_cpu_seconds(stat=None):
    """(CPU seconds every CPU of the machine spent busy since boot, the number of CPUs counted),
    from /proc/stat's text (stat: that text, else read now). Idle and iowait are not busy."""
    if stat is None:
        with open("/proc/stat") as f:
            stat = f.read()
    lines = stat.splitlines()
    fields = [int(x) for x in lines[0].split()[1:]] + [0] * len(BUSY_FIELDS)   # old kernels: no steal
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return sum(fields[i] for i in BUSY_FIELDS) / os.sysconf("SC_CLK_TCK"), cpus


def own_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class OtherProcesses:
    """The share of the machine's CPU time that processes other than this job used between
    start() and share() (collective over comm, an mpi4py communicator of the job's ranks, all on
    this machine: the counters are one kernel's)."""

    def __init__(self, comm):
        self.comm = comm

    def start(self):
        self.comm.Barrier()
        self.busy, _ = busy_cpu_seconds()
        self.own, self.wall = own_cpu_seconds(), time.perf_counter()

    def share(self):
        self.comm.Barrier()
        wall = time.perf_counter() - self.wall
        busy, cpus = busy_cpu_seconds()
        own = self.comm.allreduce(own_cpu_seconds() - self.own)
        busy = self.comm.bcast(busy - self.busy)          # rank 0's reading: one machine's counters
        return max(0.0, busy - own) / (wall * cpus)


def best(samples, higher_is_better):
    """(the best of the samples, their spread: worst / best - 1 for times, best / worst - 1 for rates)."""
    top, bottom = (max(samples), min(samples)) if higher_is_better else (min(samples), max(samples))
    return top, (top / bottom - 1 if higher_is_better else bottom / top - 1)


def void_reasons(ratios, others_share):
    """Why a run's numbers are void ([] when they are results): ratios {row: measured / floor}."""
    reasons = [f"{row} ran at {ratio:.2f}x its floor (below 1: the floor was not one)"
               for row, ratio in ratios.items() if ratio < 1.0]
    if others_share > OTHERS_LIMIT:
        reasons.append(f"other processes took {100 * others_share:.0f}% of the machine's CPU "
                       f"(more than {100 * OTHERS_LIMIT:.0f}%)")
    return reasons
