"""The meeting point of N in-process ranks: one Hub per communicator, shared by its ranks' threads.

Every collective is two meetings at a barrier of the communicator's N threads:

    deposit   each rank puts a reference to its input in its slot (no copy)
    meet 1    everyone's input is there: each rank reads the others' slots and computes its
              own output (reading only; a result that would overwrite an input is kept aside)
    meet 2    everyone has read: each rank may write its buffers again (its own only)

so no rank writes a buffer another rank may still read, and each rank's buffers stay its own.
Reductions add the ranks' inputs in rank order, 0 + 1 + ... + (N-1), on every rank alike.

Lockstep (run_ranks' `pause`): at each meeting of the world's hub, once every rank's input is
there, a callback runs in rank 0's thread with the meeting's number, name and every rank's input,
while the other ranks wait at the second barrier (rank 0 comes to it afterwards); then all go on (the deadline covers that wait too: timeout None to
stop at a breakpoint in it).

A barrier that does not fill breaks: after `timeout` seconds (the --collective-timeout deadline;
None waits for ever, for a debugger), or at once when a rank failed (`abort`, called by the
runner). Every waiting rank then raises RanksStopped, whose message says which ranks were waiting,
in which call, and which never came.
"""
import threading


class RanksStopped(RuntimeError):
    """A collective could not complete: a rank failed, or did not arrive before the deadline."""


class CollectiveTimeout(RanksStopped):
    """A rank did not arrive at a collective before the deadline."""


class CollectivesDiffer(RanksStopped):
    """The ranks met in different collectives."""


class Meeting:
    """A barrier of `size` threads that breaks at its deadline or on `abort`, except for a meeting
    that had already filled (threading.Barrier's abort breaks those too: a rank that had passed
    would be told it had not)."""

    def __init__(self, size, timeout):
        self.size, self.timeout = size, timeout
        self.cond = threading.Condition()
        self.arrived = self.generation = 0
        self.broken = False

    def wait(self):
        """Returns once every thread has arrived; raises BrokenBarrierError if the meeting broke first."""
        with self.cond:
            if self.broken:
                raise threading.BrokenBarrierError
            generation = self.generation
            self.arrived += 1
            if self.arrived == self.size:
                self.arrived, self.generation = 0, generation + 1
                self.cond.notify_all()
                return
            if not self.cond.wait_for(lambda: self.generation != generation or self.broken, self.timeout):
                self.abort_locked()                  # the deadline: no one else waits either
            if self.generation == generation:
                raise threading.BrokenBarrierError

    def abort(self):
        with self.cond:
            self.abort_locked()

    def abort_locked(self):
        self.broken = True
        self.cond.notify_all()


class Hub:
    def __init__(self, size, timeout=None, family=None, pause=None):
        """family: the hubs of one run (a world and the communicators split from it), all broken
        together when a rank fails; pause(number, name, slots): the lockstep mode's (run_ranks)."""
        self.size, self.timeout, self.pause = size, timeout, pause
        self.barrier = Meeting(size, timeout)
        self.slots = [None] * size
        self.calls = [None] * size           # what each rank is in: (its call number, its name)
        self.counts = [0] * size
        self.lock = threading.Lock()
        self.children = {}                   # (a rank's split number on this hub, color) -> Hub
        self.made = [0] * size               # splits and duplicates each rank has made on this hub
        self.family = family if family is not None else []
        self.family.append(self)
        self.reason = None                   # why the run stopped, once it did

    def meet(self, rank, value, name):
        """Collective: deposit value, wait for every rank's; returns the N slots (read them, then
        call `release`). Ranks in different calls stop, naming them."""
        self.slots[rank] = value
        self.counts[rank] += 1
        self.calls[rank] = (self.counts[rank], name)
        self._wait(rank)
        if len(set(self.calls)) > 1:
            raise CollectivesDiffer(f"collective #{self.counts[rank]} of {self.size} ranks differs: "
                               + ", ".join(f"rank {r} called {call[1]}" for r, call in enumerate(self.calls)))
        if self.pause is not None and rank == 0:     # lockstep: the others wait at `release` meanwhile
            self.pause(self.counts[rank], name, list(self.slots))
        return self.slots

    def release(self, rank):
        """Collective: every rank has read the slots."""
        self._wait(rank)

    def child(self, color, members, rank):
        """The hub of the ranks `members` (rank's next split or duplicate on this hub, of this color),
        made by whichever arrives first; broken at once if the run has stopped."""
        self.made[rank] += 1                 # every rank splits in the same order: the keys agree
        key = (self.made[rank], color)
        with self.lock:
            if key not in self.children:
                self.children[key] = Hub(len(members), self.timeout, self.family)
            hub = self.children[key]
        if self.reason:
            hub.reason = self.reason
            hub.barrier.abort()
        return hub

    def abort(self, reason):
        """Break every hub of the run: each waiting rank raises RanksStopped(the first reason)."""
        for hub in self.family:
            hub.reason = hub.reason or reason
        for hub in self.family:
            hub.barrier.abort()

    def _wait(self, rank):
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            if self.reason:
                raise RanksStopped(self.reason) from None
            raise CollectiveTimeout(self._late(rank)) from None

    def _late(self, rank):
        """The deadline passed: who waited in which call, and who did not come."""
        number, name = self.calls[rank]
        waiting = [r for r in range(self.size) if self.calls[r] == (number, name)]
        missing = [r for r in range(self.size) if r not in waiting]
        return (f"collective #{number} ({name}) of {self.size} ranks: ranks {', '.join(map(str, waiting))} waited "
                f"{self.timeout:g} s; ranks {', '.join(map(str, missing))} did not arrive (their last call: "
                + "; ".join(f"rank {r} #{self.calls[r][0]} {self.calls[r][1]}" if self.calls[r] else f"rank {r} none"
                            for r in missing) + ")")
