"""--offload-optimizer: the AdamConfig a run builds its optimizer from (with --fused-adam's kernel),
and the file tier's folder.

    none   zerompi/adam.py's AdamConfig: the state in the device's memory
    host   zerompi/offload/'s HostTier on a GPU; on a CPU run the host is the device: one warning
           line, and the run goes on as without offload
    file   zerompi/offload/'s FileTier in --offload-dir, after the lowest rank on each host took
           the folder's lock for its host (`.zerompi-offload.<host>.lock`, zerompi/train/loop/lock.py:
           two runs on one host cannot share the folder; the folder may be node-local) and removed
           what a dead run left there; every rank then creates its own file (zerompi/offload/stores.py)

The scratch files are unlinked as soon as they are open, so a run leaves none behind however it
ends; a file named like one (a run killed in the instant between creating and unlinking it) is
removed by the next run that takes the lock, when the process it names is no longer running.
"""
import os
import socket
import stat
import zlib

import numpy as np

from ...adam import AdamConfig
from ...checkpoint.files import CheckpointError
from ...fused import FusedAdamKernel, compiled_loop
from ...offload import FILE_PREFIX, FileTier, OffloadedAdamConfig
from ..options.shape import offload_tier
from ...util.atomic import process_running
from .lock import take_lock


def adam_config_for(cfg, comm, device, out):
    """Collective: the run's AdamConfig (offloaded as --offload-optimizer and --offload-params say).
    A folder whose lock another run holds: one line, every rank exits BAD_INPUT."""
    tier = offload_tier(cfg, device.is_gpu, comm.rank)
    hyper = dict(beta1=cfg.beta1, beta2=cfg.beta2, eps=cfg.eps, weight_decay=cfg.weight_decay,
                 kernel=fused_kernel(cfg, comm, device.is_gpu and cfg.offload_optimizer == "none"))
    param_tier = offload_tier(cfg, device.is_gpu, comm.rank, cfg.offload_params)
    for flag, choice in (("optimizer", cfg.offload_optimizer), ("params", cfg.offload_params)):
        if choice == "host" and not device.is_gpu:
            comm.print0(f"zerompi: warning: --offload-{flag} host on a CPU run: the host is the device, so the "
                        "state stays where it is (use file to move it out of memory)", file=out)
    if FileTier not in (type(tier), type(param_tier)):
        return OffloadedAdamConfig(**hyper, tier=tier, param_tier=param_tier) if tier else AdamConfig(**hyper)
    host = socket.gethostname()
    hosts = np.zeros(comm.size, np.int64)                   # each rank's host, as a number (one max_all)
    hosts[comm.rank] = zlib.crc32(host.encode()) + 1
    comm.max_all(hosts)
    error = None
    if comm.rank == int(np.flatnonzero(hosts == hosts[comm.rank])[0]):     # the lowest rank on this host
        error = lock_and_sweep(cfg.offload_dir, f".{FILE_PREFIX}.{host}.lock", out)
    comm.check_all(error)                                   # every sweep done before any rank creates its file
    return OffloadedAdamConfig(**hyper, tier=tier, param_tier=param_tier)


def fused_kernel(cfg, comm, update_on_gpu):
    """Collective: --fused-adam's FusedAdamKernel (zerompi/fused/), or None (the device's update);
    one line, every rank exits BAD_INPUT, where it cannot run."""
    if not cfg.fused_adam:
        return None
    comm.check_all("--fused-adam compiles the CPU's AdamW, and this run updates on the GPU in one kernel "
                   "already (it applies with --offload-optimizer, whose update runs on the CPU)" if update_on_gpu
                   else numba_error())
    return FusedAdamKernel()


def numba_error():
    """--fused-adam's one line when Numba does not import here (or cannot compile), else None."""
    try:
        compiled_loop()
    except Exception as e:                      # not installed, or built for another NumPy
        reason = "" if isinstance(e, ModuleNotFoundError) else f" ({type(e).__name__}: {e})".splitlines()[0]
        return f"--fused-adam needs Numba: pip install -e '.[fast]' (or pip install numba){reason}"
    return None


def lock_and_sweep(folder, lock_name, out):
    """Take folder's lock for this host and node (a stale one taken over: one line on out), then
    remove the scratch files of this host's dead runs; a one-line problem, or None."""
    try:
        note = take_lock(folder, lock_name)
    except CheckpointError as e:
        return f"--offload-dir: {e}"
    if note:
        print(note, file=out, flush=True)
    host_prefix = f"{FILE_PREFIX}.{socket.gethostname()}."
    try:
        names = os.listdir(folder)
    except OSError as e:
        return f"--offload-dir {folder}: cannot be listed: {e.strerror}"
    for name in names:
        pid = name[len(host_prefix):].split(".")[0]
        if name.startswith(host_prefix) and pid.isdigit() and not process_running(int(pid)):
            path = os.path.join(folder, name)
            try:
                if stat.S_ISREG(os.lstat(path).st_mode):    # a regular file, as a run made it
                    os.unlink(path)
            except OSError:                                 # gone meanwhile, or not this user's to remove
                pass
    return None
