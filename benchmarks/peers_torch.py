"""PyTorch peers for benchmarks/step_time.py: DDP, DDP + ZeroRedundancyOptimizer, FSDP2.

Optional (`pip install torch==2.13.0`), never a dependency of zerompi. Same MLP (nn.Linear +
nn.GELU(approximate="tanh")), same batch per rank, float32, Adam, 1 thread per rank, gloo over
localhost; torch.distributed is initialized from the environment, with the port chosen by rank 0
and broadcast over MPI. Each peer is timed exactly as zerompi (timed_repeats from step_time.py).
"""
import os
import socket

import torch
import torch.distributed as dist
from torch import nn

LR = 1e-3


def init_distributed(comm):
    if dist.is_initialized():
        return
    port = None
    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      RANK=str(comm.Get_rank()), WORLD_SIZE=str(comm.Get_size()))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="env://")


def make_mlp(sizes):
    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(fan_in, fan_out))
        if i < len(sizes) - 2:
            layers.append(nn.GELU(approximate="tanh"))
    return nn.Sequential(*layers)


def adam_kwargs():
    """fused Adam where this torch has it on CPU, else foreach."""
    try:
        torch.optim.Adam([nn.Parameter(torch.zeros(1))], lr=LR, fused=True)
        return {"fused": True}
    except (RuntimeError, ValueError, TypeError):
        return {"foreach": True}


def build(name, sizes):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = make_mlp(sizes)
    kw = adam_kwargs()
    if name == "ddp":
        model = DDP(model)
        return model, torch.optim.Adam(model.parameters(), lr=LR, **kw), f"DDP (Adam {list(kw)[0]})"
    if name == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        model = DDP(model)
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=LR, **kw)
        return model, opt, f"DDP+ZeRO-opt ({list(kw)[0]})"
    if name == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        kw = {"foreach": True}                        # fused Adam on CPU DTensors: not relied on
        return model, torch.optim.Adam(model.parameters(), lr=LR, **kw), "FSDP2 fully_shard (foreach)"
    raise ValueError(f"unknown peer {name!r}")


def run_peers(comm, args, timed_repeats):
    """{name: {"label", "step_s", "repeats_s"} or {"error"}} for each of args.peers."""
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    init_distributed(comm)
    B, sizes = args.batch_per_rank, args.sizes
    gen = torch.Generator().manual_seed(1000 + comm.Get_rank())
    x = torch.randn(B, sizes[0], generator=gen)
    y = torch.randint(0, sizes[-1], (B,), generator=gen)
    loss_fn = nn.CrossEntropyLoss()
    results = {}
    for name in args.peers:
        error = None
        try:
            model, opt, label = build(name, sizes)

            def step():
                opt.zero_grad(set_to_none=True)
                loss_fn(model(x), y).backward()
                opt.step()
            median, per_repeat = timed_repeats(step, args.repeats, args.steps, args.warmup)
            results[name] = {"label": label, "step_s": median, "repeats_s": per_repeat}
        except Exception as e:                        # noqa: BLE001: report and go on
            error = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        # a peer that failed on one rank only must not leave the other waiting in a collective
        errors = comm.allgather(error)
        if any(errors):
            results[name] = {"error": next(e for e in errors if e)}
        dist.barrier()
        model = opt = None
    dist.destroy_process_group()
    return results
