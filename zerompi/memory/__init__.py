"""The ZeRO memory and communication model: what each rank holds and sends.

Notation
--------
    Ψ  number of model parameters
    N  number of data-parallel ranks
    P  bytes of parameter per parameter
    G  bytes of gradient per parameter
    K  bytes of optimizer state per parameter

Mixed-precision Adam: P=2, G=2 (fp16/bf16), K=12 (fp32 master copy, m, v).
fp32 Adam: P=4, G=4, K=8 (m, v; the fp32 parameters are their own master copy).

Model-state memory per rank: stage s partitions one more model state over the N ranks (1: the
optimizer state K, 2: + the gradients G, 3: + the parameters P); what is partitioned costs 1/N,
the rest is whole: stage 1 holds (P + G)Ψ + KΨ/N (partitioned, model_state_bytes). Communication per rank per
step, in elements, ring collectives (a reduce-scatter or all-gather of Ψ moves Ψ(N-1)/N per rank,
an all-reduce, which is one of each, 2Ψ(N-1)/N): c Ψ(N-1)/N with c = 2, 2, 2, 3 passes over Ψ
for stages 0-3 (passes_over_params; stage 3 gathers the parameters for forward and again for
backward). `python -m zerompi.memory --formulas` tabulates both for the four stages (README shows
that table); STAGE_COLLECTIVES below says which collectives run when.

Example (mixed precision, Ψ = 7.5e9, N = 64; ZeRO paper, Figure 1):
120 GB, 31.4 GB, 16.6 GB and 1.9 GB per rank for stages 0 to 3.

A note on stage 1: one source article describes it as an all-reduce of the
gradients followed by an all-gather of the parameters (3Ψ). The ZeRO paper's
partition-aware version, and ours, use reduce-scatter + all-gather (2Ψ):
reduce-scatter already gives each rank exactly the averaged gradient shard
it updates, so the rest of a full all-reduce would be wasted work.

Across nodes, a flat ring over the ranks in rank order sends each rank's whole volume to rank
r+1 mod N: inter-node when that rank is on another node (ring_traffic). With the ranks in
blocks on k > 1 nodes, k ranks send across, one rank's volume out of each node per collective.

Activations, temporary buffers and fragmentation are not modelled.

Across nodes: hybrid sharding and hpZ
-------------------------------------
    L  ranks per node; ranks are placed in blocks, node j holds ranks jL .. jL+L-1
    k  = N/L nodes
    S  shard group of hybrid sharding (--shard-group, S divides N): ZeRO inside each group
       of S consecutive ranks, the N/S groups are replicas of each other
    R  = N/S replicas

Hybrid sharding (PyTorch FSDP2's HSDP, DeepSpeed's MiCS), stages 1-3: each group runs the stage
over its S ranks (reduce-scatter of the gradients, all-gather of the parameters), and the shard a
rank owns, Ψ/S, is all-reduced over the R ranks that own it, one per group, so the replicas stay
equal. hpZ (ZeRO++), stage 3: the parameters keep their primary partition over all N ranks, and
each rank also keeps a secondary copy, the Ψ/L slice of its node, cut from the forward's
all-gather over all N; backward all-gathers those slices over the L ranks of the node only.

    variant          memory per rank                    collectives per step
    ---------------  ---------------------------------  --------------------------------------------
    hybrid, stage s  stage s's formula, N replaced      in the group (S ranks): stage s's own
                     by S: (P + G)Ψ + KΨ/S (s = 1)      (stage 1-2: RS grads + AG params,
                     PΨ + (G + K)Ψ/S (s = 2)            stage 3: AG, AG params + RS grads);
                     (P + G + K)Ψ/S (s = 3)             across groups (R ranks): AR of the Ψ/S shard
    hpZ, stage 3     (P + G + K)Ψ/N + PΨ/L              AG params over N (forward), AG params over
                     (primary over N, secondary over    the node's L ranks (backward), RS grads over N
                     the node)

Ring model of the wire (the ledger's count, zerompi/ledger.py): a ring collective over n ranks
moves (n-1)/n of its buffer per rank for a reduce-scatter or an all-gather, 2(n-1)/n for an
all-reduce, and each rank sends all of it to its successor in the ring (the next rank of the ring,
the last one wrapping to the first). A rank's bytes are inter-node exactly when its successor is
on another node. So a ring over all N ranks crosses at the last rank of each node, k senders when
k > 1; a ring inside a node never crosses; a ring over the R replicas crosses wherever two members
in a row are on different nodes: at every member when S is a multiple of L (R = k when S = L), at
the members in each node's last group when S divides L.

Elements sent per step (one micro-batch) when k > 1; with one node nothing crosses. c = 2, 2, 2, 3
passes over Ψ for stages 0-3, as above (hybrid: the stage's c, inside its groups):

    variant          across nodes, per rank                inside nodes, per rank         across, per node
    ---------------  ------------------------------------  -----------------------------  ----------------
    flat, stage s    c Ψ(N-1)/N by each node's last rank   c Ψ(N-1)/N by the others       c Ψ(N-1)/N
    hybrid, S = L    2(Ψ/L)(k-1)/k by every rank           c Ψ(L-1)/L by every rank       2Ψ(k-1)/k
    hybrid, S | L    2(Ψ/S)(R-1)/R by the ranks of each    c Ψ(S-1)/S by every rank,      2Ψ(R-1)/R
                     node's last group                     + 2(Ψ/S)(R-1)/R by the others
    hybrid, S = mL   c Ψ(S-1)/S by each node's last rank,  c Ψ(S-1)/S by the others       c Ψ(S-1)/S
    (m = 2, 3, ...)  + 2(Ψ/S)(R-1)/R by every rank                                        + 2LΨ(R-1)/(RS)
    hpZ, stage 3     2Ψ(N-1)/N by each node's last rank    Ψ(L-1)/L by every rank,        2Ψ(N-1)/N
                                                           + 2Ψ(N-1)/N by the others

Across nodes, stage 3 moves 3Ψ(N-1)/N per node and step, hpZ 2Ψ(N-1)/N: 3Ψ -> 2Ψ. Hybrid
sharding with S = L sends only the all-reduce of the shards across, 2Ψ(k-1)/k per node at any
stage, on rings of k ranks instead of N. The functions below apply the ring rule to each ring of
the step (ring_traffic_per_rank), so they also cover an S that neither divides L nor is a multiple
of it (its groups straddle nodes unevenly, and some nodes send more than others). In bytes:
elements of the gradients times G, of the parameters times P.

Run `python -m zerompi.memory --params 7e9` for the per-rank table, and
`python -m zerompi.memory --params 7e9 --ranks-per-node 8` for the variants on 1 to 16 nodes
(zerompi/train/commands/memory_table.py prints them).
"""

