"""The share of the machine that other processes took while a job measured it, from the kernel's counters.

A time measured while another process held a core is long, and a limit measured then is low. So
a measurement (the calibration, the benchmarks) reads, over its timed section:

    share = (busy CPU seconds of every CPU of the kernel - the job's own CPU seconds on it)
            / (wall seconds x the CPUs the kernel counts)

busy: /proc/stat's user, nice, system, irq, softirq and steal (the host's other guests); idle and
iowait are not busy. own: every rank's getrusage, summed (a launcher's little counts as other).
The ranks are grouped by the kernel they run on (/proc/sys/kernel/random/boot_id: one per booted
kernel, the same in every network namespace of an emulated cluster, another on each real node):
each kernel's share from its first rank's counters and its own ranks' time; the job's share is
the largest. Without /proc/stat (not Linux) the share is unknown: None.
"""
import os
import platform
import resource
import time

OTHERS_LIMIT = 0.10
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)      # /proc/stat "cpu": user nice system (idle iowait) irq softirq steal


def busy_cpu_seconds(stat=None):
    """(CPU seconds every CPU spent busy since boot, the number of CPUs counted) from /proc/stat's
    text (stat: that text, else read now); None where there is no /proc/stat."""
    if stat is None:
        try:
            with open("/proc/stat") as f:
                stat = f.read()
        except OSError:
            return None
    lines = stat.splitlines()
    fields = [int(x) for x in lines[0].split()[1:]] + [0] * len(BUSY_FIELDS)   # old kernels: no steal
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return sum(fields[i] for i in BUSY_FIELDS) / os.sysconf("SC_CLK_TCK"), cpus


def kernel_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return platform.node()


def own_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class OtherProcesses:
    """Between start() and share(): collective over comm (an mpi4py communicator of the job's ranks)."""

    def __init__(self, comm):
        self.comm, self.kernel = comm, kernel_id()

    def start(self):
        self.comm.Barrier()
        self.busy, self.own, self.wall = busy_cpu_seconds(), own_cpu_seconds(), time.perf_counter()

    def share(self):
        """The largest share other processes took of one kernel's CPUs; None if any is unknown."""
        self.comm.Barrier()
        wall, now = time.perf_counter() - self.wall, busy_cpu_seconds()
        busy = None if now is None or self.busy is None else (now[0] - self.busy[0], now[1])
        ranks = self.comm.allgather((self.kernel, busy, own_cpu_seconds() - self.own, wall))
        shares = []
        for kernel in dict.fromkeys(k for k, _, _, _ in ranks):
            mine = [r for r in ranks if r[0] == kernel]
            if mine[0][1] is None:
                return None
            (busy, cpus), own = mine[0][1], sum(r[2] for r in mine)
            shares.append(max(0.0, busy - own) / (max(r[3] for r in mine) * cpus))
        return max(shares)


def busy_reason(share, limit=OTHERS_LIMIT):
    """Why a measurement is void for the share (None when it is not)."""
    if share is not None and share > limit:
        return f"other processes took {100 * share:.0f}% of the machine's CPU (more than {100 * limit:.0f}%)"
    return None
