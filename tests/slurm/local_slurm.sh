#!/usr/bin/env bash
# A real Slurm for the tests: Debian's slurmctld, slurmd and munge, on localhost or on the nodes of
# an emulated cluster (tools/emulated_cluster.py).
#
#   tests/slurm/local_slurm.sh start     back up the configuration files it replaces, write its own,
#                                        start munged, slurmctld, slurmd; wait for the node to be idle
#   tests/slurm/local_slurm.sh start --cluster C
#                                        the same across the nodes of emulated cluster C, which must be
#                                        up (`python tools/emulated_cluster.py --cluster C up --nodes 2`):
#                                        slurmctld on node 1, one slurmd on each node, each in the node's
#                                        network namespace with its hostname; munged once, here (its
#                                        socket is a file, which every node sees). The controller is
#                                        reached at node 1's address only, so Slurm's commands (sbatch,
#                                        squeue, ...) run on node 1 too, as on a cluster's login node:
#                                        `python tools/emulated_cluster.py --cluster C on 1 -- sbatch ...`
#   tests/slurm/local_slurm.sh stop      cancel its jobs and end their steps (slurmstepd processes working
#                                        in its folder), stop the daemons it started (by the pids they
#                                        wrote, never by name) and put back the files it replaced, byte for byte, and the
#                                        owner and mode of munge's folders; remove the folders it made
#
# What it started and what it replaced is kept in $state (below) until `stop`; so are Slurm's state,
# spool and log files (a system Slurm's saved state in /var/spool is never touched). It refuses to start
# next to a munged, slurmctld or slurmd it did not start. Needs root and the packages (`apt-get
# install slurmd slurmctld slurm-client munge`; .ci/run installs them). Each node declares 16 CPUs
# whatever the machine has (SlurmdParameters=config_overrides), so that the scripts' own requests
# (up to 8 ranks x 2 CPUs on a node) fit on a 2-core CI machine, oversubscribed; and 4 GPUs as a
# generic resource without devices, so that the GPU scripts' requests (--gpus-per-node, --gpu-bind)
# are accepted and scheduled: the jobs then run with --device cpu. It adds no address outside the
# emulated nodes and leaves /etc/hosts alone: Slurm finds each node by the NodeAddr it is given.
set -euo pipefail
action=${1:-start}
cluster=                                   # the emulated cluster's number; none: localhost
if [ "${2:-}" = --cluster ]; then cluster=${3:-}; fi
state=/run/zerompi-local-slurm            # pids of the daemons it started; backups of replaced files
conf=/etc/slurm/slurm.conf
REPLACED=("$conf" /etc/slurm/gres.conf /etc/munge/munge.key)
FOLDERS=(/etc/slurm /etc/munge /run/munge /var/lib/munge /var/log/munge)   # made if absent; munge's chowned

on_node() {                                # a command on a node: in its network namespace, with its hostname
    local node=$1; shift
    if [ "$node" = localhost ]; then "$@"; return; fi
    nsenter --net="/run/netns/$node" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$node" "$@"
}

client() {                                 # a Slurm command where the controller is reached (its login node)
    on_node "$(cat "$state/login" 2>/dev/null || echo localhost)" "$@"
}

stop_daemon() {                            # by the pid it wrote to its pid file, if that process is still it
    local name=$1 pid_file=$2 pid
    [ -s "$pid_file" ] || return 0
    pid=$(cat "$pid_file")
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] || return 0
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 100); do
        [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}

stop_steps() {                             # job steps of our slurmd (their files are in $state): end them
    local pid children
    client scancel --full --quiet --state=RUNNING,PENDING 2>/dev/null || true
    for _ in $(seq 1 50); do [ -z "$(client squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
    for pid in $(pgrep -x slurmstepd || true); do
        case "$(readlink "/proc/$pid/cwd" 2>/dev/null)" in "$state"*) ;; *) continue ;; esac
        children=$(pgrep -P "$pid" || true)  # the batch script or the ranks, each a process group
        for child in $children; do kill -KILL -- "-$child" 2>/dev/null || kill -KILL "$child" 2>/dev/null || true; done
        kill -KILL "$pid" 2>/dev/null || true
    done
}

stop() {
    [ -d "$state" ] || return 0
    stop_steps                             # a job still running (a test that timed out) must not outlive us
    for pid_file in "$state"/slurmd.*.pid; do stop_daemon slurmd "$pid_file" & done
    stop_daemon slurmctld "$state/slurmctld.pid" & wait
    stop_daemon munged "$state/munged.pid"   # last: the others talk to it while they shut down
    for file in "${REPLACED[@]}"; do       # put back what was there, remove what was not
        backup=$state/backup$file
        if [ -e "$backup" ]; then cp -p "$backup" "$file"; elif [ -e "$state/absent$file" ]; then rm -f "$file"; fi
    done
    for folder in "${FOLDERS[@]}"; do      # owner and mode as they were; a folder it made, removed if empty
        if [ -s "$state/owner$folder" ]; then
            read -r owner mode < "$state/owner$folder"
            chown "$owner" "$folder" 2>/dev/null || true
            chmod "$mode" "$folder" 2>/dev/null || true
        elif [ -e "$state/absent$folder" ]; then
            rm -f "$folder/munged.pid" 2>/dev/null || true
            rmdir "$folder" 2>/dev/null || true
        fi
    done
    rm -rf "$state"
}