from dataclasses import dataclass

STAGES = (0, 1, 2, 3)
MOST_RANKS = 1 << 20                 # the most ranks zerompi tabulates or plans (zerompi/plan/preflight.py)
MOST_PARAMS = (1 << 63) // 16        # parameters whose mixed-precision state fills 2^63 bytes: no machine holds more
MOST_LAYERS = 4096                   # the deepest MLP zerompi plans: a refusal's search plans some 40 runs of it


@dataclass(frozen=True)
class BytesPerParam:
    param: float  # P
    grad: float  # G
    optimizer: float  # K


MIXED_PRECISION = BytesPerParam(2, 2, 12)
FP32 = BytesPerParam(4, 4, 8)

# the collectives of each stage, and when they run (zerompi/stages/ runs them; `python -m
# zerompi.memory --formulas` tabulates them beside the formulas below, and README shows that table)
STAGE_COLLECTIVES = (
    "all-reduce of the gradients after backward",
    "reduce-scatter of the gradients after backward; all-gather of the parameters after the step",
    "reduce-scatter of each layer's gradients as backward produces them; all-gather of the "
    "parameters after the step",
    "all-gather of a layer's parameters before its forward and again before its backward; "
    "reduce-scatter of its gradients after its backward",
)


def _check(stage, num_params, num_ranks):
    if stage not in STAGES:
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage!r}")
    if not num_ranks >= 1:
        raise ValueError(f"num_ranks must be >= 1, got {num_ranks!r}")
    if not num_params > 0:
        raise ValueError(f"num_params must be > 0, got {num_params!r}")


def model_size_error(sizes):
    """One line if an MLP of these widths is beyond what zerompi plans: more parameters than any
    machine can address (their buffers' sizes would not fit a C long), or more than MOST_LAYERS
    layers; else None."""
    params = sum(out * (inp + 1) for inp, out in zip(sizes, sizes[1:]))
    shown = "-".join(map(str, sizes)) if len(sizes) <= 8 else f"{sizes[0]}-...-{sizes[-1]} ({len(sizes) - 1} layers)"
    if params > MOST_PARAMS:
        return (f"the MLP {shown} has {params:.2g} parameters: more than any machine can address (2^63 bytes "
                f"hold {MOST_PARAMS:.2g} of them at 16 bytes each); choose smaller --hidden or --classes")
    if len(sizes) - 1 > MOST_LAYERS:
        return f"the MLP {shown} has more layers than the {MOST_LAYERS} zerompi plans: choose fewer layers"
    return None


def partitioned(stage: int) -> dict:
    """{'params': ..., 'grads': ..., 'optimizer': ...}: whether stage `stage` partitions each model
    state over the N ranks (each stage one more: the optimizer state, + gradients, + parameters)."""
    return {"params": stage >= 3, "grads": stage >= 2, "optimizer": stage >= 1}


