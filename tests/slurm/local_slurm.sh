#!/usr/bin/env bash
# A real single-node Slurm on localhost for the tests: Debian's slurmctld, slurmd and munge.
#
#   tests/slurm/local_slurm.sh start     write the config, start munged, slurmctld, slurmd; wait for idle
#   tests/slurm/local_slurm.sh stop      stop the three daemons
#
# Needs root and the packages (`apt-get install slurmd slurmctld slurm-client munge`; .ci/run
# installs them). The node declares 8 CPUs whatever the machine has (SlurmdParameters=
# config_overrides), so that 4- and 8-rank jobs fit on a 2-core CI machine, oversubscribed; and 4
# GPUs as a generic resource without devices, so that the GPU scripts' requests (--gpus-per-node,
# --gpu-bind) are accepted and scheduled: the jobs then run with --device cpu.
set -euo pipefail
action=${1:-start}
conf=/etc/slurm/slurm.conf

stop() {
    pkill -x slurmd 2>/dev/null || true
    pkill -x slurmctld 2>/dev/null || true
    pkill -x munged 2>/dev/null || true
}

if [ "$action" = stop ]; then stop; exit 0; fi

stop
sleep 0.5
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /etc/munge
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
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
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
runuser -u munge -- /usr/sbin/munged
slurmctld -c          # a clean start: no jobs or node states from an earlier run
slurmd -N localhost
for _ in $(seq 1 60); do
    state=$(sinfo -h -n localhost -o %T 2>/dev/null || true)
    if [ "$state" = idle ]; then echo "slurm: localhost idle"; exit 0; fi
    sleep 0.5
done
echo "slurm: localhost did not become idle (state: ${state:-none}); see /var/log/slurm/" >&2
exit 1
