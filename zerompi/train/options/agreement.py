"""Before the first step the ranks agree on the run, or the job stops naming what differs.

Every rank parses its own command line, reads its own config file and data, and finds its own
checkpoint. A config file that differs between two nodes' local disks, or a node with another
environment, would otherwise train silently wrong (each rank adding the gradients of another
run) or stop in a collective whose sizes differ. So at three moments of the start-up each rank
describes what it has as named fields, and the ranks compare them:

    when                              fields
    the command line is read          the versions of zerompi (with a digest of its source files),
      (loop/run.py main)                NumPy and mpi4py; the device (--device as it resolved);
                                      every flag after config files and defaults, except: --config
                                      and --deepspeed-config (what they set is compared), --data
                                      (next row), the outputs rank 0 alone writes (--save-weights,
                                      --metrics, --trace, --tensorboard) and the inputs of the
                                      last row, compared by whether they are set
    the data is read (setup)          the data: its arrays' shapes and dtypes and a SHA-256 of their bytes
    the start is loaded (setup)       --save-dir: the lock rank 0 took there, as each rank reads it
                                      (one folder, by whatever path each rank names it); --resume:
                                      a SHA-256 of the checkpoint's manifest (which holds its files'
                                      CRCs); --init-weights: a SHA-256 of the file

So paths may differ wherever what they name is the same (a relative path under two working
directories, one share mounted at two places), and so may host names and BLAS threads. The CPU
model and BLAS kernel are reported in one line when they differ, not refused: every rank still
applies the same update to the same values; only the rounding of its own products may differ.

The comparison is one collective. Field i's SHA-256, cut to 62 bits, is slot i of a fixed array
of SLOTS int64 (slot 0: the list of field names, so that two versions of the list differ there
first), and one MAX all-reduce of [d, -d] gives each slot's largest and smallest value over the
ranks: they agree where the two are equal. Only when a field differs are its values gathered to
rank 0, which names the field and which ranks hold which value, and every rank exits BAD_INPUT:

    zerompi: error: the ranks disagree on --lr: 0.003 on rank 0, 0.1 on rank 1; every rank must run ...
"""
import functools
import hashlib
import os
from dataclasses import dataclass, fields as dataclass_fields

import numpy as np
from threadpoolctl import threadpool_info

import zerompi
from ...checkpoint.files import LOCK, MANIFEST
from ...util.inputs import open_regular
from .config import TrainConfig
from .version import mpi4py_version

SLOTS = 128                  # at most SLOTS - 1 fields in one comparison
SHOWN = 72                   # characters of a value shown in the error line
GROUPS_SHOWN = 4             # values shown, the most common first after rank 0's
NOT_COMPARED = ("config", "deepspeed_config", "data")      # their effect is compared instead
WHETHER_SET = ("save_weights", "metrics", "trace", "tensorboard", "save_dir", "init_weights", "resume")


@dataclass(frozen=True)
class Field:
    name: str                # as the error line names it: "--lr", "the data"
    compared: str            # what must be equal on every rank
    shown: str = ""          # what the error line shows of this rank's value (default: compared)
    refused: bool = True     # False: a difference is reported in one line, and the run goes on

    def value(self):
        return self.shown or self.compared


def run_fields(cfg, device):
    """The fields of the command line, the versions and the device."""
    found = [Field("zerompi's version", f"{zerompi.__version__} (sources {source_digest()[:12]})"),
             Field("NumPy's version", np.__version__), Field("mpi4py's version", mpi4py_version()),
             Field("the device (--device)", "gpu" if device.is_gpu else "cpu"), machine_field()]
    for f in dataclass_fields(TrainConfig):
        if f.name in NOT_COMPARED:
            continue
        value = getattr(cfg, f.name)
        flag = f"--{f.name.replace('_', '-')}"
        if f.name in WHETHER_SET:
            found.append(Field(flag, "set" if value else "not set", repr(value) if value else "not set"))
        else:
            found.append(Field(flag, ",".join(map(str, value)) if isinstance(value, tuple) else repr(value)))
    return found


def machine_field():
    """The CPU model and the BLAS kernel: reported where they differ, not refused."""
    blas = ", ".join(f"{d.get('internal_api')} {d.get('architecture') or ''}".strip()
                     for d in threadpool_info() if d.get("user_api") == "blas") or "no BLAS found"
    return Field("the CPU and BLAS kernel", f"{cpu_model()}, {blas}", refused=False)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "a CPU")
    except OSError:
        import platform
        return platform.processor() or "a CPU"


def data_fields(data):
    """The data's arrays: shapes, dtypes, and a SHA-256 of their bytes."""
    digest = hashlib.sha256()
    for name in ("x_train", "y_train", "x_test", "y_test"):
        array = getattr(data, name)
        digest.update(f"{name} {None if array is None else (array.dtype.str, array.shape)};".encode())
        if array is not None:
            digest.update(np.ascontiguousarray(array).data)
    held_out = 0 if data.x_test is None else data.x_test.shape[0]
    shown = (f"{data.name}: {data.x_train.shape[0]} x {data.num_features} train, {held_out} held out, "
             f"sha256 {digest.hexdigest()[:12]}")
    return [Field("the data (--data)", digest.hexdigest(), shown)]


