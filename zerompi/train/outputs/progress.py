"""The progress line every --log-every steps, printed by rank 0, at most 80 columns:

    step  25/300  loss 2.055  acc 49.0%  |g| 0.284  lr 3.0e-3  9.45 ms/step  0:02

loss (at most 4 significant digits: 0.00004 prints as 4e-05, never 0.0000), training accuracy and
gradient norm |g| (3 significant digits, trailing zeros kept: 0.700) average the applied steps
since the last line; lr is the step's learning rate; ms/step the window's wall time per step (3
significant digits, s/step from a second up, right-aligned in a fixed width); the last field the
time since training began (m:ss, h:mm:ss from an hour). fp16 adds the loss scale and, when
steps were skipped for overflow, their count, which leaves no room for lr (and |g|, see below):

    step  25/300  loss 2.055  acc 49.0%  |g| 0.284  scale 65536  9.45 ms/step  0:02
    step  50/300  loss 1.032  acc 71.2%  scale 32768  2 skipped  9.51 ms/step  0:04

A window in which every step was skipped has no loss, accuracy or norm to average, and says so:

    step  25/300  all 25 steps skipped  lr 3.0e-3  scale 512  9.45 ms/step  0:02

A line that would be longer than 80 columns leaves out, in this order, lr, |g| and the loss scale
(all three are in --metrics, and every loss-scale change is a line of its own). The default run
(300 steps) keeps every field; from about 1000 steps, or 10 minutes, lr is left out; an fp16 line
with skipped steps keeps the scale up to 999 steps; step, loss, accuracy, the skipped count and the
times always fit (up to 10**6 steps).
"""
import time

WIDTH = 80
OPTIONAL = ("lr ", "|g| ", "scale ")          # left out first to last when the line is too long


class Progress:
    """Sums of the steps since the last progress line, and the line itself (rank 0 prints).
    Loss, accuracy and gradient norm average the applied steps; ms/step divides by all steps
    (an fp16 step skipped for overflow took its time too)."""

    def __init__(self, cfg, comm, out):
        self.cfg, self.comm, self.out = cfg, comm, out
        self.started = time.perf_counter()          # training began (the first line's window too)
        self.reset(self.started)

    def reset(self, now):
        self.loss = self.correct = self.norm = 0.0
        self.applied = self.steps = 0
        self.since = now

    def add(self, result):
        self.steps += 1
        if result.applied:
            self.loss += result.loss
            self.correct += result.correct
            self.norm += result.grad_norm
            self.applied += 1

    def print_line(self, step, lr, scaler):
        cfg, n, now = self.cfg, self.applied, time.perf_counter()
        fields = [f"step {step:>{len(str(cfg.steps))}}/{cfg.steps}"]
        if n:
            fields += [f"loss {self.loss / n:.4g}",
                       f"acc {100 * self.correct / (n * cfg.batch_size):.1f}%", f"|g| {significant(self.norm / n, 3)}"]
        else:
            fields.append(f"all {self.steps} steps skipped")
        fields.append(f"lr {format_lr(lr)}")
        if scaler.enabled:
            fields.append(f"scale {scaler.scale:g}")
        if 0 < n < self.steps:
            fields.append(f"{self.steps - n} skipped")
        fields += [format_step_time((now - self.since) / self.steps), format_elapsed(now - self.started)]
        self.comm.print0(fit(fields), file=self.out)
        self.reset(now)


def fit(fields, width=WIDTH):
    """The fields joined by two spaces; the OPTIONAL ones left out, in order, until it fits width."""
    line = "  ".join(fields)
    for prefix in OPTIONAL:
        if len(line) <= width:
            break
        fields = [f for f in fields if not f.startswith(prefix)]
        line = "  ".join(fields)
    return line


def significant(value, digits):
    """value with `digits` significant digits, trailing zeros kept so that columns line up (0.700,
    12.0), but no bare trailing point (145, not 145.); powers of ten stay short (4e-05)."""
    text = f"{value:#.{digits}g}"
    return f"{value:.{digits}g}" if "e" in text else text.rstrip(".")


def format_lr(lr):
    """Two significant digits, a short exponent: 3.0e-3, 9.4e-8, 1.0e+0."""
    mantissa, exponent = f"{lr:.1e}".split("e")
    return f"{mantissa}e{int(exponent):+d}"


def format_step_time(seconds):
    """Three significant digits, always 12 columns (so that which fields fit never depends on the
    timing): `9.45 ms/step`, ` 145 ms/step`, `1.23  s/step`, ` 912 us/step`, ` 927 ns/step`."""
    if seconds < 0.9995e-6:
        return f"{significant(1e9 * seconds, 3):>4} ns/step"
    if seconds < 0.0009995:
        return f"{significant(1e6 * seconds, 3):>4} us/step"
    if seconds < 0.9995:
        return f"{significant(1e3 * seconds, 3):>4} ms/step"
    return f"{significant(seconds, 3):>4}  s/step"


def format_elapsed(seconds):
    """m:ss under an hour, else h:mm:ss (as tqdm and sacct's Elapsed)."""
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