if [ "$action" = stop ]; then stop; exit 0; fi

# The nodes: localhost, or emulated cluster C's (zmpiC-nodeI at 10.203.C.1I), node 1 also the controller's
if [ -z "$cluster" ]; then
    NODES=(localhost)
    ADDRESSES=(127.0.0.1)
else
    if ! [[ "$cluster" =~ ^[0-9]$ ]]; then echo "slurm: --cluster takes the emulated cluster's number, 0-9" >&2; exit 1; fi
    mapfile -t NODES < <(ip netns list | grep -o "^zmpi$cluster-node[1-8]" | sort)
    if [ ${#NODES[@]} = 0 ]; then
        echo "slurm: emulated cluster $cluster has no nodes: python tools/emulated_cluster.py --cluster $cluster up --nodes 2" >&2
        exit 1
    fi
    ADDRESSES=("${NODES[@]/#zmpi$cluster-node/10.203.$cluster.1}")
fi
login=${NODES[0]}
controller=$login
[ -n "$cluster" ] && controller="$login(${ADDRESSES[0]})"

stop                                       # an earlier start of ours that was never stopped
for daemon in munged slurmctld slurmd; do
    if pid=$(pgrep -x "$daemon"); then
        echo "slurm: a $daemon this script did not start is running (pid ${pid//$'\n'/ }): stop it first" >&2
        exit 1
    fi
done
mkdir -p "$state"
trap '[ $? = 0 ] || stop' EXIT             # a start that fails leaves nothing running or replaced
for file in "${REPLACED[@]}"; do
    if [ -e "$file" ]; then
        mkdir -p "$(dirname "$state/backup$file")" && cp -p "$file" "$state/backup$file"
    else
        mkdir -p "$(dirname "$state/absent$file")" && touch "$state/absent$file"
    fi
done
for folder in "${FOLDERS[@]}"; do
    if [ -d "$folder" ]; then
        mkdir -p "$(dirname "$state/owner$folder")" && stat -c '%U:%G %a' "$folder" > "$state/owner$folder"
    else
        mkdir -p "$(dirname "$state/absent$folder")" "$folder" && touch "$state/absent$folder"
    fi
done
mkdir -p "$state/slurmctld" "$state/log"
for node in "${NODES[@]}"; do mkdir -p "$state/slurmd.$node"; done
echo "$login" > "$state/login"
# Job ids new at every start (slurmctld -c would begin at 1 again): MPICH names its shared-memory
# segment after the job step, and one a killed rank left in /dev/shm hangs the next "job 1.0" in MPI_Init
first_job_id=$(( $(date +%s) % 500000 * 100 + 1000 ))
cat > "$conf" <<CONF
ClusterName=zerompi
SlurmctldHost=$controller
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=pmi2
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobRequeue=1
FirstJobId=$first_job_id
ReturnToService=2
StateSaveLocation=$state/slurmctld
SlurmdSpoolDir=$state/slurmd.%n
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.%n.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.%n.log
SchedulerParameters=defer_batch
KillWait=5
GresTypes=gpu
$(for i in "${!NODES[@]}"; do
    echo "NodeName=${NODES[i]} NodeAddr=${ADDRESSES[i]} CPUs=16 RealMemory=2000 Gres=gpu:4 State=UNKNOWN"
done)
PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP
CONF
# 4 "GPUs" a node: character devices that every machine has stand in for /dev/nvidia0..3 (Slurm
# counts them and, with task/none, never touches them)
for node in "${NODES[@]}"; do
    printf "NodeName=$node Name=gpu File=%s\n" /dev/null /dev/zero /dev/full /dev/urandom
done > /etc/slurm/gres.conf
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
chmod 0700 /etc/munge
chmod 0400 /etc/munge/munge.key
rm -f /run/munge/munged.pid
runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
for _ in $(seq 1 50); do [ -s /run/munge/munged.pid ] && break; sleep 0.1; done
cp /run/munge/munged.pid "$state/munged.pid"
on_node "$login" slurmctld -c        # a clean start: no jobs or node states from an earlier run
for node in "${NODES[@]}"; do on_node "$node" slurmd -N "$node"; done
for _ in $(seq 1 60); do
    node_states=$(client sinfo -h -N -o %T 2>/dev/null | sort | uniq -c | xargs || true)
    if [ "$node_states" = "${#NODES[@]} idle" ]; then echo "slurm: ${NODES[*]} idle"; exit 0; fi
    sleep 0.5
done
echo "slurm: ${NODES[*]} did not become idle (states: ${node_states:-none}); the logs:" >&2
tail -n 20 "$state"/log/*.log >&2 || true
exit 1
