"""The live progress line on rank 0 (`--progress live`, or `auto` where zerompi/train/outputs/destination.py
finds a terminal the user watches), drawn by tqdm:

    step 120/300 |███████▋           | loss 0.4312 | 81.20 steps/s | 00:01<00:02

tqdm does the terminal work: it redraws the line in place at most every 0.1 s (mininterval), fitted
to the terminal's width as it is at that redraw (dynamic_ncols: a narrower window shrinks the bar,
then cuts the line, so it never wraps), and tqdm.write prints a log line above it (erase the line,
write, draw it again). The rate and the time left (after the `<`) are tqdm's, measured from the
steps this process ran (a resumed run starts at its checkpoint's step). At the end, or before an
error, the line is erased: what remains on the terminal is the plain log.

Why tqdm: small, pure Python with no dependencies of its own, maintained for a decade, and what
most training scripts already show; rich would draw the same line but is a much larger library
that also wants to own the terminal's other output.

StatusLine is a text stream for print(): what rank 0 prints goes through it, and each whole line
goes to tqdm.write.
"""
import os

from tqdm import tqdm


class _Bar(tqdm):
    monitor_interval = 0                   # no monitor thread: the training loop updates every step


class StatusLine:
    """A text stream (rank 0's progress output) with the live line kept at its bottom."""

    MIN_INTERVAL = 0.1                     # seconds between redraws

    def __init__(self, stream, first_step, steps, terminal=None):
        """terminal: the path of the terminal the stream ends on, where the stream is a pipe to it
        (MPICH's mpirun: zerompi/train/outputs/destination.py), whose width the line then fits."""
        self.stream, self.pending = stream, ""
        self.terminal = _Terminal(terminal) if terminal is not None else None
        width = {"dynamic_ncols": True} if self.terminal is None else {"ncols": self.terminal.size()[0]}
        self.bar = _Bar(total=steps, initial=first_step, file=stream, leave=False, mininterval=self.MIN_INTERVAL,
                        unit=" steps", ascii=False, **width,
                        bar_format="step {n}/{total} |{bar}| {desc} | {rate_fmt} | {elapsed}<{remaining}")
        if self.terminal is not None:                # each redraw at the terminal's width as it is then
            self.bar.dynamic_ncols = self.terminal.size

    def update(self, step, loss):
        """After each step: tqdm redraws when MIN_INTERVAL has passed."""
        self.bar.set_description_str(f"loss {loss:.4g}", refresh=False)
        self.bar.update(step - self.bar.n)

    def write(self, text):
        """Text printed to the stream: whole lines go above the live line (tqdm.write)."""
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            self.bar.write(line, file=self.stream)
        return len(text)

    def flush(self):
        self.stream.flush()

    def close(self):
        """Erase the live line for good (idempotent)."""
        self.bar.close()
        self.stream.flush()
        if self.terminal is not None:
            self.terminal.close()


class _Terminal:
    """The terminal a pipe ends on, opened to read its size at each redraw (tqdm's dynamic_ncols):
    (columns, rows), or 80 columns when it cannot be read."""

    FALLBACK = (80, None)

    def __init__(self, path):
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError:
            self.fd = None

    def size(self, _stream=None):
        try:
            return tuple(os.get_terminal_size(self.fd)) if self.fd is not None else self.FALLBACK
        except OSError:
            return self.FALLBACK

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
