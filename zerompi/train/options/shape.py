"""The RunShape of a run: its command line resolved once into the typed objects the reference
takes (zerompi/plan/'s RunShape: sizes, stage, Precision, rows, micro-batches, Grouping,
OverlapConfig, the node map). The run and its --dry-run plan build the same one; below the program
nothing sees a flag or a dtype's name.
"""
from ...overlap import OverlapConfig
from ...plan import RunShape


def overlap_config(cfg):
    return OverlapConfig(enabled=cfg.overlap, bucket_mb=cfg.bucket_mb, prefetch=cfg.prefetch)


def run_shape(cfg, sizes, num_ranks, grouping, node_of_rank=None):
    """What the run's memory and collectives depend on (RunShape, zerompi/plan/__init__.py)."""
    return RunShape(tuple(sizes), cfg.stage, cfg.precision, cfg.micro_batch_size, num_ranks,
                    cfg.grad_accum, grouping, overlap_config(cfg), node_of_rank, bool(cfg.init_weights or cfg.resume),
                    cfg.collective_timeout > 0)
