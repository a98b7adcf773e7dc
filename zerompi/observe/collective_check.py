"""--check-collectives: before each collective, the ranks show each other what they are about to call.

Ranks that disagree on a collective (another kind, another size, another dtype, or a rank that
skipped one) hang, or worse, silently mix unrelated buffers: the class of hang ZeRO users report
most. With the check on, the guards (zerompi/observe/guards.py) precede every collective with one
small all-gather:

    header (4,) int64 = [kind, elements, crc32(dtype name), crc32(call site)]
    all-gather: table (N, 4), the same on every rank; all rows equal -> go on

On the first disagreement every rank holds the same table, so all of them take the same second
step: an all-gather of each rank's description, `allreduce of 1,234 float32 (grads) at
zerompi/stages/stage0.py:40`, as fixed-width text; the lowest rank prints one line naming each
side, and every rank exits with status ExitCode.COLLECTIVE_MISMATCH (zerompi/util/exit_codes.py). The
call site is the first frame outside the communicator, its control messages, the guards and the
collectives (sys._getframe, only while the check is on).
Cost: one latency-bound all-gather of 32 N bytes per collective, and a stack walk.

A rank that calls no collective at all while the others do is caught by --collective-timeout
(zerompi/observe/watchdog.py) instead: nobody answers its header.
"""
import os
import sys
import zlib

import numpy as np

DESCRIPTION_BYTES = 256             # fixed width of the text exchanged on a mismatch
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))        # .../zerompi
_PACKAGE_PARENT = os.path.dirname(_PACKAGE)                                     # call sites are relative to it
_SKIPPED_FILES = {os.path.abspath(__file__)} | {os.path.join(_PACKAGE, *path) for path in
                  (("comm.py",), ("control.py",), ("collectives.py",), ("overlap", "thread.py"),
                   ("overlap", "prefetch.py"), ("observe", "guards.py"), ("inprocess", "communicator.py"),
                   ("inprocess", "guards.py"))}


def call_site():
    """'zerompi/stages/stage0.py:40': the first caller outside the communicator (comm.py, control.py,
    zerompi/inprocess/'s), the collectives (collectives.py, overlap/), the guards and this module."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename) in _SKIPPED_FILES:
        frame = frame.f_back
    if frame is None:
        return "?"
    path = os.path.abspath(frame.f_code.co_filename)
    if path.startswith(_PACKAGE_PARENT + os.sep):
        path = os.path.relpath(path, _PACKAGE_PARENT)
    return f"{path}:{frame.f_lineno}"


def _crc(text):
    return zlib.crc32(text.encode())


class CollectiveCheck:
    """The header of the next collective and the table of everyone's; guards.py does the exchanges."""

    def __init__(self, rank, size):
        self.rank = rank
        self.header = np.zeros(4, np.int64)                      # this rank's
        self.table = np.zeros((size, 4), np.int64)               # every rank's, in rank order
        self.descriptions = np.zeros((size, DESCRIPTION_BYTES), np.uint8)
        self.calls = 0                                           # collectives checked so far
        self.description = ""
        self.site = None       # set by the --overlap communication thread: where the call was submitted

    def fill_header(self, kind, purpose, buffer):
        """Before the header exchange: describe the collective this rank is about to call."""
        site = self.site or call_site()
        elements, dtype = (buffer.size, buffer.dtype.name) if buffer is not None else (0, "-")
        self.header[:] = (_crc(kind), elements, _crc(dtype), _crc(site))
        self.description = f"{kind} of {elements:,} {dtype} ({purpose}) at {site}"
        self.calls += 1

    def agreed(self):
        """After the header exchange: True when every rank is about to call the same collective."""
        return bool(np.all(self.table == self.header))

    def own_description(self):
        """This rank's description as fixed-width bytes, for the exchange after a mismatch."""
        text = self.description.encode()[:DESCRIPTION_BYTES]
        return np.frombuffer(text.ljust(DESCRIPTION_BYTES, b"\0"), np.uint8)

    def mismatch_message(self, job_ranks):
        """After the description exchange: one line naming what each group of ranks called
        (job_ranks: the job's rank of each rank of the communicator)."""
        groups = {}                                              # description -> ranks
        for rank, row in zip(job_ranks, self.descriptions):
            groups.setdefault(bytes(row).rstrip(b"\0").decode(errors="replace"), []).append(rank)
        sides = "; ".join(f"{_ranks(ranks)}: {text}" for text, ranks in groups.items())
        return f"the ranks disagree at collective #{self.calls}: {sides}"


def _ranks(ranks):
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(map(str, ranks))
