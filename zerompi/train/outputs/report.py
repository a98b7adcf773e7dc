"""The end-of-run report: each rank's measured memory and communication beside the formulas.

Measured (from zerompi/ledger.py): bytes of every buffer allocated, by kind; the OS peak RSS; the
ring volume of every collective, counted from the buffer handed to MPI (elements, and bytes: 16-bit
gradients are reduced in float32, so their bytes are 4 per element).
Formulas: zerompi.memory's (`python -m zerompi.memory --formulas` tabulates them), with P, G, K
from zerompi/precision.py (float32: 4, 4, 8 as m and v; float64: 8, 8, 16; bf16 and fp16: 2, 2, 12
as the fp32 master, m and v); communication c Psi (N-1)/N elements, c the step's passes over Psi.

Each formula is shown twice: at Psi (the model's parameter count) and at Psi_pad (each layer padded
to a multiple of N, what the buffers really hold). Measured equals the Psi_pad column exactly;
the difference from the Psi column is the padding, at most N-1 elements per layer.

Intra- and inter-node: the ring volume split by the ledger's ring model (zerompi/ledger.py):
each rank sends its whole ring volume to its successor in the ring, inter-node when that rank is
on another node. Formula (zerompi.memory.ring_traffic over the step's rings), with V the comm
formula above, flat ZeRO:

    inter-node per rank per step   V if rank r+1 mod N is on another node, else 0
    intra-node                     V - inter-node
    summed over ranks              k V on k > 1 nodes with the ranks in blocks (the ring leaves
                                   each node once per collective)

Hybrid sharding and hpZ (zerompi/hierarchy/): the same rule over each of their rings (the shard
groups, the replica groups, the nodes), and the memory formula of the variant (zerompi.memory).

qwZ and qgZ (--quantize-weights, --quantize-grads; zerompi/quantize/): the parameter gathers and
the gradient reductions send int8 levels, one byte per element (the elements and their formula
unchanged; int4 gradients two to a byte, counted as the bytes they are, their formula sum_u
ceil(n_u / 2) per owner), and float32 scales under their own purpose: 4 (N-1) ceil(n_u / B) bytes per quantized
call on layer u (n_u its shard), 2 M gathers per step (M with hpZ: backward gathers the node's
exact copy) and M reductions.

Rank 0 gathers every rank's numbers with one buffer Gather and prints a table or JSON.
"""
import json

import numpy as np

from ...ledger import MEMORY_KINDS
from ...memory import passes_over_params, ring_traffic
from ...offload import OffloadedAdamW
from ...quantize import SCALES, QuantizedCollectives, alltoall_elements, owner_words, scales_ring_bytes
from ...util.words import counted, format_bytes

OFFLOADED = {"optimizer": "optimizer state", "params": "parameters"}    # what the report calls each kind
MOVES = ("to_host", "to_device", "file_read", "file_written")    # zerompi/offload/'s TierTraffic, per step
COLUMNS = MEMORY_KINDS + ("peak_rss", "grads_elements", "params_elements", "comm_bytes", "calls", "comm_seconds",
                          "grads_intra_node_bytes", "grads_inter_node_bytes", "params_intra_node_bytes",
                          "params_inter_node_bytes", "intra_node_elements", "inter_node_elements", "scales_bytes",
                          "host_bytes", "file_bytes", *(f"{kind}{side}" for side in ("", "_formula") for kind in MOVES))


def tier_numbers(engine, steps, moved, micro_batches):
    """This rank's bytes in the host and file tiers, what the training steps moved between tiers
    per step (`moved`, a mean over the steps run: a skipped step moves less) and the formula of one
    step (zerompi/offload/)."""
    memory, adam = engine.memory, engine.stage.adam
    tiers = [memory.bytes_by_tier["host"], memory.bytes_by_tier["file"]]
    if not isinstance(adam, OffloadedAdamW):
        return tiers + [0.0] * 2 * len(MOVES)
    formula = adam.formula_per_step(micro_batches)
    return tiers + [getattr(moved, kind) / steps for kind in MOVES] + [getattr(formula, kind) for kind in MOVES]


