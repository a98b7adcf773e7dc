"""Step time and inter-node bytes of flat ZeRO stage 3, stage 3 with hpZ, qwZ, qgZ and all three (ZeRO++),
and hybrid sharding, across nodes.

    python tools/emulated_cluster.py --cluster 8 up --nodes 2 --rate 200mbit        (as root)
    python tools/emulated_cluster.py --cluster 8 mpiexec --ppn 2 -- python benchmarks/multi_node.py
    mpiexec -hosts node1,node2 -ppn 8 python benchmarks/multi_node.py --iface ib0   (a real cluster)
        [--sizes 1024,1024,1024,10] [--batch-per-rank 32] [--repeats 5] [--steps 3] [--warmup 1]
        [--variants flat3,hpz3,qwz3,qgz3,qgz3hop,zeropp3,hybrid3,hybrid2,hybrid1,flat2,flat1] [--json PATH]

Ranks must be placed on the nodes in blocks (mpiexec -ppn L): L ranks on each of k nodes.

Method (every rank with 1 BLAS thread, float32, the same MLP and batch shapes for every variant):
  variants   flat stage s (ZeRO over all N ranks), stage 3 with hpZ (--hpz: a secondary partition
             over the node's L ranks), hybrid sharding stage s (--shard-group node: ZeRO inside
             each node, the owned shards all-reduced across the k nodes), stage 3 with qwZ's int8
             parameter gathers, with qgZ's int8 gradient all-to-alls (two hops: inside the node, then
             between nodes; and in one flat all-to-all), and with hpZ, qwZ and qgZ
             (zerompi/quantize/, blocks of 2048). Each is built once
             (build_engine with its Grouping), init_params(0), random data per rank, `warmup`
             steps. Then `repeats` rounds; in each, every variant in turn: Barrier, `steps`
             train_steps. A round's time is the max over ranks of its mean step time; we print
             the median over rounds. Interleaving makes a burst of load hit all variants alike.
  ledger     the inter-node ring bytes the CommLedger counted in the timed steps (purposes grads
             and params), per step, summed over the ranks of each node: what the node sent to
             other nodes in the ring model (zerompi/ledger.py, docs/multi-node.md).
  formula    zerompi.memory's ring collectives of the variant (Grouping.ring_collectives at the
             layout's padded Psi, so that it equals the ledger exactly) through ring_traffic and
             inter_node_per_node: the same, predicted. Quantized: the parameters' and gradients'
             elements at one byte each, qgZ's all-to-alls in place of the gradients' rings (blocks
             of Psi / N, M - 1 of them between nodes with two hops, one to each rank on another
             node with one: zerompi.quantize.hop_slots), and the scales, 4 bytes per block,
             crossing as the calls that carry them.
  wire       the bytes that really left each node: the first rank of each node reads its network
             namespace's transmit counter of --iface (/proc/net/dev, which shows the reading
             process's namespace; /sys/class/net shows the namespace that mounted /sys, which on
             the emulated cluster is the machine's own) before and after each round. It counts
             every byte the node's interface sent: MPI's real algorithms (not the ring model),
             TCP/IP headers, the acknowledgements of what the node received, the round's Barrier.
  rate       the wire bytes of the busiest node per step / the step time: the rate at which the
             node's link was used, to compare with its nominal rate (the tc rate, the network's).
  ratios     each variant's step time, ledger bytes and formula bytes over flat stage 3's: the
             formula's 2/3 for hpZ (2 Psi against 3 Psi per step across nodes), 2 Psi (k-1)/k
             over 3 Psi (N-1)/N for hybrid sharding at any stage.
  link       the limit (benchmarks/floors.py's rule): in each round, after the variants, every rank
             all-gathers --probe-mb MB (MPI's Allgather), timed, the node leaders reading their tx
             counters: the busiest node's wire bytes / the time is one sample of the link's rate,
             and the best of the rounds' samples is the link, its spread beside it. A variant's
             floor is its busiest node's wire bytes per step at that rate; its ratio, step / floor.
  void       a ratio below 1 (a step sent faster than the link was seen to go: the probe was not
             the limit), or other processes taking more than 10% of the machine's CPU over the
             rounds (zerompi/util/other_processes.py, per kernel): the table says VOID and why.
"""
import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI
from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from zerompi.adam import AdamConfig                   # noqa: E402
from zerompi.comm import Communicator                 # noqa: E402
from zerompi.engine import build_engine               # noqa: E402
from zerompi.hierarchy import FLAT, Grouping, hierarchy_for   # noqa: E402
from zerompi.hierarchy.groups import node_size        # noqa: E402
from zerompi.memory import BytesPerParam, ring_traffic, wire_bytes   # noqa: E402
from zerompi.precision import precision_for           # noqa: E402
from zerompi.quantize import Quantizer, hop_slots, quantized_collectives, scales_ring_bytes   # noqa: E402
from zerompi.util.other_processes import OtherProcesses   # noqa: E402
from floors import best, void_reasons                  # noqa: E402  (beside this file)
from step_time import warmed_up_step                   # noqa: E402