def model_state_bytes(stage: int, num_params: float, num_ranks: int, b: BytesPerParam) -> dict:
    """{'params': ..., 'grads': ..., 'optimizer': ..., 'total': ...} bytes per rank by the formulas."""
    _check(stage, num_params, num_ranks)
    per_param = {"params": b.param, "grads": b.grad, "optimizer": b.optimizer}
    state = {kind: per_param[kind] * num_params / (num_ranks if split else 1)
             for kind, split in partitioned(stage).items()}
    return dict(state, total=state["params"] + state["grads"] + state["optimizer"])


def comm_elements_per_step(stage: int, num_params: float, num_ranks: int, micro_batches: int = 1) -> float:
    """Per-rank ring volume in elements per step: 2Ψ(N-1)/N for stages 0-2, 3Ψ(N-1)/N for stage 3.

    With K micro-batches per step (gradient accumulation), the stages that keep no full gradient
    between micro-batches communicate per micro-batch: stage 2 reduce-scatters K times,
    (K+1)Ψ(N-1)/N; stage 3 also gathers parameters K times in forward and backward, 3KΨ(N-1)/N.
    """
    _check(stage, num_params, num_ranks)
    return passes_over_params(stage, micro_batches) * num_params * (num_ranks - 1) / num_ranks


def passes_over_params(stage: int, micro_batches: int = 1) -> int:
    """c in c Ψ(N-1)/N: the passes over Ψ of one step's collectives, as _stage_collectives lists
    them (2, 2, 2, 3 for stages 0-3 with one micro-batch)."""
    _check(stage, 1, 1)
    return sum(c.passes for c in _stage_collectives(stage, 1, None, micro_batches))


# ---------------------------------------------------------------- across nodes: hybrid sharding and hpZ
# Memory of the hierarchical variants, and the ring model of every variant's traffic split into
# intra- and inter-node elements ("Across nodes" in the module docstring).


def _check_divides(name, size, num_ranks):
    if not (isinstance(num_ranks, int) and isinstance(size, int) and size >= 1 and num_ranks % size == 0):
        raise ValueError(f"{name} must be an integer >= 1 that divides num_ranks = {num_ranks!r}, "
                         f"got {size!r}")


def _check_hybrid(stage, num_params, num_ranks, shard_group):
    _check(stage, num_params, num_ranks)
    if stage == 0:
        raise ValueError("hybrid sharding shards stage 1, 2 or 3 inside the groups, got stage 0")
    _check_divides("shard_group", shard_group, num_ranks)


def _check_nodes(num_params, num_ranks, ranks_per_node):
    _check(3, num_params, num_ranks)                     # hpZ is a form of stage 3
    _check_divides("ranks_per_node", ranks_per_node, num_ranks)


def hybrid_model_state_bytes(stage: int, num_params: float, num_ranks: int, shard_group: int,
                             b: BytesPerParam) -> dict:
    """Bytes per rank of hybrid sharding: stage 1-3 inside groups of S ranks, N replaced by S."""
    _check_hybrid(stage, num_params, num_ranks, shard_group)
    return model_state_bytes(stage, num_params, shard_group, b)


def hpz_model_state_bytes(num_params: float, num_ranks: int, ranks_per_node: int, b: BytesPerParam) -> dict:
    """Bytes per rank of stage 3 with hpZ: 'params' holds the primary shard PΨ/N and the
    secondary one, the node's slice PΨ/L."""
    _check_nodes(num_params, num_ranks, ranks_per_node)
    state = model_state_bytes(3, num_params, num_ranks, b)
    secondary = b.param * num_params / ranks_per_node
    return {**state, "params": state["params"] + secondary, "total": state["total"] + secondary}


@dataclass(frozen=True)
class RingCollective:
    """One collective of a training step, run at once on disjoint rings of ranks."""
    purpose: str        # "grads" (reduce-scatter, all-reduce) or "params" (all-gather), as the ledger counts
    passes: int         # 1 for reduce-scatter and all-gather, 2 for all-reduce
    numel: float        # elements of the buffer: the ring moves passes * numel * (n-1)/n per rank
    rings: tuple        # each ring's ranks in ring order


def _blocks(num_ranks, size):
    """Rings of `size` consecutive ranks: (0 .. size-1), (size .. 2 size-1), ..."""
    return tuple(tuple(range(first, first + size)) for first in range(0, num_ranks, size))


def _strided(num_ranks, size):
    """Rings of the ranks at the same place in each block of `size`: (0, size, 2 size, ...), (1, ...)."""
    return tuple(tuple(range(first, num_ranks, size)) for first in range(size))