def rank_numbers(engine, train_comm, steps, moved=None, micro_batches=1):
    """This rank's measured numbers, per step for communication. train_comm: the CommLedger
    totals of the training steps only, as {purpose: (calls, bytes, elements, seconds, inter-node
    bytes, inter-node elements)}."""
    memory = engine.memory
    steps = max(steps, 1)                  # a resumed run with no steps left moved nothing
    grads, params, scales = train_comm["grads"], train_comm["params"], train_comm[SCALES]
    inter_elements = grads[5] + params[5]
    return np.array([memory.bytes_by_kind[k] for k in MEMORY_KINDS] +
                    [memory.peak_rss_bytes(), grads[2] / steps, params[2] / steps,
                     (grads[1] + params[1] + scales[1]) / steps, (grads[0] + params[0] + scales[0]) / steps,
                     (grads[3] + params[3] + scales[3]) / steps,
                     (grads[1] - grads[4]) / steps, grads[4] / steps, (params[1] - params[4]) / steps,
                     params[4] / steps, (grads[2] + params[2] - inter_elements) / steps, inter_elements / steps,
                     scales[1] / steps,
                     *tier_numbers(engine, steps, moved, micro_batches)], dtype=np.float64)


def build_report(engine, train_comm, steps, stage, micro_batches, grouping, moved=None):
    """Collective. On rank 0: a dict with every rank's numbers and the formulas; None elsewhere.
    moved: the training steps' TierTraffic (zerompi/offload/), or None."""
    comm, layout = engine.comm, engine.layout
    mine = rank_numbers(engine, train_comm, steps, moved, micro_batches)
    everyone = np.zeros((comm.size, mine.size)) if comm.rank == 0 else None
    comm.gather_to_root(mine, everyone)
    if comm.rank != 0:
        return None
    bytes_per_param = engine.stage.precision.bytes_per_param()
    n, psi, psi_pad = comm.size, layout.num_params, layout.full_numel
    # [intra-node, inter-node] elements of each rank per step, and their sum (the same on every rank)
    qgz = engine.stage.collectives.grads if isinstance(engine.stage.collectives, QuantizedCollectives) else None
    owner = (psi / n * qgz.bits / 8, owner_words(qgz, layout)) if qgz else (None, None)   # at Psi, Psi_pad
    hops = engine.stage.collectives.node_size if qgz else None
    last = layout.layers[-1]                     # --keep-last-layer: its backward gather is not made
    kept = (last.numel, last.padded) if stage == 3 and engine.stage.keep_last_layer else (0, 0)
    split = [formula_split(grouping.ring_collectives(stage, num, n, micro_batches, k), comm.node_of_rank,
                           alltoall_elements(words, micro_batches, comm.node_of_rank, hops) if qgz else None)
             for num, words, k in zip((psi, psi_pad), owner, kept)]
    return {
        "stage": stage, "ranks": n, "steps": steps, "dtype": engine.stage.precision.name,
        "grouping": grouping.describe(stage, n), "shard_group": grouping.shard_group or n,
        "hpz_ranks_per_node": grouping.hpz_node_size,
        "psi": psi, "psi_padded": psi_pad, "bytes_per_param": bytes_per_param.__dict__,
        "memory_formula_bytes": grouping.model_state_bytes(stage, psi, n, bytes_per_param),
        "memory_formula_padded_bytes": grouping.model_state_bytes(stage, psi_pad, n, bytes_per_param),
        "micro_batches": micro_batches, "kept_last_layer_elements": kept[0],
        "comm_formula_elements_per_step": sum(split[0][0]),
        "comm_formula_padded_elements_per_step": sum(split[1][0]),
        "nodes": len(set(comm.node_of_rank)), "node_of_rank": list(comm.node_of_rank),
        "comm_formula_node_elements_per_step": split[0],
        "comm_formula_padded_node_elements_per_step": split[1],
        "per_rank": [dict(zip(COLUMNS, map(float, row))) for row in everyone],
        "offloaded": offloaded_kinds(everyone),
        **quantized(engine.stage.collectives, layout, micro_batches, grouping, kept[0] > 0),
    }


