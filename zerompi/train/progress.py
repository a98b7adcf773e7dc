"""The progress line every --log-every steps, printed by rank 0:

    step  25/300 | loss 0.4312 | train acc  88.1% | grad norm 0.512 | lr 3.00e-03 |    4.12 ms/step

fp16 adds `| loss scale 65536` and, when steps were skipped for overflow, `| 2 skipped`. A window
in which every step was skipped has no loss, accuracy or norm to average, and says so:

    step  25/300 | all 25 steps skipped | lr 3.00e-03 | loss scale 512 |    4.12 ms/step
"""
import time


class Progress:
    """Sums of the steps since the last progress line, and the line itself (rank 0 prints).
    Loss, accuracy and gradient norm average the applied steps; ms/step divides by all steps
    (an fp16 step skipped for overflow took its time too)."""

    def __init__(self, cfg, comm, out):
        self.cfg, self.comm, self.out = cfg, comm, out
        self.loss = self.correct = self.norm = 0.0
        self.applied = self.steps = 0
        self.since = time.perf_counter()

    def add(self, result):
        self.steps += 1
        if result.applied:
            self.loss += result.loss
            self.correct += result.correct
            self.norm += result.grad_norm
            self.applied += 1

    def print_line(self, step, lr, scaler):
        cfg, n, now = self.cfg, self.applied, time.perf_counter()
        scale = f" | loss scale {scaler.scale:g}" if scaler.enabled else ""
        skipped = f" | {self.steps - n} skipped" if 0 < n < self.steps else ""
        averages = (f"loss {self.loss / n:.4f} | train acc {100 * self.correct / (n * cfg.batch_size):5.1f}%"
                    f" | grad norm {self.norm / n:.3g}" if n else f"all {self.steps} steps skipped")
        self.comm.print0(f"step {step:>{len(str(cfg.steps))}}/{cfg.steps} | {averages} | lr {lr:.2e}{scale}"
                         f"{skipped} | {1e3 * (now - self.since) / self.steps:7.2f} ms/step", file=self.out)
        self.__init__(cfg, self.comm, self.out)
