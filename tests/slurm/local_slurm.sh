#!/usr/bin/env bash
# A real single-node Slurm on localhost for the tests: Debian's slurmctld, slurmd and munge.
#
#   tests/slurm/local_slurm.sh start     back up the configuration files it replaces, write its own,
#                                        start munged, slurmctld, slurmd; wait for the node to be idle
#   tests/slurm/local_slurm.sh stop      cancel its jobs and end their steps (slurmstepd processes working
#                                        in its folder), stop the daemons it started (by the pids they
#                                        wrote, never by name) and put back the files it replaced, byte for byte, and the
#                                        owner and mode of munge's folders; remove the folders it made
#
# What it started and what it replaced is kept in $state (below) until `stop`; so are Slurm's state,
# spool and log files (a system Slurm's saved state in /var/spool is never touched). It refuses to start
# next to a munged, slurmctld or slurmd it did not start. Needs root and the packages (`apt-get
# install slurmd slurmctld slurm-client munge`; .ci/run installs them). The node declares 8 CPUs
# whatever the machine has (SlurmdParameters=config_overrides), so that 4- and 8-rank jobs fit on a
# 2-core CI machine, oversubscribed; and 4 GPUs as a generic resource without devices, so that the
# GPU scripts' requests (--gpus-per-node, --gpu-bind) are accepted and scheduled: the jobs then run
# with --device cpu.
set -euo pipefail
action=${1:-start}
state=/run/zerompi-local-slurm            # pids of the daemons it started; backups of replaced files
conf=/etc/slurm/slurm.conf
REPLACED=("$conf" /etc/slurm/gres.conf /etc/munge/munge.key)
FOLDERS=(/etc/slurm /etc/munge /run/munge /var/lib/munge /var/log/munge)   # made if absent; munge's chowned

stop_daemon() {                            # by the pid recorded at start, if that process is still it
    local name=$1 pid
    [ -s "$state/$name.pid" ] || return 0
    pid=$(cat "$state/$name.pid")
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
    scancel --full --quiet --state=RUNNING,PENDING 2>/dev/null || true
    for _ in $(seq 1 50); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
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
    stop_daemon slurmd & stop_daemon slurmctld & wait
    stop_daemon munged                     # last: the other two talk to it while they shut down
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
mkdir -p "$state/slurmctld" "$state/slurmd" "$state/log"
# Job ids new at every start (slurmctld -c would begin at 1 again): MPICH names its shared-memory
# segment after the job step, and one a killed rank left in /dev/shm hangs the next "job 1.0" in MPI_Init
first_job_id=$(( $(date +%s) % 500000 * 100 + 1000 ))
cat > "$conf" <<CONF
ClusterName=zerompi
SlurmctldHost=localhost
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
SlurmdSpoolDir=$state/slurmd
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
SchedulerParameters=defer_batch
KillWait=5
GresTypes=gpu
NodeName=localhost NodeAddr=127.0.0.1 CPUs=8 RealMemory=2000 Gres=gpu:4 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
# 4 "GPUs": character devices that every machine has stand in for /dev/nvidia0..3 (Slurm counts
# them and, with task/none, never touches them)
printf 'NodeName=localhost Name=gpu File=%s\n' /dev/null /dev/zero /dev/full /dev/urandom > /etc/slurm/gres.conf
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
slurmctld -c          # a clean start: no jobs or node states from an earlier run
slurmd -N localhost
for _ in $(seq 1 60); do
    node_state=$(sinfo -h -n localhost -o %T 2>/dev/null || true)
    if [ "$node_state" = idle ]; then echo "slurm: localhost idle"; exit 0; fi
    sleep 0.5
done
echo "slurm: localhost did not become idle (state: ${node_state:-none}); its logs:" >&2
tail -n 20 "$state"/log/*.log >&2 || true
exit 1