def quantized(collectives, layout, micro_batches, grouping, kept_last=False):
    """qwZ's and qgZ's block, what they quantize, and the scales' formula bytes per step: 2 M quantized
    gathers of every layer (M with hpZ; M fewer of the last with --keep-last-layer, kept_last) and M
    quantized reductions; {} without either."""
    if not isinstance(collectives, QuantizedCollectives):
        return {}
    weights, grads, hops = collectives.weights, collectives.grads, collectives.node_size
    gathers = micro_batches * (1 if grouping.hpz_node_size else 2) if weights else 0
    calls = [(gathers, weights), (micro_batches if grads else 0, grads)]    # two hops send N - 1 slots too
    return {"quantize_block": (weights or grads).block, "two_hops_node_size": hops,
            "quant_error": error_summary(collectives.error),
            "quantized": [f"{name} as int{q.bits}" for name, q in (("parameters", weights), ("gradients", grads)) if q],
            "scales_formula_bytes_per_step": sum(n * scales_ring_bytes(layout, q) for n, q in calls if n) - (
                micro_batches * 4 * (layout.num_ranks - 1) * weights.blocks(layout.layers[-1].shard_size)
                if kept_last and weights and not grouping.hpz_node_size else 0)}


def error_summary(error):
    """--quant-error's {kind: {mean, max, steps}} of the steps' relative L2 errors (the steps that
    have one: not an overflowed fp16 step's), or None."""
    summary = {}
    for kind, values in zip(("weights", "grads"), zip(*(error.steps if error is not None else ()))):
        values = [v for v in values if v is not None]
        if values:
            summary[kind] = {"mean": sum(values) / len(values), "max": max(values), "steps": len(values)}
    return summary or None


def offloaded_kinds(everyone):
    """The model-state kinds kept outside the device's memory (zerompi/offload/): none of their
    bytes in it on any rank."""
    return [kind for kind in ("optimizer", "params") if not everyone[:, COLUMNS.index(kind)].any()]


def node_split(collectives, node_of_rank):
    """[[intra-node, inter-node] elements of each rank per step] in the ring model."""
    return [[sum(t["intra"].values()), sum(t["inter"].values())] for t in ring_traffic(collectives, node_of_rank)]


def formula_split(collectives, node_of_rank, alltoall=None):
    """node_split, with qgZ's all-to-alls (alltoall: zerompi/quantize/'s alltoall_elements) in place
    of the gradient reductions' rings."""
    if alltoall is None:
        return node_split(collectives, node_of_rank)
    rings = node_split([c for c in collectives if c.purpose != "grads"], node_of_rank)
    return [[a + b for a, b in zip(ring, pairs)] for ring, pairs in zip(rings, alltoall)]


def _passes(stage, per_micro_batch):
    """The step's passes over Psi (zerompi.memory.passes_over_params): '2', '3'; with micro-batches,
    as a + b M: '2', '(M+1)', '3M'."""
    one, two = passes_over_params(stage, 1), passes_over_params(stage, 2)
    if not per_micro_batch or one == two:
        return f"{one}"
    a, b = 2 * one - two, two - one
    return f"{b}M" if a == 0 else f"({'' if b == 1 else b}M+{a})"


WHAT = {"weights": "the gathered weights", "grads": "the reduced gradients"}