def _stage_collectives(stage, num_params, rings, micro_batches=1, kept=0):
    """What stage s runs on each ring per step. Stages 0-1 reduce once per step (an all-reduce
    is a reduce-scatter + an all-gather: 2 passes over Ψ); with M micro-batches, stage 2
    reduce-scatters M times and stage 3 gathers twice and reduce-scatters, M times; its backward
    gathers Ψ - kept (--keep-last-layer: kept = the last layer's elements, still gathered)."""
    m = micro_batches
    if stage == 0:
        return [RingCollective("grads", 2, num_params, rings)]                # all-reduce
    if stage in (1, 2):
        return [RingCollective("grads", m if stage == 2 else 1, num_params, rings),   # reduce-scatter
                RingCollective("params", 1, num_params, rings)]               # all-gather after the update
    return [RingCollective("params", m, num_params, rings),                   # all-gather in forward
            RingCollective("params", m, num_params - kept, rings),            # all-gather in backward
            RingCollective("grads", m, num_params, rings)]                    # reduce-scatter


def flat_collectives(stage: int, num_params: float, num_ranks: int, micro_batches: int = 1, kept: float = 0) -> list:
    """Stage 0-3 over all N ranks: one ring."""
    _check(stage, num_params, num_ranks)
    return _stage_collectives(stage, num_params, _blocks(num_ranks, num_ranks), micro_batches, kept)


def hybrid_collectives(stage: int, num_params: float, num_ranks: int, shard_group: int,
                       micro_batches: int = 1, kept: float = 0) -> list:
    """Stage 1-3 inside each group of S consecutive ranks, then the all-reduce of each owned shard
    (Ψ/S elements) over the R = N/S ranks that own it, one per group, once per step (after the
    last micro-batch: the group's sums accumulate until then)."""
    _check_hybrid(stage, num_params, num_ranks, shard_group)
    return (_stage_collectives(stage, num_params, _blocks(num_ranks, shard_group), micro_batches, kept) +
            [RingCollective("grads", 2, num_params / shard_group, _strided(num_ranks, shard_group))])


def hpz_collectives(num_params: float, num_ranks: int, ranks_per_node: int, micro_batches: int = 1,
                    kept: float = 0) -> list:
    """Stage 3 with hpZ: forward's all-gather over all N (each rank keeps its node's slice of it),
    backward's all-gather of those slices over the L ranks of the node, the reduce-scatter over all N
    (each once per micro-batch)."""
    _check_nodes(num_params, num_ranks, ranks_per_node)
    everyone, nodes, m = _blocks(num_ranks, num_ranks), _blocks(num_ranks, ranks_per_node), micro_batches
    return [RingCollective("params", m, num_params, everyone),
            RingCollective("params", m, num_params - kept, nodes),
            RingCollective("grads", m, num_params, everyone)]


def ring_traffic(collectives: list, node_of_rank) -> list:
    """Elements each rank sends per step in the ring model, by link and purpose, rank r on node
    node_of_rank[r] (any placement): [{'intra': {'grads': ..., 'params': ...}, 'inter': {...}}, ...].

    A rank's share of a ring collective goes to its successor in the ring (the next rank of the
    ring, the last wrapping to the first): inter-node when the successor is on another node."""
    traffic = [{link: {"grads": 0.0, "params": 0.0} for link in ("intra", "inter")} for _ in node_of_rank]
    for collective in collectives:
        for ring in collective.rings:
            per_rank = collective.passes * collective.numel * (len(ring) - 1) / len(ring)
            for rank, successor in zip(ring, ring[1:] + ring[:1]):
                link = "intra" if node_of_rank[rank] == node_of_rank[successor] else "inter"
                traffic[rank][link][collective.purpose] += per_rank
    return traffic


def ring_traffic_per_rank(collectives: list, num_ranks: int, ranks_per_node: int) -> list:
    """ring_traffic for ranks placed in blocks of L per node (rank r on node r // L)."""
    _check_divides("ranks_per_node", ranks_per_node, num_ranks)
    return ring_traffic(collectives, [rank // ranks_per_node for rank in range(num_ranks)])


def inter_node_per_node(traffic: list, ranks_per_node: int) -> list:
    """Elements each node sends to other nodes per step, {'grads': ..., 'params': ...} by node:
    the sum of its ranks' inter-node traffic (from ring_traffic_per_rank)."""
    return [{purpose: sum(t["inter"][purpose] for t in traffic[first:first + ranks_per_node])
             for purpose in ("grads", "params")}
            for first in range(0, len(traffic), ranks_per_node)]


def wire_bytes(elements: dict, b: BytesPerParam) -> float:
    """Bytes of {'grads': ..., 'params': ...} elements: gradients at G bytes, parameters at P."""
    return b.grad * elements["grads"] + b.param * elements["params"]
