"""The run's header, printed by rank 0 before the first step: what is trained, how and on what.

    zerompi: ZeRO stage S on N ranks[, the grouping], DTYPE, STEPS steps
    model: MLP IN-HIDDEN-...-CLASSES (P parameters)
    data NAME: R train[, H held out]
    global batch G = N ranks x M micro-batches x B rows

then the device (on a GPU, and for --in-process-ranks: the ranks' threads) and what a resumed
checkpoint changed, one line each.
"""
import textwrap

from ...util.words import counted

HEADER_WIDTH = 80


def print_header(state, sizes, note):
    """Rank 0: what is trained, how and on what; the device; what a resumed checkpoint changed.
    The header's lines have at most 80 columns (a longer one, from a long data path or many
    layers, wraps, indented)."""
    cfg, comm, data, engine = state.cfg, state.comm, state.data, state.engine
    held_out = "" if data.x_test is None else f", {data.x_test.shape[0]} held out"
    fused = ", AdamW fused (Numba)" if cfg.fused_adam else ""
    lines = [f"zerompi: {state.shape.grouping.describe(cfg.stage, comm.size)}, {cfg.dtype}{fused}, {cfg.steps} steps",
             f"model: MLP {'-'.join(map(str, sizes))} ({engine.layout.num_params:,} parameters)",
             f"data {data.name}: {data.x_train.shape[0]} train{held_out}",
             f"global batch {cfg.batch_size} = {counted(comm.size, 'rank')} x {counted(cfg.grad_accum, 'micro-batch')}"
             f" x {counted(state.shape.rows, 'row')}"]
    if comm.device.is_gpu or cfg.in_process_ranks:
        lines.append(f"device: {comm.device.name} on rank 0, {comm.describe_transport()}")
    for line in lines:
        comm.print0(textwrap.fill(line, HEADER_WIDTH, subsequent_indent="  ", break_on_hyphens=False),
                    file=state.out)
    if note:                    # one line each, as the checkpoint code words them (searchable whole)
        comm.print0(note, file=state.out)