def start_fields(cfg, resumed):
    """What the start was loaded from: --save-dir's folder (by the lock rank 0 took in it), and the
    checkpoint resumed (resumed: its folder, or None), the --init-weights file or the seed: the
    same fields on every rank whose flags agree. Call after rank 0 took the lock, and after the
    start was read (every file is checked by then: regular, its sizes within memory)."""
    found = []
    if cfg.save_dir:
        lock = _text(os.path.join(cfg.save_dir, LOCK))
        holder = " pid ".join(lock.split()[:2])               # "host pid": whose lock this rank finds
        found.append(Field("--save-dir (one folder for every rank)", lock or "no lock",
                           f"{cfg.save_dir!r}, " + (f"locked by {holder}" if lock else "where rank 0's lock is missing")))
    if resumed is not None:
        digest = file_digest(os.path.join(resumed, MANIFEST))
        shown = f"checkpoint {resumed!r}, manifest sha256 {digest[:12]}"
    elif cfg.init_weights:
        digest = file_digest(cfg.init_weights)
        shown = f"weights {cfg.init_weights!r}, sha256 {digest[:12]}"
    else:
        digest = shown = f"the initial values of --seed {cfg.seed}"
    return found + [Field("the start (--resume, --init-weights)", digest, shown)]


def agree(comm, fields, out):
    """Collective: every rank passes its fields, in the same order. Where a refused field differs,
    rank 0 prints the one-line error and every rank exits BAD_INPUT; a differing field that is
    only reported is one note line on `out` (rank 0), and the run goes on."""
    error, notes = disagreement(comm, fields)
    comm.check_all(error)
    for note in notes:
        comm.print0(f"zerompi: note: {note}; reported, not refused: every rank applies the same update, only "
                    f"the rounding of its own products may differ", file=out)


def disagreement(comm, fields):
    """Collective: (error, notes). error: None when every rank holds the same value of every
    refused field, else (rank 0's; None elsewhere) the line naming the first that differs and which
    ranks hold which value. notes: rank 0's lines for the fields only reported that differ."""
    assert len(fields) < SLOTS
    names = ";".join(field.name for field in fields)
    digests = np.zeros(2 * SLOTS, dtype=np.int64)
    for slot, text in enumerate([names] + [field.compared for field in fields]):
        digests[slot] = _digest62(text)
        digests[SLOTS + slot] = -digests[slot]
    comm.max_all(digests)                                    # [max over ranks, -min over ranks]
    differ = [slot for slot in range(SLOTS) if digests[slot] != -digests[SLOTS + slot]]
    if differ and differ[0] == 0:                            # the lists of fields differ
        return _spread(comm, "the fields they compare (other versions of zerompi)", names, names), []
    refused = [fields[slot - 1] for slot in differ if fields[slot - 1].refused]
    if refused:
        return _spread(comm, refused[0].name, refused[0].compared, refused[0].value()), []
    notes = [_spread(comm, fields[slot - 1].name, fields[slot - 1].compared, fields[slot - 1].value(),
                     verb="differ in") for slot in differ]
    return None, [note for note in notes if note is not None]


def _spread(comm, name, compared, shown, verb="disagree on"):
    """Collective: rank 0's line naming which ranks hold which value of the field; None elsewhere."""
    shown = shown if len(shown) <= SHOWN else shown[:SHOWN - 3] + "..."
    received = comm.gather_bytes_to_root(f"{_digest62(compared)}\n{shown}".encode(errors="backslashreplace"))
    if received is None:
        return None
    ranks = {}                                               # digest -> (shown, [ranks])
    for rank, payload in enumerate(received):
        digest, _, value = payload.decode(errors="replace").partition("\n")
        ranks.setdefault(digest, (value, []))[1].append(rank)
    groups = sorted(ranks.values(), key=lambda group: (group[1][0] != 0, -len(group[1])))
    parts = [f"{value} on {ranks_text(members)}" for value, members in groups[:GROUPS_SHOWN]]
    if len(groups) > GROUPS_SHOWN:
        parts.append(f"{len(groups) - GROUPS_SHOWN} more values on the other ranks")
    line = f"the ranks {verb} {name}: {', '.join(parts)}"
    if verb == "disagree on":
        line += ("; every rank must run the same training: compare the nodes' command lines, config files, "
                 "data and environments")
    return line


def ranks_text(ranks):
    """[0, 1, 2, 5] -> 'ranks 0-2, 5'; [3] -> 'rank 3'."""
    runs = []
    for rank in ranks:
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    return f"rank{'s' if len(ranks) > 1 else ''} {text}"


def _digest62(text):
    """62 bits of text's SHA-256, so that its negation is an int64 too."""
    return int.from_bytes(hashlib.sha256(text.encode(errors="backslashreplace")).digest()[:8], "little") >> 2


def file_digest(path):
    """SHA-256 of a regular file's bytes, read a block at a time (hex); what went wrong instead,
    should it no longer be readable."""
    digest = hashlib.sha256()
    try:
        with open_regular(path, OSError) as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
    except OSError as e:
        return f"unreadable ({e})"
    return digest.hexdigest()


def _text(path):
    try:
        with open_regular(path, OSError, "r") as f:
            return f.read(512).strip()
    except (OSError, UnicodeDecodeError):
        return ""


@functools.lru_cache(maxsize=1)
def source_digest():
    """SHA-256 of zerompi's module files (relative path and bytes, in sorted order): two nodes with
    the same version number but other code differ here. Only files that could be modules count
    (an editor's lock or backup file beside them does not)."""
    top = os.path.dirname(os.path.abspath(zerompi.__file__))
    digest = hashlib.sha256()
    for folder, _, files in sorted(os.walk(top)):
        for name in sorted(files):
            path = os.path.join(folder, name)
            if not (name.endswith(".py") and name[:-3].isidentifier() and os.path.isfile(path)):
                continue
            digest.update(os.path.relpath(path, top).encode() + b"\0")
            try:
                with open(path, "rb") as f:
                    digest.update(f.read())
            except OSError as e:             # unreadable: say so, in the digest too
                digest.update(f"unreadable: {e.strerror}".encode())
    return digest.hexdigest()