def format_table(report):
    r = report
    b = r["bytes_per_param"]
    m = r["micro_batches"]
    comm_name = f"{_passes(r['stage'], m > 1)} Psi (N-1)/N"
    if r["kept_last_layer_elements"]:                 # --keep-last-layer
        comm_name = f"({_passes(r['stage'], m > 1)} Psi - {'M ' if m > 1 else ''}psi_last) (N-1)/N"
    if r["shard_group"] != r["ranks"] or r["hpz_ranks_per_node"]:     # zerompi/hierarchy/
        comm_name = "of the groups' rings (zerompi.memory.ring_traffic)"
    if m > 1:
        comm_name += f", M = {m} micro-batches"
    if "gradients as int4" in r.get("quantized", []):
        comm_name += ", the gradients' Psi as the Psi / 2 bytes of int4 pairs"
    lines = [
        f"{r['grouping']}, {r['dtype']}, Psi = {r['psi']:,} parameters"
        f" ({r['psi_padded']:,} padded), P={b['param']:g} G={b['grad']:g} K={b['optimizer']:g} bytes/param",
        "",
        "Memory per rank, measured from the allocated buffers (model state = params + grads + optimizer)",
        f"{'rank':>4} {'params':>11} {'grads':>11} {'optimizer':>11} {'model state':>12} "
        f"{'formula':>11} {'work':>11} {'activations':>11} {'peak RSS':>10}",
    ]
    offloaded = r["offloaded"]
    formula = r["memory_formula_bytes"]["total"] - sum(r["memory_formula_bytes"][kind] for kind in offloaded)
    for rank, row in enumerate(r["per_rank"]):
        state = row["params"] + row["grads"] + row["optimizer"]
        lines.append(f"{rank:>4} {format_bytes(row['params']):>11} {format_bytes(row['grads']):>11} {format_bytes(row['optimizer']):>11} "
                     f"{format_bytes(state):>12} {format_bytes(formula):>11} {format_bytes(row['work']):>11} "
                     f"{format_bytes(row['activations']):>11} {format_bytes(row['peak_rss']):>10}")
    padded = r["memory_formula_padded_bytes"]["total"] - sum(r["memory_formula_padded_bytes"][k] for k in offloaded)
    lines += [f"     formula at Psi_pad: {padded:,.0f} B; at Psi: {formula:,.0f} B (difference = padding)"
              f"{''.join(f'; less the offloaded {OFFLOADED[kind]}' for kind in offloaded)}", "",
              "Communication per rank per training step (ring volume counted from each call's buffer, elements)",
              f"{'rank':>4} {'grads':>12} {'params':>12} {'total':>12} {'formula':>12} {'bytes':>10} {'calls':>6}"
              f" {'MPI time':>10}"]
    comm_formula = r["comm_formula_elements_per_step"]
    for rank, row in enumerate(r["per_rank"]):
        total = row["grads_elements"] + row["params_elements"]
        lines.append(f"{rank:>4} {row['grads_elements']:>12,.0f} {row['params_elements']:>12,.0f} {total:>12,.0f} "
                     f"{comm_formula:>12,.0f} {format_bytes(row['comm_bytes']):>10} {row['calls']:>6.0f}"
                     f" {row['comm_seconds'] * 1e3:>8.2f}ms")
    lines.append(f"     formula {comm_name}: {comm_formula:,.0f} at Psi, "
                 f"{r['comm_formula_padded_elements_per_step']:,.0f} at Psi_pad")
    if r["kept_last_layer_elements"]:
        lines.append(f"     psi_last = {r['kept_last_layer_elements']:,} elements: the last layer, kept gathered "
                     f"from forward into backward (--keep-last-layer)")
    quantized = " ".join(r.get("quantized", []))
    if b["param"] == 2 and not ("parameters" in quantized and "gradients" in quantized):
        lines.append("     bytes: " + ", ".join(
            part for what, part in (("gradients", "16-bit gradients are summed in float32 (4 bytes per element)"),
                                    ("parameters", "parameters gathered as 16-bit words (2)")) if what not in quantized))
    if "quantize_block" in r:
        scales = {format_bytes(row["scales_bytes"]) for row in r["per_rank"]}
        what = [f"{q} ({'half a byte per element, counted in bytes' if q.endswith('int4') else 'a byte per element'})"
                for q in r["quantized"]]
        hops = (f"; the gradients in two hops, inside each node of {r['two_hops_node_size']} ranks, then between nodes"
                if r.get("two_hops_node_size") else "")
        lines.append(f"     ZeRO++: {' and '.join(what)}{hops} with float32 scales, one per "
                     f"block of {r['quantize_block']} (counted in bytes, calls and MPI time): "
                     f"{' / '.join(sorted(scales))} of scales per rank (formula "
                     f"{format_bytes(r['scales_formula_bytes_per_step'])}, 4 (N-1) ceil(n_u / B) per call on layer u)")
    if r.get("quant_error"):
        lines.append("     --quant-error, relative L2 error against the exact calls, mean (max) over the steps: " + ", ".join(
            f"{WHAT[kind]} {e['mean']:.3%} ({e['max']:.3%})" + (f" over the {e['steps']} finite" if e["steps"] < r["steps"] else "")
            for kind, e in r["quant_error"].items()))
    lines += ["", *format_node_split(r)]
    if offloaded:
        lines += ["", *format_tiers(r)]
    return "\n".join(lines)


