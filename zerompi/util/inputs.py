"""Reading what the user names, safely: regular files only, and sizes checked before allocating.

Every file zerompi reads from a path the user gave (data, weights, config files, checkpoints and
their `latest`) is opened through `open_regular`:

    fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY)     never blocks, even on a FIFO
    fstat(fd) is a regular file?                          else: one line, the file is not read
    back to blocking reads; return a file object          the same file that was checked

Checking the open descriptor (not the path, then opening) leaves no window in which the path can
be swapped for a FIFO or a device. A FIFO, a device or a folder would otherwise block forever or
read without end, before any collective runs, where the watchdog cannot see it. A file read whole
(a config file, a calibration) is also bounded: `read_whole` refuses one of more than
WHOLE_FILE_LIMIT bytes, by its size and by what it yields (a file may grow while it is read).

A file also declares sizes (an .npy header's shape, a manifest's ranks and layers): `check_fits`
compares the bytes they would allocate with what this process may still use before anything is
allocated, so a file that lies about its size costs one line, not the node's memory:

    available = min( MemAvailable (/proc/meminfo) / ranks sharing the node,
                     the cgroup's limit - usage (v2 memory.max, v1 memory.limit_in_bytes;
                       the tightest of its own and its ancestors', / ranks sharing it),
                     the address-space limit (ulimit -v) - what the process maps already )

A limit the system does not report is left out; where none is known, nothing is refused.

What the user names is also shown back, in error lines and notes: `printable` escapes the control
characters a path or a flag may hold (a newline would break the one-line rule, an escape sequence
would redraw the terminal), as Python's string escapes (\\n, \\x1b).
"""
import os
import resource
import stat

from .words import format_bytes

FILE_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
              (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def open_regular(path, error, mode="rb"):
    """The file at path, opened for reading, if it is a regular file; else raises error(one line
    naming path). error: the caller's exception class (DataError, CheckpointError, ...)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except OSError as e:
        raise error(f"{path}: cannot be read: {e.strerror or e}") from None
    try:
        mode_bits = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode_bits):
            kind = next((name for test, name in FILE_KINDS if test(mode_bits)), "not a regular file")
            raise error(f"{path}: is {kind}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))
    except BaseException:
        os.close(fd)
        raise


def printable(text, lines=False):
    """text with each character that is not printable shown as its escape (\\n, \\x1b, \\udcff for
    a byte that is not UTF-8); lines: the newlines that separate lines are kept."""
    return "\n".join("".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in line)
                     for line in (text.split("\n") if lines else [text]))


WHOLE_FILE_LIMIT = 1 << 20          # a config file or a calibration is a few kB


def read_whole(path, error, what, mode="rb"):
    """The whole content of the regular file at path, at most WHOLE_FILE_LIMIT bytes; else raises
    error(one line naming path: it is not `what`, e.g. "a config file")."""
    with open_regular(path, error, mode) as f:
        size = os.fstat(f.fileno()).st_size
        content = f.read(WHOLE_FILE_LIMIT + 1) if size <= WHOLE_FILE_LIMIT else None
    if content is None or len(content) > WHOLE_FILE_LIMIT:
        raise error(f"{path}: larger than {format_bytes(WHOLE_FILE_LIMIT)}, too large for {what}")
    return content


def available_bytes(ranks_on_node=1):
    """The bytes this process may still allocate (see the module docstring), or None if unknown."""
    return memory_limit(ranks_on_node)[0]


def memory_limit(ranks_on_node=1):
    """(bytes this process may still allocate, which limit that is), or (None, None) if unknown."""
    limits = []
    meminfo = _read_numbers("/proc/meminfo", "MemAvailable:")
    if meminfo is not None:
        limits.append((meminfo * 1024 // max(1, ranks_on_node),
                       "the node's available memory" + (f" shared by {ranks_on_node} ranks" if ranks_on_node > 1 else "")))
    cgroup = cgroup_room()
    if cgroup is not None:
        limits.append((cgroup[0] // max(1, ranks_on_node),
                       cgroup[1] + (f" shared by {ranks_on_node} ranks" if ranks_on_node > 1 else "")))
    address_limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    mapped = _read_numbers("/proc/self/status", "VmSize:")
    if address_limit != resource.RLIM_INFINITY and mapped is not None:
        limits.append((max(0, address_limit - mapped * 1024),
                       "the address-space limit (ulimit -v) less what the process maps already"))
    return min(limits, key=lambda limit: limit[0]) if limits else (None, None)


# where each cgroup version keeps a memory limit: (mounts of the controller, limit file, usage file)
CGROUP_V2 = (("/sys/fs/cgroup", "/sys/fs/cgroup/unified"), "memory.max", "memory.current")
CGROUP_V1 = (("/sys/fs/cgroup/memory",), "memory.limit_in_bytes", "memory.usage_in_bytes")


def cgroup_room():
    """(bytes, which file) the tightest memory cgroup around this process has left: the least of
    limit - usage over its cgroup and their ancestors (a job's limit may sit on a parent: Slurm's
    job_N above step_M), in cgroup v2 ("0::/path" in /proc/self/cgroup) or v1 ("N:memory:/path");
    None where no limit is set."""
    room = None
    for line in (_read_text("/proc/self/cgroup") or "").splitlines():
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0":
            mounts, limit_file, usage_file = CGROUP_V2
        elif "memory" in controllers.split(","):
            mounts, limit_file, usage_file = CGROUP_V1
        else:
            continue
        for mount in mounts:
            folder = path
            while folder.startswith("/"):
                limit = _read_text(mount + folder.rstrip("/") + "/" + limit_file)
                used = _read_text(mount + folder.rstrip("/") + "/" + usage_file)
                numbers = all(text and text.isascii() and text.isdigit() for text in (limit, used))
                if numbers and int(limit) < 1 << 62:          # v1 writes "no limit" as a huge number
                    left = max(0, int(limit) - int(used))
                    if room is None or left < room[0]:
                        room = (left, f"the cgroup's {limit_file} in {mount + folder}")
                folder = "" if folder == "/" else os.path.dirname(folder)
    return room


def check_fits(nbytes, what, error, ranks_on_node=1):
    """Raise error(one line) if allocating nbytes for `what` (e.g. "data.npz: 'x' of shape
    (100000000000, 4) float64") would exceed the bytes available to this process."""
    available = available_bytes(ranks_on_node)
    if available is not None and nbytes > available:
        raise error(f"{what} needs {format_bytes(nbytes)}, more than the {format_bytes(available)} "
                    f"this process can still allocate")


def _read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _read_numbers(path, key):
    """The first number on the line of path that starts with key (kB in /proc files), or None."""
    text = _read_text(path)
    for line in (text or "").splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return None
