"""The RunShape of a run: its command line resolved once into the typed objects the reference
takes (zerompi/plan/'s RunShape: sizes, stage, Precision, rows, micro-batches, Grouping,
OverlapConfig, the node map). The run and its --dry-run plan build the same one; below the program
nothing sees a flag or a dtype's name.
"""
from ...fused import FusedAdamKernel
from ...offload import FileTier, HostTier
from ...overlap import OverlapConfig
from ...plan import RunShape
from ...quantize import Quantizer


def overlap_config(cfg):
    return OverlapConfig(enabled=cfg.overlap, bucket_mb=cfg.bucket_mb, prefetch=cfg.prefetch)


def offload_tier(cfg, on_gpu, rank, choice=None):
    """--offload-optimizer's tier (or choice's: --offload-params'; zerompi/offload/), or None: the
    device's memory (and a CPU run's host tier, the host being the device)."""
    choice = cfg.offload_optimizer if choice is None else choice
    if choice == "file":
        return FileTier(cfg.offload_dir, rank)
    # a CPU's host tier is its memory; kept for the optimizer that updates a parameter file
    return HostTier() if choice == "host" and (on_gpu or cfg.offload_params == "file") else None


def run_shape(cfg, sizes, num_ranks, grouping, node_of_rank=None, on_gpu=False, rank=0):
    """What the run's memory and collectives depend on (RunShape, zerompi/plan/__init__.py)."""
    return RunShape(tuple(sizes), cfg.stage, cfg.precision, cfg.micro_batch_size, num_ranks,
                    cfg.grad_accum, grouping, overlap_config(cfg), node_of_rank, bool(cfg.init_weights or cfg.resume),
                    cfg.collective_timeout > 0, offload_tier(cfg, on_gpu, rank),
                    offload_tier(cfg, on_gpu, rank, cfg.offload_params),
                    quantizer(cfg.quantize_weights, cfg.quant_block), quantizer(cfg.quantize_grads, cfg.quant_block),
                    cfg.quant_error, FusedAdamKernel() if cfg.fused_adam else None, cfg.keep_last_layer)


def quantizer(choice, block):
    """--quantize-weights' or --quantize-grads' Quantizer (zerompi/quantize/), or None (exact)."""
    return {"none": None, "int8": Quantizer(8, block), "int4": Quantizer(4, block)}[choice]
