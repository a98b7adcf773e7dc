"""The live progress line on rank 0 (`--progress live`, or `auto` when the output is a terminal).

    step  120/300 | loss 0.4312 | 18,204 samples/s | 0.8 s elapsed | ETA 1.2 s

One line, redrawn in place at most every 0.1 s ("\\r", then ANSI erase-to-end-of-line). Every other
line printed to the same stream (the plain progress lines every --log-every steps, loss-scale
events, the end-of-run report) goes through StatusLine.write, which erases the live line first and
draws it again below, so the log scrolls above it as it would without it.

samples/s and the ETA are measured: global rows per step times the steps done since training began,
divided by the wall time since then; ETA = steps left x that time per step.

Under mpirun the ranks' output is a pipe even when mpirun writes to a terminal, so `auto` sees no
terminal there; `--progress live` draws the line anyway (mpirun passes the bytes on as they come).
"""
import time

ERASE_LINE = "\x1b[K"          # ANSI: erase from the cursor to the end of the line


def format_status(step, steps, loss, samples_per_second, elapsed, eta):
    """The live line's text (no control characters)."""
    width = len(str(steps))
    return (f"step {step:>{width}}/{steps} | loss {loss:.4f} | {samples_per_second:,.0f} samples/s"
            f" | {format_seconds(elapsed)} elapsed | ETA {format_seconds(eta)}")


def format_seconds(seconds):
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


class StatusLine:
    """A text stream (rank 0's progress output) with the live line kept at its bottom."""

    MIN_INTERVAL = 0.1         # seconds between redraws

    def __init__(self, stream, first_step, steps, batch_size):
        self.stream = stream
        self.first_step, self.steps, self.batch_size = first_step, steps, batch_size
        self.text = ""                         # the live line as last drawn ("" : none shown)
        self.started = time.perf_counter()
        self.drawn_at = -float("inf")          # the first step draws at once

    def update(self, step, loss):
        """After each step: redraw if MIN_INTERVAL has passed (and always at the last step)."""
        now = time.perf_counter()
        if now - self.drawn_at < self.MIN_INTERVAL and step < self.steps:
            return
        elapsed = now - self.started
        done = step - self.first_step
        seconds_per_step = elapsed / max(done, 1)
        self.text = format_status(step, self.steps, loss, self.batch_size / seconds_per_step, elapsed,
                                  (self.steps - step) * seconds_per_step)
        self.stream.write("\r" + ERASE_LINE + self.text + "\r")   # the cursor stays at column 0
        self.stream.flush()
        self.drawn_at = now

    def write(self, text):
        """Text printed to the stream: erase the live line, write, redraw it after a line end."""
        if not self.text:                      # no live line (yet, or any more): plain output
            self.stream.write(text)
            return len(text)
        self.stream.write(ERASE_LINE + text)
        if text.endswith("\n"):
            self.stream.write(self.text + "\r")
        return len(text)

    def flush(self):
        self.stream.flush()

    def close(self):
        """Erase the live line for good: what remains on the terminal is the plain log."""
        if self.text:
            self.stream.write(ERASE_LINE)
            self.stream.flush()
        self.text = ""
