"""An emulated cluster on one Linux machine: K "nodes" as network namespaces joined by a bridge.

Each node has its own network stack (a namespace named zmpiC-nodeI with one interface, eth0, at
10.203.C.1I) and, when something runs on it, its own hostname (zmpiC-nodeI, a UTS namespace), so
MPI treats the ranks of different nodes as different nodes: shared memory inside a node, TCP over
the bridge between nodes. `tc` can shape the link between nodes (rate and delay on each node's
eth0: what leaves a node); traffic inside a node never touches it.

    root namespace:        zmbrC (bridge, no address)
                            |            |            |
    nodes:            zmpiC-node1  zmpiC-node2 ... zmpiC-nodeK     eth0 10.203.C.11, .12, ...

C is the cluster's number (--cluster, 0 by default; 0-99): clusters of different numbers are
independent, so two test runs (or a test run and a user's cluster) do not meet.

Everything it creates is named here and removed by `down`, whatever state `up` left; it writes
no file outside the namespaces' own entries in /run/netns, gives no address to the machine's own
namespace, and sends nothing anywhere else. Needs root, `ip`, `tc`, `nsenter` and `unshare`.

    python tools/emulated_cluster.py [--cluster C] up --nodes 2 [--rate 1gbit --delay 200us]
    python tools/emulated_cluster.py mpiexec --ppn 2 -- python -m zerompi.train --steps 50
    python tools/emulated_cluster.py on 2 -- hostname            run one command on node 2
    python tools/emulated_cluster.py shape --rate 100mbit --delay 1ms   (or `shape` alone: unshaped)
    python tools/emulated_cluster.py down

`mpiexec` runs MPICH's mpiexec (hydra) on node 1, as one would on a cluster's first node, with
tools/node_shell as its "ssh": the proxies start on the other nodes through it. It sets UCX_TLS=tcp
for the ranks: MPICH's wheel reaches other nodes through UCX, and UCX, seeing one machine (one
boot id), would otherwise pass their messages through shared memory, past eth0 and its shaping.
Ranks on one node still talk through MPICH's own shared memory.
"""
import argparse
import os
import shutil
import subprocess
import sys

MAX_NODES = 8
NODE_SHELL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node_shell")