COMM = MPI.COMM_WORLD
RANK, N = COMM.Get_rank(), COMM.Get_size()
PURPOSES = {"grads", "params", "scales"}
QUANTIZER = Quantizer(8, 2048)


@dataclass(frozen=True)
class Variant:
    key: str          # the name --variants takes
    label: str
    stage: int
    hpz: bool = False
    hybrid: bool = False
    qwz: bool = False         # --quantize-weights int8
    qgz: bool = False         # --quantize-grads int8, in two hops across the nodes
    one_hop: bool = False     # qgZ's flat all-to-all over every rank instead

    def start_collectives(self, ranks_per_node):
        return quantized_collectives(QUANTIZER if self.qwz else None, QUANTIZER if self.qgz else None,
                                     None if self.one_hop else ranks_per_node)

    def grouping(self, ranks_per_node):
        if self.hpz:
            return Grouping(hpz_node_size=ranks_per_node)
        return Grouping(shard_group=ranks_per_node) if self.hybrid else FLAT


BASELINE = Variant("flat3", "flat stage 3", 3)
VARIANTS = {v.key: v for v in (BASELINE, Variant("hpz3", "hpZ stage 3", 3, hpz=True),
                               Variant("qwz3", "qwZ stage 3", 3, qwz=True), Variant("qgz3", "qgZ stage 3", 3, qgz=True),
                               Variant("qgz3hop", "qgZ 1 hop stage 3", 3, qgz=True, one_hop=True),
                               Variant("zeropp3", "ZeRO++ stage 3", 3, hpz=True, qwz=True, qgz=True),
                               Variant("hybrid3", "hybrid stage 3", 3, hybrid=True),
                               Variant("hybrid2", "hybrid stage 2", 2, hybrid=True),
                               Variant("hybrid1", "hybrid stage 1", 1, hybrid=True),
                               Variant("flat2", "flat stage 2", 2), Variant("flat1", "flat stage 1", 1))}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1024,1024,1024,10", help="MLP widths (default: 2.1 M parameters)")
    p.add_argument("--batch-per-rank", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5, help="timed rounds; the median is reported")
    p.add_argument("--steps", type=int, default=3, help="timed steps per round")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma list of {', '.join(VARIANTS)} (flat3 is always run: the ratios' base)")
    p.add_argument("--iface", default="eth0", help="the network interface between nodes, for the wire bytes")
    p.add_argument("--probe-mb", type=float, default=4.0, help="the link probe's all-gathered MB (default 4)")
    p.add_argument("--json", default=None, help="write every number to this file (rank 0)")
    args = p.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",")]
    unknown = [k for k in args.variants.split(",") if k not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    args.variants = [BASELINE.key] + [k for k in args.variants.split(",") if k != BASELINE.key]
    return args


def tx_bytes(iface):
    """Bytes this process's network namespace has sent over iface since it came up, or None where
    it has no such interface (or no /proc: not Linux). /proc/net/dev lists the namespace of the
    process that reads it."""
    if not os.path.exists("/proc/net/dev"):
        return None
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, _, counters = line.partition(":")
            if name.strip() == iface:
                return int(counters.split()[8])     # receive: 8 counters, then transmit bytes
    return None


class LinkProbe:
    """The link's rate, sampled once per round: an all-gather of nbytes over every rank."""

    def __init__(self, iface, node_leader, nbytes):
        self.iface, self.reads = iface, node_leader and tx_bytes(iface) is not None
        self.shard = np.ones(max(1, int(nbytes) // 4 // N), np.float32)
        self.full = np.empty(self.shard.size * N, np.float32)
        self.samples = []

    def sample(self):
        before = tx_bytes(self.iface) if self.reads else 0
        COMM.Barrier()
        start = time.perf_counter()
        COMM.Allgather(self.shard, self.full)
        seconds = COMM.allreduce(time.perf_counter() - start, op=MPI.MAX)
        sent = COMM.allreduce((tx_bytes(self.iface) - before) if self.reads else -1, op=MPI.MAX)
        if sent > 0:                                   # -1 everywhere: no node reads a counter
            self.samples.append(sent / seconds)


class VariantRun:
    """One variant: built and warmed up once, then timed in rounds between the others."""

    def __init__(self, variant, ranks_per_node, node_leader, args):
        self.variant, self.iface = variant, args.iface
        self.grouping = variant.grouping(ranks_per_node)
        comm = Communicator()
        quantized = variant.qwz or variant.qgz
        self.engine = build_engine(args.sizes, variant.stage, precision_for("float32"), AdamConfig(),
                                   args.batch_per_rank, comm, hierarchy=hierarchy_for(comm, self.grouping),
                                   **({"start_collectives": variant.start_collectives(ranks_per_node)} if quantized else {}))
        self.step = warmed_up_step(self.engine, args)     # benchmarks/step_time.py's
        self.round_s, self.steps, self.inter_bytes = [], 0, 0.0
        self.tx = 0 if node_leader and tx_bytes(self.iface) is not None else None   # None: not read here

    def time_round(self, steps):
        ledger = self.engine.comm.ledger
        inter_before, _ = ledger.inter_node(PURPOSES)
        tx_before = tx_bytes(self.iface) if self.tx is not None else None
        COMM.Barrier()
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        self.engine.stage.finish_communication()
        self.round_s.append(COMM.allreduce((time.perf_counter() - start) / steps, op=MPI.MAX))
        inter_after, _ = ledger.inter_node(PURPOSES)
        if tx_before is not None:
            self.tx += tx_bytes(self.iface) - tx_before
        self.inter_bytes += inter_after - inter_before
        self.steps += steps

    def result(self):
        """On rank 0 (None elsewhere): times, and each node's inter-node bytes per step."""
        engine = self.engine
        node_of_rank = engine.comm.node_of_rank
        ledger = COMM.gather(self.inter_bytes / self.steps)
        wire = COMM.gather(self.tx / self.steps if self.tx is not None else None)
        if RANK != 0:
            return None
        nodes = len(set(node_of_rank))
        collectives = self.grouping.ring_collectives(self.variant.stage, engine.layout.full_numel, N)
        bytes_per_param = engine.stage.precision.bytes_per_param()
        formula = formula_inter_bytes(self.variant, collectives, engine.layout, node_of_rank, bytes_per_param)
        return {"label": self.variant.label, "stage": self.variant.stage,
                "grouping": self.grouping.describe(self.variant.stage, N),
                "step_s": statistics.median(self.round_s), "rounds_s": self.round_s,
                "psi": engine.layout.num_params, "psi_padded": engine.layout.full_numel,
                "ledger_inter_bytes_per_rank": ledger,
                "ledger_inter_bytes_per_node": [sum(b for b, n in zip(ledger, node_of_rank) if n == node)
                                                for node in range(nodes)],
                "formula_inter_bytes_per_node": [sum(formula[r] for r in range(N) if node_of_rank[r] == node)
                                                 for node in range(nodes)],
                "wire_tx_bytes_per_node": [w for w in wire if w is not None] or None}


def formula_inter_bytes(variant, collectives, layout, node_of_rank, bytes_per_param):
    """Each rank's inter-node bytes per step by the formulas: the rings' elements at P and G bytes (one
    byte each where quantized; qgZ's all-to-alls in place of the gradients' rings), and the scales."""
    if variant.qgz:
        collectives = [c for c in collectives if c.purpose != "grads"]
    rings = ring_traffic(collectives, node_of_rank)
    per_element = BytesPerParam(1 if variant.qwz else bytes_per_param.param, bytes_per_param.grad, 0)
    inter = [wire_bytes(t["inter"], per_element) for t in rings]
    scales = scales_ring_bytes(layout, QUANTIZER)        # per quantized call on every layer
    for rank, successor in enumerate(node_of_rank[1:] + node_of_rank[:1]):
        if variant.qwz:                                   # forward's gathers (and backward's, without hpZ)
            inter[rank] += (1 if variant.hpz else 2) * scales * (successor != node_of_rank[rank])
        if variant.qgz:                                   # the levels and scales of each all-to-all
            crossing = hop_slots(list(node_of_rank), None if variant.one_hop else node_of_rank.count(0))[rank][1]
            inter[rank] += crossing * (layout.full_numel / N + scales / max(N - 1, 1))
    return inter


def main(argv=None):
    args = parse_args(argv)
    out = {"args": vars(args), "ranks": N, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "mpi": " ".join(MPI.Get_library_version().split()[:3])}
    world = Communicator()
    ranks_per_node, placement_error = node_size(world)
    error = next((e for e in COMM.allgather(placement_error) if e), None)
    if error:
        if RANK == 0:
            print(f"multi_node.py: error: {error}", file=sys.stderr)
        return 2
    node_leader = RANK % ranks_per_node == 0           # the first rank of its node (block placement)
    out["nodes"], out["ranks_per_node"] = N // ranks_per_node, ranks_per_node
    out["hosts"] = COMM.gather(MPI.Get_processor_name())
    with threadpool_limits(limits=1):
        runs = {key: VariantRun(VARIANTS[key], ranks_per_node, node_leader, args) for key in args.variants}
        probe, others = LinkProbe(args.iface, node_leader, args.probe_mb * 1e6), OtherProcesses(COMM)
        others.start()
        for _ in range(args.repeats):
            for run in runs.values():
                run.time_round(args.steps)
            probe.sample()
        out["others_share"] = others.share()
        out["variants"] = {key: run.result() for key, run in runs.items()}
    if RANK == 0:
        add_ratios(out)
        add_floors(out, probe.samples)
        print_table(out)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
            print(f"wrote {args.json}")
    return 0


def add_ratios(out):
    """Each variant over flat stage 3: step time, and the busiest node's bytes (ledger, formula, wire)."""
    base = out["variants"][BASELINE.key]
    for v in out["variants"].values():
        v["step_ratio"] = v["step_s"] / base["step_s"]
        for kind in ("ledger_inter_bytes_per_node", "formula_inter_bytes_per_node", "wire_tx_bytes_per_node"):
            most, base_most = (max(x[kind]) if x[kind] else None for x in (v, base))
            v[kind.replace("_per_node", "_ratio")] = most / base_most if most and base_most else None
        v["wire_bytes_per_s"] = max(v["wire_tx_bytes_per_node"]) / v["step_s"] if v["wire_tx_bytes_per_node"] else None


def add_floors(out, samples):
    """The link's best rate and spread, each variant's floor (its busiest node's wire bytes at that
    rate) and ratio, and why the numbers are void ([] when they are results)."""
    out["link_bytes_per_s"], out["link_spread"] = best(samples, higher_is_better=True) if samples else (None, None)
    ratios = {}
    for v in out["variants"].values():
        wire = v["wire_tx_bytes_per_node"]
        v["floor_s"] = max(wire) / out["link_bytes_per_s"] if wire and samples else None
        if v["floor_s"]:
            ratios[v["label"]] = v["floor_ratio"] = v["step_s"] / v["floor_s"]
    out["void"] = void_reasons(ratios, out["others_share"])


def print_table(out):
    a = out["args"]
    base = out["variants"][BASELINE.key]
    mb = lambda b: f"{b / 1e6:8.2f}" if b is not None else "       -"      # noqa: E731
    ratio = lambda r: f"{r:6.2f}" if r is not None else "     -"         # noqa: E731
    print(f"zerompi across nodes | {out['nodes']} nodes x {out['ranks_per_node']} ranks "
          f"({', '.join(sorted(set(out['hosts'])))}) | MLP {'-'.join(map(str, a['sizes']))} ({base['psi']:,} params, "
          f"float32) | batch {a['batch_per_rank']}/rank | median of {a['repeats']} rounds x {a['steps']} steps | {out['mpi']}")
    if out["nodes"] == 1:
        print("one node: nothing crosses, and hybrid sharding is flat ZeRO (its group is the whole world)")
    print(f"\nMB per step that the busiest node sent to other nodes: the ledger (ring model), the formula, "
          f"and {a['iface']}'s tx counter (every byte on the wire);\n"
          f"Mbit/s = wire tx / step time; the ratios are to flat stage 3")
    link = out["link_bytes_per_s"]
    print("link: " + (f"{8 * link / 1e6:.0f} Mbit/s, the best of {a['repeats']} all-gathers of {a['probe_mb']} MB "
                      f"(spread {100 * out['link_spread']:.0f}%)" if link else f"not measured (no tx counter of {a['iface']})")
          + "; other processes: " + ("unknown" if out["others_share"] is None else
                                     f"{100 * out['others_share']:.1f}% of the machine's CPU (kernel counters)"))
    print("variant            step ms |   ledger  formula  wire tx  tx/ledger   Mbit/s | step  ledger formula wire"
          " | floor ms ratio")
    for v in out["variants"].values():
        ledger, formula = max(v["ledger_inter_bytes_per_node"]), max(v["formula_inter_bytes_per_node"])
        wire = max(v["wire_tx_bytes_per_node"]) if v["wire_tx_bytes_per_node"] else None
        rate = f"{8 * v['wire_bytes_per_s'] / 1e6:8.0f}" if v["wire_bytes_per_s"] else "       -"
        print(f"{v['label']:<18} {1e3 * v['step_s']:8.1f} | {mb(ledger)} {mb(formula)} {mb(wire)} "
              f"{ratio(wire / ledger if wire and ledger else None):>10} {rate} |{ratio(v['step_ratio'])}"
              f"{ratio(v['ledger_inter_bytes_ratio'])}{ratio(v['formula_inter_bytes_ratio'])}"
              f"{ratio(v['wire_tx_bytes_ratio'])} | " + (f"{1e3 * v['floor_s']:8.1f} {v['floor_ratio']:5.2f}"
                                                         if v["floor_s"] else "       -     -"))
    if out["void"]:
        print("VOID, not a result: " + "; ".join(out["void"]))


if __name__ == "__main__":
    sys.exit(main())
