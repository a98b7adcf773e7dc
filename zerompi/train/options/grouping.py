"""--shard-group and --hpz: from the flags to the Grouping the engine builds (zerompi/hierarchy/).

    --shard-group world      flat ZeRO: every layer sharded over all N ranks (the default)
    --shard-group node       hybrid sharding with S = the ranks of a node
    --shard-group S          hybrid sharding with groups of S consecutive ranks (S divides N)
    --hpz                    stage 3 with a secondary partition over the ranks of each node

`grouping_error` checks what the flags alone decide (on every rank alike, before MPI work);
`resolve_grouping` reads where the ranks are (the node map every rank holds, zerompi/nodes.py)
and returns the Grouping, or the first problem as one line, the same on every rank.
"""
from ...hierarchy import FLAT, Grouping
from ...hierarchy.groups import node_size, shard_group_error

WORLD, NODE = "world", "node"


def group_size(spec):
    """S from `--shard-group S` (ASCII digits only: str.isdigit also takes '²'), else None."""
    return int(spec) if spec.isascii() and spec.isdigit() else None


def grouping_error(cfg, num_ranks):
    """The first problem with --shard-group / --hpz for N = num_ranks, one line, or None."""
    spec = cfg.shard_group
    if spec not in (WORLD, NODE) and group_size(spec) is None:
        return f"--shard-group must be world, node or a number of ranks, got {spec!r}"
    hybrid = spec != WORLD
    if hybrid and cfg.stage == 0:
        return "--shard-group shards ZeRO's state: it needs --stage 1, 2 or 3"
    if cfg.hpz and cfg.stage != 3:
        return "--hpz partitions stage 3's parameters a second time: it needs --stage 3"
    if cfg.hpz and hybrid:
        return "--hpz and --shard-group are two ways to keep traffic in the node: choose one"
    if (hybrid or cfg.hpz) and cfg.overlap:
        return f"{'--hpz' if cfg.hpz else '--shard-group'} runs without --overlap: leave --overlap off"
    if (hybrid or cfg.hpz) and cfg.comm == "nccl":
        return f"{'--hpz' if cfg.hpz else '--shard-group'} runs its collectives through MPI: use --comm mpi"
    if group_size(spec) is not None:
        return shard_group_error(group_size(spec), num_ranks)
    return None


def resolve_grouping(cfg, comm):
    """(Grouping, error), the same on every rank; where the node matters (`node`, --hpz) from
    the communicator's node map."""
    if group_size(cfg.shard_group) is not None:
        return Grouping(shard_group=group_size(cfg.shard_group)), None
    if cfg.shard_group == WORLD and not cfg.hpz:
        return FLAT, None
    ranks_per_node, error = node_size(comm)
    if cfg.hpz:
        return Grouping(hpz_node_size=ranks_per_node), error
    return Grouping(shard_group=ranks_per_node), error