def run(*command, check=True):
    return subprocess.run(command, check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class Cluster:
    """The names and addresses of emulated cluster number c (0-99)."""

    def __init__(self, c=0):
        if not 0 <= c <= 99:
            raise SystemExit(f"emulated_cluster: --cluster {c}: a number from 0 to 99")
        self.c = c
        self.bridge = f"zmbr{c}"

    def node_name(self, i):
        return f"zmpi{self.c}-node{i}"

    def node_address(self, i):
        return f"10.203.{self.c}.{10 + i}"

    def veth_name(self, i):
        return f"zmveth{self.c}-{i}"

    def nodes(self):
        """The node numbers whose namespaces exist now."""
        names = run("ip", "netns", "list").stdout.split()
        return sorted(i for i in range(1, MAX_NODES + 1) if self.node_name(i) in names)

    def on_node(self, i, command):
        """The command, run on node i: its network namespace and a hostname of its own. (`ip netns
        exec` would remount /sys, where Slurm's and MPI's cgroup lookups then fail.)"""
        return ["nsenter", f"--net=/run/netns/{self.node_name(i)}", "unshare", "--uts", "sh", "-c",
                f'hostname {self.node_name(i)} && exec "$@"', "sh"] + list(command)

    def up(self, nodes, rate="", delay=""):
        if self.nodes() or os.path.exists(f"/sys/class/net/{self.bridge}"):
            raise SystemExit(f"emulated_cluster: cluster {self.c} is already up (or left over): run `down` first")
        try:
            run("ip", "link", "add", self.bridge, "type", "bridge")
            run("ip", "link", "set", self.bridge, "up")
            for i in range(1, nodes + 1):
                ns, veth = self.node_name(i), self.veth_name(i)
                run("ip", "netns", "add", ns)
                run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
                run("ip", "link", "set", veth, "master", self.bridge)
                run("ip", "link", "set", veth, "up")
                run("ip", "-n", ns, "addr", "add", f"{self.node_address(i)}/24", "dev", "eth0")
                run("ip", "-n", ns, "link", "set", "eth0", "up")
                run("ip", "-n", ns, "link", "set", "lo", "up")
            problem = self.shape_or_problem(rate, delay)
        except subprocess.CalledProcessError as e:
            self.down()
            raise SystemExit(f"emulated_cluster: {' '.join(e.cmd)} failed: {e.stderr.strip()}")
        except BaseException:                # Ctrl-C: nothing is left half-made
            self.down()
            raise
        if problem:                          # shaping refused: nothing is left half-made either
            self.down()
            raise SystemExit(f"{problem}; cluster {self.c} was not made")

    def shape(self, rate="", delay=""):
        """What leaves each node over eth0: at most `rate` (tc's tbf, a 256 kB burst), `delay`
        later (netem, where the kernel has it). Neither: unshaped. Every node alike: when tc
        refuses the shaping on one node, every node is left unshaped, never some of them shaped."""
        problem = self.shape_or_problem(rate, delay)
        if problem:
            raise SystemExit(f"{problem}; the link is left unshaped")

    def shape_or_problem(self, rate="", delay=""):
        """`shape`, returning tc's refusal as one line (every node then unshaped), or None."""
        for i in self.nodes():
            ns = self.node_name(i)
            run("tc", "-n", ns, "qdisc", "del", "dev", "eth0", "root", check=False)
            if delay:
                qdisc = ["netem", "delay", delay] + (["rate", rate] if rate else []) + ["limit", "100000"]
            elif rate:
                qdisc = ["tbf", "rate", rate, "burst", "256kb", "latency", "100ms"]
            else:
                continue
            done = run("tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", *qdisc, check=False)
            if done.returncode:
                self.shape()
                hint = " (this kernel has no netem: --rate alone works, with tbf)" if delay else ""
                return f"emulated_cluster: tc {' '.join(qdisc)}: {done.stderr.strip()}{hint}"
        return None

    def down(self):
        """Remove every namespace and link of this cluster (whatever is left of them)."""
        for i in range(1, MAX_NODES + 1):
            run("ip", "link", "del", self.veth_name(i), check=False)
            run("ip", "netns", "del", self.node_name(i), check=False)
        run("ip", "link", "del", self.bridge, check=False)

    def mpiexec_command(self, ppn, command, num_nodes=None):
        """MPICH's mpiexec across the first num_nodes nodes (all by default), started on node 1,
        ppn ranks per node."""
        return self.mpiexec_placed([ppn] * len(self.nodes()[:num_nodes]), command)

    def mpiexec_placed(self, ranks_per_node, command):
        """MPICH's mpiexec, started on node 1, with ranks_per_node[i] ranks on node i + 1, in
        blocks (e.g. [3, 1]: ranks 0-2 on node 1, rank 3 on node 2)."""
        nodes = self.nodes()[:len(ranks_per_node)]
        mpiexec = shutil.which("mpiexec") or "mpiexec"
        hosts = ",".join(f"{self.node_address(i)}:{ranks}" for i, ranks in zip(nodes, ranks_per_node))
        return self.on_node(nodes[0], [mpiexec, "-launcher", "ssh", "-launcher-exec", NODE_SHELL,
                                       "-iface", "eth0", "-genv", "UCX_TLS", "tcp",
                                       "-hosts", hosts, "-n", str(sum(ranks_per_node))] + list(command))

def ranks(text):
    """--ppn: a number of ranks, at least one."""
    if not text.lstrip("-").isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a number of ranks >= 1, got {text}")
    return int(text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", type=int, default=0, help="the cluster's number, 0-99 (default 0)")
    sub = parser.add_subparsers(dest="action", required=True)
    p_up = sub.add_parser("up", help="create the nodes and the bridge")
    p_up.add_argument("--nodes", type=int, default=2, choices=range(1, MAX_NODES + 1))
    for p in (p_up, sub.add_parser("shape", help="shape (or, without options, unshape) the link")):
        p.add_argument("--rate", default="", help="e.g. 1gbit, 100mbit (tc units)")
        p.add_argument("--delay", default="", help="e.g. 200us, 1ms (tc units; needs netem)")
    sub.add_parser("down", help="remove everything `up` created")
    sub.add_parser("list", help="the nodes that exist, with their addresses")
    p_mpi = sub.add_parser("mpiexec", help="mpiexec across all nodes (MPICH), from node 1")
    p_mpi.add_argument("--ppn", type=ranks, default=2, help="ranks per node")
    p_mpi.add_argument("command", nargs=argparse.REMAINDER)
    p_on = sub.add_parser("on", help="run a command on one node")
    p_on.add_argument("node", type=int)
    p_on.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("emulated_cluster: needs root (network namespaces)")
    cluster = Cluster(args.cluster)
    if args.action == "up":
        cluster.up(args.nodes, args.rate, args.delay)
    elif args.action == "shape":
        cluster.shape(args.rate, args.delay)
    elif args.action == "down":
        cluster.down()
    elif args.action == "list":
        for i in cluster.nodes():
            print(cluster.node_name(i), cluster.node_address(i))
    else:
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            raise SystemExit("emulated_cluster: give the command after --")
        nodes = cluster.nodes()
        if not nodes:
            raise SystemExit(f"emulated_cluster: cluster {args.cluster} has no nodes: run `up` first")
        if args.action == "on" and args.node not in nodes:
            raise SystemExit(f"emulated_cluster: node {args.node} is not up in cluster {args.cluster} "
                             f"(nodes: {', '.join(map(str, nodes))})")
        full = (cluster.mpiexec_command(args.ppn, command) if args.action == "mpiexec"
                else cluster.on_node(args.node, command))
        os.execvp(full[0], full)


if __name__ == "__main__":
    sys.exit(main())