def format_tiers(report):
    """--offload-optimizer (and --offload-params): each rank's bytes by tier, and what it moved
    between them per step."""
    lines = [f"Offloaded {' and '.join(OFFLOADED[kind] for kind in report['offloaded'])} per rank: bytes by tier, and moved between tiers per "
             "step (counted from each copy, read and write)",
             f"{'rank':>4} {'device':>10} {'host':>10} {'file':>10} {'to host':>10} {'to device':>10} "
             f"{'file read':>10} {'file write':>10} {'formula':>10}"]
    for rank, row in enumerate(report["per_rank"]):
        device = sum(row[kind] for kind in MEMORY_KINDS)
        lines.append(f"{rank:>4} {format_bytes(device):>10} {format_bytes(row['host_bytes']):>10} "
                     f"{format_bytes(row['file_bytes']):>10} " + " ".join(f"{format_bytes(row[k]):>10}" for k in MOVES) +
                     f" {format_bytes(row['file_read_formula'] + row['file_written_formula']):>10}")
    row = report["per_rank"][0]
    lines.append(f"     formula per step that updates: file C x Psi_owned x bytes each way (C = 3 with an fp32 "
                 f"master, 2 without); GPU: the gradient host-ward {format_bytes(row['to_host_formula'])}, "
                 f"the parameters device-ward {format_bytes(row['to_device_formula'])}")
    if "params" in report["offloaded"]:
        lines.append("     and the offloaded parameter shard: a file read (2 M + 1) times, written once; a GPU's "
                     "copied device-ward for each of the 2 M all-gathers (M micro-batches)")
    return lines


def format_node_split(report):
    """The communication table's ring volume split into intra- and inter-node, per rank per step."""
    r = report
    nodes = counted(r['nodes'], "node")
    lines = [f"Intra- and inter-node communication per rank per training step, {nodes} (ring model, bytes)",
             f"{'rank':>4} {'node':>4} {'grads intra':>12} {'grads inter':>12} {'params intra':>12} "
             f"{'params inter':>12} {'inter elements':>14} {'formula':>12}"]
    formula = r["comm_formula_node_elements_per_step"]
    for rank, row in enumerate(r["per_rank"]):
        lines.append(f"{rank:>4} {r['node_of_rank'][rank]:>4} {format_bytes(row['grads_intra_node_bytes']):>12} "
                     f"{format_bytes(row['grads_inter_node_bytes']):>12} {format_bytes(row['params_intra_node_bytes']):>12} "
                     f"{format_bytes(row['params_inter_node_bytes']):>12} {row['inter_node_elements']:>14,.0f} "
                     f"{formula[rank][1]:>12,.0f}")
    padded = sum(inter for _, inter in r["comm_formula_padded_node_elements_per_step"])
    lines.append(f"     formula: a rank's ring volume when its successor is on another node; all ranks: "
                 f"{sum(inter for _, inter in formula):,.0f} at Psi, {padded:,.0f} at Psi_pad")
    return lines


def format_json(report):
    return json.dumps(report, indent=1)
