"""`--tensorboard DIR`: the per-step records of zerompi/train/outputs/metrics.py as TensorBoard scalars,
written by rank 0 into an event file in DIR (`tensorboard --logdir DIR` shows them).

Every step, at the step number and the record's wall-clock time:

    train/loss  train/accuracy  train/lr  train/grad_norm  train/loss_scale
    time/step_seconds  time/samples_per_second
    comm/<purpose>_bytes  comm/<purpose>_seconds       rank 0's, per purpose (grads, params, metrics; scales with --quantize-weights)
    offload/<move>_bytes                               --offload-optimizer: rank 0's bytes between tiers
    quant_error/weights  quant_error/grads             --quant-error: the step's relative L2 errors

At the steps that gather every rank's numbers (step 1, every --log-every steps, the last step),
one value per rank r:

    memory/ledger_bytes/rank_r  memory/peak_rss_bytes/rank_r  comm/bytes/rank_r  comm/seconds/rank_r
    comm/inter_node_bytes/rank_r                       the part of comm/bytes that leaves the node
    run/restarts (and run/slurm_restarts where Slurm set it)

A step whose loss or gradient norm is not finite has no value for those tags (as --metrics has
null). Values are TensorBoard's float32 (a byte count above 2**24 is rounded to 7 digits).

tensorboardX (the `tensorboard` extra: it writes event files without TensorFlow or PyTorch)
provides the protocol buffers and the record framing. Its SummaryWriter is not used: it writes
from a thread behind a bounded queue, and a write that fails there (a full disk) would end the
thread silently and then block training once the queue is full. Here each step's event is written
by rank 0 itself, into a buffered file that is flushed every --log-every steps and at the end; a
write that fails costs one warning line and training goes on without the event file (as
--metrics). A folder that cannot be created is bad input (setup, before any step).
"""
import importlib
import itertools
import os

from .metrics import warn

WRITERS = itertools.count()          # event files this process opened
INSTALL_HINT = "--tensorboard needs tensorboardX: pip install -e '.[tensorboard]'"
STEP_TAGS = (("train/loss", "loss"), ("train/accuracy", "accuracy"), ("train/lr", "lr"),
             ("train/grad_norm", "grad_norm"), ("train/loss_scale", "loss_scale"),
             ("time/step_seconds", "step_seconds"), ("time/samples_per_second", "samples_per_second"))


def tensorboard_missing():
    """One line (the install hint) if tensorboardX cannot be imported, else None."""
    try:
        importlib.import_module("tensorboardX")
    except ImportError:
        return INSTALL_HINT
    return None


class TensorBoardLog:
    """Rank 0: one event file in `folder`; write(record) adds the record's scalars."""

    def __init__(self, folder):
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto import event_pb2, summary_pb2
        self.Event, self.Summary = event_pb2.Event, summary_pb2.Summary
        self.folder, self.writer, self.open_error = folder, None, None
        if os.path.lexists(folder) and not os.path.isdir(folder):
            self.open_error = f"cannot write TensorBoard events to {folder}: it exists and is not a folder"
            return
        try:
            os.makedirs(folder, exist_ok=True)
            # the name has the second and the host; the pid and a count keep runs started together apart
            self.writer = EventsWriter(os.path.join(folder, "events"), f".{os.getpid()}.{next(WRITERS)}")
        except OSError as e:
            self.open_error = f"cannot write TensorBoard events to {folder}: {e.strerror or e}"

    @property
    def open(self):
        return self.writer is not None

    def write(self, record):
        values = [self.Summary.Value(tag=tag, simple_value=value) for tag, value in scalars(record)]
        event = self.Event(wall_time=record["time"], step=record["step"], summary=self.Summary(value=values))
        try:
            self.writer.write_event(event)
            if "memory" in record:                # the gathered steps: every --log-every steps
                self.writer.flush()
        except OSError as e:
            self.give_up(e)

    def close(self):
        self.give_up(None)

    def give_up(self, error):
        """Close the file; after a failed write (error), one warning line, and no more events."""
        writer, self.writer = self.writer, None
        if writer is not None:
            try:
                writer.close()
            except OSError as e:
                error = error or e
        if error is not None:
            warn(f"cannot write TensorBoard events to {self.folder}: {error.strerror or error}; training goes "
                 f"on without them")


def scalars(record):
    """[(tag, value)] of one metrics record (zerompi/train/outputs/metrics.py)."""
    out = [(tag, record[key]) for tag, key in STEP_TAGS if record[key] is not None]
    for purpose, totals in record["comm"].items():
        out += [(f"comm/{purpose}_bytes", totals["bytes"]), (f"comm/{purpose}_seconds", totals["seconds"])]
    out += [(f"offload/{kind}_bytes", value) for kind, value in record.get("offload", {}).items()]
    out += [(f"quant_error/{kind}", value) for kind, value in record.get("quant_error", {}).items() if value is not None]
    if "memory" in record:
        for kind in ("ledger_bytes", "peak_rss_bytes"):
            out += [(f"memory/{kind}/rank_{r}", v) for r, v in enumerate(record["memory"][kind])]
        for kind in ("bytes", "inter_node_bytes", "seconds"):
            out += [(f"comm/{kind}/rank_{r}", v) for r, v in enumerate(record["comm_per_rank"][kind])]
        out += [(f"run/{key}", record[key]) for key in ("restarts", "slurm_restarts") if key in record]
    return out
